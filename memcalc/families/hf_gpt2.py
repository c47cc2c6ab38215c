"""transformers GPT2LMHeadModel (models/gpt2/modeling_gpt2.py, transformers 5.x), use_cache=False by default
(the other call paths: memcalc.families.call_path).

Python-level lifetimes that matter: GPT2Model.forward keeps inputs_embeds and position_embeds
until it returns; GPT2Block.forward keeps attn_output and feed_forward_hidden_states until the
block returns; NewGELUActivation is eight elementwise ops (activations.py).
"""
from __future__ import annotations

from memcalc.families.attention import add_float_mask, attention_core, head_copy, gpt2_eager, sdpa_attention
from memcalc.families.call_path import cache_kv, causal_mask, position_ids
from memcalc.families.base import TOKENS, DecoderProgram, Embedded, input_require_grads, param_maker, size
from memcalc.families.layers import gelu_new
from memcalc.families.loss import hf_causal_lm_loss
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import FreeTemps, Grad, Temp, Value
from memcalc.tape.ops import Ops


def activation(ops: Ops, x: Value, kind: str) -> Value:
    """The MLP activation as HF runs it."""
    if kind == "gelu_new":
        return gelu_new(ops, x)
    return ops.unary_saving_input(kind, x)


def upcast_reordered_attn(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value) -> tuple[Value, Value]:
    """GPT2Attention._upcast_and_reordered_attn (reorder_and_upcast_attn under eager attention):
    torch.empty of fp32 (b*heads, s, s) scores; with autocast off, reshape copies of q and k^T
    (locals `q`, `k` until the function returns) and their `.float()` copies, which baddbmm saves
    (beta=0, alpha=scaling: the scale folds into the matmul, so no (b, heads, s, s) scaling op;
    backward makes each operand's gradient as bmm(...) then * alpha: a temporary, then the
    gradient); + the float mask; softmax saving its fp32 result; `.type(value.dtype)`; dropout;
    @ v (v copied by bmm's reshape); transpose, then the caller's reshape(...).contiguous()."""
    g, a, d = ops.g, spec.num_heads, spec.head_size
    empty = g.op("torch.empty fp32 scores", [], size("b a s s", 4, a=a), requires_grad=False, elt=4)
    qc, kc = head_copy(ops, spec, q, "q reshape copy"), head_copy(ops, spec, k, "k^T reshape copy")
    q32, k32 = ops.to(qc, 4, "q.float()"), ops.to(kc, 4, "k.float()")
    scores = g.op("baddbmm", [empty, q32, k32], size("b a s s", 4, a=a), saves=[q32, k32],
                  backward=[Temp(q32.size), Grad(1), FreeTemps(), Temp(k32.size), Grad(2), FreeTemps()], elt=4)
    p = ops.unary_saving_output("softmax", add_float_mask(ops, scores, mask))
    p = ops.dropout(ops.to(p, v.elt, "attn_weights.type(value.dtype)"), spec.attn_dropout)
    vc = head_copy(ops, spec, v, "v reshape copy")
    y = g.op("p@v", [p, vc], size("b s a d", v.elt, a=a, d=d), saves=[p, vc], backward=[Grad(0), Grad(1)], elt=v.elt)
    ops.scope_end([qc, kc])
    return head_copy(ops, spec, y, "transpose contiguous"), p


def eager_core(ops: Ops, spec: ModelSpec, regime: Regime, q: Value, k: Value, v: Value,
               mask: Value, contiguous: bool = False) -> tuple[Value, Value]:
    """The eager attention GPT2Attention.forward picks: the upcast path with reorder_and_upcast_attn
    when `config._attn_implementation == "eager"` (`using_eager`), else eager_attention_forward;
    selective checkpointing runs eager through a registered interface of another name
    (validate.models.hf.register_selective), so `using_eager` is false there. `contiguous`: k and v are
    the DynamicCache's copies (use_cache; refused with reorder_and_upcast_attn, check_call_path)."""
    if spec.reorder_and_upcast_attn and not regime.selective:
        return upcast_reordered_attn(ops, spec, q, k, v, mask)
    return gpt2_eager(ops, spec, q, k, v, mask, contiguous)


class HFGPT2(DecoderProgram):
    """GPT2LMHeadModel: parameters transformer.wte/wpe/h.{i}.*/ln_f, tied lm_head."""

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """wte(ids) + wpe(position_ids); a (b,1,s,s) additive float mask for eager attention
        (create_causal_mask); embedding dropout."""
        g, h, V, P = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings
        ids = g.input("input_ids", size("b s", 8))
        wte = ops.param("transformer.wte.weight", V * h, V)
        wpe = ops.param("transformer.wpe.weight", P * h, P)
        rows = "b s" if regime.positions_batched else "s"  # generate passes (b, s) position_ids
        pos_ids = position_ids(ops, regime)  # the batch's when packed (call_path)
        tok = g.op("wte embedding", [wte, ids], size("b s h", wte.elt, h=h), saves=[ids],
                   backward=[Grad(0)], elt=wte.elt)
        input_require_grads(ops, tok)  # get_input_embeddings() is wte
        pos = g.op("wpe embedding", [wpe, pos_ids], size(rows + " h", wpe.elt, h=h), saves=[pos_ids],
                   backward=[Grad(0)], elt=wpe.elt)
        x = ops.add_broadcast(tok, pos, size(rows + " h", wpe.elt, h=h))
        mask = causal_mask(ops, regime, tok.elt)  # create_causal_mask (call_path)
        x = ops.dropout(x, spec.embd_dropout)
        # GPT2Model passes position_ids to every GPT2Block (modeling_gpt2.py, transformers 5.24),
        # which passes it on to the attention interface: a checkpoint keeps it (run_layers,
        # attention_core); it matters only where wpe is frozen (else wpe's backward saves it)
        return Embedded(x, ids, {"mask": mask, "position_ids": pos_ids}, held_until_norm=[tok, pos, mask])

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One GPT2Block."""
        h, a, d, f = spec.hidden_size, spec.num_heads, spec.head_size, spec.ffn_size
        p = param_maker(ops, f"transformer.h.{layer}.")
        N = TOKENS
        block_input = x  # the caller's loop variable holds it until the block returns
        ln1 = ops.layer_norm(x, p("ln_1.weight", h), p("ln_1.bias", h), N)
        qkv = ops.linear(ln1, p("attn.c_attn.weight", h * 3 * a * d, h),
                         p("attn.c_attn.bias", 3 * a * d) if spec.qkv_bias else None, N, 3 * a * d, "c_attn")
        q, k, v = ops.g.views("split qkv", qkv, [size("b s a d", qkv.elt, a=a, d=d)] * 3, backward=[Grad(0)])
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies
        y, weights = attention_core(ops, regime, lambda: (
            (sdpa_attention(ops, spec, q, k, v, context["mask"], contiguous), None) if regime.attention == "sdpa"
            else eager_core(ops, spec, regime, q, k, v, context["mask"], contiguous)), context.get("position_ids"))
        attn = ops.linear(y, p("attn.c_proj.weight", a * d * h, a * d),
                          p("attn.c_proj.bias", h) if spec.out_bias else None, N, h, "attn c_proj")
        attn = ops.dropout(attn, spec.resid_dropout)
        ops.scope_end([q, k, v])  # GPT2Attention.forward's locals
        # `attn_output, _ = self.attn(...)`: the weights `_` live until the block returns
        x = ops.add(attn, x, "residual 1")
        ops.scope_end([ln1])  # the block's `hidden_states` held ln_1's output until this rebinding
        ln2 = ops.layer_norm(x, p("ln_2.weight", h), p("ln_2.bias", h), N)
        h1 = ops.linear(ln2, p("mlp.c_fc.weight", h * f, h), p("mlp.c_fc.bias", f) if spec.mlp_bias else None,
                        N, f, "c_fc")
        m = ops.linear(activation(ops, h1, spec.activation), p("mlp.c_proj.weight", f * h, f),
                       p("mlp.c_proj.bias", h) if spec.mlp_bias else None, N, h, "mlp c_proj")
        m = ops.dropout(m, spec.resid_dropout)
        x = ops.add(x, m, "residual 2")
        ops.scope_end([ln2])
        ops.scope_end([attn, m, block_input, weights])
        return x

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """transformer.ln_f."""
        h = spec.hidden_size
        return ops.layer_norm(x, ops.param("transformer.ln_f.weight", h), ops.param("transformer.ln_f.bias", h),
                              TOKENS)

    def loss(self, ops: Ops, logits: Value, _ids: Value) -> None:
        """ForCausalLMLoss (labels=input_ids)."""
        hf_causal_lm_loss(ops, logits)


PROGRAM = HFGPT2()
