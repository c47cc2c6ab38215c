"""The `memcalc` command: estimate, check, capacity, plan, gpus, tables (each with --json).

Imports are lazy so that `memcalc estimate` answers cold in well under a second (sympy only for
--formula, numpy never). Bad input of any kind prints one line
`memcalc: error: <field>: <problem>; fix: <fix>` on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from memcalc.cli import cluster as cluster_cli
from memcalc.cli import lengths as lengths_cli
from memcalc.cli.args import (Parser, fail, json_arg, model_args, model_from_args, training_args,
                              training_from_args)
from memcalc.serve import cli as serve_cli
from memcalc.cli.screens import cmd_gpus, print_estimate
from memcalc.core.units import GIB

if TYPE_CHECKING:
    from memcalc.queries.planner import Plan
    from memcalc.queries.preflight import Verdict
    from memcalc.inputs.training import TrainingConfig


def _basis_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--basis", default="device", choices=["allocated", "reserved", "device"],
                   help="what must fit: device (default: the caching allocator's reserved memory plus the "
                        "CUDA context, as nvidia-smi shows), reserved (max_memory_reserved) or allocated "
                        "(max_memory_allocated)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; given the `command` that will run, the model and
    training flags of the others are left out (a cold `memcalc estimate` builds only its own).

    >>> parser = build_parser("plan")
    >>> args = parser.parse_args(["plan", "--model", "gpt2", "--gpu", "L4", "--global-batch", "8", "--seq-len", "8"])
    >>> args.gpu, args.model, args.precision
    ('L4', 'gpt2', None)
    """
    def fields(p: argparse.ArgumentParser, name: str, shapes: bool = True) -> None:
        if command in (None, name):
            model_args(p), training_args(p, shapes)

    parser = Parser(prog="memcalc", description="Peak memory of a transformer training step.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("estimate", help="peak memory and its breakdown")
    fields(p, "estimate"), json_arg(p)
    lengths_cli.add_arguments(p)  # --seq-lens (memcalc.cli.lengths)
    p.add_argument("--formula", nargs="?", const="peak", choices=["peak", "activations"],
                   help="print the peak as a sympy expression in b, s and L (num_layers, where the "
                        "layers repeat), or with 'activations' the activation memory alone")
    p = sub.add_parser("capacity", help="largest micro-batch / seq_len / depth within a budget")
    fields(p, "capacity"), json_arg(p)
    p.add_argument("--budget", default=None, help="GPU name, 'local', bytes or '80GB'")
    p.add_argument("--gpu", default=None, help="catalogue GPU (same as --budget NAME)")
    p.add_argument("--solve", default=None,
                   choices=["micro_batch", "seq_len", "num_layers", "world_size"],
                   help="the unknown (default: world_size with --sharding zero*, else micro_batch)")
    _basis_arg(p)
    p = sub.add_parser("plan", help="ranked training plans for one GPU (--gpu) or a cluster (--gpus)")
    fields(p, "plan", shapes=False), json_arg(p)
    p.add_argument("--gpu", default=None, help="catalogue GPU, e.g. H100-80GB")
    cluster_cli.add_arguments(p)  # --gpus COUNTxGPU and the cluster's links (memcalc.cli.cluster)
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--utilisation", type=float, default=0.4, help="fraction of peak FLOPS (0.4)")
    p.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    _basis_arg(p)
    _check_parser(sub, command in (None, "check"))
    serve_cli.add_parser(sub)  # `memcalc serve` (memcalc/serve/cli.py)
    p = sub.add_parser("gpus", help="the GPU catalogue and this machine's GPUs")
    json_arg(p)
    p = sub.add_parser("tables", help="write (or --check) the reference tables")
    p.add_argument("--out", default="tables", help="output folder (default tables/)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when committed tables differ (with --presets: only their rows)")
    p.add_argument("--presets", nargs="*", help="only these presets")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--jobs", type=int, help="worker processes (default: the CPUs this process may use)")
    _basis_arg(p)
    json_arg(p)
    from memcalc.cli.snapshot import add_snapshot_parser

    add_snapshot_parser(sub)
    return parser


# ---- commands ---------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> dict:
    """Run `estimate`; return the JSON payload (printed as text unless --json)."""
    from memcalc.queries.estimate import estimate

    model = model_from_args(args)
    if args.seq_lens is not None or args.pad_to_multiple_of or args.packing:  # variable lengths (memcalc.cli.lengths)
        return lengths_cli.run(args, model, training_from_args, print_estimate)
    training = training_from_args(args)
    r = estimate(model, training)
    out = {"model": model.name, "params": model.param_count, "peak_bytes": r.peak_bytes,
           "peak_gib": r.peak_gib, "peak_phase": r.peak_phase, "moment": r.moment,
           "first_step_peak_bytes": r.first_step_peak_bytes, "phases": r.phases,
           "components": r.components, "rank_peak_bytes": r.rank_peak_bytes,
           "attention": r.attention, "attention_assumed": r.attention_assumed}
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
        fail("budget", "give exactly one of --budget or --gpu", "e.g. --gpu H100-80GB")
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
    if (args.gpu is None) == (args.gpus is None):
        fail("gpu", "give --gpu (one GPU) or --gpus (a cluster, COUNTxGPU), not both or neither",
             "pass --gpu H100-80GB or --gpus 64xH100-80GB")
    if args.gpus is not None:
        return cluster_cli.run(args, model_from_args(args), training_from_args(args, seq_len=args.seq_len))
    cluster_cli.refuse_cluster_flags(args)
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
def _check_parser(sub: argparse._SubParsersAction, model_flags: bool = True) -> None:
    p = sub.add_parser("check", help="fits / does not fit, from TrainingArguments JSON and a config.json")
    if model_flags:
        model_args(p)
    json_arg(p)
    p.add_argument("--trainer-args", help="TrainingArguments JSON (to_json_string()); "
                   "default: transformers' defaults")
    p.add_argument("--trainer", choices=("hf", "dpo", "sft", "grpo"), default="hf",
                   help="what runs the --trainer-args: the HF Trainer (TrainingArguments), "
                   "trl.DPOTrainer (a DPOConfig's JSON; per_device_train_batch_size pairs), "
                   "trl.SFTTrainer (an SFTConfig's JSON, no packing) or trl.GRPOTrainer (a "
                   "GRPOConfig's JSON; --seq-len is prompt + max_completion_length; the verdict is "
                   "the training step's, the generation and scoring phases are printed beside it)")
    p.add_argument("--axolotl", help="axolotl config.yml (instead of --trainer-args; gives --seq-len)")
    p.add_argument("--deepspeed", help="DeepSpeed config JSON (overrides the args' deepspeed)")
    from memcalc.cli.launch_configs import add_launch_config_args

    add_launch_config_args(p)
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
        fail("gpu", "give exactly one of --gpu or --budget", "e.g. --gpu RTX-4090")
    trainer = args.trainer_args if args.trainer_args is not None else {}
    if args.axolotl is not None:
        trainer = _from_axolotl(args)
    from memcalc.cli.launch_configs import training_from_launch_configs

    launched = training_from_launch_configs(args, trainer) if args.torchtitan_config else None
    if args.seq_len is None and launched is None:
        fail("seq_len", "the sequence length is needed", "pass --seq-len N")
    if args.deepspeed is not None:
        from memcalc.inputs.trainers.trainer_args import trainer_args_dict

        trainer = {**trainer_args_dict(trainer), "deepspeed": args.deepspeed}
    model = model_from_args(args)
    launched = launched or training_from_launch_configs(args, trainer)
    if launched is not None and args.trainer != "hf":
        fail("trainer", f"--trainer {args.trainer} reads --trainer-args (a TRL config), not a launch "
             "config", "drop the launch config")
    training = launched or TrainingConfig.from_trainer_args(trainer, seq_len=args.seq_len, device=args.device,
                                                            world_size=args.world_size,
                                                            attention_mask=args.attention_mask,
                                                            pad_tokens=args.pad_tokens,
                                                            trainer=args.trainer)
    v = check(model, training, args.gpu if args.gpu is not None else args.budget, basis=args.basis)
    out = {"fits": v.fits, "peak_bytes": v.peak_bytes, "budget_bytes": v.budget_bytes, "basis": args.basis,
           "headroom_bytes": v.headroom_bytes,
           "changes": [c.as_dict() for c in v.changes]}
    if training.trl == "grpo":  # each modelled phase's peak and the one that decides
        from memcalc.queries.grpo import grpo_phases

        phases = grpo_phases(model, training)
        out["grpo_phases"] = {"generation": phases.generation, "decode_decides": phases.decode_decides,
                              "generation_refused": phases.generation_refused,
                              "scoring": phases.scoring, "step": phases.step, "deciding": phases.deciding}
    if not args.json:
        _print_check(v, args.gpu or args.budget, args.basis)
        if training.trl == "grpo":
            floor = " (its last decode step)" if phases.decode_decides else " (the prefill)"
            gen = f"{phases.generation / GIB:.2f} GiB{floor}" if phases.generation is not None else \
                f"not modelled ({phases.generation_refused})"
            print(f"GRPO phases (allocated): generation {gen}, scoring "
                  f"{phases.scoring / GIB:.2f} GiB, step {phases.step / GIB:.2f} GiB: {phases.deciding} decides")
            if phases.deciding != "step":
                print(f"warning: the {phases.deciding} phase holds more than the step; the verdict and the "
                      "changes above are the step's (check the phase against the budget)")
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
        fail("axolotl", "give --axolotl or --trainer-args, not both", "drop one")
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
        print("  no combination of up to three changes memcalc models makes it fit")
    for i, c in enumerate(v.changes, 1):
        print(f"  {i}. fits with {c.text()}")


def cmd_snapshot(args: argparse.Namespace) -> dict:
    """Run `snapshot` (memcalc.cli.snapshot)."""
    from memcalc.cli.snapshot import cmd_snapshot as run

    return run(args)


COMMANDS = {"estimate": cmd_estimate, "check": cmd_check, "capacity": cmd_capacity, "plan": cmd_plan,
            "gpus": cmd_gpus, "tables": cmd_tables, "snapshot": cmd_snapshot, "serve": serve_cli.cmd_serve}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `memcalc` command.

    >>> main(["gpus", "--json"]) == 0  # doctest: +ELLIPSIS
    {...
    True
    """
    given = sys.argv[1:] if argv is None else argv
    args = build_parser(given[0] if given and given[0] in COMMANDS else None).parse_args(argv)
    from memcalc.core.errors import MemcalcError

    try:
        out = COMMANDS[args.command](args)
        if args.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        sys.stdout.flush()
    except MemcalcError as err:
        fail(err.field, err.problem, err.fix or f"see `memcalc {args.command} --help`")
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
