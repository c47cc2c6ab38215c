"""`python -m validate`: measure real training steps and compare them with memcalc's predictions.

    python -m validate run --matrix ci --device cpu --out validate/results/cpu-ci.jsonl
    python -m validate run --matrix dist-ci --device cpu --out validate/results/dist-ci.jsonl
    python -m validate run --model gpt2 --num-layers 2 --micro-batch 2 --seq-len 128 --device cpu --json
    python -m validate run --model gpt2 --num-layers 2 --micro-batch 2 --seq-len 64 \\
        --device cpu --world-size 2 --sharding zero3 --no-predict
    python -m validate demo --out tables/

Model and training flags are generated from ModelSpec and TrainingConfig (flag = field name with
dashes), so they cannot drift from the contracts; --world-size, --sharding and
--tensor-parallel among them run the case on gloo ranks (validate.run.runner). Bad input: one line on
stderr, exit 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

from memcalc.cli.flags import add_fields, field_values, flag_fields
from memcalc.cli.args import add_lora_args, lora_from_args
from memcalc.core.errors import MemcalcError, SpecError, closest_names
from memcalc.inputs.hf.config import load_config
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.run.compare import is_distributed_row, markdown_table, mib, verdict
from validate.matrices import MATRICES, get_matrix
from validate.matrices.tolerances import bound
from validate.run.runner import run_cases

EXIT_BAD_INPUT = 2
EXIT_OUT_OF_TOLERANCE = 1


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the house rule for bad input)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"validate: {message}; fix: see python -m validate {self.prog.split()[-1]} --help\n")


def _add_fields(parser: argparse.ArgumentParser, model: type, skip: tuple = ()) -> list[str]:
    """A flag per field of `model` (memcalc.cli.flags, booleans as true|false)."""
    group = parser.add_argument_group(f"{model.__name__} fields")
    return add_fields(group, model, flag_fields(model, skip), bools="value")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (no torch needed to build or use it)."""
    parser = _Parser(prog="validate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="measure configurations and compare with memcalc")
    src = run.add_argument_group("what to run (one of)")
    src.add_argument("--matrix", help=f"a named matrix: {', '.join(MATRICES)}")
    src.add_argument("--model", help="a memcalc preset name, e.g. gpt2, llama-2-7b")
    src.add_argument("--hf-config", help="path of a Hugging Face config.json")
    run.add_argument("--trainer", help="run through transformers.Trainer with these TrainingArguments: "
                     "a JSON file (to_json_string()) or a JSON object, e.g. '{\"bf16\": true}' "
                     "(with --model/--hf-config and --seq-len; --attention-mask/--pad-tokens say "
                     "how the synthetic batches are padded)")
    run.add_argument("--prompt-len", type=int, help="with --trainer and --trl dpo: prompt tokens of "
                     "each synthetic example (the rest of --seq-len is the completion; default a quarter)")
    run.add_argument("--backend", choices=["auto", "cpu", "fake", "cuda"], default="auto",
                     help="auto: cuda for --device cuda, else the live-tensor tracker")
    run.add_argument("--out", help="JSON lines results file (a .md table is written next to it)")
    run.add_argument("--tolerance", type=float,
                     help="allowed |error| in %% for every configuration (default: each row's topic bound, "
                     "validate.matrices.tolerances: 0.05 on CPU, 3 on CUDA)")
    run.add_argument("--limit", type=int, help="run at most N configurations of the matrix")
    run.add_argument("--only", help="run matrix configurations whose label matches this regex")
    run.add_argument("--rows", help="run these matrix rows only: names, comma-separated (e.g. ci03,moe12)")
    run.add_argument("--sample", type=int, metavar="N",
                     help="a slice of about N rows, every topic in proportion (validate.matrices.sample)")
    run.add_argument("--sample-seed", default="0", help="the slice's seed (CI passes the commit)")
    run.add_argument("--steps", type=int, default=3, help="steps per configuration (>= 2)")
    run.add_argument("--json", action="store_true", help="print one JSON object per configuration")
    run.add_argument("--no-predict", action="store_true", help="measure only; no tolerance check")
    run.add_argument("--reserved", action="store_true",
                     help="record each row's allocation sequence (cpu backend) and compare its reserved "
                          "peak in the caching-allocator replica with the engine's sequence "
                          "(validate.run.reserved; default --out DEVICE-MATRIX-reserved.jsonl)")
    run.add_argument("--sequences", metavar="FOLDER",
                     help="with --reserved: keep each row's recorded sequence in FOLDER, so that "
                          "python -m validate.run.recompare compares it with a later engine without "
                          "running the row again")
    run.add_argument("--cuda-snapshots", metavar="FOLDER",
                     help="cuda backend: write a memory snapshot with history per row into FOLDER "
                          "(validate.measure.cuda_snapshot; replayed by scripts/gpu_summary.py --snapshots)")
    run.set_defaults(model_fields=_add_fields(run, ModelSpec, skip=("name",)),
                     training_fields=_add_fields(run, TrainingConfig, skip=("lora",)))
    add_lora_args(run)
    demo = sub.add_parser("demo", help="the lecture's demonstrations, measured on CPU")
    demo.add_argument("--out", default="tables", help="folder for tables and the plot")
    demo.add_argument("--real", action="store_true",
                      help="depth sweep with real compute instead of FakeTensorMode")
    return parser


# ---- building cases ----------------------------------------------------------------------------
def _given(args, names) -> dict:
    return field_values(args, names)


def single_case(args) -> Case:
    """The Case for --model / --hf-config plus field overrides."""
    overrides = _given(args, args.model_fields)
    impl = overrides.pop("implementation", None)
    hf_config = None
    if args.hf_config:
        hf_config = load_config(args.hf_config)
        spec = ModelSpec.from_hf_config(hf_config, implementation=impl or "hf")
    elif args.model:
        spec = ModelSpec.preset(args.model)
        spec = spec.with_(implementation=impl) if impl else spec
    else:
        raise SpecError("model", "nothing to run", "give --matrix NAME, --model PRESET or --hf-config PATH")
    if overrides:  # the HF model is then built from the changed spec, not from the file
        spec, hf_config = spec.with_(**overrides), None
    if spec.implementation != "hf":
        hf_config = None
    if args.trainer is not None:
        return trainer_case(args, spec, hf_config)
    fields = _given(args, args.training_fields)
    lora = lora_from_args(args)
    training = TrainingConfig.make(**fields, **({"lora": lora} if lora is not None else {}))
    return Case(spec.name, spec, training, hf_config)


def trainer_case(args, spec: ModelSpec, hf_config: dict | None) -> Case:
    """--trainer: the TrainingArguments fields, and the TrainingConfig memcalc reads from them."""
    from memcalc.inputs.trainers.trainer_args import trainer_args_dict

    text = args.trainer.strip()
    if text.startswith("{"):
        from memcalc.core.files import parse_json_object

        fields = parse_json_object(text, "--trainer", "trainer_args")
    else:
        fields = trainer_args_dict(text)
    given = _given(args, args.training_fields)
    if "seq_len" not in given:
        raise SpecError("seq_len", "--trainer needs the sequence length", "pass --seq-len N")
    kind = given.pop("trl", "none")
    kind = "hf" if kind == "none" else kind
    extra = sorted(set(given) - {"seq_len", "attention_mask", "pad_tokens", "device"})
    if extra:
        raise SpecError(extra[0], "comes from the TrainingArguments with --trainer",
                        f"set it in the --trainer fields, not as --{extra[0].replace('_', '-')}")
    fields = {**fields, "use_cpu": True}
    training = TrainingConfig.from_trainer_args(fields, seq_len=given["seq_len"], device="cpu",
                                                attention_mask=given.get("attention_mask", "ones"),
                                                pad_tokens=given.get("pad_tokens", 0), trainer=kind)
    if kind == "hf":
        return Case(spec.name, spec, training, hf_config, trainer_args=fields)
    lora = lora_from_args(args)  # a TRL trainer's peft_config
    if lora is not None:
        training = training.with_(lora=lora)
    prompt = args.prompt_len if args.prompt_len is not None else given["seq_len"] // 4
    if kind == "grpo":  # seq_len is prompt + max_completion_length
        prompt = training.seq_len - training.grpo_completion_len
    if not 0 < prompt < given["seq_len"]:
        raise SpecError("prompt_len", f"{prompt} leaves no prompt or no completion in {given['seq_len']} "
                        "tokens", "pass --prompt-len between 1 and --seq-len - 1")
    return Case(spec.name, spec, training, hf_config, trainer_args=fields,
                trl={"kind": kind, "prompt_len": prompt})


def matrix_cases(args) -> list[Case]:
    """The selected cases of --matrix, with --device/--only/--rows/--sample/--limit applied."""
    from validate.matrices.sample import sample_rows

    if args.model or args.hf_config:
        raise SpecError("matrix", "--matrix cannot be combined with --model/--hf-config",
                        "give one of them")
    cases = get_matrix(args.matrix, args.device)
    if args.only:
        try:
            pattern = re.compile(args.only)
        except re.error as err:
            raise SpecError("only", f"bad regex ({err})", "give a Python regular expression") from None
        cases = [c for c in cases if pattern.search(c.label)]
    if args.rows:
        names = [n.strip() for n in args.rows.split(",") if n.strip()]
        known = {c.name for c in get_matrix(args.matrix, args.device)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SpecError("rows", f"no row {unknown[0]!r} in matrix {args.matrix!r}",
                            f"use row names of the matrix, e.g. {closest_names(unknown[0], sorted(known))}")
        cases = [c for c in cases if c.name in names]
    if args.sample is not None:
        if args.sample < 1:
            raise SpecError("sample", f"{args.sample} rows", "pass --sample 1 or more")
        cases = sample_rows(cases, lambda c: c.topic, args.sample, args.sample_seed)
        print(f"validate: a slice of {len(cases)} rows (--sample {args.sample}, --sample-seed {args.sample_seed}): "
              + ", ".join(c.name for c in cases), file=sys.stderr, flush=True)
    return cases[: args.limit] if args.limit is not None else cases


def tolerances(args, cases: list[Case]) -> dict[str, float]:
    """Each case's allowed |error| in %, by key: --tolerance, else its topic's bound
    (validate.matrices.tolerances; a case outside any topic, its device's).

    >>> from validate.matrices import get_matrix
    >>> case = get_matrix("ci")[0]
    >>> tolerances(build_parser().parse_args(["run", "--matrix", "ci"]), [case])[case.key]
    0.05
    """
    if args.tolerance is not None:
        return {c.key: args.tolerance for c in cases}
    return {c.key: bound(c.topic, c.training.device).peak_pct for c in cases}


def check_case(case: Case) -> None:
    """Fail early, as bad input, on what cannot run (before anything is measured)."""
    from validate.measure.step import check_runnable

    check_runnable(case.spec, case.training, trainer_run=case.trainer_args is not None or case.trl is not None)
    if case.spec.implementation == "hf":
        from validate.models.hf import CLASSES, hf_config_dict

        if case.hf_config is None:
            hf_config_dict(case.spec)
        elif case.hf_config.get("model_type") not in CLASSES:
            raise SpecError("hf_config.model_type", f"{case.hf_config.get('model_type')!r} is not supported",
                            f"use one of {', '.join(CLASSES)}")
        _require("transformers")


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MemcalcError(module, "is not installed", "pip install 'memcalc[validate]'")


def _backend(args, case: Case) -> str:
    if args.backend != "auto":
        return args.backend
    return "cuda" if case.training.device == "cuda" else "cpu"


# ---- commands ----------------------------------------------------------------------------------
def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=total, unit="config", file=sys.stderr) if tqdm else None
    count = [0]

    def step(case):
        count[0] += 1
        if bar is not None:
            if count[0] > 1:
                bar.update(1)
            bar.set_description(case.name)
        else:
            print(f"[{count[0]}/{total}] {case.name}", file=sys.stderr, flush=True)

    def close():
        if bar is not None:
            bar.update(1)
            bar.close()

    return step, close


def _default_out(args, cases: list[Case], distributed: bool) -> Path | None:
    """--out, else validate/results/DEVICE-MATRIX.jsonl (distributed: MATRIX.jsonl, the
    matrix names its kind) for a matrix, else None."""
    if args.out:
        return Path(args.out)
    if not args.matrix:
        return None
    if distributed:
        return Path("validate/results") / f"{args.matrix}.jsonl"
    device = cases[0].training.device if cases else "cpu"
    suffix = "-reserved" if args.reserved else ""
    return Path("validate/results") / f"{device}-{args.matrix}{suffix}.jsonl"


def cmd_run(args) -> int:
    """Run a matrix or one configuration; exit 1 if any is outside the tolerance."""
    cases = matrix_cases(args) if args.matrix else [single_case(args)]
    for case in cases:
        check_case(case)
    if args.steps < 2:
        raise SpecError("steps", f"need >= 2, got {args.steps}", "pass --steps 3")
    if args.reserved and (args.backend not in ("auto", "cpu") or any(_backend(args, c) != "cpu" for c in cases)):
        raise SpecError("reserved", "the allocation sequence is recorded by the cpu backend",
                        "use --device cpu (and --backend cpu or auto) with --reserved")
    if args.sequences and not args.reserved:
        raise SpecError("sequences", "keeps the sequences --reserved records", "add --reserved")
    distributed = any(c.distributed for c in cases)
    out = _default_out(args, cases, distributed)
    if args.cuda_snapshots:
        from validate.measure.cuda_snapshot import configure

        configure(args.cuda_snapshots)
    target = out or Path(tempfile.mkdtemp(prefix="validate-")) / "run.jsonl"
    step, close = _progress(len(cases)) if args.matrix else (None, lambda: None)
    with _exclusive(target):
        rows = run_cases(cases, target, _backend(args, cases[0]) if cases else "cpu", progress=step,
                         steps=args.steps, with_prediction=not args.no_predict, reserved=args.reserved,
                         sequences=args.sequences)
    close()
    allowed = tolerances(args, cases)
    if out is not None:
        out.with_suffix(".md").write_text(_md_header(args, rows, distributed, allowed)
                                          + markdown_table(rows, allowed)
                                          + (_reserved_md(rows) if args.reserved else ""))
    failures = [(r, verdict(r, allowed[r["key"]], not args.no_predict)) for r in rows]
    failures = [(r, why) for r, why in failures if why]
    for row in rows:
        print(json.dumps(row, sort_keys=True) if args.json else _line(row), flush=True)
    if args.reserved:
        from validate.run.reserved import summary, summary_lines

        print("\n".join(summary_lines(summary(rows))), flush=True)
    if failures:
        print(f"validate: {len(failures)} of {len(rows)} configurations failed: "
              + "; ".join(f"{r['name']}: {w}" for r, w in failures[:5]), file=sys.stderr)
        return EXIT_OUT_OF_TOLERANCE
    return 0


@contextlib.contextmanager
def _exclusive(path: Path):
    """Hold an advisory lock on PATH.lock: two runs appending to one file would interleave."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SpecError("out", f"another run is writing {str(path)!r}",
                            "wait for it or give another --out") from None
        yield


def _reserved_md(rows: list[dict]) -> str:
    from validate.run.reserved import markdown, summary, summary_lines

    return "\n" + "\n".join(summary_lines(summary(rows))) + "\n" + markdown(rows)


def _md_header(args, rows: list[dict], distributed: bool, allowed: dict[str, float]) -> str:
    what = args.matrix or args.model or args.hf_config
    bounds = sorted(set(allowed.values()))
    tolerance = (f"tolerance +-{bounds[0]:g}%" if len(bounds) == 1
                 else "tolerance per topic (validate.matrices.tolerances)")
    if distributed:
        return (f"# validate: {what} (distributed, gloo on CPU)\n\n{len(rows)} configurations, {tolerance}, "
                f"steady-state peak per rank (steps >= 2), MiB; one number when all ranks "
                f"agree.\n\n")
    return (f"# validate: {what}\n\n{len(rows)} configurations, {tolerance}, "
            f"steady-state peak (steps >= 2), bytes shown in MiB.\n\n")


def _line(row: dict) -> str:
    """One row for the terminal."""
    if is_distributed_row(row):
        ranks = ", ".join(mib(x, 3) for x in row.get("measured_rank_peak_bytes") or [])
        return (f"{row['label']}: ranks [{ranks}] MiB, predicted "
                f"{mib(row.get('predicted_peak_bytes'), 3)}, {row['status']}"
                + (f", {row.get('error')}" if row.get("error") else ""))
    meas, pred, err = row.get("measured_peak_bytes"), row.get("predicted_peak_bytes"), row.get("error_pct")
    in_mib = lambda x: "-" if x is None else f"{x / 2**20:.2f} MiB"  # noqa: E731
    tail = f"error {err:+.4f}%" if err is not None else (row.get("no_prediction") or row.get("error") or "")
    line = f"{row['label']}: measured {in_mib(meas)}, predicted {in_mib(pred)}, {row['status']}, {tail}"
    if "recorded_reserved_bytes" in row or "no_reserved" in row:
        rerr = row.get("reserved_error_pct")
        line += (f"; reserved recorded {in_mib(row.get('recorded_reserved_bytes'))}, engine "
                 f"{in_mib(row.get('predicted_reserved_bytes'))}"
                 + (f" ({rerr:+.4f}%)" if rerr is not None else "")
                 + (f" [{row['no_reserved']}]" if row.get("no_reserved") else ""))
    return line


def main(argv=None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from validate.run.demo import run_demo

            run_demo(Path(args.out), real=args.real)
            return 0
        return cmd_run(args)
    except MemcalcError as err:
        print(f"validate: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
