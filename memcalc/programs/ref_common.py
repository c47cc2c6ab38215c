"""Pieces of the reference models (validate/models.py) that differ from transformers'."""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.programs.common import cross_entropy_fp32
from memcalc.programs.eager import _copy
from memcalc.tape.graph import Grad


def cross_entropy(ops, logits, target) -> None:
    """F.cross_entropy(logits.view(-1, V), targets.view(-1)): autocast's fp32 list casts the
    logits up (CPU and CUDA), then log_softmax + nll_loss."""
    cross_entropy_fp32(ops, ops.fp32_op_input(logits), target)


def ref_eager(ops, spec, q, k, v, copies):
    """validate.models._eager_attention: (q @ k^T) * scale; masked_fill with a bool mask slice
    (`mask == 0` allocates an (s, s) bool tensor, saved by masked_fill); softmax; dropout; @ v;
    transpose(1, 2).contiguous()."""
    g, a, d, kv = ops.g, spec.num_heads, spec.head_size, spec.kv_heads
    q, k, v = (ops.matmul_operand(t) for t in (q, k, v))
    if kv < a:
        full = Poly.bs(a * d * k.elt)
        k = g.op("repeat_interleave k", [k], full, backward=[Grad(0)], elt=k.elt)
        v = g.op("repeat_interleave v", [v], full, backward=[Grad(0)], elt=v.elt)
    elt = q.elt
    qc = _copy(ops, q, "q reshape copy") if copies[0] else q
    kc = _copy(ops, k, "k reshape copy") if copies[1] else k
    s = g.op("q@k^T", [qc, kc], Poly.mono(a * elt, 1, 2), saves=[qc, kc], backward=[Grad(0), Grad(1)], elt=elt)
    s = ops.scale(s, "* scale")
    cond = g.op("mask == 0", [], Poly.mono(1, 0, 2), requires_grad=False, elt=1)
    s = g.op("masked_fill", [s, cond], s.size, saves=[cond], backward=[Grad(0)], elt=elt)
    p = ops.dropout(ops.unary_saving_output("softmax", s), spec.attn_dropout)
    vc = _copy(ops, v, "v reshape copy") if copies[2] else v
    y = g.op("p@v", [p, vc], Poly.bs(a * d * elt), saves=[p, vc], backward=[Grad(0), Grad(1)], elt=elt)
    return _copy(ops, y, "transpose contiguous")
