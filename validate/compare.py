"""Predicted vs measured: one result row per configuration, JSON lines, resume, markdown table.

A row's `key` is the canonical JSON of the configuration (model spec, training config, HF config
dict if one was given); a run skips configurations whose key is already in the output file.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from memcalc.errors import MemcalcError

DEFAULT_TOLERANCE_PCT = 1.0
MIB = 2**20


@dataclass(frozen=True)
class Case:
    """One configuration to validate."""

    name: str
    spec: object  # memcalc.specs.ModelSpec
    training: object  # memcalc.training.TrainingConfig
    hf_config: dict | None = None

    @property
    def key(self) -> str:
        """Canonical JSON of the configuration (what resume matches on)."""
        return config_key(self.spec, self.training, self.hf_config)


def config_key(spec, training, hf_config: dict | None = None) -> str:
    """Canonical JSON of a configuration: sorted keys, no spaces.

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> k = config_key(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> k.startswith('{"hf_config":null,"model":{"activation":"gelu_new"')
    True
    """
    return json.dumps({"model": spec.model_dump(mode="json"),
                       "training": training.model_dump(mode="json"),
                       "hf_config": hf_config}, sort_keys=True, separators=(",", ":"))


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


def predict(spec, training):
    """(report, None) from memcalc.estimate, or (None, reason) when there is no prediction.

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> report, why = predict(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> why, report.peak_bytes >= 16 * ModelSpec.preset("gpt2").param_count  # fp32 AdamW states
    (None, True)
    """
    import memcalc

    estimate = getattr(memcalc, "estimate", None)
    if estimate is None:
        return None, "memcalc.estimate is not available"
    try:
        return estimate(spec, training), None
    except MemcalcError as err:
        return None, f"memcalc.estimate: {err}"


def _triple(predicted, measured) -> dict:
    return {"predicted": predicted, "measured": measured, "error_pct": error_pct(predicted, measured)}


def result_row(case: Case, report, measurement, why_no_prediction: str | None = None) -> dict:
    """The JSON row for one configuration.

    `measurement` is a validate.measure.Measurement (or any object with the same attributes);
    `report` a memcalc report (peak_bytes, first_step_peak_bytes, phases, components) or None.
    """
    m = measurement
    pred = getattr(report, "peak_bytes", None)
    pred_phases = dict(getattr(report, "phases", None) or {})
    row = {"key": case.key, "name": case.name, "label": label(case),
           "model": case.spec.model_dump(mode="json"),
           "training": case.training.model_dump(mode="json"), "hf_config": case.hf_config,
           "status": m.status, "predicted_peak_bytes": pred, "measured_peak_bytes": m.peak_bytes,
           "error_pct": error_pct(pred, m.peak_bytes),
           "phases": {p: _triple(pred_phases.get(p), m.phases.get(p)) for p in
                      sorted(set(m.phases) | set(pred_phases))},
           "first_step": _triple(getattr(report, "first_step_peak_bytes", None),
                                 m.first_step_peak_bytes),
           "predicted_components": dict(getattr(report, "components", None) or {}),
           "no_prediction": why_no_prediction}
    row.update({k: getattr(m, k) for k in ("backend", "device", "device_name", "torch_version",
                                           "implementation", "sdpa_backend", "param_dtype",
                                           "extra", "wall_s")})
    row["transformers_version"] = _transformers_version()
    return row


def error_row(case: Case, err: Exception, backend: str, wall_s: float) -> dict:
    """A row for a configuration whose measurement raised."""
    return {"key": case.key, "name": case.name, "label": label(case),
            "model": case.spec.model_dump(mode="json"),
            "training": case.training.model_dump(mode="json"), "hf_config": case.hf_config,
            "status": "error", "error": f"{type(err).__name__}: {err}"[:500], "backend": backend,
            "predicted_peak_bytes": None, "measured_peak_bytes": None, "error_pct": None,
            "wall_s": round(wall_s, 3)}


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def label(case: Case) -> str:
    """A short human label for tables.

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> label(Case("x", ModelSpec.preset("gpt2").with_(num_layers=2),
    ...            TrainingConfig(micro_batch=1, seq_len=8)))
    'x: hf gpt2 L2 h768 V50257 | b1 s8 fp32 adamw/foreach ckpt=none sdpa ga1'
    >>> label(Case("y", ModelSpec.preset("qwen2-0.5b").with_(num_layers=2),
    ...            TrainingConfig(micro_batch=1, seq_len=8))).split("|")[0]
    'y: hf qwen2-0.5b L2 h896 V151936 '
    """
    s, t = case.spec, case.training
    ck = t.checkpointing + (f"/{t.checkpoint_every}" if t.checkpoint_every else "")
    return (f"{case.name}: {s.implementation} {s.name} L{s.num_layers} h{s.hidden_size} "
            f"V{s.vocab_size} | b{t.micro_batch} s{t.seq_len} {t.precision} "
            f"{t.optimizer}/{t.resolved_optimizer_impl} ckpt={ck} {t.attention} ga{t.grad_accum}")


# ---- verdicts ----------------------------------------------------------------------------------
def verdict(row: dict, tolerance_pct: float, require_prediction: bool = True) -> str | None:
    """Why a row fails, or None when it passes.

    >>> verdict({"status": "ok", "error_pct": 0.5}, 1.0) is None
    True
    >>> verdict({"status": "ok", "error_pct": -2.0}, 1.0)
    'error -2.00% outside +-1.0%'
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
        return f"error {err:+.2f}% outside +-{tolerance_pct}%"
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


def _mib(x) -> str:
    return "-" if x is None else f"{x / MIB:,.2f}"


def markdown_table(rows: list[dict], tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> str:
    """Markdown table: configuration, predicted, measured (MiB), error, verdict.

    >>> print(markdown_table([{"label": "a", "status": "ok", "predicted_peak_bytes": 2**20,
    ...     "measured_peak_bytes": 2**20, "error_pct": 0.0}]).splitlines()[2])
    | a | 1.00 | 1.00 | +0.00% | ok |
    """
    lines = ["| configuration | predicted (MiB) | measured (MiB) | error | status |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        err = r.get("error_pct")
        bad = verdict(r, tolerance_pct)
        status = r.get("status", "?") if bad is None else f"FAIL: {bad}"
        lines.append(f"| {r.get('label', r.get('name'))} | {_mib(r.get('predicted_peak_bytes'))} | "
                     f"{_mib(r.get('measured_peak_bytes'))} | "
                     f"{'-' if err is None else f'{err:+.2f}%'} | {status} |")
    return "\n".join(lines) + "\n"


def run_cases(cases, out_path, backend: str, progress=None, steps: int = 3,
              with_prediction: bool = True) -> list[dict]:
    """Measure (and predict) each case not yet in `out_path`, appending rows as they finish.

    Returns all rows of the file for the given cases (old and new), in case order.
    """
    from validate.measure import measure

    done = done_keys(out_path)
    for case in cases:
        if progress is not None:
            progress(case)
        if case.key in done:
            continue
        start = time.perf_counter()
        try:
            m = measure(case.spec, case.training, backend, case.hf_config, steps=steps)
        except Exception as err:  # record and go on: one broken config must not stop a matrix
            append_jsonl(out_path, error_row(case, err, backend, time.perf_counter() - start))
            continue
        report, why = None, "skipped"
        if with_prediction:
            try:
                report, why = predict(case.spec, case.training)
            except Exception as err:  # an engine bug: keep it in the row, it fails the verdict
                report, why = None, f"memcalc.estimate raised {type(err).__name__}: {err}"
        append_jsonl(out_path, result_row(case, report, m, why))
    latest = {r["key"]: r for r in read_jsonl(out_path)}
    return [latest[c.key] for c in cases if c.key in latest]
