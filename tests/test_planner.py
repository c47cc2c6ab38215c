"""Plans fit their GPU, rank by the FLOP model, and share simulations soundly."""
from hypothesis import given, settings, strategies as st

from memcalc.queries.estimate import estimate
from memcalc.inputs.gpus import GPUS
from memcalc.queries.planner import ACCUM_EQUIVALENT, plan, step_flops
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.strategies import small_models


@settings(max_examples=10)
@given(small_models(), st.sampled_from(["L4", "V100-16GB", "H100-80GB"]), st.sampled_from([4, 6, 8]),
       st.integers(8, 64))
def test_first_plan_fits_its_gpu(model, name, global_batch, seq_len):
    attention = "eager" if model.family in ("gemma2", "gpt_oss") else "sdpa"  # no SDPA path
    base = TrainingConfig(micro_batch=1, seq_len=seq_len, attention=attention)
    plans = plan(model, name, global_batch, seq_len, base, checkpointing=("none", "per-layer"), basis="allocated")
    best = plans[0]
    t = TrainingConfig(micro_batch=best.micro_batch, seq_len=seq_len, grad_accum=best.grad_accum,
                       precision=best.precision, checkpointing=best.checkpointing, attention=attention)
    assert estimate(model, t).peak_bytes == best.peak_bytes <= GPUS[name].usable_bytes
    assert [p.step_seconds for p in plans] == sorted(p.step_seconds for p in plans)


def test_grad_accum_beyond_two_costs_the_same_memory():
    model = ModelSpec.preset("gpt2").with_(num_layers=2)
    t = TrainingConfig(micro_batch=2, seq_len=64, grad_accum=ACCUM_EQUIVALENT)
    assert estimate(model, t).peak_bytes == estimate(model, t.with_(grad_accum=7)).peak_bytes


def test_flop_model():
    m = ModelSpec.preset("gpt2")
    none, full, sel = (step_flops(m, 8, 1024, c) for c in ("none", "per-layer", "selective"))
    assert 3 * full == 4 * none  # full recompute: +1/3 (one more forward)
    attention = 12 * m.num_layers * m.hidden_size * 1024 * 1024 * 8
    assert sel - none == attention // 3


def test_bf16_skipped_on_v100():
    plans = plan(ModelSpec.preset("gpt2").with_(num_layers=2), "V100-16GB", 2, 64)
    assert plans and all(p.precision != "bf16" and p.precision != "bf16-amp" for p in plans)


@given(small_models(max_layers=2), st.sampled_from(["L4", "H100-80GB"]), st.sampled_from([4, 8]), st.integers(8, 64))
def test_first_plan_fits_on_device_bytes(model, name, global_batch, seq_len):
    """The default basis: the plan's peak is the step's device bytes, within the GPU's whole memory."""
    attention = "eager" if model.family in ("gemma2", "gpt_oss") else "sdpa"  # no SDPA path
    base = TrainingConfig(micro_batch=1, seq_len=seq_len, attention=attention)
    best = plan(model, name, global_batch, seq_len, base, checkpointing=("none",))[0]
    t = TrainingConfig(micro_batch=best.micro_batch, seq_len=seq_len, grad_accum=best.grad_accum,
                       precision=best.precision, checkpointing=best.checkpointing, attention=attention)
    assert estimate(model, t).device_bytes == best.peak_bytes <= GPUS[name].total_bytes
