"""Parameter counts per tensor, as nn.Module registers them (tied weights counted once).

Source: transformers' modeling_gpt2.py (Conv1D c_attn/c_proj/c_fc, wte, wpe, ln_*) and
modeling_llama.py (q/k/v/o_proj, gate/up/down_proj, RMSNorm weights, lm_head), modeling_qwen3.py
and modeling_gemma*.py (the same, plus q_norm/k_norm and the feed-forward norms); validate.models.reference
registers the same tensors.
"""
from __future__ import annotations

from memcalc.inputs.model_fields import ModelFields


def block_param_shapes(spec: ModelFields) -> list[tuple[str, int]]:
    """(name, numel) of one block's parameters, in registration order: the inventory the family
    declares (FamilyDeclaration.block_parameters, memcalc.families.registry).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> sum(n for _, n in block_param_shapes(ModelSpec.preset("gpt2")))
    7087872
    """
    from memcalc.families.declaration import resolve
    from memcalc.families.registry import declaration

    h, f = spec.hidden_size, spec.ffn_size
    q, kv = spec.num_heads * spec.head_size, spec.kv_heads * spec.head_size
    return resolve(declaration(spec.family).block_parameters)(spec, h, f, q, kv)


def gpt2_block(spec: ModelFields, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """GPT2Block: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj); biases as the spec
    configures them (the reference model's flags)."""
    return [("ln_1.weight", h), ("ln_1.bias", h), ("attn.c_attn.weight", h * (q + 2 * kv))] \
        + [("attn.c_attn.bias", q + 2 * kv)] * spec.qkv_bias \
        + [("attn.c_proj.weight", q * h)] + [("attn.c_proj.bias", h)] * spec.out_bias \
        + [("ln_2.weight", h), ("ln_2.bias", h), ("mlp.c_fc.weight", h * f)] \
        + [("mlp.c_fc.bias", f)] * spec.mlp_bias + [("mlp.c_proj.weight", f * h)] \
        + [("mlp.c_proj.bias", h)] * spec.mlp_bias


def llama_block(spec: ModelFields, h: int, _f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """LlamaDecoderLayer and the classes shaped like it: q/k/v/o (biases as configured), the
    declaration's q/k norms of a MoE block ('head': Qwen3-MoE's per head, 'projection': OLMoE's over
    the whole projection), the MLP (dense or MoE), Qwen3/Gemma-3's per-head q/k norms (qk_norm),
    Gemma-2/3's norms around the MLP (sandwich_norms)."""
    from memcalc.families.registry import declaration

    decl = declaration(spec.family)
    shapes = [("input_layernorm.weight", h), ("q_proj.weight", h * q), ("k_proj.weight", h * kv),
              ("v_proj.weight", h * kv), ("o_proj.weight", q * h)]
    if spec.qkv_bias:
        shapes += [("q_proj.bias", q), ("k_proj.bias", kv), ("v_proj.bias", kv)]
    if spec.out_bias:
        shapes += [("o_proj.bias", h)]
    if decl.qk_norm_parameters is not None:  # q_norm/k_norm: per head (Qwen3) or whole (OLMoE)
        per_head = decl.qk_norm_parameters == "head"
        shapes += [("q_norm.weight", spec.head_size if per_head else q),
                   ("k_norm.weight", spec.head_size if per_head else kv)]
    shapes += [("post_attention_layernorm.weight", h)] + mlp_param_shapes(spec, sparse=spec.moe is not None)
    if spec.qk_norm:  # Qwen3Attention / Gemma3Attention q_norm, k_norm over head_dim
        shapes += [("q_norm.weight", spec.head_size), ("k_norm.weight", spec.head_size)]
    if decl.sandwich_norms:  # Gemma2DecoderLayer's norms around the MLP
        shapes += [("pre_feedforward_layernorm.weight", h), ("post_feedforward_layernorm.weight", h)]
    return shapes


def mlp_param_shapes(spec: ModelFields, sparse: bool) -> list[tuple[str, int]]:
    """(name, numel) of a Llama-style MLP: dense SwiGLU, or a MoE block (router (E, h), experts
    gate_up_proj (E, 2f, h) and down_proj (E, h, f), Qwen2-MoE's shared expert and its gate).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> sum(n for _, n in mlp_param_shapes(ModelSpec.preset("mixtral-8x7b"), sparse=True))
    1409318912
    """
    h, f = spec.hidden_size, spec.ffn_size
    if not sparse:
        shapes = [("gate_proj.weight", h * f), ("up_proj.weight", h * f), ("down_proj.weight", f * h)]
        return shapes + ([("gate_proj.bias", f), ("up_proj.bias", f), ("down_proj.bias", h)]
                         if spec.mlp_bias else [])
    moe = spec.moe
    E, fe = moe.num_experts, moe.expert_ffn_size
    shapes = [("gate.weight", E * h), ("experts.gate_up_proj", E * 2 * fe * h), ("experts.down_proj", E * h * fe)]
    if moe.shared_expert_ffn_size:
        fs = moe.shared_expert_ffn_size
        shapes += [("shared_expert.gate_proj.weight", h * fs), ("shared_expert.up_proj.weight", h * fs),
                   ("shared_expert.down_proj.weight", fs * h), ("shared_expert_gate.weight", h)]
    return shapes


def outer_param_shapes(spec: ModelFields) -> list[tuple[str, int]]:
    """(name, numel) of the parameters outside the blocks: embeddings, final norm, output layer.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> dict(outer_param_shapes(ModelSpec.preset("gpt2")))["wpe"]
    786432
    """
    from memcalc.families.registry import declaration

    h, V = spec.hidden_size, spec.vocab_size
    shapes = [("wte", V * h)]
    outer = declaration(spec.family).outer_parameters
    if outer == "gpt2":
        shapes += [("wpe", spec.max_position_embeddings * h), ("ln_f.weight", h), ("ln_f.bias", h)]
    elif outer == "layernorm":
        shapes += [("final_layer_norm.weight", h), ("final_layer_norm.bias", h)]
    else:
        shapes += [("norm.weight", h)]
    if not spec.tie_embeddings:
        shapes += [("lm_head", V * h)]
    return shapes


def parameter_count(spec: ModelFields) -> int:
    """All trainable parameters.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> parameter_count(ModelSpec.preset("llama-2-70b"))
    68976648192
    """
    block = sum(n for _, n in block_param_shapes(spec))
    total = spec.num_layers * block + sum(n for _, n in outer_param_shapes(spec))
    if spec.moe is not None and spec.moe.dense_layers:  # Qwen-MoE dense layers: a SwiGLU instead
        swap = (sum(n for _, n in mlp_param_shapes(spec, sparse=False))
                - sum(n for _, n in mlp_param_shapes(spec, sparse=True)))
        total += len(spec.moe.dense_layers) * swap
    return total


def active_parameter_count(spec: ModelFields) -> int:
    """Parameters one token runs through: a MoE layer's router, its top_k experts and its
    shared expert (the published "active" figure); all parameters for a dense model.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> active_parameter_count(ModelSpec.preset("mixtral-8x7b"))
    12879925248
    """
    if spec.moe is None:
        return parameter_count(spec)
    from memcalc.inputs.moe_routing import moe_layers

    moe = spec.moe
    idle = (moe.num_experts - moe.top_k) * expert_param_count(spec)
    return parameter_count(spec) - len(moe_layers(spec)) * idle


def expert_param_count(spec: ModelFields) -> int:
    """Parameters of one routed expert: gate_up (2f, h) and down (h, f), with GPT-OSS's biases
    (2f and h: modeling_gpt_oss.py GptOssExperts).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> expert_param_count(ModelSpec.preset("gpt-oss-20b"))
    24891840
    """
    from memcalc.families.registry import declaration

    h, f = spec.hidden_size, spec.moe.expert_ffn_size
    return 3 * h * f + (2 * f + h if declaration(spec.family).expert_biases else 0)


# ---- families with their own HF modules (modeling_phi3.py, modeling_gpt_neox.py, modeling_olmo2.py),
# named by their declarations' block_parameters
def phi3_block(_spec: ModelFields, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """Phi3DecoderLayer: self_attn (o_proj registered before the fused qkv_proj), mlp (fused
    gate_up_proj, down_proj), the two RMSNorms; no biases."""
    return [("o_proj.weight", q * h), ("qkv_proj.weight", h * (q + 2 * kv)),
            ("gate_up_proj.weight", h * 2 * f), ("down_proj.weight", f * h),
            ("input_layernorm.weight", h), ("post_attention_layernorm.weight", h)]


def gpt_neox_block(spec: ModelFields, h: int, f: int, q: int, _kv: int) -> list[tuple[str, int]]:
    """GPTNeoXLayer: two LayerNorms with biases, fused query_key_value and dense (biases with
    attention_bias), the MLP's two linears (always biased)."""
    attn = [("query_key_value.weight", h * 3 * q)] + [("query_key_value.bias", 3 * q)] * spec.qkv_bias \
        + [("dense.weight", q * h)] + [("dense.bias", h)] * spec.out_bias
    return [("input_layernorm.weight", h), ("input_layernorm.bias", h),
            ("post_attention_layernorm.weight", h), ("post_attention_layernorm.bias", h)] + attn \
        + [("dense_h_to_4h.weight", h * f), ("dense_h_to_4h.bias", f),
           ("dense_4h_to_h.weight", f * h), ("dense_4h_to_h.bias", h)]


def olmo2_block(spec: ModelFields, h: int, f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """Olmo2DecoderLayer: q/k/v/o (biases with attention_bias), q_norm (a*d) and k_norm (kv*d)
    over the whole projection, the SwiGLU MLP, the two post-norms."""
    bias = spec.qkv_bias
    return [("q_proj.weight", h * q)] + [("q_proj.bias", q)] * bias + [("k_proj.weight", h * kv)] \
        + [("k_proj.bias", kv)] * bias + [("v_proj.weight", h * kv)] + [("v_proj.bias", kv)] * bias \
        + [("o_proj.weight", q * h)] + [("o_proj.bias", h)] * bias \
        + [("q_norm.weight", q), ("k_norm.weight", kv), ("gate_proj.weight", h * f),
           ("up_proj.weight", h * f), ("down_proj.weight", f * h),
           ("post_attention_layernorm.weight", h), ("post_feedforward_layernorm.weight", h)]


def gpt_oss_block(spec: ModelFields, h: int, _f: int, q: int, kv: int) -> list[tuple[str, int]]:
    """GptOssDecoderLayer (modeling_gpt_oss.py): self_attn's sinks (one per head: its own
    parameter, listed before its submodules') and q/k/v/o (biases with attention_bias); mlp
    router (E, h) + bias (E), experts gate_up_proj (E, h, 2f) + bias (E, 2f), down_proj (E, f, h)
    + bias (E, h); the two RMSNorms."""
    bias, E, f = spec.qkv_bias, spec.moe.num_experts, spec.moe.expert_ffn_size
    return [("sinks", spec.num_heads), ("q_proj.weight", h * q)] + [("q_proj.bias", q)] * bias \
        + [("k_proj.weight", h * kv)] + [("k_proj.bias", kv)] * bias + [("v_proj.weight", h * kv)] \
        + [("v_proj.bias", kv)] * bias + [("o_proj.weight", q * h)] + [("o_proj.bias", h)] * bias \
        + [("router.weight", E * h), ("router.bias", E), ("experts.gate_up_proj", E * h * 2 * f),
           ("experts.gate_up_proj_bias", E * 2 * f), ("experts.down_proj", E * f * h),
           ("experts.down_proj_bias", E * h), ("input_layernorm.weight", h),
           ("post_attention_layernorm.weight", h)]
