"""Eager attention: softmax(q k^T * scale + mask) v, materialising the (b, heads, s, s) scores.

torch.matmul on 4-D operands reshapes them to 3-D for bmm; q, k, v that are transposed views
of a fused projection cannot be flattened without a copy (aten/src/ATen/native/LinearAlgebra.cpp
_matmul_impl), and bmm saves those copies. transformers' eager_attention_forward adds a float mask;
the reference model uses masked_fill with a bool buffer.
"""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.tape.graph import Alias, Grad


def _copy(ops, x, name):
    """A contiguous copy made by reshape/contiguous; its backward passes the gradient through."""
    return ops.g.op(name, [x], x.size, backward=[Alias(0)], elt=x.elt)


def _add_mask(ops, s):
    """scores + float mask: a low-precision score tensor is promoted to the mask's dtype (fp32
    under autocast), so the sum is a new fp32 tensor whose gradient is cast back."""
    elt = max(s.elt, ops.mask.elt)
    back = [Alias(0)] if elt == s.elt else [Grad(0)]
    return ops.g.op("+ mask", [s, ops.mask], Poly({m: c // s.elt * elt for m, c in s.size.terms.items()}),
                    backward=back, elt=elt)


def eager_attention(ops, spec, training, q, k, v, hf: bool, copies=(True, True, True)):
    """Scores path of one attention layer; returns the (b, s, heads*d) output before o_proj."""
    g, a, d = ops.g, spec.num_heads, spec.head_size
    elt = q.elt
    scores = Poly.mono(a * elt, 1, 2)
    qc = _copy(ops, q, "q reshape copy") if copies[0] else q
    kc = _copy(ops, k, "k reshape copy") if copies[1] else k
    s = g.op("q@k^T", [qc, kc], scores, saves=[qc, kc], backward=[Grad(0), Grad(1)], elt=elt)
    s = ops.scale(s, "* scale")
    if hf:
        s = _add_mask(ops, s)
    else:
        s = g.op("masked_fill", [s], s.size, backward=[Grad(0)], elt=elt)
    p = ops.unary_saving_output("softmax", s)
    p = ops.to(p, v.elt, "attn_weights.type(value.dtype)")
    p = ops.dropout(p, spec.attn_dropout)
    ops.attn_weights = p  # returned to the attention module, which holds it until it returns
    vc = _copy(ops, v, "v reshape copy") if copies[2] else v
    y = g.op("p@v", [p, vc], Poly.bs(a * d * elt), saves=[p, vc], backward=[Grad(0), Grad(1)], elt=elt)
    return _copy(ops, y, "transpose contiguous")


def eager_scores(ops, spec, q, k, v, hf: bool, family: str):
    """Llama-family eager attention (modeling_llama.eager_attention_forward): repeat_kv copies
    k and v (in their own dtype) to all heads when kv < heads, their backward summing back to a
    kv-sized gradient; autocast then casts the matmul operands; bmm's reshape copies q (laid out
    (b, s, heads, d) by the projection view) and k when it was not repeated; softmax runs in fp32
    and is cast to the query's dtype (fp32 under CPU autocast, where rotary promoted q), dropout
    acts in that dtype, and autocast casts the probabilities for the second matmul."""
    g, a, kv, d = ops.g, spec.num_heads, spec.kv_heads, spec.head_size
    query_elt = q.elt
    repeated = []
    if kv < a:
        k = g.op("repeat_kv k", [k], Poly.bs(a * d * k.elt), backward=[Grad(0)], elt=k.elt)
        v = g.op("repeat_kv v", [v], Poly.bs(a * d * v.elt), backward=[Grad(0)], elt=v.elt)
        repeated = [k, v]  # key_states / value_states: locals until the function returns
    else:
        v = _copy(ops, v, "v reshape copy")
    q, k = ops.matmul_operand(q), ops.matmul_operand(k)
    q = _copy(ops, q, "q reshape copy")
    if kv == a:
        k = _copy(ops, k, "k^T reshape copy")
    elt = q.elt
    s = g.op("q@k^T", [q, k], Poly.mono(a * elt, 1, 2), saves=[q, k], backward=[Grad(0), Grad(1)], elt=elt)
    s = ops.scale(s, "* scale")
    s = ops.to(_add_mask(ops, s), 4, "softmax dtype=float32")
    p = ops.unary_saving_output("softmax", s)
    p = ops.dropout(ops.to(p, query_elt, "softmax .to(query dtype)"), spec.attn_dropout)
    ops.attn_weights = p  # returned to LlamaAttention, which holds it until it returns
    pm, vm = ops.matmul_operand(p), ops.matmul_operand(v)
    y = g.op("p@v", [pm, vm], Poly.bs(a * d * pm.elt), saves=[pm, vm], backward=[Grad(0), Grad(1)], elt=pm.elt)
    out = _copy(ops, y, "transpose contiguous")
    ops.scope_end(repeated)
    return out
