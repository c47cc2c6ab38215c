"""estimate(): the peak of a training step, per phase, with its breakdown and symbolic form."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable

from memcalc.engine.candidates import Candidates
from memcalc.engine.codegen import MomentSet  # noqa: F401 (API)
from memcalc.engine.run import candidates
from memcalc.core.errors import SpecError
from memcalc.parallel.data import rank_optimizer_bytes_all
from memcalc.core.poly import ZERO
from memcalc.engine.regime import param_element_size, sqrt_segment_size  # noqa: F401 (sqrt_segment_size: API)
from memcalc.inputs.specs import ModelSpec
from memcalc.refusals.step import check_shape
from memcalc.inputs.training import TrainingConfig
from memcalc.core.units import GIB

if TYPE_CHECKING:
    from memcalc.engine.reserved import ReservedReplay
    from memcalc.tape.moment import Moment

BASES = ("allocated", "reserved", "device")
"""What a budget is compared with: allocated (max_memory_allocated), reserved (max_memory_reserved:
the caching allocator's segments) or device (reserved plus the CUDA context: nvidia-smi)."""


def check_basis(basis: object) -> str:
    """`basis` if it is one of BASES, else one line naming the fix.

    >>> check_basis("device")
    'device'
    """
    if basis not in BASES:
        raise SpecError("basis", f"{str(basis)[:40]!r} is not a basis", "use allocated, reserved or device")
    return basis


def optimal_segment_size(model: ModelSpec, training: TrainingConfig) -> int:
    """Layers per checkpointed segment that minimise the steady-state peak for this model and
    step. Chen et al. 2016 (sec. 4.1): with boundary tensors of x bytes and A bytes of saved
    activations per layer, memory ~ (L/k)x + kA is minimal at k = sqrt(L x / A); A is measured
    on the engine (forward peak of 2 layers minus 1), x = b*s*h at the residual dtype, and the
    neighbours of that k are compared exactly. Use it with checkpointing='every-k'.

    >>> k = optimal_segment_size(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=4, seq_len=1024))
    >>> 1 <= k <= 12
    True
    """
    from memcalc.refusals.step import check_step

    check_step(model, training)
    L = model.num_layers
    none = training.with_(checkpointing="none", checkpoint_every=None)
    per_layer = (estimate(model.with_(num_layers=2), none).phases["forward"]
                 - estimate(model.with_(num_layers=1), none).phases["forward"])
    boundary = training.micro_batch * training.seq_len * model.hidden_size * param_element_size(training.precision)
    guess = max(1, min(L, round(math.sqrt(L * boundary / max(per_layer, 1)))))
    options = sorted({k for k in (guess - 1, guess, guess + 1) if 1 <= k <= L}, reverse=True)
    peaks = {k: estimate(model, training.with_(checkpointing="every-k", checkpoint_every=k)).peak_bytes
             for k in options}
    return min(options, key=lambda k: peaks[k])


class MemoryReport:
    """Predicted memory of one training step. The peak is computed at once; the per-phase
    peaks, the breakdown and the first step's peak when first read (a report is cheap to make).

    >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128))
    >>> r.peak_bytes == max(r.phases.values())
    True
    """

    def __init__(self, peak_bytes: int, peak_phase: str, moment: str, model: ModelSpec,
                 training: TrainingConfig, candidates: Candidates, rank_peak_bytes: list[int],
                 **known: Callable[[], Any]):
        self.peak_bytes = peak_bytes
        """Steady-state peak (steps >= 2), bytes; per rank, the largest rank's."""
        self.peak_phase = peak_phase
        """The phase of the step where the peak happens: forward, backward or optimizer."""
        self.moment = moment
        """What runs at the peak (an op, its backward, or optimizer.step)."""
        self.model, self.training = model, training
        self.rank_peak_bytes = rank_peak_bytes
        """Per-rank steady-state peaks (one entry per rank; equal without data parallelism)."""
        self._candidates = candidates.steady if candidates is not None else []
        self._known = known  # name -> function computing it once

    def _get(self, name: str):
        found = self._known[name]
        if callable(found):
            found = self._known[name] = found()
        return found

    @property
    def attention(self) -> str:
        """The attention kernel the step was modelled with: TrainingConfig.attention, or where
        that is None the one transformers picks for the model type (eager for Gemma-2 and
        GPT-OSS, sdpa elsewhere; TrainingConfig.resolved_attention).

        >>> t = TrainingConfig(micro_batch=1, seq_len=128)
        >>> r = estimate(ModelSpec.preset("gemma-2-2b").with_(num_layers=2), t)
        >>> r.attention, r.attention_assumed
        ('eager', True)
        """
        if getattr(self.model, "traced_candidates", None) is not None:  # memcalc.traced
            return "traced (the module's own)"
        return self.training.resolved_attention(self.model)

    @property
    def attention_assumed(self) -> bool:
        """Whether `attention` is transformers' default (TrainingConfig.attention was None)."""
        return self.training.attention is None and getattr(self.model, "traced_candidates", None) is None

    @property
    def first_step_peak_bytes(self) -> int:
        """Peak of the first step (no optimizer state until optimizer.step() makes it)."""
        return self._get("first_step_peak_bytes")

    @property
    def phases(self) -> dict[str, int]:
        """Steady-state peak of each phase: forward, backward, optimizer."""
        return self._get("phases")

    @property
    def components(self) -> dict[str, int]:
        """Bytes per category at the peak (weights, gradients, optimizer, activations, ...),
        the allocator's rounding as its own component."""
        return self._get("components")

    @property
    def expr(self):
        """The steady-state peak as a sympy Max over the candidate moments, in b, s and L
        (num_layers) where memcalc.engine.depth derives the depth, else in b and s; before the CUDA
        allocator's 512-byte rounding, which `peak_bytes` includes on device cuda. Under
        'every-k' and 'sqrt' checkpointing L counts in whole segments of this depth's segment
        size k (L/k segments; under 'sqrt' k = round(sqrt(L)) of this depth). The program is
        this shape's where a shape condition changes it (memcalc.engine.run.single_sequence: b = 1
        under eager attention; window_reached): the form then holds on this side of it.

        >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128, device="cpu"))
        >>> from memcalc.core.symbols import b, s, L
        >>> int(r.expr.xreplace({b: 1, s: 128, L: 12})) == r.peak_bytes
        True
        """
        return self.formula()

    def formula(self, category: str | None = None):
        """`expr`, or with a category (e.g. 'activations') that category's largest over the
        candidate moments, in b, s and L (L where memcalc.engine.depth derives the depth).

        >>> t = TrainingConfig(micro_batch=1, seq_len=128, checkpointing="per-layer")
        >>> sorted(map(str, estimate(ModelSpec.preset("gpt2"), t).formula("activations").free_symbols))
        ['L', 'b', 's']
        """
        import sympy

        from memcalc.engine.run import depth_form
        from memcalc.core.symbols import L, b, s

        if category is not None:  # a name this step's moments carry, else no formula
            known = sorted(set().union(*(m.by_category for m in self._candidates)))
            if not isinstance(category, str) or category not in known:
                raise SpecError("category", f"{str(category)[:40]!r} is not a category of this step",
                                f"use one of {', '.join(known)}")
        form = depth_form(self.model, self.training)
        if form is None:
            pick = (lambda m: m.total) if category is None else \
                (lambda m: m.by_category.get(category, ZERO))
            polys = [pick(m) for m in self._candidates]
            top = sympy.Max(*[p.to_sympy(b, s) for p in polys])
            # whole bytes, as estimate() counts them (MomentSet: a fractional total, such as MoE
            # 'balanced' routing's S/E tokens per expert, is rounded up); ceil of the max is the
            # max of the ceils
            fractional = any(not isinstance(c, int) for p in polys for c in p.terms.values())
            return sympy.ceiling(top) if fractional else top
        more = (L - self.model.num_layers) / form.layout.unit  # units more than this depth
        return sympy.Max(*[sympy.expand(v.to_sympy(b, s) + more * d.to_sympy(b, s))
                           for v, d in form.terms(category)], evaluate=False)

    @functools.cached_property
    def reserved(self) -> "ReservedReplay | None":
        """The engine's allocation sequence replayed through the caching-allocator replica
        (memcalc.engine.reserved), computed when first read; None on device="cpu" (no caching
        allocator: reserved is allocated there)."""
        if self.training.device == "cpu":
            return None
        from memcalc.engine.reserved import reserved_for

        return reserved_for(self.model, self.training)

    @property
    def reserved_peak_bytes(self) -> int:
        """Peak reserved memory (max_memory_reserved) over model construction, the first step and
        steady steps until one reserves nothing new, under TrainingConfig.allocator's settings; on
        device="cpu" the allocated peak (no caching allocator). Computed when first read.

        >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128))
        >>> r.reserved_peak_bytes >= r.peak_bytes, r.reserved_peak_bytes % (2 << 20)
        (True, 0)
        """
        found = self.reserved
        return self.peak_bytes if found is None else max(found.peak_reserved_bytes, self.peak_bytes)

    @property
    def reserved_phases(self) -> dict[str, int]:
        """Reserved peak of each phase of the steady step (on device="cpu" the allocated ones)."""
        found = self.reserved
        if found is None:
            return dict(self.phases)
        return {p: max(v, self.phases.get(p, 0)) for p, v in found.phases.items()}

    @property
    def device_bytes(self) -> int:
        """Reserved peak plus what the process holds on the device outside the caching allocator
        (the CUDA context: memcalc.allocator.outside, a figure with its source; `memcalc gpus`
        lists them): what nvidia-smi would show. On device="cpu" the allocated peak.

        >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128, device="cpu"))
        >>> r.device_bytes == r.reserved_peak_bytes == r.peak_bytes
        True
        """
        from memcalc.allocator.outside import outside_bytes

        return self.reserved_peak_bytes + outside_bytes(self.training.device)

    def basis_bytes(self, basis: str) -> int:
        """The peak on a basis: 'allocated' (peak_bytes), 'reserved' or 'device'.

        >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
        >>> r.basis_bytes("allocated") == r.basis_bytes("device")
        True
        """
        check_basis(basis)
        return {"allocated": lambda: self.peak_bytes, "reserved": lambda: self.reserved_peak_bytes,
                "device": lambda: self.device_bytes}[basis]()

    @property
    def peak_gib(self) -> float:
        """The peak in GiB (2**30 bytes)."""
        return self.peak_bytes / GIB

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v / GIB:.3f}" for k, v in self.components.items() if v)
        return (f"MemoryReport(peak={self.peak_gib:.3f} GiB in {self.peak_phase}; {parts} GiB; "
                f"first step {self.first_step_peak_bytes / GIB:.3f} GiB)")


def estimate(model: ModelSpec, training: TrainingConfig) -> MemoryReport:
    """Predict the peak memory of one training step (per rank when world_size > 1).

    >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=4, seq_len=1024))
    >>> round(r.peak_gib, 1) > 5
    True
    """
    if isinstance(training, TrainingConfig) and training.pipeline_parallel > 1:  # (others: check_step)
        return _estimate_pipeline(model, training)
    cands = candidates(model, training)  # checks the (model, training) it simulates
    check_shape(model, training)  # and this shape
    b, s = training.micro_batch, training.seq_len
    if training.data_parallel > 1:
        return _estimate_ranks(model, training, cands, b, s)
    steady = cands.steady_set.rounded_totals(b, s)
    peak = max(steady)
    top = steady.index(peak)  # the first moment at the peak
    moment = cands.steady[top]
    by_phase = cands.steady_set.by_phase
    return MemoryReport(
        peak, moment.phase, moment.label, model, training, cands,
        [peak] * training.world_size,  # TP ranks are alike
        first_step_peak_bytes=lambda: max(cands.first_set.rounded_totals(b, s)),
        phases=lambda: {p: max((steady[i] for i in idx), default=0) for p, idx in by_phase.items()},
        components=lambda: _components(moment, b, s, steady[top]))


def _estimate_pipeline(model: ModelSpec, training: TrainingConfig) -> MemoryReport:
    """Pipeline ranks (memcalc.parallel.pipeline_peaks), checked as every step is
    (memcalc.refusals.step); the peak is the largest rank's. No symbolic form: `expr` is empty
    and the components are left out (only the peak and the phase are walked).

    >>> t = TrainingConfig(micro_batch=4, seq_len=16, device="cpu", world_size=2, pipeline_parallel=2,
    ...                    pipeline_schedule="1f1b", num_microbatches=4)
    >>> spec = ModelSpec.make(family="llama", vocab_size=96, hidden_size=32, num_layers=4, num_heads=2,
    ...                       intermediate_size=64, implementation="reference", tie_embeddings=False)
    >>> r = estimate(spec, t)
    >>> len(r.rank_peak_bytes), r.peak_bytes == max(r.rank_peak_bytes)
    (2, True)
    """
    from memcalc.parallel.pipeline_peaks import pipeline_peaks
    from memcalc.refusals.step import check_step

    check_step(model, training)
    check_shape(model, training)
    ranks = pipeline_peaks(model, training)
    top = max(ranks, key=lambda r: r.peak_bytes)
    phases = {p: max(r.phases.get(p, 0) for r in ranks) for p in ("forward", "backward", "optimizer")}
    return MemoryReport(top.peak_bytes, top.phase, top.moment, model, training, None,
                        [r.peak_bytes for r in ranks for _ in range(training.world_size // training.pipeline_parallel)],
                        first_step_peak_bytes=max(r.first_step_peak_bytes for r in ranks),
                        phases=phases, components={})


def allocator_granularity(training: TrainingConfig) -> int:
    """Alias of memcalc.allocator.rules.granularity(training.device), kept for one release."""
    from memcalc.allocator.rules import granularity

    return granularity(training.device)


def _components(moment: Moment, b: int, s: int, total: int) -> dict[str, int]:
    """Bytes per category at a moment, with the allocator's rounding as its own component.
    Categories are whole bytes summing to the moment's whole bytes (the ceiling of its total, as
    estimate() rounds a MoE 'balanced' routing's fractional tokens): each category's fraction
    is floored and the bytes left go to the largest fractions (largest-remainder apportionment),
    so no category is over-counted and the rounding stays >= 0.

    >>> from memcalc.core.poly import Poly
    >>> from fractions import Fraction
    >>> from memcalc.tape.moment import Moment
    >>> half = Poly({(1, 1): Fraction(3, 2)})  # 1.5 bytes a token: balanced routing's shares
    >>> m = Moment("backward", "x", half + half, {"a": half, "b": half})
    >>> _components(m, 1, 1, 3)
    {'a': 2, 'b': 1}
    """
    exact = {k: v.eval(b, s) for k, v in moment.by_category.items()}
    parts = {k: int(v // 1) for k, v in exact.items()}
    left = int(-(-sum(exact.values()) // 1)) - sum(parts.values())
    for k in sorted(exact, key=lambda k: -(exact[k] - parts[k]))[:max(0, left)]:
        parts[k] += 1
    rounding = total - sum(parts.values())
    if rounding:
        parts["allocator_rounding"] = rounding
    return parts


def _phase_max(moment_set: MomentSet, totals: list[int]) -> dict[str, tuple[int, int]]:
    out = {}
    for phase, idx in moment_set.by_phase.items():
        if idx:
            i = max(idx, key=totals.__getitem__)
            out[phase] = (totals[i], i)
    return out


def _step_phase(moments: list[Moment], moment_set: MomentSet, totals: list[int], states: int,
                temps: int, b: int, s: int) -> tuple[int, int]:
    """(peak, index) of the optimizer phase on a data-parallel rank: every moment holds the rank's
    optimizer states, and optimizer.step also its temporaries. clip_grad_norm_'s moment holds the
    norms (its only temporaries: memcalc.tape.step._clip, between backward and the step), freed
    before the step, which then holds the same storages less the norms (and, being no larger,
    is not kept as a moment of its own): base + states + max(norms, temps)."""
    best = None
    for i in moment_set.by_phase["optimizer"]:
        if moments[i].label == "clip_grad_norm_":
            norms = int(moments[i].by_category.get("temporaries", ZERO).eval(b, s))
            value = totals[i] - norms + states + max(norms, temps)
        else:
            value = totals[i] + states + temps
        best = max(best or (value, i), (value, i))
    return best


def _estimate_ranks(model: ModelSpec, training: TrainingConfig, cands: Candidates, b: int, s: int) -> MemoryReport:
    """Data-parallel ranks: one simulation without the optimizer, then each rank's own
    optimizer states (alive throughout the steady state) and step temporaries."""
    steady_totals = cands.steady_set.rounded_totals(b, s)
    first_totals = cands.first_set.rounded_totals(b, s)
    steady = _phase_max(cands.steady_set, steady_totals)
    first = _phase_max(cands.first_set, first_totals)
    reports = []
    for states, temps in rank_optimizer_bytes_all(cands.param_shapes, cands.param_elt, cands.regime):
        extra = {"forward": states, "backward": states, "optimizer": states + temps}
        phases = {p: v + extra[p] for p, (v, _) in steady.items()}
        at = {p: i for p, (_, i) in steady.items()}
        if "optimizer" in steady and temps:  # clip_grad_norm_'s norms are freed before the step's temporaries
            phases["optimizer"], at["optimizer"] = _step_phase(cands.steady, cands.steady_set, steady_totals,
                                                               states, temps, b, s)
        first_peak = max(v + (states if p == "optimizer" else 0) for p, (v, _) in first.items())
        if "optimizer" in first:
            step = _step_phase(cands.first, cands.first_set, first_totals, states, temps, b, s)
            first_peak = max(first_peak, step[0])
        phase = max(phases, key=phases.get)
        moment = cands.steady[at[phase]]
        components = _components(moment, b, s, steady_totals[at[phase]])
        components["optimizer"] = components.get("optimizer", 0) + states
        if phase == "optimizer" and temps:
            norms = components.get("temporaries", 0) if moment.label == "clip_grad_norm_" else 0
            components["temporaries"] = components.get("temporaries", 0) - norms + max(norms, temps)
        reports.append((phases[phase], phase, moment.label, phases, components, first_peak))
    peak, phase, label, phases, components, _ = max(reports, key=lambda r: r[0])
    # global rank = dp index * tensor_parallel + tp index (a (dp, tp) mesh, row-major); the
    # ranks of one tensor-parallel group hold the same bytes
    ranks = [r[0] for r in reports for _ in range(training.tensor_parallel)]
    return MemoryReport(peak, phase, label, model, training, cands, ranks,
                        first_step_peak_bytes=max(r[5] for r in reports), phases=phases,
                        components=components)
