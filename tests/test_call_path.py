"""The HF call paths (TrainingConfig.use_cache, attention_mask, labels, num_items_in_batch):
against a measured peak, exact byte rules drawn over every HF program, and refusals."""
import pytest
from hypothesis import given, strategies as st

import memcalc
from memcalc.core.errors import NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.strategies import cases

HF_PROGRAMS = [("gpt2", "hf"), ("llama", "hf")]


def _call_path_modelled(case) -> bool:
    """The call paths are modelled for HF GPT-2 and Llama without sliding windows or GPT-2's
    upcast attention (memcalc.families.call_path.check_call_path refuses the rest by name)."""
    model, _ = case
    return model.sliding_window is None and not model.reorder_and_upcast_attn


def _peak(model, training, **changes) -> int:
    return memcalc.estimate(model, training.with_(**changes)).peak_bytes


def test_use_cache_matches_the_measured_dynamic_cache():
    """Measured (memory-facts: HF GPT-2 b5 s160 h256 L5, bf16 autocast, SDPA): keeping HF's
    default use_cache=True added 4,096,000 B to the steady peak = 2*b*s*h*L bf16 elements."""
    model = ModelSpec.make(family="gpt2", vocab_size=500, hidden_size=256, num_layers=5, num_heads=4,
                           max_position_embeddings=256, embd_dropout=0.0, attn_dropout=0.0,
                           resid_dropout=0.0)
    t = TrainingConfig(micro_batch=5, seq_len=160, precision="bf16-amp", device="cpu")
    assert _peak(model, t, use_cache=True) - _peak(model, t) == 4_096_000


@given(cases(programs=HF_PROGRAMS, checkpointing=["none", "per-layer"]).filter(_call_path_modelled))
def test_separate_labels_add_one_int64_token_tensor(case):
    """A labels tensor of its own lives through the whole step: +8 bytes a token, everywhere."""
    model, t = case
    if t.world_size > 1:
        return
    assert _peak(model, t, labels="separate") - _peak(model, t) == 8 * t.micro_batch * t.seq_len \
        or t.device == "cuda"  # cuda rounds each storage to 512 B


@given(cases(programs=HF_PROGRAMS, checkpointing=["none", "per-layer"]).filter(_call_path_modelled))
def test_cache_never_lowers_the_peak_and_is_off_under_hf_checkpointing(case):
    model, t = case
    with_cache = _peak(model, t, use_cache=True)
    assert with_cache >= _peak(model, t)
    if t.checkpointing == "per-layer":
        assert with_cache == _peak(model, t)


@given(cases(programs=HF_PROGRAMS, checkpointing=["none"]).filter(_call_path_modelled),
       st.sampled_from(["ones", "padded"]))
def test_eager_masks_cost_only_the_batch_tensor(case, kind):
    """Eager attention builds its (b, 1, s, s) float mask whatever the 2-D mask holds (measured:
    ones and padded peak alike); only the (b, s) int64 mask itself is added."""
    model, t = case
    t = t.with_(attention="eager")
    pad = dict(pad_tokens=1) if kind == "padded" else {}
    ones = _peak(model, t, attention_mask="ones")
    assert _peak(model, t, attention_mask=kind, **pad) == ones
    if t.device == "cpu":
        assert ones - _peak(model, t) == 8 * t.micro_batch * t.seq_len


def test_padded_sdpa_saves_a_float_mask_per_layer():
    """Measured on HF GPT-2 fp32 b2 s200 L3 (CPU flash kernel): +960,000 B = L * b*s*s * 4."""
    model = ModelSpec.make(family="gpt2", vocab_size=100, hidden_size=64, num_layers=3, num_heads=4,
                           max_position_embeddings=256, embd_dropout=0.0, attn_dropout=0.0,
                           resid_dropout=0.0)
    t = TrainingConfig(micro_batch=2, seq_len=200, device="cpu", attention_mask="ones")
    assert _peak(model, t, attention_mask="padded", pad_tokens=7) - _peak(model, t) == 960_000


@pytest.mark.parametrize("changes, field", [
    (dict(use_cache=True), "use_cache"),
    (dict(labels="separate"), "labels"),
])
def test_reference_models_refuse_the_hf_call_path(changes, field):
    ref = ModelSpec.preset("gpt2").with_(implementation="reference", num_layers=1)
    with pytest.raises(NotModelledError, match=f"^{field}:"):
        memcalc.estimate(ref, TrainingConfig(micro_batch=1, seq_len=8, **changes))


def test_refusals_name_the_field():
    gpt2 = ModelSpec.preset("gpt2").with_(num_layers=2)
    t = TrainingConfig(micro_batch=1, seq_len=8, device="cpu")
    with pytest.raises(NotModelledError, match="^use_cache:"):
        memcalc.estimate(gpt2, t.with_(use_cache=True, checkpointing="sqrt"))
    with pytest.raises(NotModelledError, match="^attention_mask:"):  # GPT-2 dropout: math kernel
        memcalc.estimate(gpt2, t.with_(attention_mask="padded", pad_tokens=2))
    with pytest.raises(memcalc.MemcalcError, match="^attention_mask: .*pad_tokens > 0"):
        TrainingConfig(micro_batch=1, seq_len=8, attention_mask="padded")


@given(cases(programs=HF_PROGRAMS, checkpointing=["none", "per-layer"]).filter(_call_path_modelled))
def test_hf_trainer_holds_its_batches_and_two_scalars(case):
    """With fused optimizers (no temporaries, so the Trainer's param groups change nothing),
    the Trainer's own tensors add, on CPU, grad_accum micro-batches (input_ids, mask, labels;
    measured: grad_accum - 1 held by get_batch_samples plus the DataLoaderShard look-ahead)
    and two fp32 scalars, at every moment of the step."""
    model, t = case
    t = t.with_(device="cpu", optimizer_impl="fused", attention_mask="ones", labels="separate",
                world_size=1, sharding="none", tensor_parallel=1, sequence_parallel=False,
                fsdp_mixed_precision=False)
    held = t.grad_accum * 3 * 8 * t.micro_batch * t.seq_len + 8
    assert _peak(model, t, hf_trainer=True) - _peak(model, t) == held


def test_estimate_cli_reads_the_call_path_flags(capsys):
    from memcalc.cli import main

    main(["estimate", "--model", "gpt2", "--num-layers", "2", "--seq-len", "64", "--use-cache",
          "--attention-mask", "ones", "--labels", "separate", "--json"])
    out = capsys.readouterr().out
    t = TrainingConfig(micro_batch=1, seq_len=64, use_cache=True, attention_mask="ones", labels="separate")
    assert f'"peak_bytes": {memcalc.estimate(ModelSpec.preset("gpt2").with_(num_layers=2), t).peak_bytes}' in out
