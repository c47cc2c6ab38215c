"""The HF call paths (TrainingConfig.use_cache, attention_mask, labels, num_items_in_batch):
against a measured peak, exact byte rules drawn over every HF program, and refusals."""
import pytest
from hypothesis import given, strategies as st

import memcalc
from memcalc.core.errors import NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.strategies import PROGRAMS, cases

HF_PROGRAMS = [(f, i) for f, i in PROGRAMS if i == "hf"]
UNFUSED_KV = [("gpt2", "hf"), ("llama", "hf")]
"""Programs where the cache's copies free no projection: Llama's k and v are projections of their
own, GPT-2's q stays a saved view of c_attn (Phi-3's and GPT-NeoX's fused projection is freed:
test_use_cache_lowers_the_fused_projection_families_peak)."""


def _call_path_modelled(case) -> bool:
    """The call paths are modelled for every HF family, sliding windows included, but GPT-2's
    upcast attention and a mask with the MoE auxiliary loss (memcalc.families.call_path.
    check_call_path refuses those by name)."""
    model, _ = case
    aux = model.moe is not None and model.moe.output_router_logits
    return not model.reorder_and_upcast_attn and not aux


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


@given(cases(programs=UNFUSED_KV, checkpointing=["none", "per-layer"]).filter(_call_path_modelled))
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


# ---- issue 24: the kernel transformers picks, and the Trainer's call path on every family --------
def test_default_attention_is_what_transformers_picks_for_each_class():
    """PreTrainedModel.get_correct_attn_implementation (transformers 5.24 modeling_utils.py) tries
    SDPA and falls back to eager when the class's _supports_sdpa is False: each declaration's
    Supports.default_attention must say the same, read from the transformers class itself."""
    transformers = pytest.importorskip("transformers")
    from memcalc.families.registry import FAMILIES

    for decl in FAMILIES.values():
        for hf in decl.hf_types:
            picks = "sdpa" if getattr(transformers, hf.model_class)._supports_sdpa else "eager"
            assert decl.supports.default_attention == picks, (decl.name, hf.model_class)
            assert (decl.supports.sdpa_refusal is None) == (picks == "sdpa"), decl.name


@pytest.mark.parametrize("family, picked", [("gemma2", "eager"), ("llama", "sdpa"), ("phi3", "sdpa")])
def test_the_validator_lets_transformers_pick_and_memcalc_assumes_the_same(family, picked):
    """A model built with no attn_implementation (validate.models.hf.build_hf, attention=None)
    runs the kernel memcalc's report says it assumed."""
    pytest.importorskip("transformers")
    from tests.test_programs import SPECS
    from validate.models.hf import build_hf

    spec = ModelSpec.make(**SPECS["hf", family])
    t = TrainingConfig(micro_batch=1, seq_len=8, device="cpu")
    _, description = build_hf(spec, t)
    report = memcalc.estimate(spec, t)
    assert description.endswith(f"default={picked}") and report.attention == picked and report.attention_assumed


@given(cases(checkpointing=["none", "per-layer"]))
def test_naming_the_default_kernel_changes_no_number(case):
    """attention=None is exactly the resolved kernel named explicitly (an explicit kernel is never
    replaced)."""
    model, t = case
    default = t.with_(attention=None)
    if t.attention != default.resolved_attention(model):
        return
    assert _peak(model, default) == _peak(model, t)


def test_default_training_arguments_answer_for_every_preset():
    """`memcalc check --trainer-args` with a default TrainingArguments (mask of ones, labels of
    their own, num_items_in_batch, the Trainer's tensors) answers for every preset memcalc ships."""
    from memcalc.inputs.presets import PRESETS

    t = TrainingConfig.from_trainer_args({}, seq_len=256)
    for name in PRESETS:
        assert memcalc.estimate(ModelSpec.preset(name), t).peak_bytes > 0, name


def test_check_cli_answers_for_gemma2_with_default_trainer_args(tmp_path, capsys):
    """Gemma-2 is not stopped with "use attention='eager'": transformers picks eager for it."""
    from memcalc.cli import main

    args = tmp_path / "args.json"
    args.write_text("{}")
    code = main(["check", "--model", "gemma-2-2b", "--trainer-args", str(args), "--seq-len", "512",
                 "--budget", "1000GB"])
    assert code == 0 and "fits" in capsys.readouterr().out


@pytest.mark.parametrize("family, mask", [("mixtral", "ones"), ("olmoe", "padded")])
def test_a_mask_with_the_moe_auxiliary_loss_stays_refused_by_name(family, mask):
    """load_balancing_loss_func's attention_mask branch (its scatter_add_ weighted counts) is not
    modelled: a mask with output_router_logits is refused by name."""
    from tests.test_programs import SPECS

    fields = SPECS["hf", family]
    spec = ModelSpec.make(**{**fields, "moe": {**fields["moe"], "output_router_logits": True}})
    t = TrainingConfig(micro_batch=1, seq_len=8, attention_mask=mask, pad_tokens=2 if mask == "padded" else 0)
    with pytest.raises(NotModelledError, match="^attention_mask:"):
        memcalc.estimate(spec, t)


@pytest.mark.parametrize("family", ["phi3", "gpt_neox"])
def test_use_cache_lowers_the_fused_projection_families_peak(family):
    """Measured (validate tracker, b3 s40, SDPA): use_cache=True lowers Phi-3's peak by 46,080 B and
    GPT-NeoX's by 61,440 B: their k and v are slices of the fused qkv projection, which SDPA's saved
    views keep alive; the cache's contiguous copies are saved instead and the projection is freed."""
    from tests.test_programs import SPECS

    spec = ModelSpec.make(**SPECS["hf", family])
    t = TrainingConfig(micro_batch=3, seq_len=40, attention="sdpa", device="cpu")
    assert _peak(spec, t, use_cache=True) < _peak(spec, t)


@pytest.mark.slow
@pytest.mark.parametrize("name", [f"cpf{i:02d}" for i in range(98)])
def test_the_trainer_call_path_is_the_measured_peak_on_every_family(name):
    """validate/matrices/rows/call-paths-by-family.json's rows, measured now."""
    from validate.matrices.load import topic_cases
    from validate.run.runner import run_case

    case = next(c for c in topic_cases("call-paths-by-family", "cpu") if c.name == name)
    row = run_case(case)
    assert row["status"] == "ok" and abs(row["error_pct"]) <= 0.01, row.get("error_pct")


def test_every_family_has_each_call_path_pair_measured():
    """Issue 24's grid: on every hand-written family each pair of use_cache (both ways), mask
    (none/ones/padded), kernel (SDPA where the class has it, eager) and checkpointing (none/some)
    is in a recorded ci row within 0.01% of its measured peak (scripts/call_path_coverage.py)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from call_path_coverage import main

    assert main([]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", [f"cpg{i:02d}" for i in range(34)])
def test_the_call_path_grid_is_the_measured_peak_on_every_family(name):
    """validate/matrices/rows/call-paths-grid.json's rows, measured now."""
    from validate.matrices.load import topic_cases
    from validate.run.runner import run_case

    case = next(c for c in topic_cases("call-paths-grid", "cpu") if c.name == name)
    row = run_case(case)
    assert row["status"] == "ok" and abs(row["error_pct"]) <= 0.01, row.get("error_pct")
