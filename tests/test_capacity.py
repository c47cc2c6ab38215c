"""Capacity answers sit exactly on the boundary: estimate(n) <= budget < estimate(n + 1) on the allocated
basis (the reserved and device bases: tests/test_reserved.py)."""
from hypothesis import given, strategies as st

from memcalc.queries.capacity import fits, largest_root, max_layers, max_micro_batch, max_seq_len
from memcalc.queries.estimate import estimate
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.strategies import cases

MIB = 2 ** 20


def _peak(model, training, **changes):
    return estimate(model, training.with_(**changes)).peak_bytes


@given(cases(), st.integers(1, 400))
def test_micro_batch_boundary(case, budget_mib):
    model, training = case
    r = max_micro_batch(model, training, budget_mib * MIB, basis="allocated")
    if r.value:
        assert _peak(model, training, micro_batch=r.value) == r.peak_bytes <= r.budget_bytes
    assert _peak(model, training, micro_batch=r.value + 1) == r.next_peak_bytes > r.budget_bytes


@given(cases(), st.integers(1, 400))
def test_seq_len_boundary(case, budget_mib):
    model, training = case
    r = max_seq_len(model, training, budget_mib * MIB, basis="allocated")
    if r.value:
        assert _peak(model, training, seq_len=r.value) <= r.budget_bytes
    if r.value == model.max_position_embeddings:  # GPT-2 runs no longer sequence
        assert r.next_peak_bytes is None
    else:
        assert _peak(model, training, seq_len=r.value + 1) > r.budget_bytes


@given(cases(), st.integers(1, 200), st.integers(0, 200))
def test_larger_budget_never_smaller_answer(case, budget_mib, extra_mib):
    model, training = case
    small = max_micro_batch(model, training, budget_mib * MIB, basis="allocated").value
    assert max_micro_batch(model, training, (budget_mib + extra_mib) * MIB, basis="allocated").value >= small


def test_no_fit_is_zero_not_an_error():
    r = max_micro_batch(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=1024), "1GiB",
                        basis="allocated")
    assert (r.value, r.fits, r.peak_bytes) == (0, False, None)
    assert r.next_peak_bytes > r.budget_bytes


def test_max_layers_boundary():
    model = ModelSpec.preset("gpt2").with_(hidden_size=64, num_heads=4, vocab_size=256)
    training = TrainingConfig(micro_batch=2, seq_len=32)
    r = max_layers(model, training, "40MiB", basis="allocated")
    assert estimate(model.with_(num_layers=r.value), training).peak_bytes <= r.budget_bytes
    assert estimate(model.with_(num_layers=r.value + 1), training).peak_bytes > r.budget_bytes


def test_fits_matches_estimate():
    model, training = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=512)
    peak = estimate(model, training).peak_bytes
    assert fits(model, training, peak, "allocated") and not fits(model, training, peak - 1, "allocated")


@given(st.integers(0, 10 ** 6), st.integers(0, 10 ** 4), st.integers(0, 100), st.integers(0, 10 ** 9))
def test_largest_root_is_exact(c0, c1, c2, budget):
    x = largest_root({0: c0, 1: c1, 2: c2}, budget, cap=10 ** 7)
    value = lambda n: c2 * n * n + c1 * n + c0  # noqa: E731
    assert x == 0 or value(x) <= budget
    assert x == 10 ** 7 or value(x + 1) > budget
