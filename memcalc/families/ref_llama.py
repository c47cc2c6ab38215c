"""validate.models.reference.ReferenceLlama: F.rms_norm (composite on CPU: upcast, pow, mean, rsqrt,
multiply by the weight in fp32, cast back), rotary from fp32 (P, d) buffers cast to q's dtype in
every attention call, SDPA with enable_gqa, eager with repeat_interleave; the tensor- and
sequence-parallel plans of validate.distributed.tensor_parallel apply."""
from __future__ import annotations

from memcalc.families.attention import attention_core, reference_eager, sdpa
from memcalc.families.base import TOKENS, DecoderProgram, Embedded, param_maker, size
from memcalc.families.layers import qkv_projections, rms_norm, rotary, swiglu_mlp
from memcalc.families.loss import reference_cross_entropy
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops


class ReferenceLlama(DecoderProgram):
    """ReferenceLlama: parameters embed, blocks.{i}.*, norm, lm_head."""

    keeps_norm_output = False  # head_loss(x, ...) holds the trunk's output

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed(ids); the rotary cos/sin buffers (P, d), sliced to s; a (L, P, P) bool
        causal-mask buffer for eager attention."""
        g, h, V, P, d = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings, spec.head_size
        ids = g.input("ids", size("b s", 8))
        embed = ops.param("embed.weight", V * h, V)
        be = ops.buffer_elt
        cos = g.buffer("rotary.cos", size("P d", be, P=P, d=d), elt=be)
        sin = g.buffer("rotary.sin", size("P d", be, P=P, d=d), elt=be)
        if regime.attention == "eager":
            g.buffer("causal_mask", size("L P P", 1, L=spec.num_layers, P=P), elt=1)
        cos = g.view("cos[:s]", cos, size("s d", be, d=d))
        sin = g.view("sin[:s]", sin, size("s d", be, d=d))
        x = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
                 backward=[Grad(0)], elt=embed.elt)
        return Embedded(x, ids, {"cos": cos, "sin": sin})

    shared_stage_buffers = ("rotary.cos", "rotary.sin")

    def stage_context(self, ops: Ops, spec: ModelSpec, _regime: Regime) -> dict:
        """A later pipeline stage keeps the model's Rotary module (validate.distributed.pipeline):
        its cos/sin buffers, sliced to s in the stage's forward."""
        g, P, d, be = ops.g, spec.max_position_embeddings, spec.head_size, ops.buffer_elt
        cos = g.buffer("rotary.cos", size("P d", be, P=P, d=d), elt=be)
        sin = g.buffer("rotary.sin", size("P d", be, P=P, d=d), elt=be)
        return {"cos": g.view("cos[:s]", cos, size("s d", be, d=d)),
                "sin": g.view("sin[:s]", sin, size("s d", be, d=d))}

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One reference LlamaBlock."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h, a, kv, d = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_size
        p = param_maker(ops, f"blocks.{layer}.")
        N, Ns = TOKENS, ops.seq_tokens(TOKENS)  # Ns: b*s/t under SP
        n1 = rms_norm(ops, x, p("input_layernorm.weight", h), Ns, weight_in_fp32=True)
        xin = ops.sp_gather(n1)
        q, k, v = qkv_projections(ops, spec, xin, p)
        c, s_ = ops.to(context["cos"], q.elt, "cos.to(q.dtype)"), ops.to(context["sin"], q.elt, "sin.to(q.dtype)")
        q, k = rotary(ops, q, c, s_, a, d), rotary(ops, k, c, s_, kv, d)
        q_local, k_local = q, k

        def core():
            if regime.attention == "sdpa":
                return sdpa(ops, spec, *(ops.matmul_operand(t) for t in (q, k, v)))
            return reference_eager(ops, spec, q, k, v, copies=(False, False, kv == a))

        y = attention_core(ops, regime, core)
        attn = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h),
                              p("self_attn.o_proj.bias", h) if spec.out_bias else None, N, h, "o_proj")
        ops.scope_end([n1, xin, q_local, k_local, v, c, s_])  # self_attn.forward's argument and locals
        x = ops.add(x, attn, "residual 1")
        n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), Ns, weight_in_fp32=True)
        mlp_in = ops.sp_gather(n2)  # mlp.forward's argument (the all-gathered norm under SP)
        m = swiglu_mlp(ops, spec, mlp_in, N, p)
        ops.scope_end([n2, mlp_in])
        out = ops.add(x, m, "residual 2")
        ops.scope_end([block_input])
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """norm."""
        return rms_norm(ops, x, ops.param("norm.weight", spec.hidden_size), TOKENS, weight_in_fp32=True)

    def loss(self, ops: Ops, logits: Value, ids: Value) -> None:
        """F.cross_entropy(logits, ids)."""
        reference_cross_entropy(ops, logits, ids)

    def registration_rank(self, label: str) -> int:
        """embed and the blocks (created in registration order), then lm_head, then norm
        (validate.models.reference.ReferenceLM)."""
        return 2 if label == "norm.weight" else 1 if label == "lm_head.weight" else 0


PROGRAM = ReferenceLlama()
