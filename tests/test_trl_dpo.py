"""trl.DPOTrainer (memcalc.families.trl_dpo, memcalc.inputs.trainers.dpo_args) against TRL itself:
DPOConfig's field list and defaults, the fused LM head's temporaries measured by the live-tensor
tracker, and invariants of the composed step drawn over the families DPO runs on."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memcalc
from memcalc.core.errors import MemcalcError, NotModelledError, SpecError, UnknownNameError
from memcalc.inputs.lora import LoRA
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.trainers import dpo_args, sft_args, trainer_args
from memcalc.inputs.training import TrainingConfig

CPU = {"use_cpu": True}


def test_every_dpoconfig_field_is_accounted_for():
    """A TRL release adding a DPOConfig field turns this red (TrainingArguments' own fields are
    tests/test_trainer_args.py's)."""
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    names = {f.name for f in dataclasses.fields(trl.DPOConfig) if f.init} - base
    known = set(dpo_args.DEFAULTS) | set(dpo_args.INERT)
    assert names - known == set()
    assert known - names == set()
    assert set(dpo_args.READ) | set(dpo_args.REFUSED_UNLESS_DEFAULT) <= set(dpo_args.DEFAULTS)


def test_defaults_are_trls_defaults():
    trl = pytest.importorskip("trl")
    fields = {f.name: f for f in dataclasses.fields(trl.DPOConfig)}
    for name, value in dpo_args.DEFAULTS.items():
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert default == value, name


def test_object_dict_and_json_agree(tmp_path):
    """A DPOConfig object, its to_dict() and its JSON give the same step: TRL's defaults are
    bf16 autocast and gradient checkpointing; per_device_train_batch_size counts pairs."""
    trl = pytest.importorskip("trl")
    args = trl.DPOConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=3,
                         use_cpu=True, precompute_ref_log_probs=True)
    path = tmp_path / "dpo.json"
    path.write_text(args.to_json_string())
    want = TrainingConfig(micro_batch=6, seq_len=64, precision="bf16-amp", optimizer="adamw",
                          optimizer_impl="fused", weight_decay=0.0, checkpointing="per-layer",
                          device="cpu", attention_mask="ones", hf_trainer=True, max_grad_norm=1.0,
                          trl="dpo", dpo_reference="precomputed")
    for given_ in (args, args.to_dict(), str(path)):
        assert TrainingConfig.from_trainer_args(given_, seq_len=64, trainer="dpo") == want


@pytest.mark.parametrize("fields, name", [
    ({"loss_type": ["sigmoid", "ipo"]}, "trainer_args.loss_type"),
    ({"use_weighting": True}, "trainer_args.use_weighting"),
    ({"padding_free": True}, "trainer_args.padding_free"),
    ({"sync_ref_model": True}, "trainer_args.sync_ref_model"),
    ({"disable_dropout": False}, "trainer_args.disable_dropout"),
    ({"max_length": 32}, "trainer_args.max_length"),
    ({"f_divergence_type": "js_divergence"}, "trainer_args.f_divergence_type"),
    ({"deepspeed": {"zero_optimization": {"stage": 2}}}, "trainer_args.deepspeed"),
    ({"use_liger_kernel": True}, "trainer_args.use_liger_kernel"),
])
def test_refused_by_name(fields, name):
    with pytest.raises(MemcalcError) as err:
        TrainingConfig.from_trainer_args({**CPU, **fields}, seq_len=64, trainer="dpo")
    assert err.value.field == name


def test_unknown_field_and_trainer_refused():
    with pytest.raises(UnknownNameError) as err:
        TrainingConfig.from_trainer_args({"bettaa": 0.1}, seq_len=64, trainer="dpo")
    assert err.value.field == "trainer_args.bettaa"
    with pytest.raises(UnknownNameError):
        TrainingConfig.from_trainer_args({}, seq_len=64, trainer="ppo")


def test_cuda_refused_until_measured():
    """TRL's Triton head (compact rows) on a GPU is not the CPU path memcalc measured."""
    t = TrainingConfig.from_trainer_args({}, seq_len=64, trainer="dpo")
    with pytest.raises(NotModelledError) as err:
        memcalc.estimate(ModelSpec.preset("gpt2").with_(num_layers=1), t)
    assert err.value.field == "device"


@pytest.mark.parametrize("outputs, amp", [(("log_probs", "entropy", "mean_logits", "is_top1"), False),
                                          (("log_probs",), False),
                                          (("log_probs", "entropy", "mean_logits", "is_top1"), True)])
def test_chunked_logprob_tile_against_the_tracker(outputs, amp):
    """The fused head's forward and backward peaks over their inputs, measured by the live-tensor
    tracker on trl's ChunkedLogProbFunction, against the sizes memcalc.families.trl_dpo adds:
    the seven running statistics, the (n, 32768) tile buffer, the fold's widest moment
    (13 or 12 bytes per tile element plus 20 or 16 per row) and in backward the two fp32 gradient
    accumulators, the buffer and 29 bytes per tile element."""
    torch = pytest.importorskip("torch")
    kernels = pytest.importorskip("trl.kernels")
    from validate.measure.tracker import LiveTensorTracker

    N, h, V = 60, 16, 300
    c = 2 if amp else 4
    hidden = torch.randn(N, h, requires_grad=True)
    weight = torch.randn(V, h, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    with LiveTensorTracker() as tr:
        for t in (hidden, weight, targets):
            tr.track_tensor(t)
        base = tr.live
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = kernels.ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None,
                                                       1.0, outputs)
        forward = tr.peak - base
        grad = torch.ones(N)
        tr.track_tensor(grad)
        tr.reset_peak()
        before = tr.live
        out[0].backward(grad)
        backward = tr.peak - before
    policy = "entropy" in outputs
    fold = N * V * (13 if policy else 12) + N * (20 if policy else 16)
    chunk = N * h * c if amp else 0  # hidden[chunk].to(bf16), bound through the vocabulary loop
    assert forward == 7 * N * 4 + N * 32768 * c + chunk + fold
    copies = (N * h + V * h) * c if amp else 0  # the bf16 chunk and weight slice
    assert backward == (N * h + V * h) * 4 + N * 32768 * c + copies + N * V * 29


DPO_PRESETS = ("gpt2", "llama-2-7b", "qwen2-0.5b")


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(DPO_PRESETS), st.integers(1, 3), st.integers(16, 600),
       st.sampled_from(["fp32", "bf16-amp"]), st.sampled_from(["none", "per-layer"]))
def test_dpo_step_invariants(preset, pairs, seq_len, precision, checkpointing):
    """Over the families DPO runs on: a reference forward never lowers the peak, its copy doubles
    the weights held, and LoRA's reference (adapters off) holds no copy."""
    model = ModelSpec.preset(preset).with_(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=None,
                                           intermediate_size=128, vocab_size=1000, max_position_embeddings=1024) \
        if preset != "gpt2" else ModelSpec.preset(preset).with_(num_layers=2, hidden_size=64, num_heads=4,
                                                                vocab_size=1000)
    args = {"per_device_train_batch_size": pairs, "use_cpu": True, "bf16": precision == "bf16-amp",
            "gradient_checkpointing": checkpointing == "per-layer"}
    t = TrainingConfig.from_trainer_args(args, seq_len=seq_len, trainer="dpo")
    copy = memcalc.estimate(model, t)
    pre = memcalc.estimate(model, t.with_(dpo_reference="precomputed"))
    weights = pre.components["weights"]
    assert copy.peak_bytes >= pre.peak_bytes
    assert copy.components["weights"] == 2 * weights  # the policy and its frozen copy, one dtype
    lora = memcalc.estimate(model, t.with_(lora=LoRA(rank=4, targets="all-linear")))
    assert lora.components["weights"] == weights  # the reference runs the same base weights


def test_trainer_names_stay_distinct():
    assert set(trainer_args.TRAINERS) == {"hf", "dpo", "sft", "grpo"}


def test_every_sftconfig_field_is_accounted_for():
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    names = {f.name for f in dataclasses.fields(trl.SFTConfig) if f.init} - base
    assert names == sft_args.own_names()
    fields = {f.name: f for f in dataclasses.fields(trl.SFTConfig)}
    for name, value in sft_args.DEFAULTS.items():
        f = fields[name]
        assert (f.default if f.default is not dataclasses.MISSING else f.default_factory()) == value, name


def test_sftconfig_object_gives_the_step(tmp_path):
    """SFTTrainer's step: the batch's own labels, num_items_in_batch, TRL's defaults."""
    trl = pytest.importorskip("trl")
    args = trl.SFTConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=3,
                         use_cpu=True, completion_only_loss=True)
    t = TrainingConfig.from_trainer_args(args, seq_len=64, trainer="sft")
    assert (t.micro_batch, t.trl, t.labels, t.num_items_in_batch, t.precision, t.checkpointing) == \
        (3, "sft", "separate", True, "bf16-amp", "per-layer")
    for fields, name in (({"packing": True, "packing_strategy": "wrapped"}, "trainer_args.packing_strategy"),
                         ({"loss_type": "dft"}, "trainer_args.loss_type"),
                         ({"padding_free": True}, "trainer_args.max_length")):  # TRL refuses it too
        with pytest.raises(MemcalcError) as err:
            TrainingConfig.from_trainer_args({**CPU, **fields}, seq_len=64, trainer="sft")
        assert err.value.field == name


def test_sft_packing_is_one_padding_free_row(tmp_path):
    """SFTConfig(packing=True) (BFD, padding-free): the micro-batch is one row of
    per_device_train_batch_size x seq_len tokens; packed_sequences sizes only cu_seq_lens
    (4 B a sequence, in the batch in use and the CPU look-ahead batch), and it is read only
    with packing."""
    trl = pytest.importorskip("trl")
    args = trl.SFTConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=3,
                         use_cpu=True, packing=True, max_length=64)
    t = TrainingConfig.from_trainer_args(args, seq_len=64, trainer="sft", packed_sequences=5)
    assert (t.micro_batch, t.seq_len, t.attention_mask, t.packed_sequences) == (1, 192, "packed", 5)
    model = ModelSpec.preset("gpt2").with_(num_layers=2, attn_dropout=0.0)  # CPU SDPA's math kernel
    peaks = [memcalc.estimate(model, t.with_(packed_sequences=n)).peak_bytes for n in (5, 6)]
    assert peaks[1] - peaks[0] == 4 * 2
    with pytest.raises(SpecError) as err:
        TrainingConfig.from_trainer_args({**CPU}, seq_len=64, trainer="sft", packed_sequences=5)
    assert err.value.field == "packed_sequences"


def test_check_offers_dpo_changes_in_pairs():
    """memcalc check on a DPO config that does not fit: every change keeps whole pairs, the
    precomputed reference is among them, and each change's peak is a fresh estimate."""
    from memcalc.queries.preflight import check

    model = ModelSpec.preset("gpt2").with_(num_layers=2)
    t = TrainingConfig.from_trainer_args({"per_device_train_batch_size": 4, "use_cpu": True,
                                          "bf16": False, "gradient_checkpointing": False},
                                         seq_len=256, device="cpu", trainer="dpo")
    peak = memcalc.estimate(model, t).peak_bytes
    verdict = check(model, t, int(peak * 0.9))
    assert not verdict.fits and verdict.changes
    for change in verdict.changes:
        fields = change.fields
        assert fields.get("micro_batch", 2) % 2 == 0
        args = change.trainer_args()
        if "per_device_train_batch_size" in args:
            assert args["per_device_train_batch_size"] * 2 == fields["micro_batch"]
        assert memcalc.estimate(model, t.with_(**fields)).peak_bytes == change.peak_bytes
    if memcalc.estimate(model, t.with_(dpo_reference="precomputed")).peak_bytes <= verdict.budget_bytes:
        assert any(c.fields.get("dpo_reference") == "precomputed" for c in verdict.changes)
