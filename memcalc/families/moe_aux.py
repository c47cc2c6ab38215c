"""The auxiliary load-balancing loss of transformers' MoE causal LMs (config output_router_logits)
and Mixtral's router jitter, op by op (transformers 5.24: models/mixtral/modeling_mixtral.py;
Qwen2-MoE, Qwen3-MoE and OLMoE carry the same `load_balancing_loss_func`).

Capture: `_can_record_outputs = {"router_logits": OutputRecorder(*TopKRouter, index=0)}` hooks
every router (utils/output_capturing.py) while the base model's forward runs, so each MoE layer's
(N, E) logits stay alive until the causal LM's forward returns (the output object holds them).
The hooks are inactive during a checkpoint recompute (the collector is reset when the forward
returns): the recomputed logits are not kept.

Loss, per MoE layer in order, with N = b*s tokens, E experts, k = top_k:
softmax(logits) (saved: its result), topk (values and int64 indices, held by `_` and
`selected_experts` until the next layer rebinds them: nothing flows back through them),
indices.to(float32) (N*k), histc (E), a new (E) running count; routing_weights.float() (a copy
unless fp32), .sum(dim=0) (E), a new (E) running sum. Then two (E) divisions, a (1, E) product
(saving the counts), sum, * E, * router_aux_loss_coef, and `loss +=` in place.

Backward (it runs first: its nodes are the step's last): scalar products, SumBackward's expand
(a view of the (E) gradient, no allocation), the .float() copy's gradient (N, E) in the logits'
dtype, softmax's gradient (N, E), which waits in the router linear's input buffer until that
layer's backward adds the router's own gradient: L (N, E) gradients are alive through the
trunk's backward (measured: validate/matrices/rows/moe-aux-loss.json).
"""
from __future__ import annotations

from memcalc.core.poly import Poly
from memcalc.families.base import TOKENS
from memcalc.families.moe_ops import INDEX, inplace
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, Grad, Value
from memcalc.tape.ops import Ops

FP32 = 4


def router_jitter(ops: Ops, x: Value) -> Value:
    """MixtralSparseMoeBlock.forward in training with router_jitter_noise > 0:
    `hidden_states *= torch.empty_like(hidden_states).uniform_(1 - j, 1 + j)`. The noise (x's
    shape and dtype) is saved by the in-place mul (the gradient of `hidden_states` is
    grad * noise, a new tensor); the multiply writes into x's storage."""
    noise = ops.g.op("jitter empty_like().uniform_()", [], x.size, requires_grad=False, elt=x.elt)
    return inplace(ops, "hidden_states *= jitter", x, [noise], [noise], [Grad(0)])


def load_balancing_loss(ops: Ops, spec: ModelSpec, router_logits: list[Value]) -> Value:
    """load_balancing_loss_func(router_logits, E, k, attention_mask=None); returns the (fp32
    scalar) aux_loss, held by the output until the forward returns."""
    g, E, k = ops.g, spec.moe.num_experts, spec.moe.top_k
    vector = Poly.const(E * FP32)
    counts = g.op("zeros tokens_per_expert_sum", [], vector, requires_grad=False)
    sums = g.op("zeros router_prob_sum", [], vector, requires_grad=False)
    previous: list[Value] = []  # `_, selected_experts` of the layer before
    for logits in router_logits:
        probs = _aux_softmax(ops, logits)
        # topk: nothing flows back (its values are discarded), so its node saves nothing that
        # outlives `_`: modelled without autograd, the outputs freed when rebound
        topk = g.op_multi("aux topk", [probs], [TOKENS * (k * probs.elt), TOKENS * (k * INDEX)],
                          requires_grad=False, elts=[probs.elt, INDEX])
        ops.scope_end(previous)
        previous = topk
        as_float = g.op("selected_experts.to(float32)", [topk[1]], TOKENS * (k * FP32),
                        requires_grad=False)
        histc = g.op("aux histc", [as_float], vector, requires_grad=False)
        counts = g.op("tokens_per_expert_sum +", [counts, histc], vector, requires_grad=False)
        wide = ops.to(probs, FP32, "routing_weights.float()")
        # sum(dim=0)'s backward expands the (E) gradient: a view, no allocation
        layer_sum = g.op("routing_weights.sum(dim=0)", [wide], vector, backward=[Alias(0)])
        sums = ops.add(sums, layer_sum, "router_prob_sum +")
    tokens = g.op("tokens_per_expert_sum / total_rows", [counts], vector, requires_grad=False)
    per_expert = ops.scale(sums, "router_prob_sum / total_rows")
    row = g.view("router_prob_per_expert.unsqueeze(0)", per_expert)
    product = ops.mul(tokens, row, "tokens_per_expert * router_prob")  # saves the counts
    total = g.op("torch.sum", [product], Poly.const(FP32), backward=[Alias(0)])  # expand: a view
    aux = ops.scale(total, "* num_experts")
    ops.scope_end(previous + [counts, sums, tokens, per_expert])  # the function's locals
    return aux


def _aux_softmax(ops: Ops, logits: Value) -> Value:
    """softmax(layer_gate, dim=-1), saving its result: in the logits' dtype, except under CUDA
    autocast (softmax is on its fp32 list: a cast copy, then fp32). Its backward allocates the
    (N, E) gradient; the gradient that reaches it in fp32 is SumBackward's stride-0 expand
    (measured on CPU: no copy the tracker sees). CUDA's softmax_backward_cuda_out also computes
    `grad * output` into an (N, E) temporary (aten SoftMax.cu, source-read); like every other
    softmax of the engine's programs, that kernel temporary is not modelled (not measured on
    CUDA)."""
    x = ops.fp32_op_input(logits) if ops.device == "cuda" else logits
    return ops.g.op("aux softmax", [x], x.size, backward=[Grad(0)], elt=x.elt, save_output=True)


def add_aux_loss(ops: Ops, spec: ModelSpec, router_logits: list[Value]) -> Value:
    """`loss += router_aux_loss_coef * aux_loss.to(loss.device)` after the causal-LM loss: the
    product is a new scalar, the add writes into the loss (whose node saves nothing of it), and
    the in-place result is what backward starts from. Returns aux_loss."""
    g = ops.g
    aux = load_balancing_loss(ops, spec, router_logits)
    scaled = ops.scale(aux, "router_aux_loss_coef *")
    loss = g.keep[0]
    total = inplace(ops, "loss +=", loss, [scaled], [], [Alias(0), Alias(1)])
    g.keep[0] = total
    return aux
