"""transformers MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and OlmoeForCausalLM
(models/*/modeling_*.py, transformers 5.x; use_cache and the masks: memcalc.families.call_path):
the Llama trunk (embeddings, rotary tables, RMSNorms, attention, loss: memcalc.families.hf_llama)
with a sparse MoE block
(memcalc.families.moe) in place of the MLP, except in Qwen-MoE's dense layers.

Attention differs by family: Qwen3-MoE RMSNorms q and k per head (q_norm/k_norm of head_dim, on
the (b, s, heads, d) view); OLMoE over the whole projection (q_norm of heads*d, k_norm of
kv_heads*d) before the view; Mixtral and Qwen2-MoE as Llama (Qwen2-MoE with q/k/v biases).
"""
from __future__ import annotations

from typing import Callable

from memcalc.inputs.moe_routing import moe_layers
from memcalc.families.attention import attention_core, llama_eager, sdpa_attention
from memcalc.families.base import TOKENS, param_maker
from memcalc.families.call_path import cache_kv
from memcalc.families.hf_llama import HFLlama
from memcalc.families.layers import apply_rotary_pos_emb, qkv_projections, rms_norm, rotary, swiglu_mlp
from memcalc.families.moe import sparse_moe_block
from memcalc.families.moe_aux import add_aux_loss
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Value
from memcalc.tape.ops import Ops


def attention(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, context: dict,
              p: Callable[..., Value]) -> tuple[Value, Value]:
    """The family's attention module; returns (output, weights)."""
    a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    q, k, v = qkv_projections(ops, spec, x, p)
    if spec.family == "qwen3_moe":  # Qwen3MoeRMSNorm(head_dim) on the (b, s, heads, d) views
        q = rms_norm(ops, q, p("self_attn.q_norm.weight", d), TOKENS * a, weight_in_fp32=False)
        k = rms_norm(ops, k, p("self_attn.k_norm.weight", d), TOKENS * kv, weight_in_fp32=False)
    elif spec.family == "olmoe":  # OlmoeRMSNorm over the whole projection
        q = rms_norm(ops, q, p("self_attn.q_norm.weight", a * d), TOKENS, weight_in_fp32=False)
        k = rms_norm(ops, k, p("self_attn.k_norm.weight", kv * d), TOKENS, weight_in_fp32=False)
    cos, sin = context["cos"], context["sin"]
    q, k = apply_rotary_pos_emb(ops, q, k, lambda q, k: (rotary(ops, q, cos, sin, a, d),
                                                         rotary(ops, k, cos, sin, kv, d)))
    k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies

    def core():
        if regime.attention == "sdpa":
            return sdpa_attention(ops, spec, q, k, v, context["mask"], contiguous), None
        return llama_eager(ops, spec, q, k, v, context["mask"], contiguous=contiguous)

    y, weights = attention_core(ops, regime, core, context.get("position_ids"))
    out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h),
                         p("self_attn.o_proj.bias", h) if spec.out_bias else None, TOKENS, h, "o_proj")
    ops.scope_end([q, k, v])  # the attention module's locals
    return out, weights


class HFMoE(HFLlama):
    """A Llama-trunk causal LM whose MLPs are sparse MoE blocks."""

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One decoder layer (MixtralDecoderLayer and its kin)."""
        block_input = x
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = rms_norm(ops, x, p("input_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        attn, weights = attention(ops, spec, regime, n1, context, p)
        ops.scope_end([n1])  # hf_llama.BLOCK_REBINDING
        x = ops.add(x, attn, "residual 1")
        n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        if layer in moe_layers(spec):
            m = sparse_moe_block(ops, spec, regime, n2, layer, p, context.setdefault("router_logits", []))
        else:
            m = swiglu_mlp(ops, spec, n2, TOKENS, p)
        ops.scope_end([n2])  # hf_llama.BLOCK_REBINDING
        out = ops.add(x, m, "residual 2")
        ops.scope_end([block_input, weights])
        return out

    def auxiliary_loss(self, ops: Ops, spec: ModelSpec, context: dict) -> None:
        """With output_router_logits: the load-balancing loss over the captured router logits,
        added to the loss; the logits and aux_loss live until the forward returns (the output
        object holds them)."""
        if not spec.moe.output_router_logits:
            return
        captured = context.get("router_logits", [])
        aux = add_aux_loss(ops, spec, captured)
        ops.scope_end(captured + [aux])

    def registration_rank(self, label: str) -> tuple:
        """nn.Module registration order: embed_tokens, layers (self_attn, mlp, the two norms),
        norm, lm_head; inside the MoE block, the family's order of router and experts."""
        outer = {"model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}
        if not label.startswith("model.layers."):
            return (outer[label], 0, 0)
        i, name = label[len("model.layers."):].split(".", 1)
        return (1, int(i), LAYER_ORDER.index(name))


ATTENTION_ORDER = [f"self_attn.{n}.{w}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")
                   for w in ("weight", "bias")] + ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
# Qwen3-MoE registers experts before the router; the others the router first (modeling_*.py)
LAYER_ORDER = ATTENTION_ORDER + [
    "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight", "mlp.experts.gate_up_proj",
    "mlp.experts.down_proj", "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
    "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"]


class HFQwen3MoE(HFMoE):
    """Qwen3MoeSparseMoeBlock registers its experts before its router."""

    def registration_rank(self, label: str) -> tuple:
        """As HFMoE, with mlp.experts.* ahead of mlp.gate (LAYER_ORDER's first entries)."""
        return super().registration_rank(label)


class HFRouterFirst(HFMoE):
    """Mixtral, Qwen2-MoE, OLMoE: the router (mlp.gate) registered before the experts."""

    def registration_rank(self, label: str) -> tuple:
        """As HFMoE, with mlp.experts.* after mlp.gate."""
        rank = super().registration_rank(label)
        if "mlp.experts." in label:
            return rank[:2] + (rank[2] + 3,)  # the second listing, after mlp.gate.weight
        return rank


# one program per family (memcalc.families.declarations.moe)
MIXTRAL, QWEN2_MOE, OLMOE, QWEN3_MOE = HFRouterFirst(), HFRouterFirst(), HFRouterFirst(), HFQwen3MoE()
