"""The `memcalc` command: estimate, check, capacity, plan, gpus, tables (each with --json).

Imports are lazy so that `memcalc estimate` answers cold in well under a second (sympy only for
--formula, numpy never). Bad input of any kind prints one line
`memcalc: error: <field>: <problem>; fix: <fix>` on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING

from memcalc.cli.screens import cmd_gpus, print_estimate
from memcalc.core.units import GIB

if TYPE_CHECKING:
    from memcalc.queries.planner import Plan
    from memcalc.queries.preflight import Verdict
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

MODEL_OVERRIDES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                   "head_dim", "intermediate_size", "max_position_embeddings")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the project's one-line form (exit 2)."""

    def error(self, message: str):
        match = (re.match(r"argument (?:--)?([\w-]+)(?:/[^:]*)?: (.*)", message)
                 or re.match(r"unrecognized arguments: --([\w-]+)()", message))
        field, problem = (match.group(1).replace("-", "_"), match.group(2)
                          or "this command has no such option") if match else (
            "arguments", message)
        _fail(field, problem, f"see `{self.prog} --help`")


def _fail(field: str, problem: str, fix: str):
    print(f"memcalc: error: {field}: {problem}; fix: {fix}", file=sys.stderr)
    raise SystemExit(2)


# ---- arguments --------------------------------------------------------------------------------
def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", help="preset name, e.g. gpt2, llama-3-8b")
    g.add_argument("--hf-config", help="path to a Hugging Face config.json")
    g.add_argument("--implementation", help="hf (default) or reference")
    for name in MODEL_OVERRIDES:
        g.add_argument("--" + name.replace("_", "-"), type=int, help=f"override {name}")


def _training_args(p: argparse.ArgumentParser, shapes: bool = True) -> None:
    from memcalc.inputs.training import OPTIMIZERS

    g = p.add_argument_group("training")
    if shapes:
        g.add_argument("--micro-batch", type=int, default=1, help="sequences per pass (default 1)")
        g.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (default 1024)")
        g.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    g.add_argument("--precision", default="fp32", help="fp32, fp16-amp, bf16-amp or bf16")
    g.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS, metavar="NAME",
                   help="one of: " + ", ".join(OPTIMIZERS) + " (default adamw)")
    g.add_argument("--max-grad-norm", type=float,
                   help="clip_grad_norm_ before each optimizer step (default: no clipping)")
    g.add_argument("--optimizer-impl", help="foreach, fused or for-loop (default: torch's)")
    g.add_argument("--weight-decay", type=float, help="default: torch's for the optimizer")
    g.add_argument("--checkpointing", default="none",
                   help="none, per-layer, sqrt, every-k or selective")
    g.add_argument("--checkpoint-every", type=int, help="layers per segment for every-k")
    g.add_argument("--attention", default="sdpa", help="eager or sdpa")
    g.add_argument("--device", default="cuda", help="cuda or cpu")
    g.add_argument("--world-size", type=int, help="ranks training together (default 1)")
    g.add_argument("--sharding", help="none (DDP), zero1, zero2 or zero3 (FSDP2)")
    g.add_argument("--fsdp-mixed-precision", action="store_true", default=None,
                   help="FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce) with --precision fp32 "
                        "and --sharding zero2/zero3")
    g.add_argument("--tensor-parallel", type=int,
                   help="tensor-parallel degree t (Megatron column/row splits; default 1); "
                        "--world-size defaults to t")
    g.add_argument("--experts-implementation", help="MoE models: grouped_mm (transformers' default) "
                   "or eager (a loop over the experts)")
    g.add_argument("--moe-routing", help="MoE models, eager experts: worst (default: a bound over "
                   "every routing) or balanced tokens per expert")
    g.add_argument("--alloc-conf", dest="allocator", metavar="CONF",
                   help="the caching allocator's PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True "
                        "(changes reserved memory only)")
    _call_path_args(g)
    add_finetuning_args(p)


def _call_path_args(g: argparse._ArgumentGroup) -> None:
    """The HF call path (TrainingConfig.use_cache ... hf_trainer; memcalc.families.call_path)."""
    g.add_argument("--use-cache", action="store_true", default=None,
                   help="HF models: the forward keeps use_cache=True (a DynamicCache of k and v)")
    g.add_argument("--attention-mask", help="none (default), ones, or padded (with --pad-tokens)")
    g.add_argument("--pad-tokens", type=int, help="padding tokens a sequence, with --attention-mask padded")
    g.add_argument("--labels", help="input_ids (default) or separate (a labels tensor of its own)")
    g.add_argument("--num-items-in-batch", action="store_true", default=None,
                   help="the loss gets num_items_in_batch (as the HF Trainer passes it)")
    g.add_argument("--hf-trainer", action="store_true", default=None,
                   help="the HF Trainer's own tensors (held micro-batches, loss scalars, param groups)")


def add_finetuning_args(p: argparse.ArgumentParser, freeze_and_quantization: bool = True) -> None:
    """--lora-* (peft LoRA adapters), --lora-config, and (unless the caller generates them from
    TrainingConfig's fields) --freeze, --quantization."""
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--lora-rank", type=int, help="LoRA adapters of this rank r on a frozen model")
    g.add_argument("--lora-alpha", type=float, help="lora_alpha (default 8; scaling alpha/r)")
    g.add_argument("--lora-dropout", type=float, help="lora_dropout (default 0: no input copy)")
    g.add_argument("--lora-targets", help="comma-separated module names (default q_proj,v_proj) "
                                          "or all-linear")
    g.add_argument("--lora-config", help="peft adapter_config.json (or its folder)")
    if freeze_and_quantization:
        g.add_argument("--freeze", action="append",
                       help="freeze parameters matching this fnmatch pattern (repeatable)")
        g.add_argument("--quantization", help="none, nf4, nf4-double, fp4 or int8 (bitsandbytes)")


def lora_from_args(args: argparse.Namespace):
    """The LoRA of --lora-config and the --lora-* flags (None without any of them).

    >>> a = argparse.Namespace(lora_rank=16, lora_alpha=32.0, lora_dropout=None,
    ...                        lora_targets="q_proj,v_proj", lora_config=None)
    >>> lora_from_args(a).scaling
    2.0
    """
    from memcalc.inputs.lora import LoRA

    flags = {"rank": args.lora_rank, "alpha": args.lora_alpha, "dropout": args.lora_dropout,
             "targets": _targets(args.lora_targets) if args.lora_targets else None}
    given = {k: v for k, v in flags.items() if v is not None}
    if args.lora_config is None:
        return LoRA(**given) if given else None
    base = LoRA.from_peft_config(args.lora_config)
    return LoRA(**{**base.model_dump(), **given}) if given else base


def _targets(text: str):
    return "all-linear" if text == "all-linear" else [t.strip() for t in text.split(",") if t.strip()]


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def _basis_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--basis", default="device", choices=["allocated", "reserved", "device"],
                   help="what must fit: device (default: the caching allocator's reserved memory plus the "
                        "CUDA context, as nvidia-smi shows), reserved (max_memory_reserved) or allocated "
                        "(max_memory_allocated)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="memcalc", description="Peak memory of a transformer training step.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("estimate", help="peak memory and its breakdown")
    _model_args(p), _training_args(p), _json_arg(p)
    p.add_argument("--formula", nargs="?", const="peak", choices=["peak", "activations"],
                   help="print the peak as a sympy expression in b, s and L (num_layers, where the "
                        "layers repeat), or with 'activations' the activation memory alone")
    p = sub.add_parser("capacity", help="largest micro-batch / seq_len / depth within a budget")
    _model_args(p), _training_args(p), _json_arg(p)
    p.add_argument("--budget", default=None, help="GPU name, 'local', bytes or '80GB'")
    p.add_argument("--gpu", default=None, help="catalogue GPU (same as --budget NAME)")
    p.add_argument("--solve", default=None,
                   choices=["micro_batch", "seq_len", "num_layers", "world_size"],
                   help="the unknown (default: world_size with --sharding zero*, else micro_batch)")
    _basis_arg(p)
    p = sub.add_parser("plan", help="ranked training plans for one GPU")
    _model_args(p), _training_args(p, shapes=False), _json_arg(p)
    p.add_argument("--gpu", required=True, help="catalogue GPU, e.g. H100-80GB")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--utilisation", type=float, default=0.4, help="fraction of peak FLOPS (0.4)")
    p.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    _basis_arg(p)
    _check_parser(sub)
    p = sub.add_parser("gpus", help="the GPU catalogue and this machine's GPUs")
    _json_arg(p)
    p = sub.add_parser("tables", help="write (or --check) the reference tables")
    p.add_argument("--out", default="tables", help="output folder (default tables/)")
    p.add_argument("--check", action="store_true", help="exit 1 when committed tables differ")
    p.add_argument("--presets", nargs="*", help="only these presets")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--jobs", type=int, help="worker processes (default: the CPUs this process may use)")
    _basis_arg(p)
    _json_arg(p)
    from memcalc.cli.snapshot import add_snapshot_parser

    add_snapshot_parser(sub)
    return parser


# ---- building specs ---------------------------------------------------------------------------
def model_from_args(args: argparse.Namespace):
    """The ModelSpec named by --model / --hf-config plus overrides."""
    from memcalc.inputs.specs import ModelSpec

    if (args.model is None) == (args.hf_config is None):
        _fail("model", "give exactly one of --model PRESET or --hf-config PATH",
              "e.g. --model gpt2")
    if args.implementation is not None and args.implementation not in ("hf", "reference"):
        _fail("implementation", f"{args.implementation!r} is not an implementation", "use hf or reference")
    model = ModelSpec.preset(args.model) if args.model is not None else _from_hf(args.hf_config, args)
    changes = {k: getattr(args, k) for k in MODEL_OVERRIDES if getattr(args, k) is not None}
    if args.implementation and args.model:
        changes["implementation"] = args.implementation
    model = model.with_(**changes) if changes else model
    _check_moe_flags(args, model)
    return model


def _check_moe_flags(args: argparse.Namespace, model: ModelSpec) -> None:
    """--moe-routing / --experts-implementation name a dense model's nothing: refused, not ignored."""
    from memcalc.core.errors import SpecError

    for name in ("moe_routing", "experts_implementation"):
        if model.moe is None and getattr(args, name, None) is not None:
            raise SpecError(name, f"{model.name} has no mixture-of-experts layers",
                            f"drop --{name.replace('_', '-')} (it applies to MoE models only)")


def _from_hf(path: str, args: argparse.Namespace):
    from memcalc.core.files import read_json_object
    from memcalc.inputs.specs import ModelSpec

    config = read_json_object(path)  # a regular file of at most 1 MiB holding a JSON object
    return ModelSpec.from_hf_config(config, implementation=args.implementation or "hf")


def training_from_args(args: argparse.Namespace, **fixed):
    """The TrainingConfig of the training flags (plus `fixed` fields)."""
    from memcalc.inputs.training import TrainingConfig

    names = ("micro_batch", "seq_len", "grad_accum", "precision", "optimizer", "optimizer_impl",
             "weight_decay", "max_grad_norm", "checkpointing", "checkpoint_every", "attention", "device",
             "world_size", "sharding", "tensor_parallel", "fsdp_mixed_precision",
             "use_cache", "attention_mask", "pad_tokens", "labels", "num_items_in_batch", "hf_trainer",
             "experts_implementation", "moe_routing", "allocator")
    fields = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    lora = lora_from_args(args) if hasattr(args, "lora_rank") else None
    if lora is not None:
        fields["lora"] = lora
    if getattr(args, "freeze", None):
        fields["freeze"] = tuple(args.freeze)
    if getattr(args, "quantization", None) is not None:
        fields["quantization"] = args.quantization
    if "tensor_parallel" in fields and "world_size" not in fields:
        fields["world_size"] = fields["tensor_parallel"]
    return TrainingConfig.make(**{"micro_batch": 1, "seq_len": 1, **fields, **fixed})


# ---- commands ---------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> dict:
    """Run `estimate`; return the JSON payload (printed as text unless --json)."""
    from memcalc.queries.estimate import estimate

    model, training = model_from_args(args), training_from_args(args)
    r = estimate(model, training)
    out = {"model": model.name, "params": model.param_count, "peak_bytes": r.peak_bytes,
           "peak_gib": r.peak_gib, "peak_phase": r.peak_phase, "moment": r.moment,
           "first_step_peak_bytes": r.first_step_peak_bytes, "phases": r.phases,
           "components": r.components, "rank_peak_bytes": r.rank_peak_bytes}
    if args.formula:
        expr = r.expr if args.formula == "peak" else r.formula("activations")
        out["formula"] = str(expr)
        out["formula_of"] = f"{args.formula}({', '.join(sorted(map(str, expr.free_symbols), key='bsL'.index))})"
    if model.moe is not None:
        out["moe_routing"] = routing_note(training)
    out["reserved_peak_bytes"], out["device_bytes"] = r.reserved_peak_bytes, r.device_bytes
    out["reserved_phases"] = r.reserved_phases
    if not args.json:
        print_estimate(out, training.device)
    return out


def routing_note(training: TrainingConfig) -> str:
    """What a MoE answer assumed about routing (memcalc.inputs.moe).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> routing_note(TrainingConfig(micro_batch=1, seq_len=8))
    'grouped_mm experts: every tensor is sized by tokens*top_k, so routing does not change memory'
    """
    if training.experts_implementation == "grouped_mm":
        return "grouped_mm experts: every tensor is sized by tokens*top_k, so routing does not change memory"
    routing = training.moe_routing
    what = {"worst": "the worst case (a bound of the peak over every routing, allocator rounding "
                     "included; the bound to plan with)",
            "balanced": "balanced routing (b*s*top_k/E tokens per expert)"}.get(routing, "the given counts") \
        if isinstance(routing, str) else "the given counts per layer and expert"
    return f"eager experts with {what}"


def cmd_capacity(args: argparse.Namespace) -> dict:
    """Run `capacity`."""
    from memcalc.queries import capacity
    from memcalc.inputs.gpus import gpu, parse_budget

    if (args.budget is None) == (args.gpu is None):
        _fail("budget", "give exactly one of --budget or --gpu", "e.g. --gpu H100-80GB")
    budget = gpu(args.gpu) if args.gpu is not None else args.budget
    parse_budget(budget)  # names its flag
    model, training = model_from_args(args), training_from_args(args)
    solve = args.solve or ("world_size" if training.sharding != "none" else "micro_batch")
    solver = {"micro_batch": capacity.max_micro_batch, "seq_len": capacity.max_seq_len,
              "num_layers": capacity.max_layers, "world_size": capacity.min_world_size}[solve]
    r = solver(model, training, budget) if solve == "world_size" else solver(model, training, budget, basis=args.basis)
    out = {"field": r.field, "value": r.value, "budget_bytes": r.budget_bytes, "basis": r.basis,
           "peak_bytes": r.peak_bytes, "next_peak_bytes": r.next_peak_bytes, "fits": r.fits}
    if model.moe is not None:
        out["moe_routing"] = routing_note(training)
    if not args.json:
        if "moe_routing" in out:
            print(f"routing: {out['moe_routing']}")
        if r.field == "world_size" and r.fits:
            t = training.tensor_parallel
            split = f" = {r.value // t} data-parallel x {t} tensor-parallel" if t > 1 else ""
            print(f"fewest ranks: {r.value} x {args.gpu or args.budget}{split} under "
                  f"{training.sharding} (peak per rank {r.peak_bytes / GIB:.3f} GiB of "
                  f"{r.budget_bytes / GIB:.3f} GiB)")
        elif r.field == "world_size":
            print(f"does not fit on any number of ranks: the per-rank peak stays at "
                  f"{r.next_peak_bytes / GIB:.3f} GiB > budget {r.budget_bytes / GIB:.3f} GiB")
        elif not r.fits:
            print(f"does not fit: {r.field}=1 needs {r.next_peak_bytes / GIB:.3f} GiB "
                  f"> budget {r.budget_bytes / GIB:.3f} GiB")
        else:
            print(f"largest {r.field}: {r.value} ({r.basis} peak {r.peak_bytes / GIB:.3f} GiB of "
                  f"{r.budget_bytes / GIB:.3f} GiB; headroom {r.headroom_bytes / GIB:.3f} GiB)")
    return out


def cmd_plan(args: argparse.Namespace) -> dict:
    """Run `plan`."""
    from memcalc.core.arguments import check_int
    from memcalc.queries.planner import plan

    check_int("top", args.top, 1)
    model = model_from_args(args)
    base = training_from_args(args, seq_len=args.seq_len)
    plans = plan(model, args.gpu, args.global_batch, args.seq_len, base, args.utilisation, basis=args.basis)
    out = {"gpu": args.gpu, "global_batch": args.global_batch, "seq_len": args.seq_len, "basis": args.basis,
           "utilisation": args.utilisation, "plans": [p.as_dict() for p in plans[:args.top]],
           "fitting": len(plans)}
    if not args.json:
        _print_plans(plans[:args.top], len(plans), args)
    return out


def _print_plans(plans: list[Plan], total: int, args: argparse.Namespace) -> None:
    if not plans:
        print(f"no plan fits {args.gpu} (global batch {args.global_batch}, seq_len {args.seq_len})")
        return
    print(f"{total} plans fit {args.gpu}; fastest {len(plans)} (utilisation {args.utilisation}):")
    print(f"{'#':>3} {'precision':<9} {'ckpt':<10} {'micro':>5} {'accum':>5} "
          f"{'peak GiB':>9} {'headroom':>9} {'step s':>9}")
    for i, p in enumerate(plans, 1):
        print(f"{i:>3} {p.precision:<9} {p.checkpointing:<10} {p.micro_batch:>5} {p.grad_accum:>5} "
              f"{p.peak_bytes / GIB:>9.2f} {p.headroom_bytes / GIB:>9.2f} {p.step_seconds:>9.2f}")


def cmd_tables(args: argparse.Namespace) -> dict:
    """Run `tables` (write, or --check and exit 1 on a difference)."""
    from memcalc.queries import tables
    from memcalc.core.arguments import check_out_dir
    from memcalc.core.errors import MemcalcError
    from memcalc.core.limits import MAX_JOBS

    check_out_dir("out", args.out, create=not args.check)
    if args.jobs is not None and not 1 <= args.jobs <= MAX_JOBS:
        raise MemcalcError("jobs", f"{args.jobs} worker processes", f"pass --jobs from 1 to {MAX_JOBS}")
    _check_presets(args.presets)
    if args.check:
        stale = tables.check(args.out, args.presets, args.jobs, args.basis)
        if not args.json:
            print("tables are up to date" if not stale else
                  f"tables differ from the code: {', '.join(stale)}; run `memcalc tables`")
        if stale:
            if args.json:
                print(json.dumps({"stale": stale}))
            raise SystemExit(1)
        return {"stale": stale}
    names = tables.write(args.out, args.presets, plots=not args.no_plots, jobs=args.jobs, basis=args.basis)
    if not args.json:
        print(f"wrote {len(names)} files to {args.out}: {', '.join(names)}")
    return {"written": names}


def _check_presets(names: list[str] | None) -> None:
    """--presets: known preset names (an unknown one named under --presets, not --model)."""
    from memcalc.core.errors import UnknownNameError
    from memcalc.inputs.specs import ModelSpec

    for name in names or []:
        try:
            ModelSpec.preset(name)
        except UnknownNameError as err:
            raise UnknownNameError("presets", err.problem, err.fix) from None


# ---- check: pre-flight from the user's own files (memcalc.queries.preflight, memcalc.inputs.trainers.trainer_args) ---
def _check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="fits / does not fit, from TrainingArguments JSON and a config.json")
    _model_args(p), _json_arg(p)
    p.add_argument("--trainer-args", help="TrainingArguments JSON (to_json_string()); "
                   "default: transformers' defaults")
    p.add_argument("--axolotl", help="axolotl config.yml (instead of --trainer-args; gives --seq-len)")
    p.add_argument("--deepspeed", help="DeepSpeed config JSON (overrides the args' deepspeed)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--gpu", default=None, help="catalogue GPU, e.g. RTX-4090 (its usable memory)")
    p.add_argument("--budget", default=None, help="'local', bytes or '24GB' instead of --gpu")
    p.add_argument("--device", default=None, help="cuda (default) or cpu (default under use_cpu)")
    p.add_argument("--world-size", type=int, default=1, help="ranks training together (default 1)")
    p.add_argument("--attention-mask", default="ones",
                   help="what the data collator passes: ones (unpadded or packed) or padded")
    p.add_argument("--pad-tokens", type=int, default=0, help="padding tokens a sequence, with padded")
    _basis_arg(p)


def cmd_check(args: argparse.Namespace) -> dict:
    """Run `check`: exit 0 fits, 1 does not fit (with the changes that fit), 2 bad input."""
    from memcalc.queries.preflight import check
    from memcalc.inputs.training import TrainingConfig

    if (args.budget is None) == (args.gpu is None):
        _fail("gpu", "give exactly one of --gpu or --budget", "e.g. --gpu RTX-4090")
    trainer = args.trainer_args if args.trainer_args is not None else {}
    if args.axolotl is not None:
        trainer = _from_axolotl(args)
    if args.seq_len is None:
        _fail("seq_len", "the sequence length is needed", "pass --seq-len N")
    if args.deepspeed is not None:
        from memcalc.inputs.trainers.trainer_args import trainer_args_dict

        trainer = {**trainer_args_dict(trainer), "deepspeed": args.deepspeed}
    model = model_from_args(args)
    training = TrainingConfig.from_trainer_args(trainer, seq_len=args.seq_len, device=args.device,
                                                world_size=args.world_size,
                                                attention_mask=args.attention_mask,
                                                pad_tokens=args.pad_tokens)
    v = check(model, training, args.gpu if args.gpu is not None else args.budget, basis=args.basis)
    out = {"fits": v.fits, "peak_bytes": v.peak_bytes, "budget_bytes": v.budget_bytes, "basis": args.basis,
           "headroom_bytes": v.headroom_bytes,
           "changes": [dict(trainer_args=c.trainer_args(), training=c.fields, peak_bytes=c.peak_bytes,
                            why=c.why) for c in v.changes]}
    if not args.json:
        _print_check(v, args.gpu or args.budget, args.basis)
    if not v.fits:
        if args.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        sys.stdout.flush()
        raise SystemExit(1)
    return out


def _from_axolotl(args: argparse.Namespace) -> dict:
    """TrainingArguments fields of --axolotl; --seq-len and the padding from it unless given."""
    from memcalc.inputs.trainers.axolotl import axolotl_fields

    if args.trainer_args is not None:
        _fail("axolotl", "give --axolotl or --trainer-args, not both", "drop one")
    fields, seq_len, mask = axolotl_fields(args.axolotl)
    args.seq_len = args.seq_len or seq_len
    if mask == "padded" and args.attention_mask == "ones":
        args.attention_mask, args.pad_tokens = "padded", args.pad_tokens or 1
    return fields


def _print_check(v: Verdict, where: str, basis: str = "device") -> None:
    peak, budget = v.peak_bytes / GIB, v.budget_bytes / GIB
    of = "total" if basis == "device" else "usable"
    if v.fits:
        print(f"fits: {basis} peak {peak:.2f} GiB of {budget:.2f} GiB {of} on {where} "
              f"(headroom {v.headroom_bytes / GIB:.2f} GiB)")
        return
    print(f"does not fit: {basis} peak {peak:.2f} GiB > {budget:.2f} GiB {of} on {where} "
          f"(short by {-v.headroom_bytes / GIB:.2f} GiB)")
    if not v.changes:
        print("  no single change memcalc models makes it fit (try more GPUs with --world-size "
              "and a DeepSpeed ZeRO-3 config)")
    for c in v.changes:
        fields = ", ".join(f"{k}={v}" for k, v in c.trainer_args().items())
        print(f"  fits with {fields}: peak {c.peak_bytes / GIB:.2f} GiB ({c.why})")


def cmd_snapshot(args: argparse.Namespace) -> dict:
    """Run `snapshot` (memcalc.cli.snapshot)."""
    from memcalc.cli.snapshot import cmd_snapshot as run

    return run(args)


COMMANDS = {"estimate": cmd_estimate, "check": cmd_check, "capacity": cmd_capacity, "plan": cmd_plan,
            "gpus": cmd_gpus, "tables": cmd_tables, "snapshot": cmd_snapshot}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `memcalc` command.

    >>> main(["gpus", "--json"]) == 0  # doctest: +ELLIPSIS
    {...
    True
    """
    args = build_parser().parse_args(argv)
    from memcalc.core.errors import MemcalcError

    try:
        out = COMMANDS[args.command](args)
        if args.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        sys.stdout.flush()
    except MemcalcError as err:
        _fail(err.field, err.problem, err.fix or f"see `memcalc {args.command} --help`")
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
