"""The `sweep4` rows (in validate/matrices/rows/: attention-views, moe, optimizers,
attention-locals): three cases of the fresh sweep seed 6 and their neighbours (one kv head at
b=1, top_k 1 grouped experts, eager experts whose micro-steps route differently; foreach Adam with
weight decay), measured by the live-tensor tracker (validate/results/cpu-ci-sweep4.jsonl). Each
row's peak and phases are held by tests/test_recorded_rows.py; these tests check what the rows
show beyond that."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given

import memcalc
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.strategies import cases
from validate.matrices.tolerances import bound
from validate.run.routed_steps import predict_steps

ROWS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-sweep4.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


def _predicted(row: dict):
    key = json.loads(row["key"])
    spec, training = ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"])
    counts = ((row.get("extra") or {}).get("moe") or {}).get("routing_counts")
    if not counts:
        return memcalc.estimate(spec, training)
    steps = predict_steps(memcalc.estimate, spec, training, counts)
    return max(steps, key=lambda r: r.peak_bytes)


def _sweep4_cases() -> dict:
    from validate.matrices import get_matrix

    return {c.name: c for c in get_matrix("ci") if c.name.startswith("sweep4")}


def test_the_rows_are_the_ci_matrix_rows_and_the_sweeps_misses():
    """The sweep4 rows of the ci matrix are the configurations the seed-6 sweep measured, as
    recorded then (validate/results/cpu-ci-sweep4.jsonl holds the sweep's own keys)."""
    cases_ = _sweep4_cases()
    assert sorted(r["name"] for r in _rows()) == sorted(cases_)
    assert {r["key"] for r in _rows()} == {c.key for c in cases_.values()}


def test_one_routing_for_every_micro_step_over_predicts_the_measured_step():
    """sweep408 (the sweep's Qwen2-MoE miss): each pass's routing applied to the whole step puts
    the largest over 1.5% above the measured peak (a first micro-step routing three experts in the
    last layer, the second one); each micro-step with its own is within 0.01%."""
    row = next(r for r in _rows() if r["name"] == "sweep408")
    measured = row["measured_peak_bytes"]
    assert max(row["extra"]["moe"]["routed_peaks"]) > 1.015 * measured
    assert abs(_predicted(row).peak_bytes - measured) < 1e-4 * measured


@given(cases())
def test_second_micro_step_holds_at_least_the_first(case):
    """validate.run.routed_steps reads memcalc's forward and backward phases under gradient
    accumulation as its second micro-step's: at any one routing they bound the first's (a step of
    one micro-step), since the second holds everything the first does and the gradients."""
    model, training = case
    if training.grad_accum == 1 or training.hf_trainer:
        training = training.with_(grad_accum=2)
    try:
        one = memcalc.estimate(model, training.with_(grad_accum=1)).phases
        more = memcalc.estimate(model, training).phases
    except memcalc.MemcalcError:
        return
    assert more["forward"] >= one["forward"] and more["backward"] >= one["backward"]


def test_foreach_adam_weight_decay_copy_is_gone_before_the_sqrt():
    """sweep410-411 (foreach Adam, weight decay 0.1): the measured optimizer phase is the one
    memcalc predicts with a single parameter-sized temporary, as without weight decay (torch's
    `del device_grads` before `_foreach_sqrt`); two at once would be 20% over."""
    for row in (r for r in _rows() if r["name"] in ("sweep410", "sweep411")):
        key = json.loads(row["key"])
        spec, training = ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"])
        without = memcalc.estimate(spec, training.with_(weight_decay=None)).phases["optimizer"]
        assert memcalc.estimate(spec, training).phases["optimizer"] == without
        assert bound("optimizers").allows_phase(without, row["phases"]["optimizer"]["measured"])



def test_sweep412_is_the_seed_8_sweeps_worst():
    """sweep412 is fresh8-015 of the seed-8 sweep (scripts/fresh_sweep.py --n 40 --seed 8, its row's
    key in validate/results/fresh-sweep-seed8.jsonl; a checkpointed layer's routing-weights product,
    memcalc.tape.graph.Returns; today's strategies do not draw it again, so the test reads the key
    from the recorded sweep); sweep413 peaks at the same moment, small."""
    sweep = ROWS.parent / "fresh-sweep-seed8.jsonl"
    if not sweep.exists():
        pytest.skip("the seed-8 sweep's rows are not in this checkout")
    keys = {r["name"]: r["key"] for r in map(json.loads, sweep.read_text().splitlines()) if r}
    assert _sweep4_cases()["sweep412"].key == keys["fresh8-015"]
    for row in (r for r in _rows() if r["name"] in ("sweep412", "sweep413")):
        assert _predicted(row).moment == "* routing weights backward"
