"""Issue 12, part b: Phi-3/Phi-4, GPT-NeoX (Pythia), OLMo-2, Granite, SmolLM3 (Ministral refused) and
Llama 3.x. Every key of each transformers config class is modelled, known inert or refused
(tests/test_hf_keys.py walks these classes with the others); published config.json files (written
here as data) load to the presets, whose parameter counts equal transformers' own num_parameters()
of the same config on the meta device and the model cards' figures."""
import pytest

from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.inputs.specs import ModelSpec
from tests.configs import meta_num_parameters

_LLAMA3 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "initializer_range": 0.02,
           "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
           "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
           "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256}
_ROPE_LLAMA3 = {"high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
                "rope_type": "llama3"}
_PYTHIA = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
           "initializer_range": 0.02, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
           "model_type": "gpt_neox", "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
           "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
           "use_parallel_residual": True, "vocab_size": 50304}
# huggingface.co/<repo>/blob/main/config.json, and the parameter count each model card (or its
# safetensors index) publishes
PUBLISHED = {
    "llama-3.1-8b": (dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                          num_hidden_layers=32, tie_word_embeddings=False, transformers_version="4.43.0.dev0",
                          rope_scaling=dict(_ROPE_LLAMA3, factor=8.0)), 8_030_261_248),
    "llama-3.2-1b": (dict(_LLAMA3, head_dim=64, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                          num_hidden_layers=16, tie_word_embeddings=True, transformers_version="4.45.0.dev0",
                          rope_scaling=dict(_ROPE_LLAMA3, factor=32.0)), 1_235_814_400),
    "llama-3.2-3b": (dict(_LLAMA3, head_dim=128, hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                          num_hidden_layers=28, tie_word_embeddings=True, transformers_version="4.45.0.dev0",
                          rope_scaling=dict(_ROPE_LLAMA3, factor=32.0)), 3_212_749_824),
    "phi-3-mini": ({"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
                    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
                    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
                    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
                    "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": False,
                    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True,
                    "vocab_size": 32064}, 3_821_079_552),  # published with sliding_window 2047 and auto_map
    "phi-4": ({"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
               "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
               "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
               "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
               "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
               "rope_theta": 250000, "sliding_window": None, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "transformers_version": "4.47.0", "use_cache": True,
               "vocab_size": 100352}, 14_659_507_200),
    "pythia-160m": (dict(_PYTHIA, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                         num_hidden_layers=12), 162_322_944),
    "pythia-1.4b": (dict(_PYTHIA, hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                         num_hidden_layers=24), 1_414_647_808),
    "olmo-2-7b": ({"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                   "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                   "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
                   "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                   "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000,
                   "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.47.0.dev0",
                   "use_cache": True, "vocab_size": 100352}, 7_298_617_344),
    "granite-3-8b": ({"architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
                      "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0,
                      "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                      "intermediate_size": 12800, "logits_scaling": 16.0, "max_position_embeddings": 4096,
                      "mlp_bias": False, "model_type": "granite", "num_attention_heads": 32,
                      "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
                      "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None,
                      "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                      "transformers_version": "4.46.0.dev0", "use_cache": True, "vocab_size": 49155},
                     8_170_848_256),  # model card: 8.1B
    "smollm3-3b": ({"architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                    "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
                    "initializer_range": 0.02, "intermediate_size": 11008,
                    "layer_types": ["full_attention"] * 36, "max_position_embeddings": 65536,
                    "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3",
                    "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
                    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4,
                    "pad_token_id": 128004, "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
                    "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True,
                    "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0", "use_cache": False,
                    "use_sliding_window": False, "vocab_size": 128256}, 3_075_098_624),
}


def _resolved(spec: ModelSpec) -> dict:
    """A spec's fields with num_kv_heads and head_dim resolved (None means the default)."""
    return {**spec.model_dump(), "num_kv_heads": spec.kv_heads, "head_dim": spec.head_size, "name": ""}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_published_configs_load_to_the_presets_and_their_published_counts(preset):
    config, published = PUBLISHED[preset]
    spec = ModelSpec.from_hf_config(config)
    assert _resolved(spec) == _resolved(ModelSpec.preset(preset))
    assert spec.param_count == published


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_parameter_counts_equal_transformers_num_parameters_on_meta(preset):
    assert meta_num_parameters(PUBLISHED[preset][0]) == ModelSpec.preset(preset).param_count


@pytest.mark.parametrize("preset", ["phi-3-mini", "pythia-160m", "olmo-2-7b", "granite-3-8b", "smollm3-3b"])
def test_the_validator_builds_each_preset_from_its_spec_alone(preset):
    """validate.models.hf.hf_config_dict(spec) builds the same architecture as the published config."""
    pytest.importorskip("transformers")
    from validate.models.hf import hf_config_dict

    spec = ModelSpec.preset(preset)
    assert _resolved(ModelSpec.from_hf_config(hf_config_dict(spec))) == _resolved(spec)


@pytest.mark.parametrize("model_type,key,value", [
    ("phi-3-mini", "sliding_window", 2047), ("phi-3-mini", "auto_map", {"AutoConfig": "x"}),
    ("smollm3-3b", "use_sliding_window", True), ("granite-3-8b", "brand_new_key", 1),
    ("pythia-160m", "hidden_act", "relu"), ("olmo-2-7b", "hidden_act", "gelu")])
def test_settings_that_change_memory_are_refused_by_name(model_type, key, value):
    with pytest.raises(MemcalcError, match=f"hf_config.{key}"):
        ModelSpec.from_hf_config({**PUBLISHED[model_type][0], key: value})


def test_ministral_is_refused_by_name():
    # MinistralModel always builds a sliding-window mask (and raises without a window)
    base = {"model_type": "ministral", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128}
    for window in (None, 4096):
        with pytest.raises(NotModelledError, match="hf_config.model_type.*sliding"):
            ModelSpec.from_hf_config({**base, "sliding_window": window})


def test_smollm3_nope_layers_default_to_every_fourth():
    cfg = {k: v for k, v in PUBLISHED["smollm3-3b"][0].items() if k != "no_rope_layers"}
    assert ModelSpec.from_hf_config(cfg).no_rope_layers == tuple(range(3, 36, 4))


def test_smollm3_nope_flags_must_cover_every_layer():
    with pytest.raises(MemcalcError, match="hf_config.no_rope_layers"):
        ModelSpec.from_hf_config({**PUBLISHED["smollm3-3b"][0], "no_rope_layers": [1, 0]})


def test_a_spec_reads_back_from_its_json_dump():
    spec = ModelSpec.preset("smollm3-3b")
    assert ModelSpec.make(**spec.model_dump(mode="json")) == spec


def test_pythia_rotary_pct_moves_into_rope_parameters_as_transformers_does():
    cfg = {**PUBLISHED["pythia-160m"][0], "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}
    assert ModelSpec.from_hf_config(cfg).rotary_fraction == 0.5


@pytest.mark.parametrize("fields,match", [
    (dict(family="olmo2", resid_dropout=0.1), "resid_dropout"), (dict(family="llama", rotary_fraction=0.5), "rotary"),
    (dict(family="llama", parallel_residual=True), "parallel_residual"),
    (dict(family="gpt_neox", num_kv_heads=2), "grouped-query"),
    (dict(family="llama", no_rope_layers=(7,)), "no_rope_layers")])
def test_fields_a_family_does_not_read_are_refused(fields, match):
    base = dict(vocab_size=100, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
    with pytest.raises(MemcalcError, match=match):
        ModelSpec.make(**{**base, **fields})
