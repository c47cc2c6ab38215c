"""The engine: a model's program (memcalc.programs) walked through one training step
(memcalc.tape) into the candidate moments that can set the peak, and the queries over them.

Every size is a polynomial in b (micro_batch) and s (seq_len), so one simulation of a
(model, regime) serves every shape: `candidates` caches it; `estimate_peak`, `steady_polys` and
`activation_peak_bytes` read it (memcalc.estimate builds the full report).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memcalc.allocator import device_constants
from memcalc.errors import NotModelledError
from memcalc.parallel.fsdp import Fsdp
from memcalc.parallel.tensor import check_tensor_parallel, local_spec
from memcalc.poly import ZERO, Poly
from memcalc.programs import program_for
from memcalc.regime import Regime
from memcalc.specs import ModelSpec
from memcalc.tape.graph import Graph
from memcalc.tape.ops import Ops
from memcalc.tape.simulate import Moment
from memcalc.tape.step import simulate_step
from memcalc.training import TrainingConfig

PHASES = ("forward", "backward", "optimizer")


def check_supported(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse, naming the field, what is not modelled rather than answer for something else.

    >>> check_supported(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8,
    ...     precision="fp32", world_size=1, sharding="zero3", fsdp_mixed_precision=True))
    Traceback (most recent call last):
    ...
    memcalc.errors.NotModelledError: fsdp_mixed_precision: FSDP2's MixedPrecisionPolicy on a single ...
    """
    check_tensor_parallel(model, training)
    if training.fsdp_mixed_precision and training.data_parallel == 1:
        raise NotModelledError("fsdp_mixed_precision", "FSDP2's MixedPrecisionPolicy on a single "
                               "data-parallel rank is not modelled (measured +1.3%)",
                               "use world_size >= 2 x tensor_parallel")
    if training.tensor_parallel > 1 and training.data_parallel > 1 and training.sharding in ("none", "zero1"):
        raise NotModelledError("sharding", "data parallelism across tensor-parallel groups is "
                               "modelled with FSDP2 (zero2/zero3) only",
                               "use --sharding zero3 (or zero2), or world_size = tensor_parallel")


def build_graph(model: ModelSpec, regime: Regime) -> Graph:
    """The forward program one rank runs (a tensor-parallel rank runs a narrower model).

    >>> g = build_graph(ModelSpec.preset("gpt2"), Regime.of(TrainingConfig(micro_batch=1, seq_len=8)))
    >>> len(g.params)  # wte, wpe, 12 x 12 per block, ln_f weight and bias (lm_head tied)
    148
    """
    ops = Ops(Graph(), regime)
    spec = local_spec(model, regime.tensor_parallel)
    program_for(spec).build(ops, spec, regime)
    return ops.g


class MomentSet:
    """Candidate moments with a fast evaluator: each total is a row of coefficients over the
    monomials b**i * s**j they use, evaluated with plain integer arithmetic (~1 us a moment)."""

    def __init__(self, moments: list[Moment]):
        self.moments = moments
        self.monomials = sorted({mono for m in moments for mono in m.total.terms})
        self.rows = [tuple(m.total.terms.get(mono, 0) for mono in self.monomials) for m in moments]
        self.by_phase = {p: [i for i, m in enumerate(moments) if m.phase == p] for p in PHASES}
        self.fractional = any(not isinstance(c, int) for row in self.rows for c in row)
        self._rounded: dict = {}

    def rounded_totals(self, b: int, s: int, granularity: int) -> list[int]:
        """Totals with every live storage rounded up to `granularity` bytes (memcalc.allocator).
        Cached per shape: a warm call is a dict lookup.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1),))]).rounded_totals(3, 4, 512)
        [512]
        """
        if granularity <= 1:
            return self.totals(b, s)
        key = (b, s, granularity)
        found = self._rounded.get(key)
        if found is None:
            if len(self._rounded) > 4096:
                self._rounded.clear()
            found = self._rounded[key] = [
                t + sum(n * int(-p.eval(b, s) % granularity) for p, n in m.sizes)
                for t, m in zip(self.totals(b, s), self.moments)]
        return found

    def totals(self, b: int, s: int) -> list[int]:
        """Every moment's bytes at micro_batch b, seq_len s.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {})]).totals(3, 4)
        [24]
        """
        values = [b ** i * s ** j for i, j in self.monomials]
        totals = [sum(c * v for c, v in zip(row, values)) for row in self.rows]
        if self.fractional:  # sequence parallelism: b*s/t tokens, whole when t divides s
            totals = [-(-x // 1) for x in totals]
        return totals


@dataclass(eq=False)
class Candidates:
    """The moments that can set the peak, for the steady state and the first step, and the
    parameters the optimizer sees (for per-rank optimizer memory, memcalc.parallel.data)."""

    regime: Regime
    steady: list[Moment]
    first: list[Moment]
    param_shapes: list[tuple[int, int]]
    """(elements, dim 0) of each parameter in module order."""
    param_elt: int
    """Bytes per element of the optimizer's view of the parameters (regime.master_elt)."""
    steady_set: MomentSet = field(init=False)
    first_set: MomentSet = field(init=False)

    def __post_init__(self):
        self.steady_set = MomentSet(self.steady)
        self.first_set = MomentSet(self.first)


_CACHE: dict = {}
_SHAPE_FIELDS = ("micro_batch", "seq_len")


def candidates(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The simulated candidate moments of (model, training), after check_supported; the shape
    fields micro_batch and seq_len are free symbols, so one simulation serves every shape.

    >>> c = candidates(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> {m.phase for m in c.steady} == {"forward", "backward", "optimizer"}
    True
    """
    key = (model, tuple(v for k, v in training.__dict__.items() if k not in _SHAPE_FIELDS))
    found = _CACHE.get(key)
    if found is None:
        check_supported(model, training)
        if len(_CACHE) > 512:
            _CACHE.clear()
        found = _CACHE[key] = _simulate(model, Regime.of(training))
    return found


def _simulate(model: ModelSpec, regime: Regime) -> Candidates:
    constants = device_constants(regime.device)
    if regime.replicated:  # DDP's gradient buckets: one more copy of every gradient
        constants["ddp_buckets"] = sum(v.size.eval(1, 1) for v in build_graph(model, regime).params)

    def run(first_step: bool) -> tuple[list[Moment], list[tuple[int, int]]]:
        graph = build_graph(model, regime)
        shapes = [(v.size.eval(1, 1) // regime.param_elt, v.rows) for v in graph.params]
        fsdp = None
        if regime.fsdp:
            fsdp = Fsdp.of(graph, regime)
            for v in graph.params:
                v.storage.size = Poly()  # counted by Fsdp: padded shards, unsharded copies
        moments = simulate_step(graph, regime, first_step, constants,
                                with_optimizer=regime.data_parallel == 1, fsdp=fsdp)
        return moments, shapes

    steady, shapes = run(False)
    first, _ = run(True)
    return Candidates(regime, steady, first, shapes, regime.master_elt)


def estimate_peak(model: ModelSpec, training: TrainingConfig) -> int:
    """The steady-state peak of a single-process step, from the cached candidates (no report
    built; per-rank peaks need memcalc.estimate).

    >>> t = TrainingConfig(micro_batch=2, seq_len=64, device="cpu")
    >>> gpt2 = ModelSpec.preset("gpt2")
    >>> estimate_peak(gpt2, t) == max(p.eval(2, 64) for p in steady_polys(gpt2, t))
    True
    """
    c = candidates(model, training)
    return max(c.steady_set.rounded_totals(training.micro_batch, training.seq_len, c.regime.granularity))


def steady_polys(model: ModelSpec, training: TrainingConfig) -> list[Poly]:
    """The steady-state candidate totals in b and s (before the allocator's rounding).

    >>> polys = steady_polys(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> all(p.eval(1, 8) > 0 for p in polys)
    True
    """
    return [m.total for m in candidates(model, training).steady]


def activation_peak_bytes(model: ModelSpec, training: TrainingConfig) -> int:
    """The most activation memory alive at any candidate moment of the steady-state step.

    >>> t = TrainingConfig(micro_batch=1, seq_len=128)
    >>> m = ModelSpec.preset("gpt2")
    >>> activation_peak_bytes(m, t.with_(checkpointing="per-layer")) < activation_peak_bytes(m, t)
    True
    """
    b, s = training.micro_batch, training.seq_len
    return max(m.by_category.get("activations", ZERO).eval(b, s)
               for m in candidates(model, training).steady)
