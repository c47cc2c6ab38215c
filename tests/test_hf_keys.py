"""HF config reading that cannot be silently wrong: every key of each supported transformers
config class is modelled, known inert or refused by name; real published config.json files
load and give their published parameter counts; memory-relevant settings are refused."""
import pytest

from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.families.registry import MODEL_TYPES, hf_type
from memcalc.inputs.hf.keys import INERT, REFUSED_UNLESS
from memcalc.inputs.specs import ModelSpec

CLASSES = {"gpt2": "GPT2Config", "llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
           "qwen3": "Qwen3Config", "gemma": "GemmaConfig", "gemma2": "Gemma2Config",
           "gemma3_text": "Gemma3TextConfig",
           "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig",
           "olmoe": "OlmoeConfig", "gpt_oss": "GptOssConfig",
           "phi3": "Phi3Config", "gpt_neox": "GPTNeoXConfig", "olmo2": "Olmo2Config", "granite": "GraniteConfig",
           "smollm3": "SmolLM3Config", "stablelm": "StableLmConfig"}

# Published config.json files (huggingface.co/<repo>/blob/main/config.json) and the parameter
# counts on their model cards.
GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257}
LLAMA_2_7B = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
              "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
              "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
              "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
              "tie_word_embeddings": False, "torch_dtype": "float16",
              "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000}
QWEN2_05B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
             "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
             "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24,
             "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
             "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
             "sliding_window": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
             "transformers_version": "4.40.1", "use_cache": True, "use_sliding_window": False,
             "vocab_size": 151936}
MISTRAL_7B_V03 = {"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
                  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                  "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 32768}
# transcribed from the Hub's config.json of Qwen/Qwen3-0.6B, google/gemma-2b, google/gemma-2-2b,
# google/gemma-3-1b-pt; counts: transformers' num_parameters() (tests/test_families.py)
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
             "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
GEMMA_2B = {"architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 16384, "max_position_embeddings": 8192,
            "model_type": "gemma", "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1,
            "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
            "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0", "use_cache": True,
            "vocab_size": 256000}
GEMMA_2_2B = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
              "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
              "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
              "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
              "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
              "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
              "use_cache": True, "vocab_size": 256000}
GEMMA_3_1B = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
              "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
              "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
              "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
              "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
              "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
              "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True,
              "vocab_size": 262144}
PUBLISHED = [(GPT2, 124_439_808), (LLAMA_2_7B, 6_738_415_616), (QWEN2_05B, 494_032_768),
             (MISTRAL_7B_V03, 7_248_023_552), (QWEN3_06B, 596_049_920), (GEMMA_2B, 2_506_172_416),
             (GEMMA_2_2B, 2_614_341_888), (GEMMA_3_1B, 999_885_952)]


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_every_key_of_the_transformers_config_is_accounted_for(model_type):
    transformers = pytest.importorskip("transformers")
    keys = set(getattr(transformers, CLASSES[model_type])().to_dict())
    declared = hf_type(model_type)[1]
    unknown = keys - declared.modelled - set(INERT) - set(REFUSED_UNLESS) - set(declared.inert)
    assert not unknown, f"{model_type}: classify {sorted(unknown)} in its family's declaration"


def test_the_registry_declares_the_model_types_and_config_classes_listed_here():
    assert set(MODEL_TYPES) == set(CLASSES)
    assert {t: hf_type(t)[1].config_class for t in MODEL_TYPES} == CLASSES


@pytest.mark.parametrize("config,published", PUBLISHED, ids=lambda c: str(c)[:20])
def test_published_configs_load_with_their_published_parameter_counts(config, published):
    assert ModelSpec.from_hf_config(config).param_count == published


@pytest.mark.parametrize("key,value", [("output_attentions", True), ("brand_new_key", 1)])
def test_gpt2_settings_that_change_memory_are_refused_by_name(key, value):
    with pytest.raises(NotModelledError, match=f"hf_config.{key}"):
        ModelSpec.from_hf_config({**GPT2, key: value})


@pytest.mark.parametrize("config,key,value,window,sliding", [
    (MISTRAL_7B_V03, "sliding_window", 4096, 4096, [True] * 32),
    (QWEN2_05B, "use_sliding_window", True, 131072, [False] * 24),  # max_window_layers=24: none slides
    ({**QWEN2_05B, "max_window_layers": 20}, "use_sliding_window", True, 131072, [False] * 20 + [True] * 4),
    (GEMMA_2_2B, "sliding_window", 4096, 4096, [True, False] * 13),
    (GEMMA_3_1B, "sliding_window", 512, 512, ([True] * 5 + [False]) * 4 + [True] * 2)])
def test_sliding_windows_are_read_per_layer(config, key, value, window, sliding):
    spec = ModelSpec.from_hf_config({**config, key: value})
    assert spec.sliding_window == window
    assert [spec.layer_is_sliding(i) for i in range(spec.num_layers)] == sliding


@pytest.mark.parametrize("config,key,value", [
    (QWEN2_05B, "layer_types", ["sliding_attention"] * 24),  # not what use_sliding_window=False gives
    (GEMMA_2_2B, "layer_types", ["full_attention"] * 26),
    (LLAMA_2_7B, "sliding_window", 4096),  # Llama has no sliding-window code path
    (GEMMA_2_2B, "use_bidirectional_attention", True),
    (GEMMA_2_2B, "hidden_activation", "relu")])
def test_settings_that_are_not_modelled_are_refused_by_name(config, key, value):
    with pytest.raises(MemcalcError, match=f"hf_config.{key}"):
        ModelSpec.from_hf_config({**config, key: value})


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path, capsys):
    import json

    from memcalc.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL_7B_V03, "output_attentions": True}))
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--hf-config", str(path), "--micro-batch", "1", "--seq-len", "8192"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hf_config.output_attentions" in err


def test_gpt2_upcast_attention_is_modelled_and_inverse_layer_scaling_is_inert():
    spec = ModelSpec.from_hf_config({**GPT2, "reorder_and_upcast_attn": True, "scale_attn_by_inverse_layer_idx": True})
    assert spec.reorder_and_upcast_attn
