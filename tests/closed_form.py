"""Second methods the tests check the engine against, written apart from memcalc's own code."""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec


def closed_form_rank_params(spec: ModelSpec, t: int) -> int:
    """Parameters one rank holds: embeddings, norms and LM head whole; attention and MLP
    weights (and column biases) divided by t; row-parallel biases whole (Shoeybi et al. 2019,
    section 3)."""
    h, L, V, a, kv, d, f = (spec.hidden_size, spec.num_layers, spec.vocab_size, spec.num_heads,
                            spec.kv_heads, spec.head_size, spec.ffn_size)
    embed = V * h * (1 if spec.tie_embeddings else 2)
    if spec.family == "gpt2":
        embed += spec.max_position_embeddings * h
        norms = (2 * L + 1) * 2 * h
        attn = h * 3 * a * d // t + (3 * a * d // t if spec.qkv_bias else 0) + a * d * h // t \
            + (h if spec.out_bias else 0)
        mlp = 2 * h * f // t + ((f // t + h) if spec.mlp_bias else 0)
    elif spec.family == "gpt_neox":  # LayerNorms with biases; MLP biases always
        norms = (2 * L + 1) * 2 * h
        attn = 4 * h * h // t + (3 * h // t + h if spec.qkv_bias else 0)
        mlp = 2 * h * f // t + f // t + h
    elif spec.family == "stablelm":  # LayerNorms with biases (one a layer with the parallel residual), no o/MLP biases
        norms = ((1 if spec.parallel_residual else 2) * L + 1) * 2 * h
        attn = h * (a + 2 * kv) * d // t + ((a + 2 * kv) * d // t if spec.qkv_bias else 0) + a * d * h // t
        mlp = 3 * h * f // t
    elif spec.family == "phi3":  # fused qkv_proj and gate_up_proj hold the same weights, no biases
        norms = (2 * L + 1) * h
        attn = h * (a + 2 * kv) * d // t + a * d * h // t
        mlp = 3 * h * f // t
    else:
        sandwich = spec.family in ("gemma2", "gemma3")  # pre/post feed-forward norms
        norms = ((4 if sandwich else 2) * L + 1) * h + (2 * L * d if spec.qk_norm else 0) \
            + (L * (a + kv) * d if spec.family == "olmo2" else 0)  # OLMo-2 q/k norms over the projection
        attn = h * (a + 2 * kv) * d // t + ((a + 2 * kv) * d // t if spec.qkv_bias else 0) \
            + a * d * h // t + (h if spec.out_bias else 0)
        mlp = 3 * h * f // t + ((2 * f // t + h) if spec.mlp_bias else 0)
    if spec.moe is not None:  # mixture of experts (t = 1): q/k norms, router, experts, shared expert
        m = spec.moe
        attn += {"qwen3_moe": 2 * d, "olmoe": (a + kv) * d, "gpt_oss": a}.get(spec.family, 0)  # GPT-OSS: sinks
        sparse = m.num_experts * h + 3 * m.num_experts * h * m.expert_ffn_size \
            + (3 * h * m.shared_expert_ffn_size + h if m.shared_expert_ffn_size else 0)
        if spec.family == "gpt_oss":  # router bias, expert biases (2f up, h down each)
            sparse += m.num_experts * (1 + 2 * m.expert_ffn_size + h)
        dense = len(m.dense_layers)
        return embed + norms + L * attn + dense * mlp + (L - dense) * sparse
    return embed + norms + L * (attn + mlp)
