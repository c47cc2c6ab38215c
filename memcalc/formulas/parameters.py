"""Parameter counts per tensor, as nn.Module registers them (tied weights counted once).

Source: transformers' modeling_gpt2.py (Conv1D c_attn/c_proj/c_fc, wte, wpe, ln_*) and
modeling_llama.py (q/k/v/o_proj, gate/up/down_proj, RMSNorm weights, lm_head), modeling_qwen3.py
and modeling_gemma*.py (the same, plus q_norm/k_norm and the feed-forward norms); validate.models
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
    if spec.qk_norm:  # Qwen3Attention / Gemma3Attention q_norm, k_norm over head_dim
        shapes += [("q_norm.weight", spec.head_size), ("k_norm.weight", spec.head_size)]
    if spec.family in ("gemma2", "gemma3"):  # Gemma2DecoderLayer's norms around the MLP
        shapes += [("pre_feedforward_layernorm.weight", h), ("post_feedforward_layernorm.weight", h)]
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
