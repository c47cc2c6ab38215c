"""estimate_grid equals estimate() point by point."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from memcalc.core.errors import MemcalcError
from memcalc.queries.estimate import estimate
from memcalc.queries.grid import estimate_grid, upper_envelope
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.strategies import cases


def _small_gpt2():
    return ModelSpec.preset("gpt2").with_(num_layers=2, hidden_size=128, num_heads=4, vocab_size=1000)


@given(cases(max_layers=2), st.lists(st.integers(1, 64), min_size=1, max_size=3),  # depth is time
       st.lists(st.integers(1, 512), min_size=1, max_size=3))  # each point is one more simulation
def test_grid_equals_estimate(case, bs, ss):
    model, training = case
    grid = estimate_grid(model, training, micro_batch=np.array(bs)[:, None], seq_len=np.array(ss))
    for i, b in enumerate(bs):
        for j, s in enumerate(ss):
            assert grid[i, j] == estimate(model, training.with_(micro_batch=b, seq_len=s)).peak_bytes


def test_envelope_path_on_many_points():
    model, training = _small_gpt2(), TrainingConfig(micro_batch=1, seq_len=8, attention="eager")
    rng = np.random.default_rng(0)
    b, s = rng.integers(1, 64, 20000), rng.integers(1, 40, 20000)  # few distinct s: envelope path
    grid = estimate_grid(model, training, micro_batch=b, seq_len=s)
    for k in rng.integers(0, b.size, 40):
        assert grid[k] == estimate(model, training.with_(micro_batch=int(b[k]), seq_len=int(s[k]))).peak_bytes


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_other_fields_loop_over_values(device):
    model, training = _small_gpt2(), TrainingConfig(micro_batch=1, seq_len=64, device=device)
    layers, precisions = [2, 3], ["fp32", "bf16"]
    grid = estimate_grid(model, training, num_layers=np.array(layers), precision=np.array(precisions)[:, None])
    for i, precision in enumerate(precisions):
        for j, n in enumerate(layers):
            assert grid[i, j] == estimate(model.with_(num_layers=n), training.with_(precision=precision)).peak_bytes


@given(st.lists(st.tuples(st.integers(-1000, 1000), st.integers(0, 50)), min_size=1, max_size=12),
       st.integers(1, 200))
def test_upper_envelope_is_the_max(lines, x):
    hull, takeover = upper_envelope(lines)
    k = hull[sum(1 for t in takeover if t <= x)]
    assert lines[k][0] + lines[k][1] * x == max(a + c * x for a, c in lines)


def test_bad_arrays():
    with pytest.raises(MemcalcError, match="micro_batch"):
        estimate_grid(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8), micro_batch=np.array([0, 1]))
    with pytest.raises(MemcalcError, match="colour"):
        estimate_grid(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8), colour=np.array([1]))


@given(cases(max_layers=2), st.integers(0, 2 ** 32 - 1))
def test_grid_equals_estimate_at_random_points(case, seed):
    """Every program, precision, checkpointing mode and device: random points over several
    octaves of micro_batch (and seq_len up to the position table) equal estimate() exactly."""
    model, training = case
    rng = np.random.default_rng(seed)
    b = np.concatenate([rng.integers(1, 9, 12), rng.integers(1, 2 ** rng.integers(4, 14), 28)])
    s = rng.integers(1, 1025, b.size)
    grid = estimate_grid(model, training, micro_batch=b, seq_len=s)
    for k in range(b.size):
        assert grid[k] == estimate(model, training.with_(micro_batch=int(b[k]), seq_len=int(s[k]))).peak_bytes


@given(cases(max_layers=2), st.integers(0, 2 ** 32 - 1))
def test_grid_equals_rounded_totals_on_dense_boxes(case, seed):
    """A dense box of shapes (every cell of memcalc.queries.grid_cells it touches, both sides of every
    crossing of two moments in it) against the engine's compiled evaluator, point by point."""
    model, training = case
    training = training.with_(device="cuda")
    rng = np.random.default_rng(seed)
    b0, s0 = int(rng.integers(1, 200)), int(rng.integers(1, 900))
    b, s = np.arange(b0, b0 + 24)[:, None], np.arange(s0, s0 + 120)[None, :]
    grid = estimate_grid(model, training, micro_batch=b, seq_len=s)
    for i in range(b.shape[0]):
        for j in range(s.shape[1]):
            assert grid[i, j] == estimate(model, training.with_(micro_batch=int(b[i, 0]),
                                                               seq_len=int(s[0, j]))).peak_bytes


@pytest.mark.parametrize("top", [2 ** 24, 2 ** 40])  # int64 throughout; past int64 (Python ints)
def test_huge_shapes_on_cuda(top):
    model, training = _small_gpt2(), TrainingConfig(micro_batch=1, seq_len=8, device="cuda")
    b, s = np.array([1, 3, 1000, top - 1, top]), np.array([1, 7, 1024, 513, 1000])
    grid = estimate_grid(model, training, micro_batch=b, seq_len=s)
    for k in range(b.size):
        assert grid[k] == estimate(model, training.with_(micro_batch=int(b[k]), seq_len=int(s[k]))).peak_bytes
