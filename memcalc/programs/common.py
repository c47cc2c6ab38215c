"""Pieces shared by the model programs: attention cores and the causal-LM loss."""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops


def sdpa(ops: Ops, q: Value, k: Value, v: Value, heads: int, head_dim: int, hf: bool) -> Value:
    """F.scaled_dot_product_attention via the flash kernel (CPU: _scaled_dot_product_flash_
    attention_for_cpu; CUDA: flash or memory-efficient): outputs (b,s,heads*d) and an fp32
    logsumexp (b,heads,s); saves q, k, v, output, logsumexp; backward allocates grad q, k, v.
    No s^2 term (memory-facts.md; aten/src/ATen/native/transformers/attention.cpp)."""
    elt = q.elt
    out, lse = ops.g.op_multi("sdpa", [q, k, v], [Poly.bs(heads * head_dim * elt),
                                                   Poly.bs(heads * 4)],
                              backward=[Grad(0), Grad(1), Grad(2)], elts=[elt, 4])
    node = ops.g.nodes[-1]
    node.saved = [q.storage, k.storage, v.storage, out.storage, lse.storage]
    ops.g.nodes[-1].outputs = [out, lse]
    return out


def causal_lm_loss(ops: Ops, logits: Value, vocab: int, labels_in_forward: bool) -> Value:
    """transformers ForCausalLMLoss (loss/loss_utils.py): logits.float(); labels padded by one
    and shifted (a contiguous copy); cross_entropy = log_softmax (saves its fp32 result) +
    nll_loss (saves log-probs, target, total_weight). Returns the loss scalar."""
    g = ops.g
    logits32 = ops.to(logits, 4, "logits.float()")
    if labels_in_forward:
        padded = g.op("pad labels", [], Poly.mono(8, 1, 1) + Poly.mono(8, 1, 0), requires_grad=False, elt=8)
        target = g.op("shift labels", [padded], Poly.bs(8), requires_grad=False, elt=8)
    else:
        target = g.inputs[-1]
    logp = g.op("log_softmax", [logits32], logits32.size, backward=[Grad(0)], elt=4)
    g.nodes[-1].saved = [logp.storage]
    loss, total_weight = g.op_multi("nll_loss", [logp, target], [Poly.const(4), Poly.const(4)],
                                    backward=[Grad(0)], elts=[4, 4])
    g.nodes[-1].saved = [logp.storage, target.storage, total_weight.storage]
    g.keep.append(loss)
    return loss
