"""The engine: a model's program (memcalc.families) walked through one training step
(memcalc.tape) into the candidate moments that can set the peak, and the queries over them.

Every size is a polynomial in b (micro_batch) and s (seq_len), so one simulation of a
(model, regime) serves every shape: `candidates` caches it; `estimate_peak`, `steady_polys` and
`activation_peak_bytes` read it (memcalc.estimate builds the full report).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Callable, Iterator

from memcalc.core.errors import NotModelledError
from memcalc.core.limits import MAX_SIMULATED_LAYERS
from memcalc.engine.depth import N1, N2, N3, Derivation, Layout, derive, layout, small_model, supported
from memcalc.core.poly import ZERO, Poly
from memcalc.engine.regime import Regime
from memcalc.engine.simulation import build_graph, run_step, run_steps  # noqa: F401 (build_graph, run_step: API)
from memcalc.inputs.specs import ModelSpec
from memcalc.refusals.step import check_step, check_supported
from memcalc.tape.simulate import Moment, replay
from memcalc.inputs.training import TrainingConfig

PHASES = ("forward", "backward", "optimizer")


class MomentSet:
    """Candidate moments with a fast evaluator. Each total is a row of integer coefficients over
    the monomials b**i * s**j the moments use. The allocator's rounding of each live storage is
    grouped by size polynomial: a size that is constant rounds to a constant, a size whose
    coefficients are all multiples of the granularity never rounds, and each remaining size's
    residue is computed once per shape and shared by every moment holding it. The evaluator is
    compiled once from these integers (as sympy's lambdify would), so a new shape costs a few
    microseconds.

    >>> ms = MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1),))], 512)
    >>> ms.totals(3, 4), ms.rounded_totals(3, 4)
    ([24], [512])
    """

    def __init__(self, moments: list[Moment], granularity: int = 1):
        self.moments = moments
        self.granularity = granularity
        self.monomials = sorted({mono for m in moments for mono in m.total.terms})
        self.rows = [tuple(m.total.terms.get(mono, 0) for mono in self.monomials) for m in moments]
        self.by_phase = {p: [i for i, m in enumerate(moments) if m.phase == p] for p in PHASES}
        self.fractional = any(not isinstance(c, int) for row in self.rows for c in row)
        self._evaluators: dict[int, Callable[[int, int], list[int]]] = {}  # granularity -> totals

    def totals(self, b: int, s: int) -> list[int]:
        """Every moment's bytes at micro_batch b, seq_len s.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {})]).totals(3, 4)
        [24]
        """
        return self.rounded_totals(b, s, 1)

    def rounded_totals(self, b: int, s: int, granularity: int | None = None) -> list[int]:
        """Totals with every live storage rounded up to `granularity` bytes (memcalc.allocator.rules;
        by default the regime's)."""
        g = self.granularity if granularity is None else granularity
        found = self._evaluators.get(g)
        if found is None:
            found = self._evaluators[g] = self._compile(g)
        return found(b, s)

    def rounding_parts(self, g: int) -> tuple[list[int], list[Poly], list[dict[int, int]]]:
        """The allocator's rounding of every moment, grouped by size polynomial: (constant
        rounding per moment, the sizes whose residue mod g varies with b and s, per moment
        {index of such a size: live storages of it}).

        >>> ms = MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1), (Poly.const(5), 2)))])
        >>> ms.rounding_parts(512)
        ([1014], [Poly(2*b*s)], [{0: 1}])
        """
        consts, varying, per_moment = [], {}, []
        for m in self.moments:
            const, counts = 0, {}
            for size, n in m.sizes:
                kind = _rounding_kind(size, g)
                if kind == "const":
                    const += n * (-size.terms.get((0, 0), 0) % g)
                elif kind == "varies":
                    k = varying.setdefault(tuple(sorted(size.terms.items())), (len(varying), size))[0]
                    counts[k] = counts.get(k, 0) + n
            consts.append(const)
            per_moment.append(counts)
        return consts, [size for _, size in varying.values()], per_moment

    def _compile(self, g: int) -> Callable[[int, int], list[int]]:
        rounding = g > 1
        if self.fractional:  # sequence parallelism: b*s/t tokens (Fraction coefficients)
            return self._slow(g)
        names = {mono: _monomial_source(mono) for mono in self.monomials if mono != (0, 0)}
        n = len(self.rows)
        consts, sizes, counts = self.rounding_parts(g) if rounding else ([0] * n, [], [{}] * n)
        lines = [f"    r{k} = -({_poly_source(size, names)}) % {g}" for k, size in enumerate(sizes)]
        exprs = []
        for row, const, mine in zip(self.rows, consts, counts):
            parts = [f"{c}*{names[mono]}" if mono != (0, 0) else str(c)
                     for mono, c in zip(self.monomials, row) if c]
            parts += [f"{k_n}*r{k}" for k, k_n in mine.items()] + ([str(const)] if const else [])
            exprs.append(" + ".join(parts) or "0")
        monos = [f"    {name} = {_monomial_expr(mono)}" for mono, name in names.items()]
        source = "\n".join(["def totals(b, s):", *monos, *lines,
                             "    return [" + ", ".join(exprs) + "]"])
        namespace: dict = {}
        exec(compile(source, "<memcalc.engine.core.MomentSet>", "exec"), namespace)  # our own integers only
        return namespace["totals"]

    def _slow(self, g: int) -> Callable[[int, int], list[int]]:
        def totals(b: int, s: int) -> list[int]:
            values = [b ** i * s ** j for i, j in self.monomials]
            out = [-(-sum(c * v for c, v in zip(row, values)) // 1) for row in self.rows]
            if g > 1:
                out = [t + sum(n * int(-p.eval(b, s) % g) for p, n in m.sizes)
                       for t, m in zip(out, self.moments)]
            return out

        return totals


def _monomial_source(mono: tuple[int, int]) -> str:
    """The variable name of b**i * s**j (i + j > 0) in compiled evaluators; constants are
    written as literals."""
    i, j = mono
    return f"b{i}s{j}"


def _monomial_expr(mono: tuple[int, int]) -> str:
    i, j = mono
    return "*".join(["b"] * i + ["s"] * j)


def _poly_source(size: Poly, names: dict) -> str:
    return " + ".join(f"{c}*{names.get(mono) or _monomial_expr(mono)}" if mono != (0, 0) else str(c)
                      for mono, c in sorted(size.terms.items()))


def _rounding_kind(size: Poly, g: int) -> str:
    """'none' when every coefficient is a multiple of g (the size always is), 'const' for a
    constant size, else 'varies'."""
    if all(c % g == 0 for c in size.terms.values()):
        return "none"
    return "const" if set(size.terms) == {(0, 0)} else "varies"


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
    _depth: "DepthForm | None" = field(init=False, default=None, repr=False)
    _pending: "Callable[[], DepthForm | None] | None" = field(init=False, default=None, repr=False)
    """What gives `depth` when it is first read (its check costs about a tenth of a cold estimate)."""

    def __post_init__(self):
        self.steady_set = MomentSet(self.steady, self.regime.granularity)
        self.first_set = MomentSet(self.first, self.regime.granularity)

    @property
    def depth(self) -> "DepthForm | None":
        """How the steady-state moments grow with depth, when derived (memcalc.engine.depth)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._depth = pending()
        return self._depth

    @depth.setter
    def depth(self, form: "DepthForm | None") -> None:
        self._pending, self._depth = None, form


@dataclass
class DepthForm:
    """The steady-state instants that can set the peak at any depth of one layout (memcalc.engine.depth),
    at this depth, each with what a unit more adds (Moment.per_unit)."""

    layout: Layout
    moments: list[Moment]

    def terms(self, category: str | None = None) -> list[tuple[Poly, Poly]]:
        """(bytes at this depth, bytes a unit more adds) of each instant: its total, or one
        category; those below another at every depth of N1 units or more left out.

        >>> form = depth_form(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
        >>> at, per_unit = form.terms("weights")[0]
        >>> per_unit.eval(1, 1) == 4 * (12 * 768 ** 2 + 13 * 768)  # one GPT-2 block's fp32 weights
        True
        """
        pick = (lambda m: m.total) if category is None else (lambda m: m.by_category.get(category, ZERO))
        back = self.layout.units - N1
        out = [(pick(m), pick(m.per_unit)) for m in self.moments]
        lifted = [Moment(m.phase, "", Poly({**{(k, 0): c for k, c in (v - d * back).terms.items()},
                                           **{(k, 1): c for k, c in d.terms.items()}}), {})
                  for m, (v, d) in zip(self.moments, out)]
        for m in lifted:
            m.phase = ""  # one frontier over every phase
        kept = {id(m) for m in replay(lifted)}
        seen, terms = set(), []
        for m, pair in zip(lifted, out):
            key = (tuple(sorted(pair[0].terms.items())), tuple(sorted(pair[1].terms.items())))
            if id(m) in kept and key not in seen:
                seen.add(key)
                terms.append(pair)
        return terms


_CACHE: dict = {}
_SHAPE_FIELDS = ("micro_batch", "seq_len")
_regime_key = attrgetter(*(f for f in TrainingConfig.model_fields if f not in _SHAPE_FIELDS))


def candidates(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The simulated candidate moments of (model, training), checked first (memcalc.refusals.step); the
    shape fields micro_batch and seq_len are free symbols, so one simulation serves every shape.

    >>> c = candidates(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> {m.phase for m in c.steady} == {"forward", "backward", "optimizer"}
    True
    """
    try:
        reached = window_reached(model, training.seq_len)
        key = (model, _regime_key(training), reached, single_sequence(training, model))
        found = _CACHE.get(key)
    except (AttributeError, TypeError):  # not a TrainingConfig, or an unhashable model
        found = None
    if found is None:
        check_step(model, training)  # types, ceilings, runnable (memcalc.refusals.step)
        check_supported(model, training)
        if len(_CACHE) > 512:
            _CACHE.clear()
        with _gc_paused():
            found = _CACHE[key] = _simulate(model, _regime(model, training))
    return found


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a step is simulated: the simulation
    allocates tens of thousands of small objects (storages, moments, dicts) that reference
    counting frees, and the collector's passes over them cost about a tenth of a cold estimate
    (measured, benchmarks/bench_estimate.py); it runs again afterwards.

    >>> import gc
    >>> with _gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _regime(model: ModelSpec, training: TrainingConfig) -> Regime:
    """The regime of `training`, with the shape conditions a program branches on."""
    return replace(Regime.of(training, model), sliding_window_reached=window_reached(model, training.seq_len),
                   single_sequence=single_sequence(training, model))


def single_sequence(training: TrainingConfig, model: ModelSpec | None = None) -> bool:
    """micro_batch == 1 under eager attention or SDPA's CPU math kernel (attention dropout on
    CPU: memcalc.families.attention.sdpa_math), whose bmm operands are then views rather than
    copies, and for the HF models, whose shifted labels are then a view
    (memcalc.engine.regime.Regime.single_sequence; loss.hf_causal_lm_loss); elsewhere no program reads
    it, and one simulation serves every batch size.

    >>> single_sequence(TrainingConfig(micro_batch=1, seq_len=8, attention="eager"))
    True
    >>> eager = TrainingConfig(micro_batch=2, seq_len=8, attention="eager")
    >>> single_sequence(eager), single_sequence(TrainingConfig(micro_batch=1, seq_len=8))
    (False, False)
    >>> cpu, gpt2 = TrainingConfig(micro_batch=1, seq_len=8, device="cpu"), ModelSpec.preset("gpt2")
    >>> ref = gpt2.with_(implementation="reference")
    >>> single_sequence(cpu, ref.with_(attn_dropout=0.1)), single_sequence(cpu, ref.with_(attn_dropout=0.0))
    (True, False)
    >>> single_sequence(cpu, gpt2.with_(attn_dropout=0.0))
    True
    """
    math = model is not None and training.device == "cpu" and model.attn_dropout > 0
    hf_loss = model is not None and model.implementation == "hf"  # loss.hf_causal_lm_loss's shift
    eager = (training.attention if model is None else training.resolved_attention(model)) == "eager"
    return training.micro_batch == 1 and (eager or math or hf_loss)


def window_reached(model: ModelSpec, seq_len: int) -> bool:
    """Whether a sequence of seq_len tokens reaches the model's sliding window, the one shape
    condition a program branches on (memcalc.engine.regime.Regime.sliding_window_reached).

    >>> window_reached(ModelSpec.preset("gemma-2-2b"), 4096), window_reached(ModelSpec.preset("gpt2"), 10**6)
    (True, False)
    """
    return model.sliding_window is not None and seq_len >= model.sliding_window


def simulated(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The candidates of simulating every layer of this depth (no memcalc.engine.depth, no cache): what
    the derivation is tested against.

    >>> t = TrainingConfig(micro_batch=2, seq_len=64)
    >>> m = ModelSpec.preset("gpt2")
    >>> max(simulated(m, t).steady_set.rounded_totals(2, 64)) == max(candidates(m, t).steady_set.rounded_totals(2, 64))
    True
    """
    check_step(model, training)
    check_supported(model, training)
    regime = _regime(model, training)
    with _gc_paused():
        steady, first = run_steps(model, regime)
    return Candidates(regime, steady.moments, first.moments, steady.param_shapes, regime.master_elt)


def depth_form(model: ModelSpec, training: TrainingConfig) -> DepthForm | None:
    """How the steady-state peak grows with depth, or None where memcalc.engine.depth does not hold
    (fewer than N1 units, layers that do not repeat).

    >>> depth_form(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8)).layout.units
    12
    """
    c = candidates(model, training)
    if c.depth is None:
        forms = []
        for regime in _routings(model, c.regime):  # a MoE 'worst' routing: the union of a few
            lay = layout(model, regime)
            derivation = _derivation(model, lay) if lay.units >= N1 and supported(regime, model) else None
            forms.append(None if derivation is None else
                         _checked_form(DepthForm(lay, derivation.at(lay.units)[0]), derivation))
        c.depth = _union(forms)
    return c.depth


def _union(forms: list["DepthForm | None"]) -> "DepthForm | None":
    """One form of several routings' steps (their moments together), if each is derived."""
    if not forms or any(f is None for f in forms):
        return None
    return DepthForm(forms[0].layout, [m for f in forms for m in f.moments])


_FORM_SHAPES = ((1, 1), (3, 4), (2, 64), (8, 512))


def _checked_form(form: DepthForm, derivation: Derivation) -> DepthForm | None:
    """The form, if its terms give the derived peak one and two units deeper at a few shapes
    (every moment and category of those depths is itself verified by memcalc.engine.depth); else None,
    so that MemoryReport.expr stays in b and s rather than show a wrong slope in L. (Found: the
    per-unit slopes of some steps, such as HF GPT-2 selective checkpointing with accumulation,
    miss the moment that peaks deeper.)"""
    units = form.layout.units
    terms = form.terms()
    for extra in (1, 2):
        deeper = derivation.steady_totals(units + extra)  # at(units + extra)'s steady totals
        for b, s in _FORM_SHAPES:
            if max(v.eval(b, s) + extra * d.eval(b, s) for v, d in terms) != max(t.eval(b, s) for t in deeper):
                return None
    return form


def _derivation(model: ModelSpec, lay: Layout) -> Derivation | None:
    key = _derivation_key(model, lay)
    if key is None:  # a spec tied to its depth (no_rope_layers): memcalc.engine.depth.derive
        return None
    if key not in _CACHE:
        with _gc_paused():  # (also when depth_form derives it outside candidates)
            _CACHE[key] = derive(model, key[2])
    return _CACHE[key]


def _derivation_key(model: ModelSpec, lay: Layout) -> tuple | None:
    """The cache key of the derivation serving `lay` (one for every depth of the layout: keyed by
    the model at N1 units and the shared layout), or None for a spec tied to its depth."""
    shared = _shared_layout(lay)
    try:
        return ("depth", small_model(model, shared, N1), shared)
    except ValueError:  # memcalc.core.errors.SpecError, pydantic's ValidationError
        return None


def _shared_layout(lay: Layout) -> Layout:
    """The layout a derivation is made and cached for: of N1 units (memcalc.engine.depth.derive reads
    the unit and the rest, not the count: every depth of a layout shares one); under DDP or ZeRO-1 over any number of
    ranks, that of 2 ranks. There the simulated step reads the rank count only as
    regime.replicated (DDP's gradient buckets, one copy of every gradient whatever the count)
    and data_parallel == 1 (the optimizer, left to memcalc.parallel.data per rank), both the
    same for every count past one (memcalc.engine.simulation._prepared, run_step), and so does
    Derivation._outside; FSDP's shards (zero2, zero3) are sized by the count and keep it.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=8, world_size=64, sharding="zero1")
    >>> m = ModelSpec.preset("gpt2")
    >>> _shared_layout(layout(m, Regime.of(t))).regime.data_parallel
    2
    >>> _shared_layout(layout(m, Regime.of(t.with_(sharding="zero3")))).regime.data_parallel
    64
    """
    if lay.regime.replicated and lay.regime.data_parallel != 2:
        lay = replace(lay, regime=replace(lay.regime, data_parallel=2))
    return lay if lay.units == N1 else replace(lay, units=N1)  # derive reads unit and rest only


def _simulate(model: ModelSpec, regime: Regime) -> Candidates:
    """Every moment of the steady and the first step. A MoE model's 'worst' routing on the eager
    experts path is the largest of several routings (memcalc.inputs.moe.worst_routings), each expert's
    storages counted with their largest rounding: the union of their moments, so that every query
    (peak, grid, capacity) takes their maximum, a bound over every routing."""
    regimes = _routings(model, regime)
    if len(regimes) == 1:
        return _simulate_one(model, regime)
    runs = [_simulate_one(model, r) for r in regimes]
    out = Candidates(regime, [m for c in runs for m in c.steady], [m for c in runs for m in c.first],
                     runs[0].param_shapes, regime.master_elt)
    out.depth = _union([c.depth for c in runs])
    return out


def _routings(model: ModelSpec, regime: Regime) -> list[Regime]:
    """The regimes whose steps together make this one's: a MoE model's 'worst' routing on the
    eager experts path, one per memcalc.inputs.moe.worst_routings; else the regime itself."""
    if not (model.moe is not None and regime.experts_implementation == "eager" and regime.moe_routing == "worst"):
        return [regime]
    from memcalc.inputs.moe import worst_routings

    count = len(worst_routings(model.moe.num_experts, model.moe.top_k))
    return [replace(regime, moe_routing=("worst", i)) for i in range(count)]


def _simulate_one(model: ModelSpec, regime: Regime) -> Candidates:
    """The candidates from memcalc.engine.depth when the stack is deep enough for it to pay (derived
    once per layout and reused at every depth), else from simulating this depth."""
    lay = layout(model, regime)
    derivable = lay.units > N3 and supported(regime, model)
    if derivable and not _direct_pays(model, lay):
        derivation = _derivation(model, lay)
        if derivation is not None:
            steady, first, shapes = derivation.at(lay.units)
            out = Candidates(regime, replay(steady), replay(first), shapes, regime.master_elt)
            out._pending = lambda: _checked_form(DepthForm(lay, steady), derivation)
            return out
        derivable = False  # the layers do not repeat: simulate them (or refuse) below
    if model.num_layers > MAX_SIMULATED_LAYERS:
        raise NotModelledError("num_layers", f"{model.num_layers:,} layers that memcalc.engine.depth cannot "
                               f"derive from a few (they do not repeat with layer_period {lay.unit} "
                               "here) would be simulated one by one",
                               f"use num_layers <= {MAX_SIMULATED_LAYERS} (memcalc.core.limits)")
    steady, first = run_steps(model, regime)
    out = Candidates(regime, steady.moments, first.moments, steady.param_shapes, regime.master_elt)
    if derivable:  # simulated directly because that is cheaper: the depth form when first read
        out._pending = lambda: _lazy_form(model, lay)
    return out


_FORCE_DERIVATION = False
"""True: memcalc.engine.depth serves every stack it supports, however short (tests/test_depth.py checks
the derivation against the simulation at depths where simulating directly would be cheaper)."""


@contextmanager
def forcing_derivation() -> Iterator[None]:
    """Candidates derived (memcalc.engine.depth) wherever the derivation holds, not simulated directly
    where that would be cheaper; for tests that compare the two.

    >>> from memcalc.engine import core as engine
    >>> with forcing_derivation():
    ...     engine._FORCE_DERIVATION
    True
    >>> engine._FORCE_DERIVATION
    False
    """
    global _FORCE_DERIVATION
    before, _FORCE_DERIVATION = _FORCE_DERIVATION, True
    try:
        yield
    finally:
        _FORCE_DERIVATION = before


def _direct_pays(model: ModelSpec, lay: Layout) -> bool:
    """Whether simulating the stack directly costs less than deriving it: the derivation walks
    N1 + N2 + N3 units (and the short last segment three times) in record mode, about as costly
    a layer as the direct walk of the steady and the first step together or a little more
    (measured, CPU medians of 3: Llama-2-70B under 'sqrt', 9-layer segments, 132 layers derived
    against 80 direct, 0.24 s against 0.13 s in bf16; 'per-layer' stacks of Llama widths, 12
    layers derived against 8-32 direct, break even near 16), so the direct walk pays when it is
    the shorter one, and a derivation already made is reused. Either gives the same numbers
    (tests/test_depth.py compares them, forcing_derivation).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> m = ModelSpec.preset("llama-2-7b")
    >>> [_direct_pays(m, layout(m, _regime(m, TrainingConfig(micro_batch=1, seq_len=8, checkpointing=c))))
    ...  for c in ("per-layer", "sqrt")]
    [False, True]
    """
    if _FORCE_DERIVATION or model.num_layers > MAX_SIMULATED_LAYERS:
        return False
    derived_layers = sum(lay.depth(n) for n in (N1, N2, N3))
    if derived_layers <= model.num_layers:
        return False
    return _derivation_key(model, lay) not in _CACHE


def _lazy_form(model: ModelSpec, lay: Layout) -> "DepthForm | None":
    """The depth form of a stack simulated directly: derived when first read (MemoryReport.expr,
    capacity.max_layers), as depth_form derives it."""
    derivation = _derivation(model, lay)
    return None if derivation is None else _checked_form(DepthForm(lay, derivation.at(lay.units)[0]), derivation)


def estimate_peak(model: ModelSpec, training: TrainingConfig) -> int:
    """The steady-state peak of a single-process step, from the cached candidates (no report
    built; per-rank peaks need memcalc.estimate).

    >>> t = TrainingConfig(micro_batch=2, seq_len=64, device="cpu")
    >>> gpt2 = ModelSpec.preset("gpt2")
    >>> estimate_peak(gpt2, t) == max(p.eval(2, 64) for p in steady_polys(gpt2, t))
    True
    """
    c = candidates(model, training)
    return max(c.steady_set.rounded_totals(training.micro_batch, training.seq_len))


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
