"""Depth as a symbol: any depth of a decoder stack from three small ones.

The layers of a decoder repeat (every layer alike, or a short pattern: `layer_period` of the
program), and a checkpointed stack repeats per segment, so a stack of L = n*u + r layers is n
identical units of u layers (u: the period and the checkpoint segment's common multiple) and r
layers more, which run with the suffix (a short last segment). Every instant of the step then has
a structural key: phase, micro-step, where in the program (before the stack, op `k` of a unit,
after the stack) and which mark there; and unit j's instants are affine in j and n (saved
activations of the j units before it, gradients of the n-1-j after it, weights of all n), so the
largest over j is that of the first or the last unit.

`derive` simulates n = 2, 3 and 4 units (every instant recorded, memcalc.tape.simulate.Memory
record mode), takes each instant of the first and the last unit and of the prefix and suffix as
affine in n from n = 2 and 3, and checks it at n = 4 exactly: totals, every category, the number
of live storages of every size (so the CUDA allocator's per-storage rounding stays exact) and the
labels; it also checks at each of the three depths that every middle unit's instant is exactly
the interpolation of the first and last ones. Any mismatch (a program whose layers do not repeat
with its declared period, a prefix of different layers) gives None, and the engine simulates the
depth itself: never a wrong answer.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from memcalc.poly import Poly
from memcalc.programs import program_for
from memcalc.regime import Regime, sqrt_segment_size
from memcalc.simulation import StepRun, run_step
from memcalc.specs import ModelSpec
from memcalc.tape.optimizer import transient_bytes
from memcalc.tape.simulate import Moment

N1, N2, N3 = 3, 4, 5
"""Units simulated: each instant is derived from the first two and checked at the third."""
ENDS = (0, 1, -2, -1)
"""The units whose instants are kept: the first and the last (which differ from the others: the
last backward use of the tensors every layer shares, FSDP's prefetch) and their neighbours,
between which the middle units' instants are affine in the unit's index."""


class NotRepeating(Exception):
    """The simulated depths do not repeat as derived (memcalc.depth falls back)."""


@dataclass(frozen=True)
class Layout:
    """How a stack of `layers` decomposes: `units` repeats of `unit` layers, then `rest`."""

    unit: int
    rest: int
    units: int
    regime: Regime
    """The regime the small depths run: under 'sqrt' the segment size of this depth, as every-k."""

    def depth(self, n: int) -> int:
        """Layers of a stack of n units."""
        return n * self.unit + self.rest


def segment_size(regime: Regime, num_layers: int) -> int:
    """Layers per checkpoint segment (1 when no segments repeat).

    >>> from memcalc.training import TrainingConfig
    >>> segment_size(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="sqrt")), 80)
    9
    """
    if regime.checkpointing == "every-k":
        return regime.checkpoint_every or 1
    return sqrt_segment_size(num_layers) if regime.checkpointing == "sqrt" else 1


def layout(model: ModelSpec, regime: Regime) -> Layout:
    """The units of `model`'s stack under `regime`.

    >>> from memcalc.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=8, checkpointing="every-k", checkpoint_every=3)
    >>> lay = layout(ModelSpec.preset("gpt2"), Regime.of(t))
    >>> lay.unit, lay.units, lay.rest
    (3, 4, 0)
    """
    L = model.num_layers
    k = segment_size(regime, L)
    period = getattr(program_for(model), "layer_period", lambda _spec: 1)(model)
    unit = math.lcm(max(1, int(period)), k)
    run_regime = replace(regime, checkpointing="every-k", checkpoint_every=k) \
        if regime.checkpointing == "sqrt" else regime
    return Layout(unit, L % unit, L // unit, run_regime)


# ---- moments as vectors ------------------------------------------------------------------------
def _key(p: Poly) -> tuple:
    return tuple(sorted(p.terms.items()))


Vec = dict
"""A moment's numbers as one flat dict without zeros: ("t", monomial) -> total's coefficient,
("c", category, monomial) -> that category's, ("n", size) -> live storages of that size."""


def vec(m: Moment, sizes: dict[tuple, Poly]) -> Vec:
    """The numbers of a moment (registering its storage sizes in `sizes`).

    >>> vec(Moment("forward", "x", Poly.bs(2), {"activations": Poly.bs(2)}, ((Poly.bs(2), 1),)), {})
    {('t', (1, 1)): 2, ('c', 'activations', (1, 1)): 2, ('n', ((1, 1), 2)): 1}
    """
    out: Vec = {("t", mono): c for mono, c in m.total.terms.items()}
    for cat, p in m.by_category.items():
        for mono, c in p.terms.items():
            out["c", cat, mono] = c
    for p, n in m.sizes:
        k = _key(p)
        sizes.setdefault(k, p)
        out["n", k] = out.get(("n", k), 0) + n
    return out


def combine(u: Vec, v: Vec, x: int, y: int) -> Vec:
    """x*u + y*v, zeros dropped."""
    out = {k: c * x for k, c in u.items()}
    for k, c in v.items():
        out[k] = out.get(k, 0) + c * y
    return {k: c for k, c in out.items() if c}


def _unflatten(v: Vec, cats: tuple[str, ...], sizes: dict) -> tuple[Poly, dict[str, Poly], tuple]:
    total, by_cat, counts = {}, {c: {} for c in cats}, []
    for k, c in v.items():
        if k[0] == "t":
            total[k[1]] = c
        elif k[0] == "c":
            by_cat.setdefault(k[1], {})[k[2]] = c
        else:
            if c < 0:
                raise NotRepeating("a negative number of storages")
            counts.append((sizes[k[1]], c))
    return Poly(total), {c: Poly(terms) for c, terms in by_cat.items()}, tuple(counts)


def _label_at(first: str, second: str, n: int) -> str:
    """A label at n units from its labels at N1 and N2: numbers that differ (a layer's index in
    an FSDP group name) move by their difference per unit."""
    if first == second:
        return first
    a, b = re.split(r"(\d+)", first), re.split(r"(\d+)", second)
    if len(a) != len(b):
        raise NotRepeating(f"labels {first!r} and {second!r}")
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if i % 2 == 0:
            if x != y:
                raise NotRepeating(f"labels {first!r} and {second!r}")
            out.append(x)
        else:
            out.append(str(int(x) + (n - N1) * (int(y) - int(x))))
    return "".join(out)


@dataclass
class Family:
    """One instant of the step (before the stack, of the first or last unit, after it) at every
    depth: its value at N1 units and what each unit more adds."""

    phase: str
    where: object
    labels: tuple[str, str]
    cats: tuple[str, ...]
    """The categories seen so far, in the order they were first held (a freed one stays at 0)."""
    base: Vec
    step: Vec

    @classmethod
    def of(cls, where: object, m1: Moment, m2: Moment, v1: Vec, v2: Vec) -> "Family":
        return cls(m1.phase, where, (m1.label, m2.label), tuple(m1.by_category), v1, combine(v2, v1, 1, -1))

    def vec(self, n: int) -> Vec:
        """Its numbers at n units."""
        return combine(self.base, self.step, 1, n - N1)

    def moment(self, n: int, sizes: dict, slope: bool = True) -> Moment:
        """The instant at n units (with its growth per unit, `per_unit`, for the formula in L)."""
        total, by_cat, counts = _unflatten(self.vec(n), self.cats, sizes)
        m = Moment(self.phase, _label_at(*self.labels, n), total, by_cat, counts)
        if slope:
            step_total, step_cats, _ = _unflatten(
                {k: c for k, c in self.step.items() if k[0] != "n"}, self.cats, sizes)
            m.per_unit = Moment(self.phase, m.label, step_total, step_cats)
        return m


# ---- the structure of one simulated depth ------------------------------------------------------
def _positions(run: StepRun, lay: Layout, n: int):
    """A function from a mark's `where` to (position key, unit index or None)."""
    starts = run.layer_starts
    if len(starts) != lay.depth(n) + 1:
        raise NotRepeating("the program does not mark its layers")
    edges = [starts[j * lay.unit] for j in range(n + 1)]
    width = edges[1] - edges[0]
    if any(b - a != width for a, b in zip(edges, edges[1:])):
        raise NotRepeating("units of different lengths")

    def node(i: int) -> tuple[tuple, int | None]:
        if i < edges[0]:
            return ("pre", i), None
        if i >= edges[-1]:
            return ("post", i - edges[-1]), None
        return ("unit", (i - edges[0]) % width), (i - edges[0]) // width

    def where(w: object) -> tuple[object, int | None]:
        if isinstance(w, int):
            return node(w)
        if isinstance(w, tuple):
            (ka, ja), (kb, jb) = node(w[0]), node(w[1])
            if ja != jb:
                raise NotRepeating("a recomputation across units")
            return (ka, kb), ja
        return w, None

    return where


def _families(run: StepRun, lay: Layout, n: int, sizes: dict) -> tuple[dict, list]:
    """{family key: {unit or None: (Moment, its Vec)}} of a recorded run, and the (key, unit)
    step order."""
    where = _positions(run, lay, n)
    out: dict[tuple, dict] = {}
    order = []
    for (phase, micro, w, count), m in run.moments:
        pos, j = where(w)
        key = (phase, micro, pos, count)
        members = out.setdefault(key, {})
        if j in members:
            raise NotRepeating(f"two instants at {key}")
        members[j] = (m, vec(m, sizes))
        order.append((key, j))
    for key, members in out.items():
        expected = {None} if None in members else set(range(n))
        if set(members) != expected:
            raise NotRepeating(f"instant {key} not in every unit")
    return out, order


@dataclass
class Derivation:
    """Every instant of a step at any number of units, and the parameters."""

    layout: Layout
    steady: list[Family]
    first: list[Family]
    sizes: dict[tuple, Poly]
    params: tuple[list, list, list]
    """Parameters' (elements, dim 0, bytes) before, of one unit (repeated), and after."""

    def at(self, n: int) -> tuple[list[Moment], list[Moment], list[tuple[int, int]]]:
        """(steady moments, first-step moments, parameter shapes) at n units, in step order."""
        before, one, after = self.params
        params = before + one * (n - N1) + after
        regime = self.layout.regime
        sizes = [nbytes for _, _, nbytes in params]
        buckets = sum(sizes) if regime.replicated else 0
        temp = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                               sizes) if regime.data_parallel == 1 else 0
        out = []
        for families, slope in ((self.steady, True), (self.first, False)):
            moments = []
            for f in families:
                m = f.moment(n, self.sizes, slope)
                if buckets:
                    _add(m, "ddp_buckets", buckets)
                if temp and f.where in ("optimizer temporaries", "optimizer"):
                    _add(m, "temporaries", temp if f.where == "optimizer temporaries" else 0)
                if temp or f.where != "optimizer temporaries":
                    moments.append(m)
            out.append(moments)
        return out[0], out[1], [(elements, rows) for elements, rows, _ in params]


def _add(m: Moment, category: str, nbytes: int) -> None:
    """One storage of `nbytes` alive at `m` that the recorded runs leave out (DDP's gradient
    buckets, the optimizer's temporaries; memcalc.simulation.run_step); 0 bytes: the category
    has been seen (a freed storage leaves its category at 0)."""
    const = Poly.const(nbytes)
    m.total = m.total + const
    m.by_category = {**m.by_category, category: m.by_category.get(category, Poly()) + const}
    if nbytes:
        m.sizes = m.sizes + ((const, 1),)


def _derive_moments(runs: list[StepRun], lay: Layout, sizes: dict) -> list[Family]:
    """The families of three recorded runs (N1, N2, N3 units), checked; in step order."""
    found = [_families(run, lay, n, sizes) for run, n in zip(runs, (N1, N2, N3))]
    (f1, _), (f2, _), (f3, order3) = found
    if set(f1) != set(f2) or set(f1) != set(f3):
        raise NotRepeating("different instants at different depths")
    derived: dict[tuple, Family] = {}
    for key, members in f1.items():
        for end in [None] if None in members else ENDS:
            (m1, v1), (m2, v2), (m3, v3) = (
                fams[key][end if end is None else end % n]
                for fams, n in ((f1, N1), (f2, N2), (f3, N3)))
            fam = Family.of(key[2], m1, m2, v1, v2)
            if fam.vec(N3) != v3 or _label_at(*fam.labels, N3) != m3.label \
                    or tuple(m3.by_category) != fam.cats or tuple(m2.by_category) != fam.cats:
                raise NotRepeating(f"instant {key} not affine in depth")
            derived[key, end] = fam
    for (fams, _), n in zip(found, (N1, N2, N3)):
        _check_middle(fams, n)
    ends = {end % N3: end for end in ENDS}
    return [derived[key, None if j is None else ends[j]]
            for key, j in order3 if j is None or j in ends]


def _check_middle(fams: dict, n: int) -> None:
    """Every middle unit's instant is the interpolation of the second and the second-last
    unit's: (n-3) * M_j == (n-2-j) * M_1 + (j-1) * M_(n-2), so the largest is at an end."""
    for key, members in fams.items():
        if None in members:
            continue
        first, last = members[1][1], members[n - 2][1]
        for j in range(2, n - 2):
            if combine(members[j][1], {}, n - 3, 0) != combine(first, last, n - 2 - j, j - 1):
                raise NotRepeating(f"instant {key} not affine across units")


def _derive_shapes(shapes: list[list]) -> tuple[list, list, list]:
    """Parameters as before + one unit's * n + after, from N1 and N2 units, checked at N3."""
    p1, p2, p3 = shapes
    a = 0  # the longest common start, then one unit's parameters inserted
    while a < len(p1) and p1[a] == p2[a]:
        a += 1
    d = len(p2) - len(p1)
    one = p2[a:a + d]
    if d < 0 or p2[a + d:] != p1[a:] or p1[:a] + one * (N3 - N1) + p1[a:] != p3:
        raise NotRepeating("parameters do not repeat")
    return p1[:a], one, p1[a:]


def derive(model: ModelSpec, regime: Regime, lay: Layout) -> Derivation | None:
    """The derivation for `model`'s stack layout, or None when its depths do not repeat.

    >>> from memcalc.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="per-layer"))
    >>> model = ModelSpec.preset("gpt2")
    >>> d = derive(model, regime, layout(model, regime))
    >>> steady, first, shapes = d.at(12)
    >>> len(shapes)
    148
    """
    sizes: dict[tuple, Poly] = {}
    models = [model.with_(num_layers=lay.depth(n)) for n in (N1, N2, N3)]
    try:
        steady = [run_step(m, lay.regime, False, record=True, with_buckets=False) for m in models]
        first = [run_step(m, lay.regime, True, record=True, with_buckets=False) for m in models]
        params = [[(e, rows, nbytes) for (e, rows), nbytes in zip(run.param_shapes, run.param_sizes)]
                  for run in steady]
        return Derivation(lay, _derive_moments(steady, lay, sizes), _derive_moments(first, lay, sizes),
                          sizes, _derive_shapes(params))
    except NotRepeating:
        return None
