"""The causal-LM losses: transformers' ForCausalLMLoss and F.cross_entropy on the logits."""
from __future__ import annotations

from memcalc.core.poly import Poly
from memcalc.families.call_path import divide_by_num_items
from memcalc.families.base import size
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops


def cross_entropy_fp32(ops: Ops, logits32: Value, target: Value) -> Value:
    """F.cross_entropy on fp32 logits = log_softmax (saves its result) + nll_loss (saves the
    log-probs, the target and total_weight); the loss is kept for backward. Returns it."""
    g = ops.g
    logp = g.op("log_softmax", [logits32], logits32.size, backward=[Grad(0)], elt=4, save_output=True)
    loss, _ = g.op_multi("nll_loss", [logp, target], [Poly.const(4), Poly.const(4)],
                         saves=[logp, target], backward=[Grad(0)], elts=[4, 4], save_outputs=(1,))
    g.keep.append(loss)
    return loss


def hf_causal_lm_loss(ops: Ops, logits: Value) -> Value:
    """transformers ForCausalLMLoss (loss/loss_utils.py): logits.float(); labels padded by one
    (b, s+1) and shifted (a contiguous (b, s) int64 copy); then cross_entropy. The padded labels
    are the function's `labels` local, alive until it returns (measured: b (s+1) int64 bytes
    through log_softmax, GPT-NeoX's forward peak at the loss). With one sequence
    (Regime.single_sequence) labels[..., 1:] of a (1, s+1) tensor is already contiguous, so
    .contiguous() copies nothing (measured: HF GPT-2 ci43 at b=1, exact with the view)."""
    g = ops.g
    logits32 = ops.to(logits, 4, "logits.float()")
    padded = g.op("pad labels", [], size("b s", 8) + size("b", 8), requires_grad=False, elt=8)
    if ops.regime.single_sequence:
        target = g.view("shift labels", padded, size("b s", 8))
    else:
        target = g.op("shift labels", [padded], size("b s", 8), requires_grad=False, elt=8)
    # with num_items_in_batch: reduction='sum', then / num_items (memcalc.families.call_path)
    loss = divide_by_num_items(ops, cross_entropy_fp32(ops, logits32, target))
    ops.scope_end([padded])
    return loss


def reference_cross_entropy(ops: Ops, logits: Value, target: Value) -> Value:
    """F.cross_entropy(logits.view(-1, V), targets.view(-1)): autocast's fp32 list casts the
    logits up (CPU and CUDA), then log_softmax + nll_loss."""
    return cross_entropy_fp32(ops, ops.fp32_op_input(logits), target)
