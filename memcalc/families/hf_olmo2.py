"""transformers Olmo2ForCausalLM (models/olmo2/modeling_olmo2.py, transformers 5.24), use_cache=False.

What differs from Llama (memcalc.families.hf_llama), op by op:
- no pre-norms: each sublayer's output goes through its own post-norm before the residual add
  (post_attention_layernorm, post_feedforward_layernorm);
- q_norm / k_norm: RMSNorms over the whole q_proj / k_proj width (heads * head_dim), before
  the (b, s, heads, d) view;
- Olmo2RMSNorm multiplies by the weight in fp32 and casts afterwards (layers.rms_norm_weight_first);
- Olmo2RotaryEmbedding returns fp32 cos/sin (no `.to(x.dtype)`), and apply_rotary_pos_emb casts
  q_embed / k_embed back to q's and k's dtype (a copy whenever the tables promoted them).
"""
from __future__ import annotations

from typing import Callable

from memcalc.families.base import TOKENS, param_maker
from memcalc.families.hf_llama import HFLlama, llama_registration_rank
from memcalc.families.layers import rms_norm_weight_first, rotary
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Value
from memcalc.tape.ops import Ops

LAYER_ORDER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
               "post_attention_layernorm", "post_feedforward_layernorm"]


class HFOlmo2(HFLlama):
    """Olmo2ForCausalLM: model.embed_tokens, model.layers.{i}.*, model.norm, lm_head."""

    def rotary_table_elt(self, _x_elt: int) -> int:
        """Olmo2RotaryEmbedding.forward returns the fp32 tables."""
        return 4

    def project_qkv(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
        """q_norm(q_proj(x)), k_norm(k_proj(x)), v_proj(x); biases with attention_bias."""
        a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
        out = []
        for name, width in (("q", a * d), ("k", kv * d), ("v", kv * d)):
            y = ops.linear(x, p(f"self_attn.{name}_proj.weight", h * width, width),
                           p(f"self_attn.{name}_proj.bias", width) if spec.qkv_bias else None,
                           TOKENS, width, f"{name}_proj")
            if name != "v":
                y = rms_norm_weight_first(ops, y, p(f"self_attn.{name}_norm.weight", width), TOKENS)
            out.append(y)
        return out[0], out[1], out[2]

    def position(self, ops: Ops, spec: ModelSpec, q: Value, k: Value, _layer: int,
                 context: dict) -> tuple[Value, Value]:
        """apply_rotary_pos_emb, then q_embed.to(q_type), k_embed.to(k_type)."""
        cos, sin, d = context["cos"], context["sin"], spec.head_size
        q2, k2 = rotary(ops, q, cos, sin, spec.num_heads, d), rotary(ops, k, cos, sin, spec.kv_heads, d)
        return ops.to(q2, q.elt, "q_embed.to(q_type)"), ops.to(k2, k.elt, "k_embed.to(k_type)")

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One Olmo2DecoderLayer: x + post_norm(attn(x)), then + post_norm(mlp(.))."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        attn, weights = self.attention(ops, spec, regime, x, layer, context, p)  # `hidden_states, _ = ...`
        x = ops.add(x, rms_norm_weight_first(ops, attn, p("post_attention_layernorm.weight", h), TOKENS),
                    "residual 1")
        m = self.mlp(ops, spec, x, p)
        out = ops.add(x, rms_norm_weight_first(ops, m, p("post_feedforward_layernorm.weight", h), TOKENS),
                      "residual 2")
        ops.scope_end([block_input, weights])
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm (an Olmo2RMSNorm)."""
        return rms_norm_weight_first(ops, x, ops.param("model.norm.weight", spec.hidden_size), TOKENS)

    def registration_rank(self, label: str) -> tuple:
        """Olmo2ForCausalLM registration order: embed_tokens, layers (self_attn q/k/v/o, q_norm,
        k_norm, mlp gate/up/down, post_attention_layernorm, post_feedforward_layernorm), norm, lm_head."""
        return llama_registration_rank(label, "model.layers.", {
            "model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}, LAYER_ORDER)


PROGRAM = HFOlmo2()
