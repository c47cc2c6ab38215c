"""GPT-OSS (memcalc.families.hf_gpt_oss): presets against the model card's total and active
parameter counts and transformers' own num_parameters(); the published config.json read back
(its quantization_config refused by name); what transformers cannot run refused; 'worst'
routing never below any routing on the eager experts loop (cpu and cuda, the allocator's
rounding included); grouped_mm memory independent of routing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc import estimate
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.formulas.parameters import active_parameter_count
from memcalc.inputs.moe import MoESpec
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.configs import meta_num_parameters
from tests.strategies import grouped_mm_peaks, random_routing

# openai/gpt-oss-20b config.json (huggingface.co; layer_types written out as published)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088}
DEQUANTIZED = {k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"}

# model card (arXiv 2508.10925, Table 1), in billions: total, and active per token, which the
# card counts with one of the two V x h matrices (embed + unembed 1.16B in the total)
PUBLISHED = [("gpt-oss-20b", 20.91, 3.61), ("gpt-oss-120b", 116.83, 5.13)]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_presets_have_the_model_cards_total_and_active_parameters(name, total, active):
    spec = ModelSpec.preset(name)
    one_embedding = spec.vocab_size * spec.hidden_size
    assert abs(spec.param_count / 1e9 - total) < 0.006
    assert abs((active_parameter_count(spec) - one_embedding) / 1e9 - active) < 0.006


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_parameter_counts_agree_with_transformers_on_a_meta_device(name):
    pytest.importorskip("torch")
    from validate.models.hf import hf_config_dict

    spec = ModelSpec.preset(name)
    assert meta_num_parameters(hf_config_dict(spec)) == spec.param_count


def test_the_published_config_reads_back_to_the_preset_once_dequantized():
    with pytest.raises(NotModelledError, match="hf_config.quantization_config.*Mxfp4Config"):
        ModelSpec.from_hf_config(GPT_OSS_20B)
    assert ModelSpec.from_hf_config(DEQUANTIZED).with_(name="gpt-oss-20b") == ModelSpec.preset("gpt-oss-20b")


@pytest.mark.parametrize("changes,key", [
    ({"layer_types": ["full_attention", "sliding_attention"] * 12}, "hf_config.layer_types"),
    ({"sliding_window": None}, "hf_config.sliding_window"),
    ({"num_experts_per_tok": 33}, "moe")])
def test_configs_memcalc_does_not_model_are_refused_by_name(changes, key):
    with pytest.raises(MemcalcError, match=key):
        ModelSpec.from_hf_config({**DEQUANTIZED, **changes})


def test_the_auxiliary_loss_is_read_and_costs_what_moe_aux_models():
    """output_router_logits turns on GptOssForCausalLM's load_balancing_loss_func: the config key
    reaches the spec, and the backward peak holds at least every layer's captured (N, E) router
    logits more (kept until the forward returns, their gradients waiting for each layer's own
    backward: L*N*E fp32 elements here; the gptoss-aux rows of validate/matrices/rows/gpt-oss.json
    measure it)."""
    from validate.matrices import topic_cases

    config = topic_cases("gpt-oss", "cpu")[0].hf_config  # the rows' config.json
    spec = ModelSpec.from_hf_config({**config, "output_router_logits": True})
    assert spec.moe.output_router_logits
    plain = ModelSpec.from_hf_config(config)
    t = TrainingConfig(micro_batch=2, seq_len=40, device="cpu", attention="eager")
    extra = estimate(spec, t).phases["backward"] - estimate(plain, t).phases["backward"]
    assert extra >= spec.num_layers * 2 * 40 * spec.moe.num_experts * 4


def test_sdpa_is_refused_for_gpt_oss():
    spec = ModelSpec.preset("gpt-oss-20b").with_(num_layers=2)
    with pytest.raises(NotModelledError, match="attention: .*sinks"):
        estimate(spec, TrainingConfig(micro_batch=1, seq_len=8, attention="sdpa"))
    assert estimate(spec, TrainingConfig(micro_batch=1, seq_len=8, attention="eager")).peak_bytes > 0


def test_the_cli_refuses_sdpa_with_exit_2(capsys):
    from memcalc.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--model", "gpt-oss-20b", "--num-layers", "2", "--seq-len", "64", "--attention", "sdpa"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "attention" in err


# ---- routing properties ------------------------------------------------------------------------
@st.composite
def gpt_oss_steps(draw):
    E = draw(st.integers(2, 8))
    moe = MoESpec(num_experts=E, top_k=draw(st.integers(1, E)), expert_ffn_size=draw(st.sampled_from([32, 64])))
    bias = draw(st.booleans())
    spec = ModelSpec.make(family="gpt_oss", vocab_size=draw(st.sampled_from([16, 64, 256])), hidden_size=32,
                          num_layers=draw(st.integers(1, 3)), num_heads=4, head_dim=8,
                          num_kv_heads=draw(st.sampled_from([1, 2, 4])), intermediate_size=32, qkv_bias=bias,
                          out_bias=bias, mlp_bias=True,
                          tie_embeddings=False, activation="silu", sliding_window=draw(st.sampled_from([4, 128])),
                          sliding_window_pattern=2, moe=moe)
    training = TrainingConfig(micro_batch=draw(st.integers(1, 3)), seq_len=draw(st.integers(1, 24)),
                              precision=draw(st.sampled_from(["fp32", "bf16-amp", "bf16"])),
                              checkpointing=draw(st.sampled_from(["none", "per-layer", "selective"])),
                              attention="eager", device=draw(st.sampled_from(["cpu", "cuda"])),
                              experts_implementation="eager")
    return spec, training, draw(st.randoms(use_true_random=False))


@settings(deadline=None)
@given(gpt_oss_steps())
def test_worst_routing_is_never_below_any_routing(step):
    spec, training, rng = step
    worst = estimate(spec, training).peak_bytes
    for _ in range(3):
        counts = random_routing(rng, spec, training.micro_batch * training.seq_len)
        assert estimate(spec, training.with_(moe_routing=counts)).peak_bytes <= worst


@settings(deadline=None)
@given(gpt_oss_steps())
def test_grouped_mm_memory_does_not_depend_on_routing(step):
    assert len(grouped_mm_peaks(*step)) == 1
