"""Fine-tuning optimizers and gradient clipping: memcalc's state and temporary bytes against the
live objects (bitsandbytes, transformers' Adafactor, clip_grad_norm_ run on CPU and measured with
validate.measure.tracker), properties over every program, and refusals by name."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memcalc.engine.run import candidates
from memcalc.core.errors import MemcalcError
from memcalc.queries.estimate import estimate
from memcalc.inputs.specs import ModelSpec
from memcalc.tape import finetune_optim as ft
from memcalc.tape.optimizer import clip_bytes
from memcalc.inputs.training import FINE_TUNE_OPTIMIZERS, TrainingConfig
from tests.strategies import cases

# (shape) of each parameter: a matrix above min_8bit_size, one below, 1-D, an embedding-like one
SHAPES = [(64, 100), (10, 64), (64,), (500, 32)]


def _params(torch, dtype):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, dtype=dtype) * 0.02) for s in SHAPES]


def _flat(shape) -> tuple[int, int]:
    n = 1
    for d in shape:
        n *= d
    return n, shape[0]


@pytest.mark.parametrize("optimizer", FINE_TUNE_OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_state_bytes_match_the_live_optimizer(optimizer, dtype):
    """Sum of the distinct state storages the real optimizer holds after one step."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from tests.configs import live_optimizer_state_bytes

    live = live_optimizer_state_bytes(torch, optimizer, _params(torch, getattr(torch, dtype)))
    shapes = [_flat(s) for s in SHAPES]
    predicted = sum(sum(ft.state_allocations(optimizer, n, rows, "cpu")) for n, rows in shapes)
    predicted += sum(ft.shared_allocations(optimizer, [n for n, _ in shapes], "cpu"))
    assert live == predicted


@pytest.mark.parametrize("optimizer", FINE_TUNE_OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_step_temporaries_match_the_tracker(optimizer, dtype):
    """Steady-state step: the peak above the live bytes before optimizer.step() is the largest
    parameter's temporaries (bitsandbytes' Python CPU kernels seen through SEE_INSIDE)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from tests.configs import measured_step_temporaries

    measured = measured_step_temporaries(optimizer, lambda: _params(torch, getattr(torch, dtype)))
    elt = 2 if dtype == "bfloat16" else 4
    assert measured == max(ft.step_temporaries(optimizer, [_flat(s) for s in SHAPES],
                                                       elt, "cpu", 1))


@pytest.mark.parametrize("foreach", [None, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_clip_grad_norm_temporaries_match_the_tracker(foreach, dtype):
    """On CPU foreach and the per-gradient loop allocate the same norms."""
    torch = pytest.importorskip("torch")
    from validate.measure.tracker import LiveTensorTracker

    with LiveTensorTracker() as tr:
        params = _params(torch, getattr(torch, dtype))
        for p in params:
            p.grad = torch.ones_like(p)
        before = tr.live
        tr.reset_peak()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
    numels = [p.numel() for p in params]
    assert tr.peak - before == clip_bytes(numels, 2 if dtype == "bfloat16" else 4, "cpu", 1)
    assert tr.live == before


def _states(model: ModelSpec, t: TrainingConfig) -> int:
    """Optimizer-state bytes alive through the steady state (the 'optimizer' component)."""
    return estimate(model, t).components.get("optimizer", 0)


def _single(t: TrainingConfig, **changes) -> TrainingConfig:
    return t.with_(optimizer_impl=None, **changes)


@given(cases(), st.sampled_from(ft.BNB_8BIT))
def test_8bit_states_below_fp32_adam(case, optimizer):
    model, t = case
    adam = _states(model, _single(t, optimizer="adam", precision="fp32"))
    eight = _states(model, _single(t, optimizer=optimizer))
    shapes = candidates(model, _single(t, optimizer=optimizer)).param_shapes
    if any(n >= ft.MIN_8BIT_SIZE for n, _ in shapes):
        assert eight < adam
    else:  # every state fp32, plus the two qmaps (CPU: made at construction)
        assert eight <= adam + 2 * ft.QMAP_BYTES


@given(cases())
def test_adafactor_states_below_adam(case):
    model, t = case
    adam = _states(model, _single(t, optimizer="adam", precision="fp32"))
    factored = _states(model, _single(t, optimizer="adafactor"))
    assert factored <= adam
    shapes = candidates(model, _single(t, optimizer="adafactor")).param_shapes
    if any(rows != n and n >= 1024 for n, rows in shapes):
        assert factored < adam


@given(cases(), st.sampled_from(["sgd", "adamw", *FINE_TUNE_OPTIMIZERS]))
def test_clipping_never_lowers_the_peak(case, optimizer):
    model, t = case
    t = _single(t, optimizer=optimizer)
    off, on = estimate(model, t), estimate(model, t.with_(max_grad_norm=1.0))
    assert on.peak_bytes >= off.peak_bytes
    assert on.first_step_peak_bytes >= off.first_step_peak_bytes


@pytest.mark.parametrize("fields, field", [
    (dict(optimizer="adamw-8bit", optimizer_impl="fused"), "optimizer_impl"),
    (dict(optimizer="adafactor", world_size=2, sharding="zero1"), "optimizer"),
    (dict(optimizer="paged-adamw", world_size=2), "optimizer"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
])
def test_refusals_name_the_field(fields, field):
    with pytest.raises(MemcalcError) as err:
        estimate(ModelSpec.preset("gpt2"), TrainingConfig.make(micro_batch=1, seq_len=8, **fields))
    assert err.value.field == field


def test_paged_states_leave_the_cuda_allocator():
    """PagedAdamW8bit on CUDA: the uint8 states of tensors >= 1e5 elements are managed memory;
    the allocator's peak is below AdamW8bit's by exactly their bytes."""
    gpt2 = ModelSpec.preset("gpt2")
    t = TrainingConfig(micro_batch=1, seq_len=128, optimizer="adamw-8bit")
    numels = [n for n, _ in candidates(gpt2, t).param_shapes]
    paged = ft.paged_state_bytes("paged-adamw-8bit", numels, "cuda")
    assert paged > 0
    assert (_states(gpt2, t) - _states(gpt2, t.with_(optimizer="paged-adamw-8bit"))
            == paged)  # the 512-B rounding is its own component (allocator_rounding)
