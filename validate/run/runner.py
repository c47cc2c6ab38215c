"""Run cases: measure each (in this process, or on gloo ranks when its TrainingConfig says
world_size > 1 or a sharding), predict it with memcalc, append its row to a JSON lines file.

torch is imported only when a case is measured, so building and checking cases needs none.
"""
from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable

from validate.run.case import Case
from validate.run.compare import append_jsonl, done_keys, error_row, predict, read_jsonl, result_row
from validate.distributed.job import BACKEND as DIST_BACKEND  # a distributed case's, whatever --backend


def run_cases(cases: list[Case], out_path: str | Path, backend: str = "cpu",
              progress: Callable[[Case], None] | None = None, steps: int = 3,
              with_prediction: bool = True, reserved: bool = False,
              sequences: str | Path | None = None) -> list[dict]:
    """Measure (and predict) each case not yet in `out_path`, appending rows as they finish.
    With `reserved`, each row also compares the reserved peaks of its recorded allocation
    sequence and the engine's (validate.run.reserved); with `sequences` too, each recorded sequence
    is kept in that folder (validate.measure.sequence.save_run) for validate.run.recompare.

    Returns all rows of the file for the given cases (old and new), in case order.
    """
    done = done_keys(out_path)
    for case in cases:
        if progress is not None:
            progress(case)
        if case.key not in done:
            append_jsonl(out_path, run_case(case, backend, steps, with_prediction, reserved,
                                                  sequences))
    latest = {r["key"]: r for r in read_jsonl(out_path)}
    return [latest[c.key] for c in cases if c.key in latest]


def run_case(case: Case, backend: str = "cpu", steps: int = 3,
             with_prediction: bool = True, reserved: bool = False,
             sequences: str | Path | None = None) -> dict:
    """One case's row: measured, then predicted; an error row when the measurement raised.
    With `reserved`, measured with its allocation sequence recorded (validate.measure.allocations)
    and the reserved comparison added (validate.run.reserved)."""
    backend = DIST_BACKEND if case.distributed else backend
    start = time.perf_counter()
    recorded, no_record = None, _no_record(case, backend) if reserved else None
    try:
        if reserved and no_record is None:
            from validate.measure.allocations import measure_recorded

            recorded = measure_recorded(case.spec, case.training, case.hf_config, steps)
            measured = recorded.measurement
            if sequences is not None:
                from validate.measure.sequence import save_run

                save_run(sequences, case.key, recorded.events, recorded.marks, recorded.ops)
        else:
            measured = _measure(case, backend, steps)
    except Exception as err:  # record and go on: one broken config must not stop a matrix
        return error_row(case, err, backend, time.perf_counter() - start)
    predicting = time.perf_counter()
    report, why = _predict(case, measured, steps) if with_prediction else (None, "skipped")
    row = result_row(case, report, measured, why)
    if case.trl is not None and case.trl["kind"] == "grpo" and with_prediction:
        row["grpo_phases"] = grpo_phases(case, measured)
    if case.traced is not None:  # the prediction traces (memcalc.traced), unless its cache holds it
        row["predict_s"] = round(time.perf_counter() - predicting, 3)
    if recorded is not None:
        row.update(_reserved(case, recorded, steps))
    elif reserved:
        row["no_reserved"] = no_record
    return row


def _no_record(case: Case, backend: str) -> str | None:
    """Why a case's allocation sequence is not recorded (None: it is)."""
    if case.distributed:
        return "a distributed case: the sequence is recorded for single-process runs"
    if case.trainer_args is not None:
        return "runs through transformers.Trainer: its sequence is not recorded"
    if backend != "cpu":
        return f"backend {backend!r}: the sequence is recorded by the cpu backend's tracker"
    return None


def _reserved(case: Case, recorded, steps: int) -> dict:
    """validate.run.reserved's fields, or the reason they are missing (an engine or replay crash)."""
    from validate.run.reserved import reserved_fields

    try:
        return reserved_fields(recorded.events, recorded.marks, case.spec, case.training, steps,
                               ops=recorded.ops)
    except Exception as err:  # kept in the row: the measurement stands
        return {"no_reserved": f"{type(err).__name__}: {err}"[:500]}


def _measure(case: Case, backend: str, steps: int):
    """A Measurement (single process) or the rank dicts (distributed)."""
    if case.distributed:
        from validate.distributed.measure import measure_distributed

        return measure_distributed(case.spec, case.training, case.world_size, case.sharding,
                                   steps=steps, hf_config=case.hf_config)
    if case.traced is not None:  # a traced model's own step, with real tensors
        from memcalc.traced.spec import TRACED
        from validate.measure.module import measure_module

        model = TRACED[case.spec.trace_key]
        return measure_module(model.factory, model.inputs, model.loss, case.training, steps)
    if case.trl is not None:  # through trl.DPOTrainer or trl.SFTTrainer
        from validate.run import trl_run

        measure_trl = {"dpo": trl_run.measure_dpo, "sft": trl_run.measure_sft,
                       "grpo": trl_run.measure_grpo}[case.trl["kind"]]
        extra = {"example_len": case.trl["example_len"]} if "example_len" in case.trl else {}
        return measure_trl(case.spec, case.training, case.trainer_args, case.trl["prompt_len"],
                           case.hf_config, steps, **extra)
    if case.trainer_args is not None:  # through transformers.Trainer
        from validate.run.trainer_run import measure_trainer

        return measure_trainer(case.spec, case.training, case.trainer_args, case.hf_config, steps)
    from validate.measure.backends import measure

    return measure(case.spec, case.training, backend, case.hf_config, steps=steps)


def _predict(case: Case, measured=None, steps: int = 3):
    """predict(), with an engine crash kept in the row (it then fails the verdict). A MoE case
    measured in this process is predicted with the routing it measured (validate.models.moe_routing)."""
    passes = getattr(measured, "extra", {}).get("routing_passes") if not case.distributed else None
    try:
        if passes:
            from validate.models.moe_routing import predict_routed

            report, extra = predict_routed(case.spec, case.training, passes, steps)
            measured.extra.pop("routing_passes")
            measured.extra["moe"] = extra
            return report, None
        return predict(case.spec, case.training)
    except Exception as err:
        return None, f"memcalc.estimate raised {type(err).__name__}: {err}"


def grpo_phases(case: Case, measured) -> dict:
    """A GRPO row's phases besides the step, measured and predicted (the forward phase of
    memcalc.families.trl_grpo's scoring and generation programs: their ops run under no_grad)."""
    from memcalc import estimate

    out = {}
    t = case.training
    configs = {"scoring": t.with_(trl_phase="scoring"),
               "generation": t.with_(trl_phase="generation", seq_len=t.seq_len - t.grpo_completion_len)}
    for phase, config in configs.items():
        value = measured.phases.get(phase)
        predicted = estimate(case.spec, config).phases["forward"]
        out[phase] = {"measured": value, "predicted": predicted,
                      "error_pct": round(100 * (predicted - value) / value, 6)}
    return out


__all__ = ["run_cases", "run_case"]
