"""StableLM (transformers 5.24 models/stablelm: configuration_stablelm.py StableLmConfig,
modeling_stablelm.py StableLmForCausalLM; stabilityai/stablelm-2-*, stablelm-3b-4e1t): LayerNorm
with bias, q/k/v with use_qkv_bias (o_proj without), partial rotary, a SwiGLU MLP without
biases, hidden_dropout on the MLP branch only, optionally the parallel residual (one norm for
attention and MLP). The program: memcalc.families.hf_stablelm. qk_layernorm (StableLmLayerNormPerHead:
one LayerNorm per head over split/cat views) is refused by name.
"""
from __future__ import annotations

from types import MappingProxyType

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.families.declaration import ALL_MASKS, LLAMA_CONFIG_KEYS, FamilyDeclaration, HFType, Supports
from memcalc.inputs.hf.values import flag, get, partial_rotary_factor

STABLELM = FamilyDeclaration(
    "stablelm", programs={"hf": "hf_stablelm:PROGRAM"},
    hf_types=(HFType("stablelm", "StableLmConfig", "StableLmForCausalLM",
                     reader="memcalc.families.declarations.stablelm:fields",
                     modelled=frozenset({"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "intermediate_size",
                                         "max_position_embeddings", "tie_word_embeddings", "hidden_act",
                                         "attention_dropout", "hidden_dropout", "use_qkv_bias",
                                         "use_parallel_residual", "qk_layernorm", "partial_rotary_factor",
                                         "rope_parameters", "_name_or_path"})),),
    config_keys=MappingProxyType(dict(LLAMA_CONFIG_KEYS, resid_dropout="hidden_dropout",
                                      rotary_fraction="rope_parameters.partial_rotary_factor")),
    block_parameters="memcalc.families.declarations.stablelm:block_parameters", outer_parameters="layernorm",
    supports=Supports(trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True,
                      dropouts=frozenset({"attn", "resid"}),
                      partial_rotary=True, parallel_residual=True,
                      # StableLmAttention views q/k/v with self.num_heads (the config's, not -1,
                      # modeling_stablelm.py) and reshapes its output to hidden_size
                      tensor_parallel_refusal=("StableLM's self_attn views q_proj/k_proj/v_proj "
                                               "outputs at the config's num_heads, which a column "
                                               "split of them cannot meet: no tensor-parallel plan",
                                               "use tensor_parallel=1 (data parallelism and FSDP "
                                               "are modelled)")),
    biases=((False, False, False), (True, False, False)),
    check="memcalc.families.declarations.stablelm:check",
    builder="memcalc.families.declarations.stablelm:hf_config")
DECLARATIONS = (STABLELM,)


def check(spec: object) -> None:
    """StableLmAttention computes head_dim = hidden_size // num_heads and refuses a hidden_size
    it does not divide.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> check(ModelSpec.make(family="stablelm", vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
    ...                      intermediate_size=8, qkv_bias=False, out_bias=False, mlp_bias=False))
    """
    if spec.head_size * spec.num_heads != spec.hidden_size:
        raise ValueError("stablelm needs head_dim = hidden_size / num_heads; drop head_dim")


def fields(cfg: dict, _model_type: str = "stablelm") -> dict:
    """StableLmConfig's fields (its defaults for absent keys).

    >>> f = fields({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    ...             "num_key_value_heads": 2})
    >>> f["rotary_fraction"], f["qkv_bias"], f["parallel_residual"], f["intermediate_size"]
    (0.25, False, False, 6912)
    """
    act = get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use silu")
    if flag(cfg, "qk_layernorm", False):
        raise NotModelledError("hf_config.qk_layernorm", "StableLmLayerNormPerHead (one LayerNorm per "
                               "head over split and concatenated views) is not modelled", "set it to false")
    return dict(family="stablelm", vocab_size=get(cfg, "vocab_size", 50304),
                hidden_size=get(cfg, "hidden_size", 2560), num_layers=get(cfg, "num_hidden_layers", 32),
                num_heads=get(cfg, "num_attention_heads", 32), num_kv_heads=get(cfg, "num_key_value_heads", 32),
                intermediate_size=get(cfg, "intermediate_size", 6912),
                max_position_embeddings=get(cfg, "max_position_embeddings", 4096),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), qkv_bias=flag(cfg, "use_qkv_bias", False),
                out_bias=False, mlp_bias=False, activation="silu", attn_dropout=get(cfg, "attention_dropout", 0.0),
                resid_dropout=get(cfg, "hidden_dropout", 0.0),
                parallel_residual=flag(cfg, "use_parallel_residual", False),
                rotary_fraction=partial_rotary_factor(cfg, 0.25))


def block_parameters(spec: object, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """StableLmDecoderLayer in registration order: self_attn q/k/v (biases with use_qkv_bias),
    o_proj; mlp gate/up/down; input_layernorm and, without the parallel residual,
    post_attention_layernorm (weights and biases).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> spec = ModelSpec.make(family="stablelm", vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
    ...                       intermediate_size=16, qkv_bias=True, out_bias=False, mlp_bias=False)
    >>> sum(n for _, n in block_parameters(spec, 8, 16, 8, 8))
    696
    """
    bias = spec.qkv_bias
    norms = ["input_layernorm"] + ["post_attention_layernorm"] * (not spec.parallel_residual)
    return [("q_proj.weight", h * q)] + [("q_proj.bias", q)] * bias + [("k_proj.weight", h * kv)] \
        + [("k_proj.bias", kv)] * bias + [("v_proj.weight", h * kv)] + [("v_proj.bias", kv)] * bias \
        + [("o_proj.weight", q * h), ("gate_proj.weight", h * f), ("up_proj.weight", h * f),
           ("down_proj.weight", f * h)] + [(f"{n}.{w}", h) for n in norms for w in ("weight", "bias")]


def hf_config(spec: object) -> dict:
    """A StableLmConfig dict that builds the spec's architecture (validate.models.hf).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> spec = ModelSpec.from_hf_config({"model_type": "stablelm", "num_hidden_layers": 2})
    >>> ModelSpec.from_hf_config(hf_config(spec)) == spec.with_(name="stablelm")
    True
    """
    if spec.out_bias or spec.mlp_bias:
        raise SpecError("out_bias", "HF StableLM has no o_proj or MLP biases", "set out_bias and mlp_bias false")
    return dict(model_type="stablelm", vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.kv_heads, intermediate_size=spec.ffn_size,
                max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=spec.tie_embeddings,
                hidden_act="silu", attention_dropout=spec.attn_dropout, hidden_dropout=spec.resid_dropout,
                use_qkv_bias=spec.qkv_bias, use_parallel_residual=spec.parallel_residual, qk_layernorm=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": spec.rotary_fraction},
                bos_token_id=0, eos_token_id=0, pad_token_id=None)
