"""Parameter counts per tensor, as nn.Module registers them (tied weights counted once).

Source: transformers' modeling_gpt2.py (Conv1D c_attn/c_proj/c_fc, wte, wpe, ln_*) and
modeling_llama.py (q/k/v/o_proj, gate/up/down_proj, RMSNorm weights, lm_head); validate.models
registers the same tensors.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.specs import ModelSpec


def block_param_shapes(spec: ModelSpec) -> list[tuple[str, int]]:
    """(name, numel) of one block's parameters, in registration order.

    >>> from memcalc.specs import ModelSpec
    >>> sum(n for _, n in block_param_shapes(ModelSpec.preset("gpt2")))
    7087872
    """
    h, f = spec.hidden_size, spec.ffn_size
    q, kv = spec.num_heads * spec.head_size, spec.kv_heads * spec.head_size
    if spec.family in FAMILY_BLOCKS:
        return FAMILY_BLOCKS[spec.family](spec, h, f, q, kv)
    if spec.family == "gpt2":  # biases as the spec configures them (the reference model's flags)
        return [("ln_1.weight", h), ("ln_1.bias", h), ("attn.c_attn.weight", h * (q + 2 * kv))] \
            + [("attn.c_attn.bias", q + 2 * kv)] * spec.qkv_bias \
            + [("attn.c_proj.weight", q * h)] + [("attn.c_proj.bias", h)] * spec.out_bias \
            + [("ln_2.weight", h), ("ln_2.bias", h), ("mlp.c_fc.weight", h * f)] \
            + [("mlp.c_fc.bias", f)] * spec.mlp_bias + [("mlp.c_proj.weight", f * h)] \
            + [("mlp.c_proj.bias", h)] * spec.mlp_bias
    shapes = [("input_layernorm.weight", h), ("q_proj.weight", h * q), ("k_proj.weight", h * kv),
              ("v_proj.weight", h * kv), ("o_proj.weight", q * h)]
    if spec.qkv_bias:
        shapes += [("q_proj.bias", q), ("k_proj.bias", kv), ("v_proj.bias", kv)]
    if spec.out_bias:
        shapes += [("o_proj.bias", h)]
    shapes += [("post_attention_layernorm.weight", h), ("gate_proj.weight", h * f),
               ("up_proj.weight", h * f), ("down_proj.weight", f * h)]
    if spec.mlp_bias:
        shapes += [("gate_proj.bias", f), ("up_proj.bias", f), ("down_proj.bias", h)]
    return shapes


def outer_param_shapes(spec: ModelSpec) -> list[tuple[str, int]]:
    """(name, numel) of the parameters outside the blocks: embeddings, final norm, output layer.

    >>> from memcalc.specs import ModelSpec
    >>> dict(outer_param_shapes(ModelSpec.preset("gpt2")))["wpe"]
    786432
    """
    h, V = spec.hidden_size, spec.vocab_size
    shapes = [("wte", V * h)]
    if spec.family == "gpt2":
        shapes += [("wpe", spec.max_position_embeddings * h), ("ln_f.weight", h), ("ln_f.bias", h)]
    elif spec.family == "gpt_neox":
        shapes += [("final_layer_norm.weight", h), ("final_layer_norm.bias", h)]
    else:
        shapes += [("norm.weight", h)]
    if not spec.tie_embeddings:
        shapes += [("lm_head", V * h)]
    return shapes


def parameter_count(spec: ModelSpec) -> int:
    """All trainable parameters.

    >>> from memcalc.specs import ModelSpec
    >>> parameter_count(ModelSpec.preset("llama-2-70b"))
    68976648192
    """
    block = sum(n for _, n in block_param_shapes(spec))
    return spec.num_layers * block + sum(n for _, n in outer_param_shapes(spec))


# ---- families with their own HF modules (modeling_phi3.py, modeling_gpt_neox.py, modeling_olmo2.py)
def _phi3_block(_spec: ModelSpec, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """Phi3DecoderLayer: self_attn (o_proj registered before the fused qkv_proj), mlp (fused
    gate_up_proj, down_proj), the two RMSNorms; no biases."""
    return [("o_proj.weight", q * h), ("qkv_proj.weight", h * (q + 2 * kv)),
            ("gate_up_proj.weight", h * 2 * f), ("down_proj.weight", f * h),
            ("input_layernorm.weight", h), ("post_attention_layernorm.weight", h)]


def _gpt_neox_block(spec: ModelSpec, h: int, f: int, q: int, _kv: int) -> list[tuple[str, int]]:
    """GPTNeoXLayer: two LayerNorms with biases, fused query_key_value and dense (biases with
    attention_bias), the MLP's two linears (always biased)."""
    attn = [("query_key_value.weight", h * 3 * q)] + [("query_key_value.bias", 3 * q)] * spec.qkv_bias \
        + [("dense.weight", q * h)] + [("dense.bias", h)] * spec.out_bias
    return [("input_layernorm.weight", h), ("input_layernorm.bias", h),
            ("post_attention_layernorm.weight", h), ("post_attention_layernorm.bias", h)] + attn \
        + [("dense_h_to_4h.weight", h * f), ("dense_h_to_4h.bias", f),
           ("dense_4h_to_h.weight", f * h), ("dense_4h_to_h.bias", h)]


def _olmo2_block(spec: ModelSpec, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """Olmo2DecoderLayer: q/k/v/o (biases with attention_bias), q_norm (a*d) and k_norm (kv*d)
    over the whole projection, the SwiGLU MLP, the two post-norms."""
    bias = spec.qkv_bias
    return [("q_proj.weight", h * q)] + [("q_proj.bias", q)] * bias + [("k_proj.weight", h * kv)] \
        + [("k_proj.bias", kv)] * bias + [("v_proj.weight", h * kv)] + [("v_proj.bias", kv)] * bias \
        + [("o_proj.weight", q * h)] + [("o_proj.bias", h)] * bias \
        + [("q_norm.weight", q), ("k_norm.weight", kv), ("gate_proj.weight", h * f),
           ("up_proj.weight", h * f), ("down_proj.weight", f * h),
           ("post_attention_layernorm.weight", h), ("post_feedforward_layernorm.weight", h)]


FAMILY_BLOCKS = {"phi3": _phi3_block, "gpt_neox": _gpt_neox_block, "olmo2": _olmo2_block}
