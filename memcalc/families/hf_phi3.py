"""transformers Phi3ForCausalLM (models/phi3/modeling_phi3.py, transformers 5.24; Phi-3 and Phi-4),
use_cache and the masks: memcalc.families.call_path.

What differs from Llama (memcalc.families.hf_llama), op by op:
- self_attn.qkv_proj: one (b, s, (heads + 2 kv) * d) projection, sliced three times
  (`qkv[..., :query_pos]`, ...): three SliceBackward nodes, each allocating a zero-filled
  gradient of the whole projection; the first one's (v's, the last created) is kept in qkv's
  input buffer and the other two are added into it in place (input_buffer.cpp accumulate);
- apply_rotary_pos_emb slices q and k at cos.shape[-1] (partial_rotary_factor) and cats the
  rotated part with the rest (layers.partial_rotary): a new contiguous (b, heads, s, d) tensor,
  so eager attention's matmuls need no reshape copies of q and k;
- mlp.gate_up_proj: one (b, s, 2f) projection chunked into gate and up (one SplitBackward: a cat
  of the two gradients), `up * silu(gate)`;
- resid_attn_dropout / resid_mlp_dropout (resid_pdrop) on both residual branches; Phi3Model has
  no embedding dropout (embd_pdrop is not read).
"""
from __future__ import annotations

from typing import Callable

from memcalc.families.attention import attention_core, head_copy, llama_eager, sdpa, sdpa_masked
from memcalc.families.base import TOKENS, size
from memcalc.families.call_path import cache_kv
from memcalc.families.hf_llama import HFLlama, llama_registration_rank
from memcalc.families.layers import partial_rotary
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Grad, Temp, Value
from memcalc.tape.ops import Ops

LAYER_ORDER = ["self_attn.o_proj", "self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj",
               "input_layernorm", "post_attention_layernorm"]


def rotary_width(spec: ModelSpec) -> int:
    """int(head_dim * partial_rotary_factor): the cos/sin tables' width (modeling_phi3.py
    compute_default_rope_parameters, modeling_gpt_neox.py rotary_ndims).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> rotary_width(ModelSpec.preset("pythia-160m"))
    16
    """
    return int(spec.head_size * spec.rotary_fraction)


def contiguous_qk_kernel(ops: Ops, spec: ModelSpec, regime: Regime, q: Value, k: Value, v: Value,
                         mask: Value | None, contiguous: bool = False) -> tuple[Value, Value | None]:
    """The attention interface's call when q and k come out of the (partial) rotary cat
    contiguous (b, heads, s, d) (Phi3Attention, GPTNeoXAttention): SDPA (is_causal; the CPU
    flash output laid out like q, copied by the transpose) or eager (bmm copies neither q nor
    k); returns (output, weights). `contiguous`: k and v are the DynamicCache's copies (use_cache)."""
    if regime.attention == "sdpa" and mask is not None:  # a padded batch's (call_path.causal_mask)
        out = sdpa_masked(ops, spec, q, k, v, mask, contiguous)
        if ops.device == "cpu":  # the flash kernel's output laid out like q, as in `sdpa` (measured:
            # Phi-3, GPT-NeoX, StableLM padded b2 s64, one (b, heads, s, d) copy per layer)
            out = head_copy(ops, spec, out, "transpose(1,2).contiguous()")
        return out, None
    if regime.attention == "sdpa":
        return sdpa(ops, spec, *(ops.matmul_operand(t) for t in (q, k, v)), contiguous=contiguous,
                    contiguous_q=True), None
    return llama_eager(ops, spec, q, k, v, mask, contiguous_qk=True, contiguous=contiguous)


class HFPhi3(HFLlama):
    """Phi3ForCausalLM: model.embed_tokens, model.layers.{i}.*, model.norm, lm_head."""

    def rotary_dim(self, spec: ModelSpec) -> int:
        """Tables of int(head_dim * partial_rotary_factor) columns."""
        return rotary_width(spec)

    def attention(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict,
                  p: Callable[..., Value]) -> tuple[Value, Value]:
        """Phi3Attention: q and k come out of the rotary cat contiguous, so eager attention copies
        neither for its matmuls."""
        a, d, h = spec.num_heads, spec.head_size, spec.hidden_size
        q, k, v = self.project_qkv(ops, spec, x, p)
        q, k = self.position(ops, spec, q, k, layer, context)
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies

        y, weights = attention_core(ops, regime, lambda: contiguous_qk_kernel(
            ops, spec, regime, q, k, v, context["mask"], contiguous), context.get("position_ids"))
        out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h), None, TOKENS, h, "o_proj")
        ops.scope_end([q, k, v])  # Phi3Attention's locals
        return out, weights

    def project_qkv(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
        """qkv_proj, then three slices of it."""
        a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
        width = (a + 2 * kv) * d
        qkv = ops.linear(x, p("self_attn.qkv_proj.weight", h * width, width), None, TOKENS, width, "qkv_proj")
        full = qkv.size
        q = ops.g.view("qkv[..., :query_pos]", qkv, size("b s a d", qkv.elt, a=a, d=d), backward=[Temp(full)])
        k = ops.g.view("qkv[..., key slice]", qkv, size("b s a d", qkv.elt, a=kv, d=d), backward=[Temp(full)])
        v = ops.g.view("qkv[..., value slice]", qkv, size("b s a d", qkv.elt, a=kv, d=d), backward=[Grad(0)])
        return q, k, v

    def position(self, ops: Ops, spec: ModelSpec, q: Value, k: Value, _layer: int,
                 context: dict) -> tuple[Value, Value]:
        """Partial rotary on q and k (layers.partial_rotary)."""
        cos, sin, d, rd = context["cos"], context["sin"], spec.head_size, rotary_width(spec)
        return (partial_rotary(ops, q, cos, sin, spec.num_heads, d, rd),
                partial_rotary(ops, k, cos, sin, spec.kv_heads, d, rd))

    def mlp(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> Value:
        """Phi3MLP: gate_up_proj, chunk(2), up * silu(gate), down_proj."""
        h, f = spec.hidden_size, spec.ffn_size
        gate_up = ops.linear(x, p("mlp.gate_up_proj.weight", h * 2 * f, 2 * f), None, TOKENS, 2 * f, "gate_up_proj")
        gate, up = ops.g.views("chunk(2)", gate_up, [size("b s f", gate_up.elt, f=f)] * 2, backward=[Grad(0)])
        act = ops.unary_saving_input("silu", gate)
        return ops.linear(ops.mul(up, act, "up*silu"), p("mlp.down_proj.weight", f * h, f), None, TOKENS, h,
                          "down_proj")

    def residual_branch(self, ops: Ops, spec: ModelSpec, y: Value) -> Value:
        """resid_attn_dropout / resid_mlp_dropout."""
        return ops.dropout(y, spec.resid_dropout)

    def registration_rank(self, label: str) -> tuple:
        """Phi3ForCausalLM registration order: embed_tokens, layers (self_attn o_proj, qkv_proj,
        mlp gate_up_proj, down_proj, input_layernorm, post_attention_layernorm), norm, lm_head."""
        return llama_registration_rank(label, "model.layers.", {
            "model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}, LAYER_ORDER)


PROGRAM = HFPhi3()
