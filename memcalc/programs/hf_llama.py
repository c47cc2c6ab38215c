"""transformers LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM (models/llama/
modeling_llama.py, transformers 5.x), use_cache=False.

LlamaRMSNorm upcasts to fp32 and saves the fp32 copy, its square, the normalised tensor and the
rsqrt; rotary embedding multiplies q and k by cos/sin tables computed once per forward (fp32 under
autocast, so q and k are promoted to fp32); rotate_half slices and concatenates; eager attention
materialises repeat_kv copies of k and v; sdpa passes enable_gqa when there is no mask
(integrations/sdpa_attention.py use_gqa_in_sdpa).
"""
from __future__ import annotations

from typing import Callable

from memcalc.programs.attention import attention_core, llama_eager, sdpa
from memcalc.programs.base import TOKENS, DecoderProgram, Embedded, input_require_grads, param_maker, size
from memcalc.programs.layers import qkv_projections, rms_norm, rotary, rotary_tables, swiglu_mlp
from memcalc.programs.loss import hf_causal_lm_loss
from memcalc.regime import Regime
from memcalc.specs import ModelSpec
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops


def attention(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, context: dict,
              p: Callable[..., Value]) -> tuple[Value, Value]:
    """LlamaAttention with the configured attention interface; returns (output, weights)."""
    a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    N = TOKENS
    q, k, v = qkv_projections(ops, spec, x, p)
    cos, sin = context["cos"], context["sin"]
    q, k = rotary(ops, q, cos, sin, a, d), rotary(ops, k, cos, sin, kv, d)
    q_local, k_local, v_local = q, k, v

    def core():
        if regime.attention == "sdpa":
            return sdpa(ops, spec, *(ops.matmul_operand(t) for t in (q, k, v))), None
        return llama_eager(ops, spec, q, k, v, context["mask"])

    y, weights = attention_core(ops, regime, core)
    out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h),
                         p("self_attn.o_proj.bias", h) if spec.out_bias else None, N, h, "o_proj")
    ops.scope_end([q_local, k_local, v_local])  # LlamaAttention's locals
    return out, weights


class HFLlama(DecoderProgram):
    """LlamaForCausalLM: parameters model.embed_tokens, model.layers.{i}.*, model.norm, lm_head."""

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_tokens(ids); position_ids; a (b,1,s,s) float mask for eager attention; the
        rotary cos/sin tables computed once per forward."""
        g, h, V = ops.g, spec.hidden_size, spec.vocab_size
        ids = g.input("input_ids", size("b s", 8))
        embed = ops.param("model.embed_tokens.weight", V * h, V)
        x = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
                 backward=[Grad(0)], elt=embed.elt)
        input_require_grads(ops, x)
        g.op("position_ids", [], size("s", 8), requires_grad=False, elt=8)
        mask = None
        if regime.attention == "eager":
            mask = g.op("causal mask", [], size("b s s", x.elt), requires_grad=False, elt=x.elt)
        cos, sin = rotary_tables(ops, spec.head_size, x.elt)
        return Embedded(x, ids, {"mask": mask, "cos": cos, "sin": sin},
                        held_until_norm=[x, mask, cos, sin])  # inputs_embeds lives to return

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One LlamaDecoderLayer."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = rms_norm(ops, x, p("input_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        attn, weights = attention(ops, spec, regime, n1, context, p)  # `hidden_states, _ = ...`
        x = ops.add(x, attn, "residual 1")
        ops.scope_end([n1])  # the layer's `hidden_states` held the norm output until rebound
        n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        m = swiglu_mlp(ops, spec, n2, TOKENS, p)
        out = ops.add(x, m, "residual 2")
        ops.scope_end([block_input, n2, weights])
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm."""
        return rms_norm(ops, x, ops.param("model.norm.weight", spec.hidden_size), TOKENS, weight_in_fp32=False)

    def loss(self, ops: Ops, logits: Value, _ids: Value) -> None:
        """ForCausalLMLoss (labels=input_ids)."""
        hf_causal_lm_loss(ops, logits)

    def registration_rank(self, label: str) -> tuple:
        """LlamaForCausalLM registration order: embed_tokens, layers (self_attn q/k/v/o, mlp
        gate/up/down, input_layernorm, post_attention_layernorm), norm, lm_head."""
        return llama_registration_rank(label, "model.layers.", {
            "model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3})


LAYER_ORDER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm"]


def llama_registration_rank(label: str, layers: str, outer: dict[str, int]) -> tuple:
    """(position among the top-level modules, layer, position inside the layer).

    >>> llama_registration_rank("model.layers.3.mlp.up_proj.weight", "model.layers.", {})
    (1, 3, 5)
    """
    if label.startswith(layers):
        i, name = label[len(layers):].split(".", 1)
        return (1, int(i), LAYER_ORDER.index(name.rsplit(".", 1)[0]))
    return (outer[label], 0, 0)


PROGRAM = HFLlama()
