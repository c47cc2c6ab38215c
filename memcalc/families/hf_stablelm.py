"""transformers StableLmForCausalLM (models/stablelm/modeling_stablelm.py, transformers 5.24),
use_cache and the masks: memcalc.families.call_path; declared in memcalc.families.declarations.stablelm.

What differs from Llama (memcalc.families.hf_llama), op by op:
- nn.LayerNorm with bias for input_layernorm, post_attention_layernorm and model.norm;
- StableLmAttention slices q and k itself (`query_rot, query_pass = q[..., :rotary_ndims],
  q[..., rotary_ndims:]`, the same for k), rotates query_rot and key_rot with Llama's
  apply_rotary_pos_emb on the (s, rotary_ndims) tables, then cats each with its pass part (a
  new contiguous tensor, so eager attention copies neither q nor k for its matmuls). The locals
  `query_rot`/`key_rot` (the rotated parts) and `query_pass`/`key_pass` (views that keep the
  q and k projections' storage) live until the attention returns; o_proj has no bias;
- StableLmDecoderLayer binds `hidden_states` to the input_layernorm output until its last line,
  so the norm output lives through the MLP; the MLP output goes through hidden_dropout
  (nn.Dropout) and is added last: `residual + self_attn_output + mlp_output` with the parallel
  residual (the MLP on the same norm output), else `residual = residual + self_attn_output`,
  then the MLP on post_attention_layernorm(residual) (passed straight into the call, held by it).
"""
from __future__ import annotations

from typing import Callable

from memcalc.engine.regime import Regime
from memcalc.families.attention import attention_core
from memcalc.families.base import TOKENS, param_maker, size
from memcalc.families.call_path import cache_kv
from memcalc.families.hf_llama import HFLlama, llama_registration_rank
from memcalc.families.hf_phi3 import contiguous_qk_kernel, rotary_width
from memcalc.families.layers import apply_rotary_pos_emb, qkv_projections, rotary, swiglu_mlp
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, Grad, Temp, Value
from memcalc.tape.ops import Ops


def rotary_slices(ops: Ops, x: Value, heads: int, d: int, rd: int) -> tuple[Value, Value]:
    """x[..., :rd] and x[..., rd:]: views whose SliceBackward each allocate a zero-filled gradient
    of x's size, the first one's added in place into the second's (as layers.partial_rotary)."""
    g, full = ops.g, size("b s a d", x.elt, a=heads, d=d)
    x_rot = g.view("x[..., :rotary_ndims]", x, size("b s a d", x.elt, a=heads, d=rd), backward=[Temp(full)])
    x_pass = g.view("x[..., rotary_ndims:]", x, size("b s a d", x.elt, a=heads, d=d - rd),
                    backward=[Grad(0, full)])
    return x_rot, x_pass


def rotary_cat(ops: Ops, rot: Value, x_pass: Value, heads: int, d: int) -> Value:
    """torch.cat((x_rot, x_pass), dim=-1) in the promoted dtype; its backward narrows the
    gradient (views), converting the part whose dtype differs (as layers.partial_rotary)."""
    elt = max(rot.elt, x_pass.elt)
    back = [Alias(0) if rot.elt == elt else Grad(0), Alias(1) if x_pass.elt == elt else Grad(1)]
    return ops.g.op("cat((x_rot, x_pass))", [rot, x_pass], size("b s a d", elt, a=heads, d=d),
                    backward=back, elt=elt)


class HFStableLm(HFLlama):
    """StableLmForCausalLM: model.embed_tokens, model.layers.{i}.*, model.norm, lm_head."""

    def rotary_dim(self, spec: ModelSpec) -> int:
        """Tables of int(head_dim * partial_rotary_factor) columns."""
        return rotary_width(spec)

    def attention(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, _layer: int, context: dict,
                  p: Callable[..., Value]) -> tuple[Value, Value]:
        """StableLmAttention; returns (output, weights)."""
        a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
        rd, cos, sin = rotary_width(spec), context["cos"], context["sin"]
        q, k, v = qkv_projections(ops, spec, x, p)
        q_rot, q_pass = rotary_slices(ops, q, a, d, rd)
        k_rot, k_pass = rotary_slices(ops, k, kv, d, rd)
        q_rot, k_rot = apply_rotary_pos_emb(ops, q_rot, k_rot, lambda q, k: (
            rotary(ops, q, cos, sin, a, rd), rotary(ops, k, cos, sin, kv, rd)))
        q, k = rotary_cat(ops, q_rot, q_pass, a, d), rotary_cat(ops, k_rot, k_pass, kv, d)
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies
        y, weights = attention_core(ops, regime, lambda: contiguous_qk_kernel(
            ops, spec, regime, q, k, v, context["mask"], contiguous), context.get("position_ids"))
        out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h), None, TOKENS, h, "o_proj")
        ops.scope_end([q, k, v, q_rot, k_rot, q_pass, k_pass])  # StableLmAttention's locals
        return out, weights

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One StableLmDecoderLayer."""
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = ops.layer_norm(x, p("input_layernorm.weight", h), p("input_layernorm.bias", h), TOKENS)
        attn, weights = self.attention(ops, spec, regime, n1, layer, context, p)  # `self_attn_output, _`
        if spec.parallel_residual:
            m = ops.dropout(swiglu_mlp(ops, spec, n1, TOKENS, p), spec.resid_dropout)
            first = ops.add(x, attn, "residual + self_attn_output")
            out = ops.add(first, m, "+ mlp_output")
            ops.scope_end([first])
        else:
            first = ops.add(x, attn, "residual + self_attn_output")  # `residual`
            n2 = ops.layer_norm(first, p("post_attention_layernorm.weight", h),
                                p("post_attention_layernorm.bias", h), TOKENS)
            m = swiglu_mlp(ops, spec, n2, TOKENS, p)
            ops.scope_end([n2])  # the MLP's argument, held by the call until it returns
            m = ops.dropout(m, spec.resid_dropout)
            out = ops.add(first, m, "residual + mlp_output")
            ops.scope_end([first])
        ops.scope_end([x, n1, attn, m, weights])  # the caller's loop variable and the layer's locals
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm (nn.LayerNorm)."""
        h = spec.hidden_size
        return ops.layer_norm(x, ops.param("model.norm.weight", h), ops.param("model.norm.bias", h), TOKENS)

    def registration_rank(self, label: str) -> tuple:
        """StableLmForCausalLM registration order: embed_tokens, layers (self_attn q/k/v/o, mlp
        gate/up/down, input_layernorm, post_attention_layernorm), norm, lm_head."""
        return llama_registration_rank(label, "model.layers.", {
            "model.embed_tokens.weight": 0, "model.norm.weight": 2, "model.norm.bias": 2, "lm_head.weight": 3})


PROGRAM = HFStableLm()
