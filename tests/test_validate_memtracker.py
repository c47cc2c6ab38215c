"""Our tracker against an independent implementation: torch's MemTracker (within 1%)."""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from memcalc.inputs.specs import ModelSpec  # noqa: E402
from memcalc.inputs.training import TrainingConfig  # noqa: E402
from validate.measure.backends import measure, memtracker_peaks  # noqa: E402

GPT2 = ModelSpec.make(family="gpt2", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                      max_position_embeddings=128, embd_dropout=0.1, attn_dropout=0.1,
                      resid_dropout=0.1)
LLAMA = ModelSpec.make(family="llama", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, intermediate_size=176, max_position_embeddings=128,
                       tie_embeddings=False, qkv_bias=False, out_bias=False, mlp_bias=False,
                       activation="silu")


@pytest.mark.slow
@pytest.mark.parametrize("spec", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("training", [
    TrainingConfig(micro_batch=2, seq_len=64, device="cpu", attention="eager"),
    pytest.param(TrainingConfig(micro_batch=2, seq_len=64, device="cpu", precision="bf16-amp",
                                optimizer_impl="foreach", checkpointing="per-layer"),
                 marks=pytest.mark.slow),
], ids=["fp32-eager", "bf16amp-ckpt"])
def test_tracker_agrees_with_memtracker_on_hf_models(spec, training):
    ours = measure(spec, training)
    theirs = memtracker_peaks(spec, training)
    assert ours.peak_bytes == pytest.approx(theirs["peak_bytes"], rel=0.01)
    assert ours.first_step_peak_bytes == pytest.approx(theirs["first_step_peak_bytes"], rel=0.01)
    for phase, value in ours.phases.items():
        assert value == pytest.approx(theirs["phases"][phase], rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "sqrt"])
def test_fake_mode_is_exact_on_reference_models(checkpointing):
    training = TrainingConfig(micro_batch=2, seq_len=64, device="cpu", optimizer="adam",
                              checkpointing=checkpointing)
    for spec in (GPT2.with_(implementation="reference"), LLAMA.with_(implementation="reference")):
        real, fake = measure(spec, training), measure(spec, training, backend="fake")
        assert (real.peak_bytes, real.first_step_peak_bytes, real.phases) == \
               (fake.peak_bytes, fake.first_step_peak_bytes, fake.phases)


@pytest.mark.slow
def test_fake_mode_is_close_on_hf_models():
    # HF builds its attention mask from data-dependent checks; under FakeTensorMode it cannot
    # prove the mask is causal-only and materialises it, so fake runs read slightly higher.
    training = TrainingConfig(micro_batch=2, seq_len=64, device="cpu", checkpointing="sqrt")
    for spec in (GPT2, LLAMA):
        real, fake = measure(spec, training), measure(spec, training, backend="fake")
        assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.02)
