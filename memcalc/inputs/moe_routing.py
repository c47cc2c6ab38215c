"""How the tokens of a mixture-of-experts layer are routed to its experts (TrainingConfig.moe_routing),
as the per-layer, per-expert token counts the programs size their tensors by (memcalc.families.moe).

Routing matters only where tensors are sized by one expert's tokens: transformers' "eager" experts
loop (modeling_mixtral.py MixtralExperts.forward: one gather, matmul, activation... per hit expert).
Its default "grouped_mm" path (integrations/moe.py grouped_mm_experts_forward) sizes every tensor
by S = tokens * top_k, whatever the routing.
"""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from memcalc.core.errors import SpecError
from memcalc.core.poly import Poly
from memcalc.inputs.model_fields import ModelFields

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig


def moe_layers(spec: ModelFields) -> list[int]:
    """The layers with a sparse MLP.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> moe_layers(ModelSpec.preset("mixtral-8x7b").with_(num_layers=3))
    [0, 1, 2]
    """
    if spec.moe is None:
        return []
    return [i for i in range(spec.num_layers) if i not in spec.moe.dense_layers]


def token_counts(spec: ModelFields, routing: object, layer: int) -> list[Poly]:
    """Tokens each expert of a MoE layer receives, as polynomials in b and s (N = b*s tokens,
    S = N*top_k token-expert pairs):
    - "balanced": S/E each;
    - ("worst", i): the i-th of `worst_routings` (the engine simulates each for "worst"; a
      graph built directly from a regime with "worst" takes the first);
    - explicit counts per MoE layer and expert (constants: they fix b*s).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> spec = ModelSpec.preset("mixtral-8x7b").with_(num_layers=1)
    >>> token_counts(spec, ("worst", 0), 0)[-1], token_counts(spec, "balanced", 0)[0]
    (Poly(1*b*s), Poly(1/4*b*s))
    >>> token_counts(spec, ((10, 0, 0, 0, 0, 0, 0, 6),), 0)[:2]
    [Poly(10), Poly(0)]
    """
    E, k = spec.moe.num_experts, spec.moe.top_k
    if routing == "balanced":
        return [Poly({(1, 1): Fraction(k, E) if k % E else k // E})] * E
    if routing == "worst":  # a graph built outside the engine: the first of worst_routings
        routing = ("worst", 0)
    if is_worst(routing):  # one of worst_routings
        return worst_routings(E, k)[routing[1]]
    return [Poly.const(n) for n in routing[moe_layers(spec).index(layer)]]


def _frac(num: int, den: int) -> int | Fraction:
    return num // den if num % den == 0 else Fraction(num, den)


def _share(total: Poly, experts: int) -> list[Poly]:
    """`total` tokens shared evenly by `experts` experts (fractional counts stand for an even
    split; the sums that matter stay exact)."""
    return [Poly({m: _frac(c, experts) for m, c in total.terms.items()})] * experts


def is_worst(routing: object) -> bool:
    """Whether a routing (TrainingConfig.moe_routing, or the engine's ("worst", i)) is the
    'worst' bound rather than a routing that can happen.

    >>> is_worst("worst"), is_worst(("worst", 2)), is_worst("balanced"), is_worst(((4, 4),))
    (True, True, False, False)
    """
    return routing == "worst" or (isinstance(routing, tuple) and routing[:1] == ("worst",))


def _spread(total: Poly, experts: int) -> list[Poly]:
    """`total` tokens shared evenly by `experts` experts, each of them hit: where `total` is
    nothing, one token each (more tokens than the routing has, so still a bound; see
    worst_routings)."""
    if total.is_zero():
        return [Poly.const(1)] * experts
    return _share(total, experts)


def worst_routings(E: int, k: int) -> list[list[Poly]]:
    """Routings whose simulations together bound the eager experts loop's peak over every routing
    (every layer's counts n_0..n_{E-1}, whole numbers each at most N = b*s, summing to S = N*k),
    after the allocator's rounding; the engine simulates each and takes the largest moment.

    Proof sketch. Each storage the loop makes for expert e is a_j * n_e bytes (a_j whole bytes
    per token, the same for every expert: where, gather, gate_up, silu, mul, down, the routing
    weight and their gradients), or a constant (a weight slice's autocast copy) made only when e
    is hit; every other storage of the step is the same for every routing. Rounded to g bytes,
    a_j * n_e takes at most a_j * n_e + sigma_j with sigma_j = g - gcd(a_j, g) (a_j * n_e is a
    multiple of gcd(a_j, g); memcalc.tape.graph.count_slack). In these simulations each such
    storage is counted as a_j * n_e + sigma_j and not rounded again, so every bound below holds
    after rounding: it is the unrounded argument with a larger constant per hit expert.

    At any moment of the step, every MoE layer but the one running holds, per hit expert, saved
    tensors of sum_j a_j * n_e + c (c >= 0 the per-hit constants and sigmas): at most
    A * S + C * E over the layer (its experts all hit). In the running layer, write B for the
    tokens of the experts whose saved tensors are alive (the `before` experts) and n for the
    expert the loop is at: memory is alpha * B + beta * n + (per-hit constants of the before
    experts) + K with alpha, beta >= 0 (sizes grow with tokens) and K the same for every routing
    at that point of the loop. The experts already done in backward leave nothing sized by
    their tokens (their gradients went into buffers of routing-free size). Forward and a
    checkpoint's recompute run the experts in index order, backward in reverse; backward's
    first expert makes each expert weight's gradient, every later one a full-size gradient
    summed into it, so K depends only on whether the expert is the first backward runs.
    - forward/recompute at expert e, or backward at the first expert e: the before experts are
      0..e-1, B <= S - n. Expert E-1 with every other one before it (B = S - n) is at least
      that; the maximum of a linear function of n in [1, N] is at n = 1 or n = N.
    - backward at a later expert e: at least one expert after e was hit, so B <= S - n - 1
      over at most E-2 experts before it: expert E-2 with E-1 holding 1 token is at least that.
      Its largest alpha * B + beta * n over 1 <= n <= N, B <= (E-2) * N, B <= S - n - 1 is at
      a vertex: n = 1 or n = min(N, S-1) (k = 1: N - 1) with B = S - n - 1, and where the cap
      binds (k = E-1) n = N - 1 with B = (E-2) * N.
    The before experts' B is spread evenly over them, so that each is hit (at most C more than
    any routing's); where B is nothing (top-1), each gets one token, more than the routing has,
    which only adds. Each vertex routing is used for every layer (it hits every expert, and
    sums to at least S). k = E: every token goes to every expert, one routing.

    >>> [[str(p) for p in r] for r in worst_routings(4, 2)]  # doctest: +NORMALIZE_WHITESPACE
    [['Poly(1/3*b*s)', 'Poly(1/3*b*s)', 'Poly(1/3*b*s)', 'Poly(1*b*s)'],
     ['Poly(-1/3 + 2/3*b*s)', 'Poly(-1/3 + 2/3*b*s)', 'Poly(-1/3 + 2/3*b*s)', 'Poly(1)'],
     ['Poly(-1/2 + 1/2*b*s)', 'Poly(-1/2 + 1/2*b*s)', 'Poly(1*b*s)', 'Poly(1)'],
     ['Poly(-1 + 1*b*s)', 'Poly(-1 + 1*b*s)', 'Poly(1)', 'Poly(1)']]
    >>> [[str(p) for p in r] for r in worst_routings(2, 1)]
    [['Poly(1)', 'Poly(1*b*s)'], ['Poly(-1 + 1*b*s)', 'Poly(1)']]
    """
    N, one = Poly.bs(1), Poly.const(1)
    S = N * k
    if k == E:
        return [[N] * E]
    out = [_spread(S - n, E - 1) + [n] for n in (N, one)]  # E-1 first in backward (and forward)
    if E >= 3:  # E-2 after E-1 (holding one token)
        top = N if k >= 2 else N - one
        if k == E - 1:  # B capped at (E-2)*N: n = N - 1 with B full, and n = N
            seconds = [[N] * (E - 2) + [N - one, one], _spread(S - N - one, E - 2) + [N, one]]
        else:
            seconds = [_spread(S - n - one, E - 2) + [n, one] for n in (top, one)]
        out += seconds
    out = [[p if not p.is_zero() else Poly() for p in r] for r in out]
    unique = []
    for r in out:
        if r not in unique:
            unique.append(r)
    return unique


def check_routing(model: ModelFields, training: TrainingConfig) -> None:
    """Explicit routing counts must fit the model and the shape: one row per MoE layer, one count
    per expert, each at most b*s (an expert receives a token once), each row summing to
    b*s*top_k.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.preset("mixtral-8x7b").with_(num_layers=1)
    >>> check_routing(spec, TrainingConfig(micro_batch=1, seq_len=4, moe_routing=((4, 4, 0, 0, 0, 0, 0, 0),)))
    >>> check_routing(spec, TrainingConfig(micro_batch=1, seq_len=4, moe_routing=((4, 3, 0, 0, 0, 0, 0, 0),)))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: moe_routing: layer 0's counts sum to 7, not b*s*top_k = 1*4*2 = 8; fix: ...
    """
    routing = training.moe_routing
    if isinstance(routing, str):
        return
    if model.moe is None:
        raise SpecError("moe_routing", "explicit routing counts given for a dense model",
                        "use moe_routing='worst' (the default) or a mixture-of-experts model")
    layers, E, k = moe_layers(model), model.moe.num_experts, model.moe.top_k
    N = training.micro_batch * training.seq_len
    if len(routing) != len(layers) or any(len(row) != E for row in routing):
        raise SpecError("moe_routing", f"expected {len(layers)} rows (one per MoE layer) of {E} "
                        "counts (one per expert)", "give one row per MoE layer, one count per expert")
    for i, row in zip(layers, routing):
        if sum(row) != N * k:
            raise SpecError("moe_routing", f"layer {i}'s counts sum to {sum(row)}, not b*s*top_k = "
                            f"{training.micro_batch}*{training.seq_len}*{k} = {N * k}",
                            "give each MoE layer's token counts per expert, summing to "
                            "micro_batch*seq_len*top_k")
        if max(row) > N:
            raise SpecError("moe_routing", f"layer {i} gives an expert {max(row)} tokens, more "
                            f"than the {N} tokens of the micro-batch (top-k experts are distinct)",
                            "give each expert at most micro_batch*seq_len tokens")
