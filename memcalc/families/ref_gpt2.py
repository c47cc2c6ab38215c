"""validate.models.reference.ReferenceGPT2 (nanoGPT style): one fused tanh-GELU op, x = x + branch with no
lingering locals, F.cross_entropy on the logits directly (autocast runs it in fp32); the
tensor- and sequence-parallel plans of validate.distributed.tensor_parallel apply."""
from __future__ import annotations

from memcalc.families.attention import attention_core, reference_eager, sdpa
from memcalc.families.base import TOKENS, DecoderProgram, Embedded, param_maker, size
from memcalc.families.loss import reference_cross_entropy
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops


class ReferenceGPT2(DecoderProgram):
    """ReferenceGPT2: parameters wte, wpe, blocks.{i}.*, ln_f, lm_head (tied to wte by default)."""

    keeps_norm_output = False  # head_loss(x, ...) holds the trunk's output

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """wte(ids) + wpe(arange(s)), embedding dropout; a (L, P, P) bool causal-mask buffer
        for eager attention."""
        g, h, V, P = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings
        ids = g.input("ids", size("b s", 8))
        wte = ops.param("wte.weight", V * h, V)
        wpe = ops.param("wpe.weight", P * h, P)
        if regime.attention == "eager":
            g.buffer("causal_mask", size("L P P", 1, L=spec.num_layers, P=P), elt=1)
        pos_ids = g.op("arange", [], size("s", 8), requires_grad=False, elt=8)
        tok = g.op("wte embedding", [wte, ids], size("b s h", wte.elt, h=h), saves=[ids],
                   backward=[Grad(0)], elt=wte.elt)
        pos = g.op("wpe embedding", [wpe, pos_ids], size("s h", wpe.elt, h=h), saves=[pos_ids],
                   backward=[Grad(0)], elt=wpe.elt)
        x = ops.dropout(ops.add_broadcast(tok, pos, size("s h", wpe.elt, h=h)), spec.embd_dropout)
        # forward's local `x` holds the embeddings until forward returns; under SP nothing else
        # does (the blocks save only this rank's chunk)
        return Embedded(x, ids, held_until_return=[x] if ops.sp else [])

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, _context: dict) -> Value:
        """One reference GPT2Block."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h, a, d, f = spec.hidden_size, spec.num_heads, spec.head_size, spec.ffn_size
        p = param_maker(ops, f"blocks.{layer}.")
        N, Ns = TOKENS, ops.seq_tokens(TOKENS)  # the norms' and residuals' tokens (b*s/t under SP)
        ln1 = ops.layer_norm(ops.replicated_input(x, "ln_1"), p("ln_1.weight", h), p("ln_1.bias", h), Ns)
        xin = ops.sp_gather(ln1)
        qkv = ops.col_linear(xin, p("attn.c_attn.weight", h * 3 * a * d, 3 * a * d),
                             p("attn.c_attn.bias", 3 * a * d) if spec.qkv_bias else None, N, 3 * a * d, "c_attn")
        q, k, v = ops.g.views("split qkv", qkv, [size("b s a d", qkv.elt, a=a, d=d)] * 3, backward=[Grad(0)])
        y = attention_core(ops, regime, lambda: sdpa(ops, spec, q, k, v) if regime.attention == "sdpa"
                           else reference_eager(ops, spec, q, k, v, copies=(True, True, True)))
        attn = ops.row_linear(y, p("attn.c_proj.weight", a * d * h, h),
                              p("attn.c_proj.bias", h) if spec.out_bias else None, N, h, "attn c_proj")
        ops.scope_end([ln1, xin, qkv])  # attn.forward's argument and locals live until it returns
        x = ops.add(x, ops.dropout(attn, spec.resid_dropout), "residual 1")
        ln2 = ops.layer_norm(ops.replicated_input(x, "ln_2"), p("ln_2.weight", h), p("ln_2.bias", h), Ns)
        mlp_in = ops.sp_gather(ln2)  # mlp.forward's argument (the all-gathered norm under SP)
        h1 = ops.col_linear(mlp_in, p("mlp.c_fc.weight", h * f, f), p("mlp.c_fc.bias", f) if spec.mlp_bias else None,
                            N, f, "c_fc")
        act = ops.unary_saving_input("gelu", h1)
        m = ops.row_linear(act, p("mlp.c_proj.weight", f * h, h), p("mlp.c_proj.bias", h) if spec.mlp_bias else None,
                           N, h, "mlp c_proj")
        ops.scope_end([ln2, mlp_in])
        out = ops.add(x, ops.dropout(m, spec.resid_dropout), "residual 2")
        ops.scope_end([block_input])
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """ln_f."""
        h = spec.hidden_size
        return ops.layer_norm(x, ops.param("ln_f.weight", h), ops.param("ln_f.bias", h), TOKENS)

    def loss(self, ops: Ops, logits: Value, ids: Value) -> None:
        """F.cross_entropy(logits, ids)."""
        reference_cross_entropy(ops, logits, ids)

    def registration_rank(self, label: str) -> int:
        """wte, wpe and the blocks, then lm_head, then ln_f (validate.models.reference.ReferenceLM)."""
        return 2 if label.startswith("ln_f") else 1 if label == "lm_head.weight" else 0


PROGRAM = ReferenceGPT2()
