"""SDPA's math kernel (CPU, attention dropout) with a materialised bool mask: the converted
float mask is scaled_dot_product_attention's local until the composite returns, alive at the
dropout (memcalc.families.attention.sdpa_masked). Checked against the recorded live-tensor
measurements of the two ci rows whose forward phase peaks there (sliding windows reached:
Qwen2 per-layer and Gemma-3 sqrt, fp32), every phase within 16 bytes (the loss's seed: 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import memcalc
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.configs import assert_matches_recorded

RESULTS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-families.jsonl"


def _rows() -> list[dict]:
    rows = {}
    for line in RESULTS.read_text().splitlines():
        row = json.loads(line)
        rows[row["name"]] = row  # the last row of a name counts (a resumed run appends)
    return [rows[name] for name in ("fam11", "fam18")]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["name"])
def test_masked_math_rows_phase_by_phase(row):
    key = json.loads(row["key"])
    report = memcalc.estimate(ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"]))
    assert_matches_recorded(report, row, 1e-5, phase_bytes=16)
