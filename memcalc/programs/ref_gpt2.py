"""validate.models.ReferenceGPT2 (nanoGPT style): one fused tanh-GELU op, x = x + branch with no
lingering locals, F.cross_entropy on the logits directly (autocast runs it in fp32)."""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.programs.common import run_layers, sdpa
from memcalc.programs.ref_common import cross_entropy, ref_eager
from memcalc.tape.graph import Grad
from memcalc.tape.ops import Ops


def block(ops: Ops, spec, training, x, N: Poly, layer: int):
    """One reference GPT2Block."""
    block_input = x  # the caller's loop variable holds it until the block returns
    h, a, d, f = spec.hidden_size, spec.num_heads, spec.head_size, spec.ffn_size
    p = lambda name, n, rows=None: ops.param(f"blocks.{layer}.{name}", n, rows)
    Ns = ops.seq_tokens(N)  # the norms' and residuals' tokens (b*s/t under SP)
    ln1 = ops.layer_norm(ops.replicated_input(x, "ln_1"), p("ln_1.weight", h), p("ln_1.bias", h), Ns)
    xin = ops.sp_gather(ln1)
    qkv = ops.col_linear(xin, p("c_attn.weight", h * 3 * a * d, 3 * a * d), p("c_attn.bias", 3 * a * d) if spec.qkv_bias else None,
                     N, 3 * a * d, "c_attn")
    q, k, v = ops.g.views("split qkv", qkv, [Poly.bs(a * d * qkv.elt)] * 3, backward=[Grad(0)])
    if training.checkpointing == "selective":
        ops.g.begin_region()
    y = sdpa(ops, spec, q, k, v) if training.attention == "sdpa" else \
        ref_eager(ops, spec, q, k, v, copies=(True, True, True))
    if training.checkpointing == "selective":
        ops.g.end_region()
    attn = ops.row_linear(y, p("attn.c_proj.weight", a * d * h, h), p("attn.c_proj.bias", h) if spec.out_bias else None,
                      N, h, "attn c_proj")
    ops.scope_end([ln1, xin, qkv])  # attn.forward's argument and locals live until it returns
    x = ops.add(x, ops.dropout(attn, spec.resid_dropout), "residual 1")
    ln2 = ops.layer_norm(ops.replicated_input(x, "ln_2"), p("ln_2.weight", h), p("ln_2.bias", h), Ns)
    mlp_in = ops.sp_gather(ln2)  # mlp.forward's argument (the all-gathered norm under SP)
    h1 = ops.col_linear(mlp_in, p("mlp.c_fc.weight", h * f, f), p("mlp.c_fc.bias", f) if spec.mlp_bias else None, N, f, "c_fc")
    act = ops.unary_saving_input("gelu", h1)
    m = ops.row_linear(act, p("mlp.c_proj.weight", f * h, h), p("mlp.c_proj.bias", h) if spec.mlp_bias else None, N, h, "mlp c_proj")
    ops.scope_end([ln2, mlp_in])
    out = ops.add(x, ops.dropout(m, spec.resid_dropout), "residual 2")
    ops.scope_end([block_input])
    return out


def build(ops: Ops, spec, training, segments) -> None:
    """ReferenceGPT2.forward and its loss."""
    g, h, V, P = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings
    N = Poly.bs(1)
    ids = g.input("ids", Poly.bs(8))
    wte, wpe = ops.param("wte", V * h, V), ops.param("wpe", P * h, P)
    if training.attention == "eager":
        g.buffer("causal_mask", Poly.const(spec.num_layers * P * P), elt=1)
    pos_ids = g.op("arange", [], Poly.mono(8, 0, 1), requires_grad=False, elt=8)
    tok = g.op("wte embedding", [wte, ids], N * h * wte.elt, saves=[ids], backward=[Grad(0)], elt=wte.elt)
    pos = g.op("wpe embedding", [wpe, pos_ids], Poly.mono(h * wpe.elt, 0, 1), saves=[pos_ids],
               backward=[Grad(0)], elt=wpe.elt)
    x = ops.dropout(ops.add_broadcast(tok, pos, Poly.mono(h * wpe.elt, 0, 1)), spec.embd_dropout)
    embedded = x  # forward's local `x` holds the embeddings until forward returns; under SP
    # nothing else does (the blocks save only this rank's chunk)
    x = ops.sp_exit(run_layers(ops, spec.num_layers, segments,
                               lambda x, layer: block(ops, spec, training, x, N, layer),
                               ops.sp_enter(x)))
    trunk_out = x  # head_loss(x, ...) holds its argument until it returns
    x = ops.layer_norm(x, ops.param("ln_f.weight", h), ops.param("ln_f.bias", h), N)
    head = wte if spec.tie_embeddings else ops.param("lm_head", V * h, V)
    logits = ops.linear(x, head, None, N, V, "lm_head")
    cross_entropy(ops, logits, ids)
    ops.scope_end([logits, trunk_out] + ops.weight_casts + ([embedded] if ops.sp else []))  # head_loss's `logits` lives until it returns
    g.order_params(lambda label: 2 if label.startswith("ln_f") else 1 if label == "lm_head" else 0)
