"""The `sweep3` rows (validate/matrices/sweep3.py): three fresh-sweep cases and their neighbours (SDPA
math with grouped-query attention, Qwen2-MoE's masks and shared-expert gate, eager experts' routing
product), measured by the live-tensor tracker (validate/results/cpu-ci-sweep3.jsonl); the engine
re-predicts each peak within 0.03% and each phase within 0.03% or 160 B (the residual tens of bytes
every row shows)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import memcalc
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.configs import assert_matches_recorded

ROWS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-sweep3.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["name"])
def test_sweep3_row_within_three_hundredths_of_a_percent(row):
    key = json.loads(row["key"])
    report = memcalc.estimate(ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"]))
    assert_matches_recorded(report, row, 3e-4)


def test_the_rows_are_the_ci_matrix_rows():
    from validate.matrices.sweep3 import ci_sweep3_cases

    assert [r["name"] for r in _rows()] == [c.name for c in ci_sweep3_cases()]


def test_mixtral_refuses_unnormalised_top_k():
    """MixtralTopKRouter renormalises its top-k weights whatever the config, so a spec saying it
    does not is refused (it would describe a model the HF class never builds)."""
    base = ModelSpec.make(**json.loads(_rows()[2]["key"])["model"])
    with pytest.raises(ValueError, match="norm_topk_prob"):
        base.with_(moe=base.moe.model_copy(update={"norm_topk_prob": False}))
