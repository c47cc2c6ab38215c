"""The largest micro-batch, sequence length or depth that fits a memory budget.

The steady-state peak is a max of candidate polynomials in b (degree 1) and s (degree <= 2), so
the peak fits iff every candidate fits: for the unknown x, each candidate is c2 x^2 + c1 x + c0,
its largest integer root of `<= budget` comes from an exact integer square root, and the min over
candidates is the first guess. estimate() then confirms it: the answer n satisfies
peak(n) <= budget < peak(n + 1). Depth is not symbolic: doubling, then bisection, over estimate().
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from memcalc.core.arguments import check_int
from memcalc.queries.peaks import steady_polys
from memcalc.queries.basis import budget_bytes, fits_on
from memcalc.queries.estimate import check_basis, estimate
from memcalc.inputs.gpus import parse_budget
from memcalc.core.limits import MAX_DATA_PARALLEL, MAX_LAYERS, MAX_RANK_LAYERS
from memcalc.refusals.step import check_search, learned_positions

if TYPE_CHECKING:
    from typing import Callable

    from memcalc.core.poly import Poly
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

NO_LIMIT = 2 ** 40  # answers are capped here when no candidate grows with the unknown


@dataclass(frozen=True)
class Capacity:
    """How far one field can go within a budget.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> r = max_micro_batch(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=1024), "24GiB")
    >>> r.peak_bytes <= r.budget_bytes < r.next_peak_bytes
    True
    """

    field: str
    """The field solved for: micro_batch, seq_len or num_layers."""
    budget_bytes: int
    """The memory budget, bytes."""
    value: int
    """The largest value that fits; 0 when even 1 does not fit."""
    peak_bytes: int | None
    """Steady-state peak at `value` (None when value is 0)."""
    next_peak_bytes: int | None
    """Steady-state peak at `value + 1` (None when value hits the cap NO_LIMIT)."""
    basis: str = "allocated"
    """What the peaks count (memcalc.queries.estimate.BASES): allocated, reserved or device."""

    @property
    def fits(self) -> bool:
        """Whether any value fits."""
        return self.value > 0

    @property
    def headroom_bytes(self) -> int | None:
        """Budget left at `value`."""
        return None if self.peak_bytes is None else self.budget_bytes - self.peak_bytes


def _peak(model: ModelSpec, training: TrainingConfig) -> int:
    return estimate(model, training).peak_bytes


def largest_root(coeffs: dict[int, int], budget: int, cap: int = NO_LIMIT) -> int:
    """Largest integer x in [0, cap] with sum(c * x**p) <= budget, for degree <= 2 and a polynomial
    nondecreasing on x >= 1 (then it is a first guess that estimate() confirms).

    >>> largest_root({0: 10, 1: 3}, 100), largest_root({2: 1}, 99), largest_root({0: 5}, 4)
    (30, 9, 0)
    """
    scale = math.lcm(*(Fraction(c).denominator for c in coeffs.values()))  # MoE routings: fractions
    coeffs, budget = {p: int(c * scale) for p, c in coeffs.items()}, budget * scale
    c0, c1, c2 = coeffs.get(0, 0), coeffs.get(1, 0), coeffs.get(2, 0)
    room = budget - c0
    if c2 > 0:
        disc = c1 * c1 + 4 * c2 * room
        if disc < 0:
            return 0
        x = (math.isqrt(disc) - c1) // (2 * c2)
    elif c1 > 0:
        x = room // c1
    else:
        x = cap if room >= 0 else 0
    x = min(max(x, 0), cap)
    while x > 0 and c2 * x * x + c1 * x + c0 > budget:
        x -= 1
    while x < cap and c2 * (x + 1) ** 2 + c1 * (x + 1) + c0 <= budget:
        x += 1
    return x


def _in_unknown(poly: Poly, unknown: str, other: int) -> dict[int, int]:
    """Coefficients of a Poly in b or s, with the other symbol set to `other`."""
    out: dict[int, int] = {}
    for (i, j), c in poly.terms.items():
        power, fixed = (i, other ** j) if unknown == "micro_batch" else (j, other ** i)
        out[power] = out.get(power, 0) + c * fixed
    return out


def _symbolic_guess(model: ModelSpec, training: TrainingConfig, field: str, budget: int) -> int:
    other = training.seq_len if field == "micro_batch" else training.micro_batch
    return min(largest_root(_in_unknown(p, field, other), budget)
               for p in steady_polys(model, training))


def _confirm(peak_at: Callable[[int], int | None], guess: int, budget: int, cap: int = NO_LIMIT) -> int:
    """Move the guess until peak_at(n) <= budget < peak_at(n + 1) (galloping when far off)."""
    n = min(max(guess, 0), cap)
    if n > 0 and peak_at(n) > budget:
        step = 1
        while n > 0 and peak_at(n) > budget:
            n, step = max(n - step, 0), step * 2
    step = 1
    while n < cap and peak_at(n + 1) <= budget:
        n, step = n + step, step * 2
        if n > cap or peak_at(n) > budget:
            return _bisect(peak_at, n - step // 2, min(n, cap), budget)
    return n


def _bisect(peak_at: Callable[[int], int | None], lo: int, hi: int, budget: int) -> int:
    """Largest n in [lo, hi] with peak_at(n) <= budget, given peak_at(lo) <= budget."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if peak_at(mid) <= budget else (lo, mid - 1)
    return lo


def _result(field: str, budget: int | float | str, n: int, peak_at: Callable[[int], int | None],
            cap: int = NO_LIMIT) -> Capacity:
    return Capacity(field, budget, n, peak_at(n) if n else None,
                    peak_at(n + 1) if n < cap else None)


def max_micro_batch(model: ModelSpec, training: TrainingConfig, budget: int | float | str,
                    basis: str = "device") -> Capacity:
    """The largest micro_batch whose steady-state peak fits `budget` (training's other fields kept),
    on `basis` (memcalc.queries.basis: device by default, reserved, or allocated).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> max_micro_batch(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=1024), "1GiB").value
    0
    """
    return _solve_shape(model, training, "micro_batch", budget, basis)


def max_seq_len(model: ModelSpec, training: TrainingConfig, budget: int | float | str,
                basis: str = "device") -> Capacity:
    """The largest seq_len whose steady-state peak fits `budget` on `basis`, at most
    model.max_position_embeddings for a model with a fixed position table (GPT-2, reference).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> r = max_seq_len(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=8, seq_len=1), "A100-80GB")
    >>> r.value, r.next_peak_bytes  # memory allows more; GPT-2 runs at most 1024 tokens
    (1024, None)
    """
    return _solve_shape(model, training, "seq_len", budget, basis)


def _shape_cap(model: ModelSpec, field: str) -> int:
    """The largest value the search may try: max_position_embeddings for seq_len on a model
    with a fixed position table (memcalc.refusals.step.learned_positions), else NO_LIMIT."""
    if field == "seq_len" and learned_positions(model):
        return min(model.max_position_embeddings, NO_LIMIT)
    return NO_LIMIT


def _solve_shape(model: ModelSpec, training: TrainingConfig, field: str, budget: int | float | str,
                 basis: str = "device") -> Capacity:
    check_search(model, training, field)
    check_basis(basis)
    nbytes = parse_budget(budget)
    cap = _shape_cap(model, field)
    guess = _symbolic_guess(model, training, field, nbytes)

    def peak_at(n: int) -> int:
        return _peak(model, training.with_(**{field: n}))

    n = _confirm(peak_at, guess, nbytes, cap)
    if basis == "allocated" or training.device == "cpu":
        return _result(field, nbytes, n, peak_at, cap)

    def allocated_answer(nbytes: int) -> int:
        return _confirm(peak_at, _symbolic_guess(model, training, field, nbytes), nbytes, cap)

    return _step_down(field, budget, basis, n, lambda n: training.with_(**{field: n}), lambda _: model, cap,
                      allocated_answer)


def _step_down(field: str, budget: int | float | str, basis: str, n: int, training_at: Callable,
               model_at: Callable, cap: int, allocated_answer: Callable[[int], int]) -> Capacity:
    """The answer on the reserved or device basis from the allocated one `n` (reserved >= allocated,
    so it is at most n). When n does not fit, the allocated answer for the budget shrunk by the
    basis/allocated ratio at n is the first guess (`allocated_answer(bytes)`); galloping from it
    and bisection find k with k fitting and k + 1 not (memcalc.queries.basis.fits_on)."""
    gpu_budget = budget_bytes(budget, basis)
    seen: dict[int, tuple[bool, int]] = {}

    def at(k: int) -> tuple[bool, int]:
        if k not in seen:
            seen[k] = fits_on(model_at(k), training_at(k), gpu_budget, basis, budget)
        return seen[k]

    def result(k: int) -> Capacity:
        nxt = at(k + 1)[1] if k < cap else None
        return Capacity(field, gpu_budget, k, at(k)[1] if k else None, nxt, basis)

    if n == 0 or at(n)[0]:
        return result(n)
    ratio = at(n)[1] / max(1, _peak(model_at(n), training_at(n)))
    guess = max(0, min(n - 1, allocated_answer(int(gpu_budget / ratio))))
    lo, hi = 0, n  # lo fits (0: trivially), hi does not
    step, k = 1, guess
    if k and at(k)[0]:
        lo = k
        while lo + step < hi and at(lo + step)[0]:
            lo, step = lo + step, step * 2
        hi = min(hi, lo + step)
    elif k:
        hi = k
        while hi - step > 0 and not at(hi - step)[0]:
            hi, step = hi - step, step * 2
        lo = max(0, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid)[0] else (lo, mid)
    return result(lo)


def max_layers(model: ModelSpec, training: TrainingConfig, budget: int | float | str,
               cap: int = MAX_LAYERS, basis: str = "device") -> Capacity:
    """The largest num_layers whose steady-state peak fits `budget` (up to `cap` layers, at most
    memcalc.core.limits.MAX_LAYERS, and MAX_RANK_LAYERS over the data-parallel ranks).

    Where memcalc.engine.depth derives the depth, the peak is a max of terms affine in L
    (engine.depth_form): each term's largest L within the budget, the min over terms, is the
    answer unless the allocator's rounding or per-rank optimizer states move it, and estimate()
    at that depth and the next confirms it. Otherwise (or when the confirmation fails) a
    secant through L = 1, 2 guesses the answer and interpolation search (bisection when it
    stalls) keeps a bracket lo (fits) < hi (does not fit) until hi = lo + 1.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> small = ModelSpec.preset("gpt2").with_(hidden_size=64, num_heads=4, vocab_size=256)
    >>> max_layers(small, TrainingConfig(micro_batch=1, seq_len=16), "64MiB", basis="allocated").value > 4
    True
    >>> max_layers(small, TrainingConfig(micro_batch=1, seq_len=16), "64MiB").value  # a 500 MiB CUDA context
    0
    """
    check_search(model, training, "num_layers")
    check_basis(basis)
    if basis != "allocated" and training.device != "cpu":
        n = max_layers(model, training, budget, cap, "allocated").value
        return _step_down("num_layers", budget, basis, n, lambda _: training,
                          lambda n: model.with_(num_layers=max(n, 1)), min(cap, MAX_LAYERS),
                          lambda nbytes: max_layers(model, training, nbytes, cap, "allocated").value)
    cap = check_int("cap", cap, 1, MAX_LAYERS)
    if training.data_parallel > 1:  # memcalc.core.limits: data-parallel ranks x layers
        cap = max(1, min(cap, MAX_RANK_LAYERS // training.data_parallel))
    nbytes = parse_budget(budget)
    seen: dict[int, int] = {}

    def peak_at(n: int) -> int:
        if n not in seen:
            seen[n] = _peak(model.with_(num_layers=n), training)
        return seen[n]

    guess = _depth_guess(model, training, nbytes, cap)
    if guess is not None and peak_at(guess) <= nbytes and (guess == cap or peak_at(guess + 1) > nbytes):
        return Capacity("num_layers", nbytes, guess, peak_at(guess), peak_at(guess + 1) if guess < cap else None)
    if peak_at(1) > nbytes:
        return Capacity("num_layers", nbytes, 0, None, peak_at(1))
    n = _interpolation_search(peak_at, seen, nbytes, cap)
    return Capacity("num_layers", nbytes, n, peak_at(n), peak_at(n + 1) if n < cap else None)


def _depth_guess(model: ModelSpec, training: TrainingConfig, budget: int, cap: int) -> int | None:
    """The largest depth whose unrounded peak fits, from the terms affine in L of
    engine.depth_form (None where the depth is not derived)."""
    from memcalc.engine.run import depth_form

    form = depth_form(model, training)
    if form is None:
        return None
    b, s, unit = training.micro_batch, training.seq_len, form.layout.unit
    best = cap
    for at, per_unit in form.terms():
        v, d = at.eval(b, s), per_unit.eval(b, s)  # bytes at this depth, and per unit more
        if d > 0:
            best = min(best, model.num_layers + math.floor((budget - v) / d) * unit)
        elif v > budget:
            return None
    return best if best >= 1 else None


def _interpolation_search(peak_at: Callable[[int], int | None], seen: dict, budget: int, cap: int) -> int:
    """Largest n in [1, cap] with peak_at(n) <= budget, given peak_at(1) <= budget."""
    lo, hi = 1, None  # peak_at(lo) <= budget; hi: the smallest depth known not to fit
    while hi is None or hi - lo > 1:
        probe = _next_probe(peak_at, seen, lo, hi, budget, cap)
        if peak_at(probe) <= budget:
            lo = probe
            if lo == cap:
                return cap
        else:
            hi = probe
    return lo


def _next_probe(peak_at: Callable[[int], int | None], seen: dict, lo: int, hi: int | None, budget: int,
                cap: int) -> int:
    """The secant's predicted answer, kept strictly inside the bracket; without an upper end,
    at most double lo (a simulation costs about L**2, so overshooting far is expensive)."""
    below = [k for k in seen if k < lo]
    ref = hi if hi is not None else max(below) if below else None
    if ref is None:
        return min(2, cap)
    slope = (peak_at(ref) - peak_at(lo)) / (ref - lo)
    top = min(2 * lo, cap) if hi is None else hi - 1
    if slope <= 0:
        return top if hi is None else (lo + hi) // 2
    guess = lo + int((budget - peak_at(lo)) // slope)
    if hi is None and guess >= cap:
        return cap  # the line says even `cap` fits: one probe there settles it (or brackets)
    return min(max(guess, lo + 1), top)


def min_world_size(model: ModelSpec, training: TrainingConfig, budget: int | float | str,
                   cap: int = MAX_DATA_PARALLEL) -> Capacity:
    """The fewest ranks (GPUs) whose per-rank peak fits `budget` under training.sharding:
    doubling to bracket, then bisection over the data-parallel degree (per-rank memory falls
    with it under zero1..3; under DDP it does not). With tensor_parallel t, `value` counts every
    GPU (data-parallel groups x t). `value` is 0 when `cap` groups do not fit.

    The fall is not monotone everywhere: FSDP pads every parameter's dim 0 to a multiple of the
    rank count (memcalc.parallel.fsdp), so counts that divide the model's dims fit sooner
    (Llama-2-70B, zero2, pure bf16 on an H200: 128 ranks fit, 127 and 129 do not, nor any count
    from 16 to 127; measured with estimate()). Doubling tries the powers of two first; the
    answer w fits and w - 1 does not, but a count between the bracket's ends that was not
    tried may fit too. (Tried instead: a 1/w extrapolation from two counts, fewer simulations,
    answered 175 there: kept the doubling.)

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=1024, precision="bf16-amp", sharding="zero3")
    >>> min_world_size(ModelSpec.preset("gpt2-xl"), t, "16GiB").value
    3
    """
    check_search(model, training, "world_size")
    cap = check_int("cap", cap, 1, MAX_DATA_PARALLEL)
    nbytes = parse_budget(budget)
    seen: dict[int, int] = {}

    def peak_at(w: int) -> int:
        if w not in seen:
            seen[w] = _peak(model, training.with_(world_size=w * training.tensor_parallel))
        return seen[w]

    first = 2 if training.fsdp_mixed_precision else 1  # FSDP2's policy needs 2+ DP ranks here
    hi = first
    while peak_at(hi) > nbytes:
        if hi >= cap:
            return Capacity("world_size", nbytes, 0, None, peak_at(hi))
        hi = min(2 * hi, cap)
    lo = hi // 2 if hi > first else 0  # does not fit (or 0: nothing below was tried)
    while hi - lo > 1 and lo >= first:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak_at(mid) <= nbytes else (mid, hi)
    return Capacity("world_size", nbytes, hi * training.tensor_parallel, peak_at(hi),
                    peak_at(lo) if lo >= first else None)


def fits(model: ModelSpec, training: TrainingConfig, budget: int | float | str, basis: str = "device") -> bool:
    """Whether the step's steady-state peak fits `budget` (bytes, '80GB', a GPU name or 'local') on
    `basis` (device by default: memcalc.queries.basis.fits_on).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> fits(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=1024), "H100-80GB")
    True
    """
    check_basis(basis)
    nbytes = parse_budget(budget)  # checked before the (slower) estimate
    if basis == "allocated" or training.device == "cpu":
        return _peak(model, training) <= nbytes
    return fits_on(model, training, budget_bytes(budget, basis), basis, budget)[0]
