"""validate.models.ReferenceLlama: F.rms_norm (composite on CPU: upcast, pow, mean, rsqrt,
multiply by the weight in fp32, cast back), rotary from fp32 (P, d) buffers cast to q's dtype in
every attention call, SDPA with enable_gqa, eager with repeat_interleave."""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.programs.common import run_layers, sdpa, swiglu_mlp
from memcalc.programs.hf_llama import rotary
from memcalc.programs.ref_common import cross_entropy, ref_eager
from memcalc.tape.graph import FreeTemps, Grad, Temp
from memcalc.tape.ops import Ops


def rms_norm(ops: Ops, x, w, N: Poly):
    """F.rms_norm op by op (aten/src/ATen/native/layer_norm.cpp rms_norm_symint)."""
    g = ops.g
    x = ops.replicated_input(x, "rms_norm")
    x32 = ops.to(x, 4, "rms_norm upcast")
    sq = ops.unary_saving_input("pow 2", x32, temps=2)
    var = ops.shift(g.op("mean", [sq], N * 4, backward=[Grad(0)], elt=4), "+ eps")
    r = ops.unary_saving_output("rsqrt", var)
    normed = ops.mul(x32, r, "x * rsqrt")
    out = g.op("* weight", [normed, w], normed.size, saves=[normed, w],  # promotes, no copy
               backward=[Grad(0), Temp(normed.size), Grad(1), FreeTemps()], elt=4)
    return ops.to(out, x.elt, "rms_norm downcast")


def block(ops: Ops, spec, training, x, cos, sin, N: Poly, layer: int):
    """One reference LlamaBlock."""
    block_input = x  # the caller's loop variable holds it until the block returns
    h, a, kv, d = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_size
    p = lambda name, n, rows=None: ops.param(f"blocks.{layer}.{name}", n, rows)
    qb = spec.qkv_bias
    Ns = ops.seq_tokens(N)  # the norms' and residuals' tokens (b*s/t under SP)
    n1 = rms_norm(ops, x, p("input_layernorm.weight", h), Ns)
    xin = ops.sp_gather(n1)
    q = ops.col_linear(xin, p("q_proj.weight", h * a * d, a * d), p("q_proj.bias", a * d) if qb else None, N, a * d, "q_proj")
    k = ops.col_linear(xin, p("k_proj.weight", h * kv * d, kv * d), p("k_proj.bias", kv * d) if qb else None, N, kv * d, "k_proj")
    v = ops.col_linear(xin, p("v_proj.weight", h * kv * d, kv * d), p("v_proj.bias", kv * d) if qb else None, N, kv * d, "v_proj")
    c, s_ = ops.to(cos, q.elt, "cos.to(q.dtype)"), ops.to(sin, q.elt, "sin.to(q.dtype)")
    q, k = rotary(ops, q, c, s_, a, d), rotary(ops, k, c, s_, kv, d)
    q_local, k_local = q, k
    if training.checkpointing == "selective":
        ops.g.begin_region()
    if training.attention == "sdpa":
        q, k, v = (ops.matmul_operand(t) for t in (q, k, v))
        y = sdpa(ops, spec, q, k, v)
    else:
        y = ref_eager(ops, spec, q, k, v, copies=(False, False, kv == a))
    if training.checkpointing == "selective":
        ops.g.end_region()
    attn = ops.row_linear(y, p("o_proj.weight", a * d * h, h), p("o_proj.bias", h) if spec.out_bias else None, N, h, "o_proj")
    ops.scope_end([n1, xin, q_local, k_local, v, c, s_])  # self_attn.forward's argument and locals
    x = ops.add(x, attn, "residual 1")
    n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), Ns)
    mlp_in = ops.sp_gather(n2)  # mlp.forward's argument (the all-gathered norm under SP)
    m = swiglu_mlp(ops, spec, mlp_in, N, p)
    ops.scope_end([n2, mlp_in])
    out = ops.add(x, m, "residual 2")
    ops.scope_end([block_input])
    return out


def build(ops: Ops, spec, training, segments) -> None:
    """ReferenceLlama.forward and its loss."""
    g, h, V, P, d = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings, spec.head_size
    N = Poly.bs(1)
    ids = g.input("ids", Poly.bs(8))
    embed = ops.param("embed", V * h, V)
    be = ops.buffer_elt
    cos = g.buffer("rotary.cos", Poly.const(P * d * be), elt=be)
    sin = g.buffer("rotary.sin", Poly.const(P * d * be), elt=be)
    if training.attention == "eager":
        g.buffer("causal_mask", Poly.const(spec.num_layers * P * P), elt=1)
    cos = g.view("cos[:s]", cos, Poly.mono(d * be, 0, 1))
    sin = g.view("sin[:s]", sin, Poly.mono(d * be, 0, 1))
    x = g.op("embedding", [embed, ids], N * h * embed.elt, saves=[ids], backward=[Grad(0)], elt=embed.elt)
    x = ops.sp_exit(run_layers(ops, spec.num_layers, segments,
                               lambda x, layer: block(ops, spec, training, x, cos, sin, N, layer),
                               ops.sp_enter(x)))
    trunk_out = x  # head_loss(x, ...) holds its argument until it returns
    x = rms_norm(ops, x, ops.param("norm.weight", h), N)
    head = embed if spec.tie_embeddings else ops.param("lm_head", V * h, V)
    logits = ops.linear(x, head, None, N, V, "lm_head")
    cross_entropy(ops, logits, ids)
    ops.scope_end([logits, trunk_out] + ops.weight_casts)  # head_loss's `logits` lives until it returns
    g.order_params(lambda label: {"norm.weight": 2}.get(label, 1 if label == "lm_head" else 0))
