"""transformers GPTNeoXForCausalLM (models/gpt_neox/modeling_gpt_neox.py, transformers 5.24;
Pythia); use_cache and the masks: memcalc.families.call_path.

Op by op:
- gpt_neox.embed_in(ids); a (b,1,s,s) float mask for eager attention; emb_dropout (hidden_dropout);
  the rotary tables (s, int(head_dim * rotary_pct)) `.to(x.dtype)`;
- each GPTNeoXLayer: attention(input_layernorm(x)) -> post_attention_dropout; the MLP on
  post_attention_layernorm(x) (parallel residual: x + attn + mlp, summed as (mlp + attn) + x) or
  on post_attention_layernorm(x + attn) (sequential);
- attention: query_key_value (b, s, 3h) viewed (b, s, heads, 3d) and transposed, chunk(3) into
  q, k, v (one SplitBackward: a cat of the three gradients, contiguous (b, heads, s, 3d), which
  the view's backward then reshapes with a copy, a view at one head); partial rotary on q and k (layers.partial_rotary:
  slices and a cat, so q and k come out contiguous); the core (eager: no repeat_kv, no q/k
  reshape copies, v copied by bmm's reshape); dense;
- LayerNorms with biases; the MLP dense_h_to_4h -> activation (hidden_act) -> dense_4h_to_h;
- final_layer_norm, lm_head (tied to embed_in with tie_word_embeddings), ForCausalLMLoss.
"""
from __future__ import annotations

from typing import Callable

from memcalc.families.attention import attention_core
from memcalc.families.call_path import cache_kv, causal_mask
from memcalc.families.base import TOKENS, DecoderProgram, Embedded, param_maker, size
from memcalc.families.hf_gpt2 import activation
from memcalc.families.hf_phi3 import contiguous_qk_kernel, rotary_width
from memcalc.families.layers import partial_rotary, rotary_buffers, rotary_tables
from memcalc.families.loss import hf_causal_lm_loss
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, Grad, Value
from memcalc.tape.ops import Ops

LAYER_ORDER = ["input_layernorm", "post_attention_layernorm", "attention.query_key_value", "attention.dense",
               "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]
OUTER = {"gpt_neox.embed_in.weight": 0, "gpt_neox.final_layer_norm.weight": 2,
         "gpt_neox.final_layer_norm.bias": 2, "lm_head.weight": 3}


class HFGPTNeoX(DecoderProgram):
    """GPTNeoXForCausalLM: gpt_neox.embed_in, gpt_neox.layers.{i}.*, gpt_neox.final_layer_norm, lm_head."""

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_in(ids), position_ids, the eager mask, emb_dropout, the rotary tables."""
        g, h, V = ops.g, spec.hidden_size, spec.vocab_size
        ids = g.input("input_ids", size("b s", 8))
        embed = ops.param("gpt_neox.embed_in.weight", V * h, V)
        emb = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
                   backward=[Grad(0)], elt=embed.elt)
        pos = g.op("position_ids", [], size("b s" if regime.positions_batched else "s", 8),
                   requires_grad=False, elt=8)  # generate passes (b, s) position_ids
        mask = causal_mask(ops, regime, emb.elt)  # create_causal_mask (call_path)
        x = ops.dropout(emb, spec.embd_dropout)
        rotary_buffers(ops, rotary_width(spec), "gpt_neox.rotary_emb.")  # GPTNeoXRotaryEmbedding's
        cos, sin = rotary_tables(ops, rotary_width(spec), x.elt)
        return Embedded(x, ids, {"mask": mask, "cos": cos, "sin": sin, "position_ids": pos},
                        held_until_norm=[emb, mask, cos, sin, pos])  # hf_llama.POSITION_IDS_LOCAL

    def attention(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, context: dict,
                  p: Callable[..., Value]) -> tuple[Value, Value]:
        """GPTNeoXAttention; returns (output, weights)."""
        a, d, h = spec.num_heads, spec.head_size, spec.hidden_size
        qkv = ops.linear(x, p("attention.query_key_value.weight", h * 3 * h, 3 * h),
                         p("attention.query_key_value.bias", 3 * h) if spec.qkv_bias else None,
                         TOKENS, 3 * h, "query_key_value")
        # its backward's reshape copies, but not one head (attention.head_copy; measured: no clone)
        qkv_t = ops.g.view("view(b, s, a, 3d).transpose(1, 2)", qkv, backward=[Alias(0) if a == 1 else Grad(0)])
        q, k, v = ops.g.views("chunk(3)", qkv_t, [size("b s a d", qkv.elt, a=a, d=d)] * 3, backward=[Grad(0)])
        cos, sin, rd = context["cos"], context["sin"], rotary_width(spec)
        q, k = partial_rotary(ops, q, cos, sin, a, d, rd), partial_rotary(ops, k, cos, sin, a, d, rd)
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies

        y, weights = attention_core(ops, regime, lambda: contiguous_qk_kernel(
            ops, spec, regime, q, k, v, context["mask"], contiguous), context.get("position_ids"))
        out = ops.linear(y, p("attention.dense.weight", h * h, h),
                         p("attention.dense.bias", h) if spec.out_bias else None, TOKENS, h, "dense")
        # GPTNeoXAttention's locals, and its `hidden_states` argument: GPTNeoXLayer passes
        # self.input_layernorm(hidden_states) straight into the call, so the norm's output lives
        # until the module returns (measured: +1 (b, s, h) through attention under per-layer
        # checkpointing and autocast, where no op saves it)
        ops.scope_end([q, k, v, x])
        return out, weights

    def mlp(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> Value:
        """GPTNeoXMLP: dense_h_to_4h, act, dense_4h_to_h (biases always). Its argument, the
        post_attention_layernorm output GPTNeoXLayer passes straight into the call, lives until
        the module returns (nn.Module._call_impl holds `args`; measured like the attention's)."""
        h, f = spec.hidden_size, spec.ffn_size
        y = ops.linear(x, p("mlp.dense_h_to_4h.weight", h * f, f), p("mlp.dense_h_to_4h.bias", f), TOKENS, f,
                       "dense_h_to_4h")
        out = ops.linear(activation(ops, y, spec.activation), p("mlp.dense_4h_to_h.weight", f * h, h),
                         p("mlp.dense_4h_to_h.bias", h), TOKENS, h, "dense_4h_to_h")
        ops.scope_end([x])
        return out

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One GPTNeoXLayer."""
        h = spec.hidden_size
        p = param_maker(ops, f"gpt_neox.layers.{layer}.")
        ln1 = ops.layer_norm(x, p("input_layernorm.weight", h), p("input_layernorm.bias", h), TOKENS)
        ln2_w, ln2_b = p("post_attention_layernorm.weight", h), p("post_attention_layernorm.bias", h)
        attn, weights = self.attention(ops, spec, regime, ln1, context, p)  # `attn_output, _ = ...`
        attn = ops.dropout(attn, spec.resid_dropout)
        if spec.parallel_residual:
            m = ops.dropout(self.mlp(ops, spec, ops.layer_norm(x, ln2_w, ln2_b, TOKENS), p), spec.resid_dropout)
            out = ops.add(ops.add(m, attn, "mlp + attn"), x, "+ hidden_states")
        else:
            attn = ops.add(attn, x, "attn + hidden_states")
            m = ops.dropout(self.mlp(ops, spec, ops.layer_norm(attn, ln2_w, ln2_b, TOKENS), p), spec.resid_dropout)
            out = ops.add(m, attn, "mlp + attn")
        # the caller's loop variable; `_` and the locals attn_output and mlp_output live until the
        # layer returns (measured, parallel residual fp32 SDPA b2 s64: both alive at the second
        # add of `mlp_output + attn_output + hidden_states`, +b*s*h*4 B in the last layer)
        ops.scope_end([x, weights, attn, m])
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """gpt_neox.final_layer_norm."""
        h = spec.hidden_size
        return ops.layer_norm(x, ops.param("gpt_neox.final_layer_norm.weight", h),
                              ops.param("gpt_neox.final_layer_norm.bias", h), TOKENS)

    def loss(self, ops: Ops, logits: Value, _ids: Value) -> None:
        """ForCausalLMLoss (labels=input_ids)."""
        hf_causal_lm_loss(ops, logits)

    def registration_rank(self, label: str) -> tuple:
        """GPTNeoXForCausalLM registration order: embed_in, layers (input_layernorm,
        post_attention_layernorm, attention query_key_value, dense, mlp dense_h_to_4h,
        dense_4h_to_h), final_layer_norm, lm_head."""
        prefix = "gpt_neox.layers."
        if label.startswith(prefix):
            i, name = label[len(prefix):].split(".", 1)
            return (1, int(i), LAYER_ORDER.index(name.rsplit(".", 1)[0]))
        return (OUTER[label], 0, 0)


PROGRAM = HFGPTNeoX()
