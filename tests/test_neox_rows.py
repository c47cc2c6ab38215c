"""The `neox` rows (validate/matrices/neox.py): checkpointed layers under autocast that run SDPA's CPU
math kernel, measured by the live-tensor tracker (validate/results/cpu-ci-neox.jsonl); the
engine re-predicts each within 0.01% (a second method: the recorded measurement)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import memcalc
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

ROWS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-neox.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["name"])
def test_neox_row_within_a_hundredth_of_a_percent(row):
    key = json.loads(row["key"])
    report = memcalc.estimate(ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"]))
    measured = row["measured_peak_bytes"]
    assert abs(report.peak_bytes - measured) / measured < 1e-4, (report.peak_bytes, measured)
    for phase, got in row["phases"].items():  # every phase too, forward's inside the math kernel
        assert abs(report.phases[phase] - got["measured"]) / got["measured"] < 2e-4, phase


def test_the_rows_are_the_ci_matrix_rows():
    from validate.matrices.neox import ci_neox_cases

    assert [r["name"] for r in _rows()] == [c.name for c in ci_neox_cases()]
