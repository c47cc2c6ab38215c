"""Distributed cases: the dist-ci matrix, per-rank result rows, predictions, and the CLI path.

    python -m validate run --matrix dist-ci --device cpu --no-predict
    python -m validate run --model gpt2 --num-layers 2 --micro-batch 2 --seq-len 64 \\
        --device cpu --world-size 2 --sharding zero3 --no-predict

A row holds every rank's measured peak (`measured_rank_peak_bytes`); `measured_peak_bytes` is the
largest. Predictions come from an engine function when one is given (`engine(spec, training,
world_size, sharding) -> report`), else from memcalc.estimate once memcalc.TrainingConfig has
`world_size` and `sharding` fields; until then predicted fields are null with the reason in
`no_prediction`. A report's `rank_peak_bytes` (list, one per rank), when present, is compared rank
by rank; otherwise its `peak_bytes` is compared with every rank.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from memcalc.errors import MemcalcError, UnknownNameError, closest_names
from memcalc.specs import ModelSpec
from memcalc.training import TrainingConfig
from validate.compare import (MIB, append_jsonl, config_key, done_keys, error_pct, read_jsonl,
                              verdict)
from validate.distributed import SHARDINGS, measure_distributed, resolve_parallelism

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class DistCase:
    """One configuration run on `world_size` ranks with a sharding."""

    name: str
    spec: object  # memcalc.specs.ModelSpec
    training: object  # memcalc.training.TrainingConfig
    world_size: int
    sharding: str
    hf_config: dict | None = None

    @property
    def key(self) -> str:
        """Canonical JSON of the configuration, parallelism included (what resume matches on)."""
        base = json.loads(config_key(self.spec, self.training, self.hf_config))
        base["parallel"] = {"world_size": self.world_size, "sharding": self.sharding}
        return json.dumps(base, sort_keys=True, separators=(",", ":"))

    @property
    def label(self) -> str:
        """A short human label for tables."""
        s, t = self.spec, self.training
        return (f"{self.name}: {s.implementation} {s.family} L{s.num_layers} h{s.hidden_size} "
                f"V{s.vocab_size} | b{t.micro_batch} s{t.seq_len} {t.precision} {t.optimizer} "
                f"| W{self.world_size} {self.sharding}"
                + (f" TP{t.tensor_parallel}" if getattr(t, "tensor_parallel", 1) > 1 else "")
                + ("+SP" if getattr(t, "sequence_parallel", False) else ""))


# ---- the dist-ci matrix ------------------------------------------------------------------------
# The shape the brief asks for: h=128, L=3, V=1000, b=2, s=64. Padding rows use sizes that 4 does
# not divide (V=1001, f=346), so FSDP2 pads dim 0 and ranks differ.
DIST_SHAPE = dict(h=128, L=3, V=1000, a=4, kv=2, f=344, b=2, s=64)


def dist_model(kind: str, V: int = 1000, f: int = 344) -> ModelSpec:
    """gpt2-ref, llama-ref, gpt2-hf or llama-hf at the dist-ci shape.

    >>> dist_model("llama-ref").param_count
    800640
    """
    sh = DIST_SHAPE
    impl = "hf" if kind.endswith("-hf") else "reference"
    if kind.startswith("gpt2"):
        return ModelSpec.make(name=f"gpt2-{impl}", family="gpt2", vocab_size=V, hidden_size=sh["h"],
                              num_layers=sh["L"], num_heads=sh["a"], max_position_embeddings=256,
                              implementation=impl)
    return ModelSpec.make(name=f"llama-{impl}", family="llama", vocab_size=V, hidden_size=sh["h"],
                          num_layers=sh["L"], num_heads=sh["a"], num_kv_heads=sh["kv"],
                          intermediate_size=f, max_position_embeddings=256, tie_embeddings=False,
                          qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
                          implementation=impl)


def dist_ci_matrix(device: str = "cpu") -> list[DistCase]:
    """World sizes 2 and 4 x each sharding x (gpt2-ref, llama-ref, llama-hf), fp32 AdamW, plus
    two padding rows (llama-ref with V=1001, f=346 at W=4, zero2 and zero3), two FSDP2 rows with
    gradient accumulation, three with FSDP2's MixedPrecisionPolicy, then the tensor-parallel rows
    (tensor_parallel_cases).

    >>> cases = dist_ci_matrix(); len(cases), cases[0].label
    (53, 'gpt2-ref-W2-none: reference gpt2 L3 h128 V1000 | b2 s64 fp32 adamw | W2 none')
    """
    training = TrainingConfig.make(micro_batch=DIST_SHAPE["b"], seq_len=DIST_SHAPE["s"],
                                   device=device)
    cases = [_case(f"{kind}-W{ws}-{sharding}", dist_model(kind), training, ws, sharding)
             for kind in ("gpt2-ref", "llama-ref", "llama-hf") for ws in (2, 4)
             for sharding in SHARDINGS]
    padded = dist_model("llama-ref", V=1001, f=346)
    cases += [_case(f"llama-ref-pad-W4-{sh}", padded, training, 4, sh) for sh in ("zero2", "zero3")]
    # gradient accumulation under FSDP2: later micro-steps add the reduce-scatter output into the
    # sharded .grad in place
    cases += [_case("llama-ref-pad-W4-zero3-ga2-bf16-amp-per-layer", padded,
                    training.with_(grad_accum=2, precision="bf16-amp", checkpointing="per-layer"),
                    4, "zero3"),
              _case("gpt2-ref-W2-zero2-ga3", dist_model("gpt2-ref"), training.with_(grad_accum=3),
                    2, "zero2")]
    # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    mixed = training.with_(sharding="zero3", fsdp_mixed_precision=True)
    cases += [_case("llama-ref-W2-zero3-mp", dist_model("llama-ref"), mixed, 2, "zero3"),
              _case("gpt2-ref-W4-zero2-mp-per-layer", dist_model("gpt2-ref"),
                    mixed.with_(checkpointing="per-layer"), 4, "zero2"),
              _case("llama-ref-pad-W4-zero3-mp-ga2", padded, mixed.with_(grad_accum=2), 4, "zero3")]
    return cases + tensor_parallel_cases(training)


# Tensor-parallel rows: (model, degree, TrainingConfig changes). Llama gets 8 query and 4 kv heads
# so that 2 and 4 both divide them; every precision, checkpointing mode, attention kind and
# optimizer implementation appears at least once.
TP_ROWS = (
    ("gpt2-ref", 2, {}),
    ("gpt2-ref", 4, dict(precision="bf16-amp", checkpointing="per-layer", optimizer_impl="foreach")),
    ("gpt2-ref-drop", 2, dict(precision="fp16-amp", attention="eager", optimizer="sgd-momentum")),
    ("gpt2-ref-untied", 4, dict(precision="bf16", checkpointing="selective", optimizer="adam",
                                optimizer_impl="fused")),
    ("llama-ref", 2, {}),
    ("llama-ref", 4, dict(precision="bf16-amp", checkpointing="per-layer")),
    ("llama-ref", 2, dict(precision="fp16-amp", grad_accum=2, optimizer_impl="foreach")),
    ("llama-ref", 4, dict(checkpointing="sqrt", attention="eager")),
    ("llama-hf", 2, {}),
    ("llama-hf", 4, dict(precision="bf16-amp", checkpointing="selective", optimizer_impl="foreach")),
    ("llama-hf", 2, dict(precision="bf16", checkpointing="per-layer", optimizer="sgd-momentum",
                         optimizer_impl="foreach")),
    ("llama-hf", 4, dict(precision="fp16-amp", attention="eager", grad_accum=2)),
    # sequence parallelism (reference models)
    ("gpt2-ref", 2, dict(sequence_parallel=True)),
    ("gpt2-ref-drop", 4, dict(sequence_parallel=True, precision="bf16-amp", attention="eager",
                              checkpointing="per-layer")),
    ("llama-ref", 2, dict(sequence_parallel=True, precision="bf16", checkpointing="selective",
                          optimizer_impl="foreach")),
    ("llama-ref", 4, dict(sequence_parallel=True, precision="fp16-amp", grad_accum=2)),
)


def tp_model(kind: str) -> ModelSpec:
    """The dist-ci shape for tensor parallelism (llama: 8 heads, 4 kv heads; gpt2 variants with
    dropout or untied embeddings).

    >>> tp_model("llama-ref").num_kv_heads, tp_model("gpt2-ref-drop").attn_dropout
    (4, 0.1)
    """
    base = kind.split("-drop")[0].split("-untied")[0].split("-pad")[0]
    spec = dist_model(base, f=346) if kind.endswith("-pad") else dist_model(base)
    if spec.family == "llama":
        spec = spec.with_(num_heads=8, num_kv_heads=4)
    if kind.endswith("-drop"):
        spec = spec.with_(attn_dropout=0.1, resid_dropout=0.1, embd_dropout=0.1)
    if kind.endswith("-untied"):
        spec = spec.with_(tie_embeddings=False)
    return spec


# 2-D rows: (model, tensor_parallel, world_size, sharding, changes): a (dp, tp) mesh, tensor
# parallelism inside each row, FSDP2 across them. The padded Llama (f=346: 173 rows per TP rank,
# odd) makes FSDP pad, so DP ranks differ.
TP2D_ROWS = (
    ("llama-ref-pad", 2, 4, "zero3", {}),
    ("gpt2-ref", 2, 4, "zero2", dict(precision="bf16-amp", checkpointing="per-layer")),
    ("llama-ref", 2, 4, "zero3", dict(sequence_parallel=True, precision="bf16",
                                      optimizer_impl="foreach")),
    ("llama-hf", 2, 4, "zero3", dict(precision="bf16-amp", checkpointing="selective")),
    ("gpt2-ref", 2, 4, "zero2", dict(grad_accum=2)),
    ("llama-hf", 2, 4, "zero3", dict(fsdp_mixed_precision=True, optimizer_impl="foreach")),
)


def tensor_parallel_cases(training) -> list[DistCase]:
    """TP_ROWS as cases (world_size == tensor_parallel, sharding none), then TP2D_ROWS."""
    rows = [(kind, tp, tp, "none", changes) for kind, tp, changes in TP_ROWS] + list(TP2D_ROWS)
    cases = []
    for kind, tp, world, sharding, changes in rows:
        t = training.with_(world_size=world, tensor_parallel=tp, sharding=sharding, **changes)
        suffix = "-".join("mp" if k == "fsdp_mixed_precision" else "SP" if v is True
                          else f"ga{v}" if k == "grad_accum" else str(v) for k, v in changes.items())
        name = f"{kind}-TP{tp}" + (f"-W{world}-{sharding}" if world > tp else "")
        cases.append(DistCase(name + (f"-{suffix}" if suffix else ""), tp_model(kind), t, world,
                              sharding))
    return cases


def _case(name, spec, training, world_size: int, sharding: str) -> DistCase:
    if engine_supports_parallelism():  # the config then says it all (and keys carry it twice)
        training = training.with_(world_size=world_size, sharding=sharding)
    return DistCase(name, spec, training, world_size, sharding)


DIST_MATRICES = {"dist-ci": dist_ci_matrix}


def get_dist_matrix(name: str, device: str | None = None) -> list[DistCase]:
    """A named distributed matrix.

    >>> len(get_dist_matrix("dist-ci")) > 20
    True
    """
    if name not in DIST_MATRICES:
        raise UnknownNameError("matrix", f"unknown matrix {name!r}",
                               f"use one of: {closest_names(name, list(DIST_MATRICES))}")
    return DIST_MATRICES[name](device or "cpu")


# ---- predictions -------------------------------------------------------------------------------
def engine_supports_parallelism() -> bool:
    """Whether memcalc.TrainingConfig has world_size and sharding fields (the engine's side)."""
    return {"world_size", "sharding"} <= set(TrainingConfig.model_fields)


def predict_distributed(case: DistCase, engine=None):
    """(report, None) or (None, reason). `engine(spec, training, world_size, sharding)` wins;
    otherwise memcalc.estimate on a TrainingConfig that carries world_size and sharding.

    >>> case = dist_ci_matrix()[0]
    >>> predict_distributed(case, engine=lambda *a: "report")
    ('report', None)
    """
    try:
        if engine is not None:
            return engine(case.spec, case.training, case.world_size, case.sharding), None
        if not engine_supports_parallelism():
            return None, "memcalc.TrainingConfig has no world_size/sharding fields yet"
        import memcalc

        training = case.training.with_(world_size=case.world_size, sharding=case.sharding)
        return memcalc.estimate(case.spec, training), None
    except MemcalcError as err:
        return None, f"memcalc.estimate: {err}"


def predicted_rank_peaks(report, world_size: int) -> list[int] | None:
    """Per-rank predicted peaks: report.rank_peak_bytes if given, else peak_bytes for each rank.

    >>> class R: peak_bytes = 5
    >>> predicted_rank_peaks(R(), 2)
    [5, 5]
    """
    if report is None:
        return None
    ranks = getattr(report, "rank_peak_bytes", None)
    if ranks is not None:
        return [int(x) for x in ranks]
    peak = getattr(report, "peak_bytes", None)
    return None if peak is None else [int(peak)] * world_size


# ---- rows --------------------------------------------------------------------------------------
def dist_row(case: DistCase, ranks: list[dict], report, why: str | None) -> dict:
    """The JSON row for one distributed configuration (per-rank results in 'ranks')."""
    measured = [r["peak_bytes"] for r in ranks]
    predicted = predicted_rank_peaks(report, case.world_size)
    rank_errors = ([error_pct(p, m) for p, m in zip(predicted, measured)]
                   if predicted is not None else None)
    worst = max(rank_errors, key=abs) if rank_errors else None
    pred_phases = dict(getattr(report, "phases", None) or {})
    return {"key": case.key, "name": case.name, "label": case.label,
            "model": case.spec.model_dump(mode="json"),
            "training": case.training.model_dump(mode="json"), "hf_config": case.hf_config,
            "world_size": case.world_size, "sharding": case.sharding, "status": "ok",
            "measured_peak_bytes": max(measured), "measured_rank_peak_bytes": measured,
            "measured_first_step_rank_peak_bytes": [r["first_step_peak_bytes"] for r in ranks],
            "predicted_peak_bytes": max(predicted) if predicted else None,
            "predicted_rank_peak_bytes": predicted, "rank_error_pct": rank_errors,
            "error_pct": worst,
            "phases": {p: {"predicted": pred_phases.get(p),
                           "measured": max(r["phases"].get(p, 0) for r in ranks)} for p in PHASES},
            "no_prediction": why, "backend": "cpu-gloo",
            "implementation": ranks[0]["implementation"],
            "torch_version": ranks[0]["torch_version"],
            "ranks": [{k: v for k, v in r.items() if k != "events"} for r in ranks],
            "wall_s": ranks[0].get("launch_wall_s")}


def dist_error_row(case: DistCase, err: Exception, wall_s: float) -> dict:
    """A row for a configuration whose run failed (rank errors kept)."""
    return {"key": case.key, "name": case.name, "label": case.label,
            "model": case.spec.model_dump(mode="json"),
            "training": case.training.model_dump(mode="json"), "hf_config": case.hf_config,
            "world_size": case.world_size, "sharding": case.sharding, "status": "error",
            "error": f"{type(err).__name__}: {err}"[:1500],
            "rank_errors": getattr(err, "errors", None), "backend": "cpu-gloo",
            "predicted_peak_bytes": None, "measured_peak_bytes": None, "error_pct": None,
            "wall_s": round(wall_s, 3)}


def run_dist_cases(cases, out_path, progress=None, steps: int = 3, with_prediction: bool = True,
                   engine=None) -> list[dict]:
    """Measure (and predict) each case not yet in `out_path`, appending rows as they finish."""
    done = done_keys(out_path)
    for case in cases:
        if progress is not None:
            progress(case)
        if case.key in done:
            continue
        start = time.perf_counter()
        try:
            ranks = measure_distributed(case.spec, case.training, case.world_size, case.sharding,
                                        steps=steps, hf_config=case.hf_config)
        except Exception as err:  # RankFailure or bad input: record it, go on with the matrix
            append_jsonl(out_path, dist_error_row(case, err, time.perf_counter() - start))
            continue
        report, why = (predict_distributed(case, engine) if with_prediction else (None, "skipped"))
        append_jsonl(out_path, dist_row(case, ranks, report, why))
    latest = {r["key"]: r for r in read_jsonl(out_path)}
    return [latest[c.key] for c in cases if c.key in latest]


def _mib(x) -> str:
    return "-" if x is None else f"{x / MIB:,.3f}"


def dist_markdown(rows: list[dict], tolerance_pct: float) -> str:
    """Markdown table: configuration, per-rank measured and predicted peaks (MiB), error."""
    lines = ["| configuration | measured per rank (MiB) | predicted (MiB) | error | status |",
             "|---|---|---|---:|---|"]
    for r in rows:
        measured = r.get("measured_rank_peak_bytes") or []
        ranks = " / ".join(_mib(x) for x in measured) if len(set(measured)) > 1 else _mib(
            measured[0] if measured else None)
        err = r.get("error_pct")
        bad = verdict(r, tolerance_pct, require_prediction=False)
        status = r.get("status") if bad is None else f"FAIL: {bad}"
        lines.append(f"| {r.get('label')} | {ranks} | {_mib(r.get('predicted_peak_bytes'))} | "
                     f"{'-' if err is None else f'{err:+.2f}%'} | {status} |")
    return "\n".join(lines) + "\n"


# ---- CLI ---------------------------------------------------------------------------------------
def wants_distributed(args) -> bool:
    """True for --matrix dist-*, or --world-size/--sharding given (flags or TrainingConfig
    fields)."""
    if args.matrix:
        return args.matrix.startswith("dist-")
    return any(getattr(args, name, None) is not None for name in ("world_size", "sharding"))


def cmd_run_distributed(args) -> int:
    """`validate run` for distributed cases; same exit codes as validate.cli.cmd_run."""
    import sys

    from validate.cli import EXIT_OUT_OF_TOLERANCE, _exclusive, _progress, single_case

    if args.steps < 2:
        raise MemcalcError("steps", f"need >= 2, got {args.steps}", "pass --steps 3")
    if args.matrix:
        cases = get_dist_matrix(args.matrix, args.device)
        if args.only:
            import re

            cases = [c for c in cases if re.search(args.only, c.label)]
        cases = cases[: args.limit] if args.limit is not None else cases
    else:
        case = single_case(args)
        ws, sh = resolve_parallelism(case.training, args.world_size, args.sharding)
        cases = [DistCase(case.name, case.spec, case.training, ws, sh, case.hf_config)]
    out = Path(args.out) if args.out else (Path("validate/results") / f"{args.matrix}.jsonl"
                                           if args.matrix else None)
    import tempfile

    target = out or Path(tempfile.mkdtemp(prefix="validate-dist-")) / "run.jsonl"
    step, close = _progress(len(cases)) if args.matrix else (None, lambda: None)
    with _exclusive(target):
        rows = run_dist_cases(cases, target, progress=step, steps=args.steps,
                              with_prediction=not args.no_predict)
    close()
    if out is not None:
        head = (f"# validate: {args.matrix or args.model or args.hf_config} (distributed, gloo on "
                f"CPU)\n\n{len(rows)} configurations, steady-state peak per rank (steps >= 2), "
                f"MiB; one number when all ranks agree.\n\n")
        out.with_suffix(".md").write_text(head + dist_markdown(rows, args.tolerance))
    failures = [(r, verdict(r, args.tolerance, not args.no_predict)) for r in rows]
    failures = [(r, why) for r, why in failures if why]
    for row in rows:
        if args.json:
            print(json.dumps(row, sort_keys=True), flush=True)
        else:
            ranks = ", ".join(_mib(x) for x in row.get("measured_rank_peak_bytes") or [])
            print(f"{row['label']}: ranks [{ranks}] MiB, predicted "
                  f"{_mib(row.get('predicted_peak_bytes'))}, {row['status']}"
                  + (f", {row.get('error')}" if row.get("error") else ""), flush=True)
    if failures:
        print(f"validate: {len(failures)} of {len(rows)} configurations failed: "
              + "; ".join(f"{r['name']}: {w}" for r, w in failures[:5]), file=sys.stderr)
        return EXIT_OUT_OF_TOLERANCE
    return 0


__all__ = ["DistCase", "dist_ci_matrix", "get_dist_matrix", "predict_distributed",
           "run_dist_cases", "dist_row", "cmd_run_distributed", "wants_distributed",
           "engine_supports_parallelism"]
