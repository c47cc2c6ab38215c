"""transformers LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM
(models/llama/modeling_llama.py, mistral/, qwen2/, qwen3/, transformers 5.x), use_cache=False.

Qwen3 adds per-head RMSNorms of q and k before rotary (spec.qk_norm). Sliding windows (Mistral's
sliding_window on every layer, Qwen2/Qwen3's on layers >= max_window_layers) change only the
masks (memcalc.programs.masks) and, where SDPA gets a materialised mask, the attention kernel's
inputs (attention.sdpa_masked).

LlamaRMSNorm upcasts to fp32 and saves the fp32 copy, its square, the normalised tensor and the
rsqrt; rotary embedding multiplies q and k by cos/sin tables computed once per forward (fp32 under
autocast, so q and k are promoted to fp32); rotate_half slices and concatenates; eager attention
materialises repeat_kv copies of k and v; sdpa passes enable_gqa when there is no mask
(integrations/sdpa_attention.py use_gqa_in_sdpa).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from memcalc.programs.attention import attention_core, llama_eager, sdpa, sdpa_masked
from memcalc.programs.base import TOKENS, DecoderProgram, Embedded, param_maker, size
from memcalc.programs.masks import build_masks, layer_mask
from memcalc.programs.layers import qkv_projections, rms_norm, rotary, rotary_tables, swiglu_mlp
from memcalc.programs.loss import hf_causal_lm_loss
from memcalc.regime import Regime
from memcalc.specs import ModelSpec
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops

if TYPE_CHECKING:
    from memcalc.poly import Poly


def llama_rms_norm(ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
    """LlamaRMSNorm (Qwen2/Qwen3RMSNorm are the same code)."""
    return rms_norm(ops, x, w, tokens, weight_in_fp32=False)


def qk_norms(ops: Ops, spec: ModelSpec, q: Value, k: Value, p: Callable[..., Value],
             norm: Callable[..., Value]) -> tuple[Value, Value]:
    """Qwen3's q_norm / k_norm (Gemma-3's too): the family's RMSNorm over each head's head_dim
    features, before rotary; its mean has one element per token and head."""
    if not spec.qk_norm:
        return q, k
    d = spec.head_size
    return (norm(ops, q, p("self_attn.q_norm.weight", d), TOKENS * spec.num_heads),
            norm(ops, k, p("self_attn.k_norm.weight", d), TOKENS * spec.kv_heads))


def attention_kernel(ops: Ops, spec: ModelSpec, regime: Regime, q: Value, k: Value, v: Value,
                     mask: Value | None, softcap: bool = False) -> tuple[Value, Value | None]:
    """The attention interface's call: SDPA (no mask: is_causal, enable_gqa; a materialised
    sliding mask: sdpa_masked) or the eager function; returns (output, weights)."""
    if regime.attention == "sdpa":
        if mask is None:
            return sdpa(ops, spec, *(ops.matmul_operand(t) for t in (q, k, v))), None
        return sdpa_masked(ops, spec, q, k, v, mask), None
    return llama_eager(ops, spec, q, k, v, mask, softcap)


def attention(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, context: dict,
              p: Callable[..., Value], layer: int, norm: Callable[..., Value] = llama_rms_norm
              ) -> tuple[Value, Value]:
    """LlamaAttention (Qwen3Attention and Gemma3Attention with q/k norms, Gemma2Attention with
    soft-capping) with the configured attention interface, the mask and rotary table of the
    layer's kind; returns (output, weights)."""
    a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    N = TOKENS
    q, k, v = qkv_projections(ops, spec, x, p)
    q, k = qk_norms(ops, spec, q, k, p, norm)
    cos, sin = context["rope"]["sliding" if spec.layer_is_sliding(layer) else "full"]
    q, k = rotary(ops, q, cos, sin, a, d), rotary(ops, k, cos, sin, kv, d)
    q_local, k_local, v_local = q, k, v
    mask = layer_mask(context, spec, layer)

    def core():
        return attention_kernel(ops, spec, regime, q, k, v, mask, spec.attn_softcap)

    y, weights = attention_core(ops, regime, core)
    out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h),
                         p("self_attn.o_proj.bias", h) if spec.out_bias else None, N, h, "o_proj")
    ops.scope_end([q_local, k_local, v_local])  # LlamaAttention's locals
    return out, weights


class HFLlama(DecoderProgram):
    """LlamaForCausalLM: parameters model.embed_tokens, model.layers.{i}.*, model.norm, lm_head."""

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_tokens(ids); position_ids; the masks (memcalc.programs.masks); the rotary
        cos/sin tables computed once per forward."""
        g, h, V = ops.g, spec.hidden_size, spec.vocab_size
        ids = g.input("input_ids", size("b s", 8))
        embed = ops.param("model.embed_tokens.weight", V * h, V)
        x = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
                 backward=[Grad(0)], elt=embed.elt)
        g.op("position_ids", [], size("s", 8), requires_grad=False, elt=8)
        masks = build_masks(ops, spec, regime, x.elt)
        cos, sin = rotary_tables(ops, spec.head_size, x.elt)
        return Embedded(x, ids, {"masks": masks, "rope": {"full": (cos, sin), "sliding": (cos, sin)}},
                        held_until_norm=[x, *masks.values(), cos, sin])  # inputs_embeds lives to return

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One LlamaDecoderLayer."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = rms_norm(ops, x, p("input_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        attn, weights = attention(ops, spec, regime, n1, context, p, layer)  # `hidden_states, _ = ...`
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
               "self_attn.q_norm", "self_attn.k_norm",  # Qwen3Attention / Gemma3Attention
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm",
               "pre_feedforward_layernorm", "post_feedforward_layernorm"]  # Gemma2/3DecoderLayer


def llama_registration_rank(label: str, layers: str, outer: dict[str, int]) -> tuple:
    """(position among the top-level modules, layer, position inside the layer).

    >>> llama_registration_rank("model.layers.3.mlp.up_proj.weight", "model.layers.", {})
    (1, 3, 7)
    """
    if label.startswith(layers):
        i, name = label[len(layers):].split(".", 1)
        return (1, int(i), LAYER_ORDER.index(name.rsplit(".", 1)[0]))
    return (outer[label], 0, 0)


PROGRAM = HFLlama()
