"""Constant buffers and the checkpointed bias gradient against recorded measurements (a second
method: the live-tensor tracker's peaks in validate/results/, re-predicted by this engine).

- Tiny one-layer s = 1 steps of the seed-7 fresh sweep, where the rotary inv_freq and
  original_inv_freq buffers (36-40 B) are a visible share of the step.
- Checkpointed linears with a bias (GPT-NeoX, reference GPT-2): the bias's gradient
  (validate_outputs' sum_to) is made after the recomputed saved tensors are freed
  (memcalc.tape.graph.Returns before it in Ops.linear); made before the frees it would put
  these rows 60-384 B over.

Each row is short by no more than the bytes memcalc knowingly leaves out
(validate.matrices.tolerances.UNMODELLED_BYTES); exactness is an xfail while those are open.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import memcalc
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.matrices.tolerances import LOSS_SEED_BYTES, UNMODELLED_BYTES

RESULTS = Path(__file__).resolve().parents[1] / "validate" / "results"


def _row(file: str, name: str) -> dict:
    for line in (RESULTS / file).read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("name") == name:
            return row
    raise KeyError(name)


def _shortfall(row: dict) -> int:
    key = json.loads(row["key"])
    report = memcalc.estimate(ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"]))
    return row["measured_peak_bytes"] - report.peak_bytes


TINY = [("fresh-sweep-seed7.jsonl", name) for name in ("fresh7-011", "fresh7-019", "fresh7-028")]
BIASED = [("cpu-ci.jsonl", name) for name in ("cifb04-gpt_neox", "cifb05-gpt_neox", "head06", "ci17", "ci61")]
"""The tiny steps and the checkpointed linears with a bias, above."""


@pytest.mark.parametrize("file,name", TINY + BIASED)
def test_short_by_no_more_than_the_unmodelled_bytes(file, name):
    """Under-predicted by at most what memcalc knowingly leaves out (tolerances.UNMODELLED_BYTES:
    the loss's 4-byte seed, 12 B more on some autocast rows), never over-predicted."""
    assert 0 <= _shortfall(_row(file, name)) <= UNMODELLED_BYTES


@pytest.mark.parametrize("file,name", TINY + BIASED)
def test_exact(file, name):
    shortfall = _shortfall(_row(file, name))
    if shortfall:
        open_ = "" if shortfall <= LOSS_SEED_BYTES else ", and bytes of some autocast rows not yet found"
        pytest.xfail(f"{shortfall} B short: the loss's backward seed{open_} (docs/known-gaps.md)")
