"""Predicted vs measured: one result row per configuration, verdicts, JSON lines with resume,
markdown tables.

A row's `key` is validate.run.case.Case.key; a run skips configurations whose key is already in the
output file. A distributed row holds every rank's measured peak (`measured_rank_peak_bytes`);
its `measured_peak_bytes` is the largest. A report's `rank_peak_bytes` (one per rank), when
present, is compared rank by rank; otherwise its `peak_bytes` is compared with every rank.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from memcalc.core.errors import MemcalcError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.core.units import MIB
from validate.run.case import Case

DEFAULT_TOLERANCE_PCT = 1.0
PHASES = ("forward", "backward", "optimizer")


def error_pct(predicted, measured) -> float | None:
    """(predicted - measured) / measured * 100, or None when either is missing.

    >>> error_pct(101, 100)
    1.0
    >>> error_pct(None, 100) is None
    True
    """
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured * 100, 4)


def predict(spec: ModelSpec, training: TrainingConfig):
    """(report, None) from memcalc.queries.estimate, or (None, reason) when there is no prediction.

    >>> report, why = predict(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> why, report.peak_bytes >= 16 * ModelSpec.preset("gpt2").param_count  # fp32 AdamW states
    (None, True)
    """
    import memcalc

    try:
        return memcalc.estimate(spec, training), None
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
def result_row(case: Case, report, measured, why_no_prediction: str | None = None) -> dict:
    """The JSON row for one configuration.

    `report`: a memcalc report (peak_bytes, first_step_peak_bytes, phases, components,
    rank_peak_bytes) or None. `measured`: for a single-process case a validate.measure.backends.Measurement
    (or any object with its attributes); for a distributed case the rank dicts of
    validate.distributed.measure.measure_distributed (per-rank results in the row's 'ranks').
    """
    fields = (_rank_fields(case, report, measured) if case.distributed
              else _single_fields(report, measured))
    return {**_config_fields(case), **fields, "no_prediction": why_no_prediction}


def error_row(case: Case, err: Exception, backend: str, wall_s: float) -> dict:
    """A row for a configuration whose measurement raised (a distributed one keeps each rank's
    error, from validate.distributed.launch.RankFailure.errors)."""
    row = {**_config_fields(case), "status": "error", "backend": backend,
           "predicted_peak_bytes": None, "measured_peak_bytes": None, "error_pct": None,
           "wall_s": round(wall_s, 3)}
    if case.distributed:  # room for one error per rank
        row.update(world_size=case.world_size, sharding=case.sharding,
                   error=f"{type(err).__name__}: {err}"[:1500],
                   rank_errors=getattr(err, "errors", None))
    else:
        row["error"] = f"{type(err).__name__}: {err}"[:500]
    return row


def _config_fields(case: Case) -> dict:
    return {"key": case.key, "name": case.name, "label": case.label,
            "model": case.spec.model_dump(mode="json"),
            "training": case.training.model_dump(mode="json"), "hf_config": case.hf_config}


def _triple(predicted, measured) -> dict:
    return {"predicted": predicted, "measured": measured,
            "error_pct": error_pct(predicted, measured)}


def _single_fields(report, m) -> dict:
    """Prediction and measurement of a single-process case."""
    pred = getattr(report, "peak_bytes", None)
    pred_phases = dict(getattr(report, "phases", None) or {})
    row = {"status": m.status, "predicted_peak_bytes": pred, "measured_peak_bytes": m.peak_bytes,
           "error_pct": error_pct(pred, m.peak_bytes),
           "phases": {p: _triple(pred_phases.get(p), m.phases.get(p)) for p in
                      sorted(set(m.phases) | set(pred_phases))},
           "first_step": _triple(getattr(report, "first_step_peak_bytes", None),
                                 m.first_step_peak_bytes),
           "predicted_components": dict(getattr(report, "components", None) or {})}
    row.update({k: getattr(m, k) for k in ("backend", "device", "device_name", "torch_version",
                                           "implementation", "sdpa_backend", "param_dtype",
                                           "extra", "wall_s")})
    row["transformers_version"] = _transformers_version()
    return row


def _rank_fields(case: Case, report, ranks: list[dict]) -> dict:
    """Prediction and per-rank measurements of a distributed case; the worst rank's error."""
    measured = [r["peak_bytes"] for r in ranks]
    predicted = predicted_rank_peaks(report, case.world_size)
    rank_errors = ([error_pct(p, m) for p, m in zip(predicted, measured)]
                   if predicted is not None else None)
    pred_phases = dict(getattr(report, "phases", None) or {})
    return {"world_size": case.world_size, "sharding": case.sharding, "status": "ok",
            "measured_peak_bytes": max(measured), "measured_rank_peak_bytes": measured,
            "measured_first_step_rank_peak_bytes": [r["first_step_peak_bytes"] for r in ranks],
            "predicted_peak_bytes": max(predicted) if predicted else None,
            "predicted_rank_peak_bytes": predicted, "rank_error_pct": rank_errors,
            "error_pct": max(rank_errors, key=abs) if rank_errors else None,
            "phases": {p: {"predicted": pred_phases.get(p),
                           "measured": max(r["phases"].get(p, 0) for r in ranks)} for p in PHASES},
            "backend": ranks[0]["backend"], "implementation": ranks[0]["implementation"],
            "torch_version": ranks[0]["torch_version"],
            "ranks": [{k: v for k, v in r.items() if k != "events"} for r in ranks],
            "wall_s": ranks[0].get("launch_wall_s")}


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def is_distributed_row(row: dict) -> bool:
    """Whether a row comes from a distributed case (it then names its world size).

    >>> is_distributed_row({"world_size": 2}), is_distributed_row({"training": {"world_size": 1}})
    (True, False)
    """
    return "world_size" in row


# ---- verdicts ----------------------------------------------------------------------------------
def verdict(row: dict, tolerance_pct: float, require_prediction: bool = True) -> str | None:
    """Why a row fails, or None when it passes.

    >>> verdict({"status": "ok", "error_pct": 0.5}, 1.0) is None
    True
    >>> verdict({"status": "ok", "error_pct": -0.0712}, 0.05)
    'error -0.0712% outside +-0.05%'
    """
    status = row.get("status")
    if status == "error":
        return row.get("error", "error")
    if status == "oom":
        pred, total = row.get("predicted_peak_bytes"), (row.get("extra") or {}).get("total_bytes")
        if pred is not None and total is not None and pred < total:
            return f"OOM although predicted {pred / MIB:.0f} MiB < {total / MIB:.0f} MiB"
        return None
    err = row.get("error_pct")
    if err is None:
        return ("no prediction: " + str(row.get("no_prediction"))) if require_prediction else None
    if abs(err) > tolerance_pct:
        return f"error {err:+.4f}% outside +-{tolerance_pct:g}%"
    return None


# ---- files -------------------------------------------------------------------------------------
def append_jsonl(path, row: dict) -> None:
    """Append one row and flush it to disk (a crash loses at most the running configuration)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as f:
        # after a crash mid-write, start a fresh line so the torn one stays the only bad line
        f.write(("\n" if torn else "") + json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list[dict]:
    """All complete rows of a results file (a torn last line is ignored).

    >>> read_jsonl("/nonexistent.jsonl")
    []
    """
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows.append(row)
    return rows


def done_keys(path) -> set[str]:
    """Keys of configurations already in the results file (errors are retried)."""
    return {r["key"] for r in read_jsonl(path) if r.get("status") != "error"}


# ---- markdown ----------------------------------------------------------------------------------
def mib(x, digits: int = 2) -> str:
    """Bytes as MiB with thousands separators, '-' for None.

    >>> mib(3 * 2**20), mib(2**19, 3), mib(None)
    ('3.00', '0.500', '-')
    """
    return "-" if x is None else f"{x / MIB:,.{digits}f}"


def markdown_table(rows: list[dict], tolerance_pct: float | Mapping[str, float] = DEFAULT_TOLERANCE_PCT) -> str:
    """Markdown table: configuration, predicted and measured (MiB), error, verdict; for
    distributed rows the measured peak of each rank (one number when all ranks agree) and no
    verdict on a missing prediction. `tolerance_pct`: one for every row, or each row's by its key.

    >>> print(markdown_table([{"label": "a", "status": "ok", "predicted_peak_bytes": 2**20,
    ...     "measured_peak_bytes": 2**20, "error_pct": 0.0}]).splitlines()[2])
    | a | 1.00 | 1.00 | +0.0000% | ok |
    >>> print(markdown_table([{"label": "b", "status": "ok", "world_size": 2, "error_pct": None,
    ...     "measured_rank_peak_bytes": [2**20, 2**21]}]).splitlines()[2])
    | b | 1.000 / 2.000 | - | - | ok |
    """
    distributed = any(is_distributed_row(r) for r in rows)
    if distributed:
        lines = ["| configuration | measured per rank (MiB) | predicted (MiB) | error | status |",
                 "|---|---|---|---:|---|"]
    else:
        lines = ["| configuration | predicted (MiB) | measured (MiB) | error | status |",
                 "|---|---:|---:|---:|---|"]
    for r in rows:
        err = r.get("error_pct")
        tolerance = tolerance_pct[r["key"]] if isinstance(tolerance_pct, Mapping) else tolerance_pct
        bad = verdict(r, tolerance, require_prediction=not distributed)
        status = r.get("status", "?") if bad is None else f"FAIL: {bad}"
        if distributed:
            peaks = [_rank_peaks(r), mib(r.get("predicted_peak_bytes"), 3)]
        else:
            peaks = [mib(r.get("predicted_peak_bytes")), mib(r.get("measured_peak_bytes"))]
        cells = [r.get("label", r.get("name")), *peaks,
                 "-" if err is None else f"{err:+.4f}%", status]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _rank_peaks(row: dict) -> str:
    """Each rank's measured peak in MiB, or one number when all ranks agree."""
    measured = row.get("measured_rank_peak_bytes") or []
    if len(set(measured)) > 1:
        return " / ".join(mib(x, 3) for x in measured)
    return mib(measured[0] if measured else None, 3)


__all__ = ["error_pct", "predict", "predicted_rank_peaks", "result_row", "error_row",
           "is_distributed_row", "verdict", "append_jsonl", "read_jsonl", "done_keys", "mib",
           "markdown_table", "MIB", "DEFAULT_TOLERANCE_PCT"]
