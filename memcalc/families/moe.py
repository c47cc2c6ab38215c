"""The sparse MoE block of transformers 5.x (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), op by op:
the top-k router and the experts, on either experts path (TrainingConfig.experts_implementation).

N = b*s tokens, S = N*top_k (token, expert) pairs, E experts, h hidden, f an expert's width.

Router (modeling_mixtral.py MixtralTopKRouter, modeling_qwen3_moe.py Qwen3MoeTopKRouter):
F.linear logits (N, E); softmax in fp32 (Mixtral: `logits.float()` first; Qwen/OLMoE:
`softmax(dtype=float)`, the same copy made inside); topk values (N, k) fp32 and int64 indices;
renormalisation by an in-place division (autograd clones the values it overwrites); Qwen/OLMoE cast
the weights back to the logits' dtype.

Experts, "grouped_mm" (integrations/moe.py grouped_mm_experts_forward): sort the S expert ids,
gather the hidden states and the weights in that order, histc/cumsum offsets, one
torch.nn.functional.grouped_mm up (S, 2f), silu(gate) * up (S, f), one grouped_mm down (S, h),
times the routing weights, un-permute, sum over top_k. grouped_mm is not an autocast op: it runs in
the parameters' dtype (fp32 under AMP). Every size is a multiple of S: routing changes nothing.

Experts, "eager" (MixtralExperts.forward): one_hot (N, k, E+1) int64 mask; for each hit expert in
index order: torch.where (two int64 index vectors of its n tokens, one storage), gather (n, h),
linear with the expert's weight slice (n, 2f), silu * up (n, f), linear (n, h), times its routing
weights (n, 1), index_add_ into a zeros_like output. Sizes follow each expert's token count
(memcalc.inputs.moe_routing.token_counts), and each slice's gradient is a zero-filled full-size parameter gradient
(select_backward). Under 'worst' routing each storage sized by one expert's tokens is counted with
the most the allocator's rounding can add to it (memcalc.tape.graph.count_slack; the bound's
argument is memcalc.inputs.moe_routing.worst_routings).
"""
from __future__ import annotations

from typing import Callable

from memcalc.inputs.moe_routing import is_worst, token_counts
from memcalc.core.poly import Poly
from memcalc.families.base import TOKENS
from memcalc.families.moe_ops import INDEX, inplace  # re-exported (memcalc.families.hf_gpt_oss)
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, FreeTemps, Grad, Returns, Temp, Value, product_saves
from memcalc.tape.ops import Ops, numel


def router(ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
    """The top-k router on (N, h) hidden states; returns (logits (N, E), routing weights (N, k),
    indices (N, k)); the MoE block holds the logits (`_, weights, index = self.gate(x)`) until it
    returns."""
    g, E, k = ops.g, spec.moe.num_experts, spec.moe.top_k
    logits = ops.linear(x, p("mlp.gate.weight", E * spec.hidden_size, E), None, TOKENS, E, "router")
    probs = ops.unary_saving_output("router softmax", ops.to(logits, 4, "router logits fp32"))
    values, indices = g.op_multi("topk", [probs], [TOKENS * (k * 4), TOKENS * (k * INDEX)],
                                 backward=[Temp(probs.size), Grad(0)], elts=[4, INDEX], save_outputs=(1,))
    if spec.moe.norm_topk_prob:
        total = g.op("topk sum", [values], TOKENS * 4, backward=[Grad(0)], elt=4)
        original = g.op("div_ clone", [values], values.size, backward=[Alias(0)], elt=4)
        # div_'s backward: grad / total and -grad * result / total (N, k) temporaries
        values = inplace(ops, "topk div_", values, [total, original], [original, total],
                         [Temp(values.size), Temp(values.size), Grad(0), Grad(1), FreeTemps()])
    if spec.family != "mixtral":  # router_top_value.to(router_logits.dtype)
        values = ops.to(values, logits.elt, "routing weights .to(logits dtype)")
    return logits, values, indices


def grouped_mm_experts(ops: Ops, spec: ModelSpec, x: Value, weights: Value, indices: Value,
                       p: Callable[..., Value]) -> Value:
    """grouped_mm_experts_forward on (N, h) hidden states; returns the (N, h) output."""
    g, E, k, h, f = ops.g, spec.moe.num_experts, spec.moe.top_k, spec.hidden_size, spec.moe.expert_ffn_size
    S = TOKENS * k
    gate_up = p("mlp.experts.gate_up_proj", E * 2 * f * h, E, (2 * f, h))
    down = p("mlp.experts.down_proj", E * h * f, E, (h, f))
    held = grouped_dispatch(ops, spec, x, weights, indices)
    gathered, offsets = held[3], held[7]
    pe = gate_up.elt  # grouped_mm runs in the weights' dtype (input.to(weight.dtype))
    xin = ops.to(gathered, pe, "input.to(weight.dtype)")
    up = g.op("grouped_mm gate_up", [xin, gate_up, offsets], S * (2 * f * pe), saves=[xin, gate_up, offsets],
              backward=[Grad(1), Grad(0)], elt=pe)
    act, mul = _gated(ops, up, S, f)
    y = g.op("grouped_mm down", [mul, down, offsets], S * (h * pe), saves=[mul, down, offsets],
             backward=[Grad(1), Grad(0)], elt=pe)
    return grouped_combine(ops, spec, x, y, held)


def grouped_dispatch(ops: Ops, spec: ModelSpec, x: Value, weights: Value, indices: Value) -> list[Value]:
    """grouped_mm_experts_forward (integrations/moe.py) up to the first grouped_mm: the expert ids
    sorted (values and permutation), each slot's token, the gathered (S, h) hidden states, the
    permuted routing weights, the ids as float, histc and the cumsum offsets; returned in that
    order: [perm, sorted_ids, token_of, gathered, w_sorted, as_float, histc, offsets] (the
    function's locals, alive until it returns, but token_of: `hidden_states[perm // num_top_k]`'s
    index is a temporary only the gather saves, freed at once in a checkpointed forward;
    measured, GPT-OSS and Mixtral per-layer: forward phase +0.10% .. +0.16% when held)."""
    g, E, k, h = ops.g, spec.moe.num_experts, spec.moe.top_k, spec.hidden_size
    S = TOKENS * k
    sorted_ids, perm = g.op_multi("sort expert ids", [indices], [S * INDEX, S * INDEX],
                                  requires_grad=False, elts=[INDEX, INDEX])
    token_of = g.op("perm // top_k", [perm], S * INDEX, requires_grad=False, elt=INDEX)
    gathered = g.op("hidden_states[perm // top_k]", [x, token_of], S * (h * x.elt), saves=[token_of],
                    backward=[Temp(TOKENS * (h * x.elt)), Grad(0), FreeTemps()], elt=x.elt)
    w_sorted = g.op("sample_weights[perm]", [weights, perm], S * weights.elt, saves=[perm],
                    backward=[Temp(weights.size), Grad(0), FreeTemps()], elt=weights.elt)
    as_float = g.op("expert ids .float()", [sorted_ids], S * 4, requires_grad=False)
    histc = g.op("histc", [as_float], Poly.const(E * 4), requires_grad=False)
    offsets = g.op("cumsum offsets", [histc], Poly.const(E * 4), requires_grad=False)
    return [perm, sorted_ids, token_of, gathered, w_sorted, as_float, histc, offsets]


def grouped_combine(ops: Ops, spec: ModelSpec, x: Value, y: Value, held: list[Value]) -> Value:
    """grouped_mm_experts_forward after the down projection `y` (S, h): times the permuted
    routing weights, un-permuted, summed over top_k, cast to the hidden states' dtype; `held`
    (grouped_dispatch's locals, then any the caller adds) die with y when the function returns."""
    g, perm, w_sorted = ops.g, held[0], held[4]
    S, h = TOKENS * spec.moe.top_k, spec.hidden_size
    elt = max(y.elt, w_sorted.elt)
    # mul backward (measured): grad * weights (y's gradient; in the promoted dtype, then cast to
    # y's when they differ), grad * y (a temporary) summed to the weights' (S, 1)
    # gradient by validate_outputs' sum_to after apply returns (Returns: in a checkpointed
    # layer y and the weights, saved by this product only, are freed first; measured, Qwen2-MoE
    # fp32 per-layer top_k 1, fresh8-015: the (S, 1) fp32 sum is made after those frees)
    wide = S * (h * elt)
    back = [Grad(0), Temp(wide), Returns(), Grad(1), FreeTemps()] if elt == y.elt else \
        [Temp(wide), Temp(wide), Returns(), Grad(0), FreeTemps(), Grad(1)]
    weighted = g.op("* routing weights", [y, w_sorted], S * (h * elt), saves=[y, w_sorted],
                    backward=back, elt=elt)
    inv = g.op("inv_perm", [perm], S * INDEX, requires_grad=False, elt=INDEX)
    g.op("arange", [], S * INDEX, requires_grad=False, elt=INDEX)
    # index backward: new_zeros (S, h) and index_put's result
    unperm = g.op("weighted_out[inv_perm]", [weighted, inv], weighted.size, saves=[inv],
                  backward=[Temp(weighted.size), Grad(0), FreeTemps()], elt=elt)
    # sum's backward expands the (N, h) gradient; view's backward copies it to (S, h) (reshape).
    # With top_k 1 the expanded dimension has size 1 and the reshape is a view: no copy (measured,
    # GPT-OSS top_k 1: one (N, h) gradient alive; top_k 4: two, the copy)
    back = [Alias(0)] if spec.moe.top_k == 1 else [Grad(0)]
    out = g.op("sum over top_k", [unperm], TOKENS * (h * elt), backward=back, elt=elt)
    # `return final_hidden_states.to(hidden_states.dtype)`: cast while the function's locals live
    # (measured, Mixtral pure bf16, whose fp32 routing weights promote the product: the forward
    # phase peaks at this cast, with the sorted ids and histc alive)
    cast = ops.to(out, x.elt, "experts out .to(hidden dtype)")
    token_of = held[2]  # not a local (grouped_dispatch)
    ops.scope_end([v for v in held if v is not token_of] + [y, inv, unperm] + ([out] if cast is not out else []))
    return cast


def _gated(ops: Ops, up: Value, rows: Poly, f: int) -> tuple[Value, Value]:
    """_default_apply_gate: chunk (views), silu(gate) (saves its input), * up (saves both)."""
    g = ops.g
    gate, upv = g.views("chunk", up, [rows * (f * up.elt)] * 2, backward=[Grad(0)])  # cat of the grads
    act = g.op("silu", [gate], gate.size, saves=[gate], backward=[Grad(0)], elt=up.elt)
    return act, ops.mul(act, upv, "silu * up")


def eager_experts(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, weights: Value,
                  indices: Value, layer: int, p: Callable[..., Value]) -> Value:
    """MixtralExperts.forward's loop over the hit experts; returns the (N, h) output."""
    g, E, k, h, f = ops.g, spec.moe.num_experts, spec.moe.top_k, spec.hidden_size, spec.moe.expert_ffn_size
    gate_up = p("mlp.experts.gate_up_proj", E * 2 * f * h, E, (2 * f, h))
    down = p("mlp.experts.down_proj", E * h * f, E, (h, f))
    out = g.op("zeros_like", [], x.size, requires_grad=False, elt=x.elt)
    mask = g.op("one_hot expert mask", [indices], TOKENS * (k * (E + 1) * INDEX), requires_grad=False,
                elt=INDEX)
    hit = g.op("expert_hit", [mask], Poly.const(E * INDEX), requires_grad=False, elt=INDEX)
    bound = is_worst(regime.moe_routing)
    g.granularity = regime.granularity
    rebind = _Locals(ops)
    for e, n in enumerate(token_counts(spec, regime.moe_routing, layer)):
        if n.is_zero():
            continue
        g.count = n if bound else None  # the bound counts each storage's rounding at its most
        where = rebind("top_k_pos, token_idx", g.op("torch.where", [mask, hit], n * (2 * INDEX),
                                                    requires_grad=False, elt=INDEX))
        state = rebind("current_state", g.op("hidden_states[token_idx]", [x, where], n * (h * x.elt),
                                             saves=[where], backward=[Temp(x.size), Grad(0), FreeTemps()],
                                             elt=x.elt))
        w1 = g.view(f"gate_up_proj[{e}]", gate_up, Poly.const(2 * f * h * gate_up.elt), backward=[Grad(0)])
        up = rebind("gate, up", ops.linear(state, w1, None, n, 2 * f, "expert gate_up"))
        # act_fn(gate) is a temporary of `act_fn(gate) * up`, freed after the product unless
        # autograd saved it (inside a checkpointed layer's forward it did not)
        mul = rebind("current_hidden_states", _gated(ops, up, n, f)[1])
        w2 = g.view(f"down_proj[{e}]", down, Poly.const(h * f * down.elt), backward=[Grad(0)])
        y = rebind("current_hidden_states", ops.linear(mul, w2, None, n, h, "expert down"))
        w = g.op("top_k_weights[token_idx, top_k_pos]", [weights, where], n * weights.elt, saves=[where],
                 backward=[Temp(weights.size), Grad(0), FreeTemps()], elt=weights.elt)
        # MulBackward0 (self's formula first): grad * w is y's gradient; grad * y, a temporary of
        # y's size, is summed to w's (n, 1) gradient by the engine's sum_to (validate_outputs).
        # Measured (tracker, Qwen3-MoE/Mixtral/OLMoE fp32 every-k, b=7, s=103): mul, mul (+n*h*4
        # each: the peak), then sum.dim_IntList with live bytes down by the temporary: the (n, 1)
        # gradient is counted after the temporary is gone.
        scaled = g.op("* routing weights", [y, w], n * (h * y.elt), saves=product_saves(y, w),
                      backward=[Grad(0), Temp(n * (h * y.elt)), FreeTemps(), Grad(1)], elt=y.elt) \
            if y.elt >= w.elt else \
            g.op("* routing weights", [y, w], n * (h * w.elt), saves=[y, w], backward=[Grad(0), Grad(1)],
                 elt=w.elt)
        rebind("current_hidden_states", scaled)
        scaled = ops.to(scaled, out.elt, ".to(final dtype)")
        # index_add_ saves its source (derivatives.yaml: source.dim() in its formula)
        out = inplace(ops, "index_add_", out, [scaled], [where, scaled], [Alias(0), Grad(1)])
    g.count = None
    ops.scope_end([mask, hit, *rebind.held()])  # the last expert's locals live to the return
    return out


class _Locals:
    """The loop's Python locals (MixtralExperts.forward): a name keeps its tensor alive until the
    next iteration rebinds it, after the new tensor is made (an assignment evaluates its right
    side first). Under autograd they are saved anyway; inside a checkpointed layer, whose
    forward saves nothing, the previous expert's tensors stay alive while the next computes."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.bound: dict[str, Value] = {}

    def __call__(self, name: str, value: Value) -> Value:
        """Bind `name` to `value`; the tensor it named before is dropped here."""
        old = self.bound.get(name)
        self.bound[name] = value
        if old is not None and old is not value:
            self.ops.scope_end([old])
        return value

    def held(self) -> list[Value]:
        """The tensors the names refer to now."""
        return list(self.bound.values())


def sparse_moe_block(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int,
                     p: Callable[..., Value], captured: list[Value] | None = None) -> Value:
    """The MoE block on the post-attention-norm hidden states (N, h): router, experts and, for
    Qwen2-MoE, the shared expert (run first) scaled by sigmoid(shared_expert_gate(x)). With
    output_router_logits the router's logits are appended to `captured` (the output-capturing
    hook keeps them; memcalc.families.moe_aux); Mixtral's jitter multiplies x first."""
    if spec.moe.router_jitter_noise > 0:
        from memcalc.families.moe_aux import router_jitter

        x = router_jitter(ops, x)
    shared = _shared_expert(ops, spec, x, p) if spec.moe.shared_expert_ffn_size else None
    logits, weights, indices = router(ops, spec, x, p)
    if spec.moe.output_router_logits and captured is not None:
        captured.append(logits)
    if regime.experts_implementation == "eager":
        out = eager_experts(ops, spec, regime, x, weights, indices, layer, p)
    else:
        out = grouped_mm_experts(ops, spec, x, weights, indices, p)
    if shared is None:
        ops.scope_end([logits, weights, indices])
        return out
    gate = ops.linear(x, p("mlp.shared_expert_gate.weight", spec.hidden_size, 1), None, TOKENS, 1,
                      "shared_expert_gate")
    scaled = _gate_times_shared(ops, ops.unary_saving_output("sigmoid", gate), shared)
    out = ops.add(out, scaled, "experts + shared")
    # `_, routing_weights, selected_experts = self.gate(...)`: Qwen2MoeSparseMoeBlock.forward's
    # locals until it returns, through the shared expert's gate (measured: the router's logits
    # and weights, 2 * N * 2 B under bf16-amp, alive at `expert_output + shared_expert_output`)
    ops.scope_end([logits, weights, indices])
    return out


def _gate_times_shared(ops: Ops, gate: Value, shared: Value) -> Value:
    """`F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output`
    (modeling_qwen2_moe.Qwen2MoeSparseMoeBlock): an (N, 1) gate broadcast over the (N, h) shared
    output, so the product is (N, h) (measured: +b*s*h*2 B at that mul under bf16-amp).
    Backward (MulBackward0, self's formula first): grad * shared
    at full size, the shared output's grad, then the engine's sum_to reduces the first to (N, 1)
    (torch/csrc/autograd/engine.cpp validate_outputs), freeing the full one."""
    elt = max(gate.elt, shared.elt)
    full = numel(shared) * elt
    return ops.g.op("sigmoid * shared", [gate, shared], full, saves=product_saves(gate, shared),
                    backward=[Temp(full), Grad(1), Grad(0), FreeTemps()], elt=elt)


def _shared_expert(ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> Value:
    """Qwen2MoeMLP(shared_expert_intermediate_size): a SwiGLU every token runs through."""
    from memcalc.families.layers import swiglu_mlp

    f = spec.moe.shared_expert_ffn_size
    return swiglu_mlp(ops, spec.with_(intermediate_size=f, mlp_bias=False), x, TOKENS,
                      lambda name, *shape: p(name.replace("mlp.", "mlp.shared_expert."), *shape))
