"""StableLM (model_type stablelm), the family added by following docs/adding-a-family.md: the
published config reads to the parameter count transformers itself gives (meta device) and its
model card's; the spec round-trips through the validator's builder; what is not modelled is
refused by name; and (slow lane) the predicted peak equals the peak the validator measures on
the real StableLmForCausalLM, on CPU, across precisions, checkpointing, eager/SDPA, GQA,
biases, partial rotary widths, the parallel residual and dropout."""
import pytest

from memcalc import estimate
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.configs import meta_num_parameters

# huggingface.co/stabilityai/stablelm-2-1_6b/blob/main/config.json; its card: 1,644,515,328 parameters
STABLELM_2_1_6B = {"architectures": ["StableLmForCausalLM"], "bos_token_id": 100257, "eos_token_id": 100257,
                   "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2048, "initializer_range": 0.02,
                   "intermediate_size": 5632, "layer_norm_eps": 1e-05, "max_position_embeddings": 4096,
                   "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 24,
                   "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "qk_layernorm": False,
                   "rope_scaling": None, "rope_theta": 10000, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16", "transformers_version": "4.38.0", "use_cache": True,
                   "use_parallel_residual": False, "use_qkv_bias": True, "vocab_size": 100352}


def test_the_published_config_has_transformers_and_the_model_cards_parameter_count():
    pytest.importorskip("torch")
    spec = ModelSpec.from_hf_config(STABLELM_2_1_6B)
    assert (spec.rotary_fraction, spec.qkv_bias, spec.out_bias, spec.parallel_residual) == (0.25, True, False, False)
    assert spec.param_count == meta_num_parameters(STABLELM_2_1_6B) == 1_644_515_328


def test_the_validators_config_builds_the_same_spec():
    from validate.models.hf import hf_config_dict

    spec = ModelSpec.make(family="stablelm", vocab_size=300, hidden_size=64, num_layers=3, num_heads=4,
                          num_kv_heads=2, intermediate_size=96, qkv_bias=True, out_bias=False, mlp_bias=False,
                          activation="silu", rotary_fraction=0.5, parallel_residual=True, resid_dropout=0.1)
    assert ModelSpec.from_hf_config(hf_config_dict(spec)) == spec.with_(name="stablelm")


@pytest.mark.parametrize("changes,field", [({"qk_layernorm": True}, "hf_config.qk_layernorm"),
                                           ({"hidden_act": "gelu"}, "hf_config.hidden_act"),
                                           ({"use_sliding_window": True}, "hf_config.use_sliding_window")])
def test_configs_memcalc_does_not_model_are_refused_by_name(changes, field):
    with pytest.raises(MemcalcError, match=field):
        ModelSpec.from_hf_config({**STABLELM_2_1_6B, **changes})


@pytest.mark.parametrize("fields,name", [({"world_size": 2, "tensor_parallel": 2}, "tensor_parallel")])
def test_what_the_family_does_not_declare_is_refused_by_name(fields, name):
    spec = ModelSpec.from_hf_config({**STABLELM_2_1_6B, "num_hidden_layers": 2})
    with pytest.raises(NotModelledError, match=name):
        estimate(spec, TrainingConfig(micro_batch=1, seq_len=8, **fields))


# (shape, training) rows measured on the real model: GQA with q/k/v biases and half rotary,
# sequential; MHA without biases, quarter rotary, parallel residual, dropout, tied embeddings
SHAPES = {"gqa-seq": dict(vocab_size=500, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=176, qkv_bias=True, rotary_fraction=0.5),
          "mha-par": dict(vocab_size=500, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=176,
                          rotary_fraction=0.25, parallel_residual=True, resid_dropout=0.1, attn_dropout=0.1,
                          tie_embeddings=True)}
ROWS = [(shape, precision, ckpt, attention) for shape in SHAPES for precision in ("fp32", "bf16-amp")
        for ckpt in ("none", "per-layer") for attention in ("eager", "sdpa")]


@pytest.mark.slow
@pytest.mark.parametrize("shape,precision,checkpointing,attention", ROWS)
def test_the_predicted_peak_is_the_measured_peak(shape, precision, checkpointing, attention):
    pytest.importorskip("transformers")
    from validate.measure.backends import measure

    spec = ModelSpec.make(family="stablelm", name=f"stablelm-{shape}", max_position_embeddings=256,
                          out_bias=False, mlp_bias=False, activation="silu", **SHAPES[shape])
    training = TrainingConfig(micro_batch=3, seq_len=40, precision=precision, checkpointing=checkpointing,
                              attention=attention, device="cpu")
    measured = measure(spec, training).peak_bytes
    assert abs(estimate(spec, training).peak_bytes - measured) <= 1e-4 * measured
