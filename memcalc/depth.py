"""Depth as a symbol: any depth of a decoder stack from three small ones.

The layers of a decoder repeat (every layer alike, or a short pattern: `layer_period` of the
program), and a checkpointed stack repeats per segment, so a stack of L = n*u + r layers is n
identical units of u layers (u: the period and the checkpoint segment's common multiple) and r
layers more, which run with the suffix (a short last segment). Every instant of the step then has
a structural key: phase, micro-step, where in the program (before the stack, op `k` of a unit,
after the stack) and which mark there; and the instants of units 1 .. n-2 are affine in the
unit's index j and in n (saved activations of the j units before, gradients of the n-1-j after,
weights of all n), so the largest over them is that of unit 1 or n-2; units 0 and n-1 differ
(the last backward use of what every layer shares, FSDP's prefetch) and are kept as they are.

`derive` simulates n = 3, 4 and 5 units (every instant recorded, memcalc.tape.simulate.Memory
record mode, live storages counted per (category, size) and packed into one integer), takes each
instant of units 0, 1, n-2, n-1 and of the prefix and suffix as affine in n from n = 3 and 4, and
checks it at n = 5 exactly: the number of live storages of every (category, size), so totals,
categories and the CUDA allocator's per-storage rounding all follow, and the labels; at n = 5 it
also checks that unit 2's instants are exactly the interpolation of units 1 and 3. Storages
whose size grows with depth are paired across the depths (_growing); those that hold every
parameter at once, and the optimizer's temporaries, are added at each depth (Derivation.at).
Any mismatch (a program whose layers do not repeat with its declared period, a prefix of
different layers) gives None, and the engine simulates the depth itself: never a wrong answer.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from operator import ge

from memcalc.parallel.fsdp import padded_shard_bytes
from memcalc.poly import Poly
from memcalc.programs import program_for
from memcalc.regime import Regime, sqrt_segment_size
from memcalc.simulation import StepRun, run_step
from memcalc.specs import ModelSpec
from memcalc.tape.finetune_optim import BNB
from memcalc.tape.optimizer import transient_bytes
from memcalc.tape.simulate import Memory, Moment, prune_convex_dense

FINETUNE_OPTIMIZERS = BNB + ("adafactor",)
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


def supported(regime: Regime, model: ModelSpec | None = None) -> bool:
    """Whether memcalc.depth derives this step: not yet gradient clipping's temporaries nor a
    memcalc.tape.finetune_optim optimizer's per-parameter states and temporaries (their sizes
    follow the parameters one by one), nor, until each is tested against a direct simulation at
    random depths, frozen parameters / LoRA / quantised bases, the HF call paths, sliding-window
    layers or mixture-of-experts stacks; those depths are simulated layer by layer.

    >>> from memcalc.training import TrainingConfig
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8)))
    True
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, use_cache=True)))
    False
    """
    from memcalc.programs.call_path import CALL_PATH_DEFAULTS

    if regime.max_grad_norm is not None or regime.optimizer in FINETUNE_OPTIMIZERS:
        return False
    if regime.lora is not None or regime.freeze or regime.quantization != "none":
        return False
    if any(getattr(regime, f, d) != d for f, d in CALL_PATH_DEFAULTS.items() if f != "pad_tokens"):
        return False
    return model is None or (model.sliding_window is None and model.moe is None)


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
Vec = dict
"""A moment as its live storages: {(category, size terms): how many}, zeros dropped. Every number
of the moment (total, each category, storages per size) is linear in these counts."""


def combine(u: Vec, v: Vec, x: int, y: int) -> Vec:
    """x*u + y*v, zeros dropped.

    >>> combine({("a", ()): 2}, {("a", ()): 1, ("w", ()): 1}, 1, -2)
    {('w', ()): -2}
    """
    out = {k: c * x for k, c in u.items()} if x != 1 else dict(u)
    for k, c in v.items():
        out[k] = out.get(k, 0) + c * y
    return {k: c for k, c in out.items() if c}


def expand(v: Vec, cats: tuple[str, ...], sizes: dict) -> tuple[Poly, dict[str, Poly], dict]:
    """(total, bytes per category in `cats` order, {size terms: storages}) of live storages.

    >>> expand({("activations", ((1, 1),)): 3}, ("weights", "activations"), {((1, 1),): Poly.bs(2)})
    (Poly(6*b*s), {'weights': Poly(0), 'activations': Poly(6*b*s)}, {((1, 1),): 3})
    """
    total: dict = {}
    by_cat: dict[str, dict] = {c: {} for c in cats}
    counts: dict[tuple, int] = {}
    for (cat, size), n in v.items():
        terms = by_cat.setdefault(cat, {})
        for mono, c in sizes[size].terms.items():
            total[mono] = total.get(mono, 0) + n * c
            terms[mono] = terms.get(mono, 0) + n * c
        counts[size] = counts.get(size, 0) + n
    return Poly(total), {c: Poly(terms) for c, terms in by_cat.items()}, counts


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
    """One instant of the step (before the stack, in one of the ENDS units, after it) at every
    depth: its live storages at N1 units and what each unit more adds."""

    phase: str
    where: object
    labels: tuple[str, str]
    cats: tuple[str, ...]
    """The categories seen so far, in the order they were first held (a freed one stays at 0)."""
    base: Vec
    second: Vec
    """Its live storages at N2 units: `step` is what each unit more adds (computed when first
    read: most instants fall under others and never need it)."""
    totals: tuple = (None, None)
    """Packed totals at N1 and N2 units (Memory.packed_total), when every size is integral."""

    @property
    def step(self) -> Vec:
        """What each unit more adds to its live storages."""
        found = self.__dict__.get("_step_vec")
        if found is None:
            found = self._step_vec = combine(self.second, self.base, 1, -1)
        return found

    def vec(self, n: int) -> Vec:
        """Its live storages at n units."""
        return combine(self.base, self.step, 1, n - N1)

    def expanded(self, sizes: dict) -> None:
        """Precompute the numbers of `base` and `step` (what `moment` adds up)."""
        self._base = expand(self.base, self.cats, sizes)
        self._step = expand(self.step, self.cats, sizes)

    def moment(self, n: int, sizes: dict, slope: bool = True) -> Moment:
        """The instant at n units (with its growth per unit, `per_unit`, for the formula in L)."""
        (total, cats, counts), (d_total, d_cats, d_counts), x = self._base, self._step, n - N1
        live = {k: counts.get(k, 0) + x * d_counts.get(k, 0) for k in {**counts, **d_counts}}
        if any(c < 0 for c in live.values()):
            raise NotRepeating("a negative number of storages")
        m = Moment(self.phase, _label_at(*self.labels, n), total + d_total * x,
                   {c: p + d_cats[c] * x for c, p in cats.items()},
                   _storages(live, sizes, x))
        if slope:
            m.per_unit = Moment(self.phase, m.label, d_total, d_cats)
        return m


def _storages(live: dict, sizes: dict, x: int) -> tuple:
    """(size, live storages of it) for the allocator's rounding: a growing storage (one whose
    size grows with depth, _growing) at its size x units past N1; its growth key is no storage."""
    out = []
    for k, c in live.items():
        if not c or not k:
            continue
        if isinstance(k, tuple) and k[:1] == ("grow",):
            out.append((sizes[k] + sizes["grow-d", k[1]] * x, c))
        elif not (isinstance(k, tuple) and k[:1] == ("grow-d",)):
            out.append((sizes[k], c))
    return tuple(out)


def _growing(runs: list[StepRun], sizes: dict) -> None:
    """Storages whose size grows with depth (a causal-mask buffer of every layer, (L, P, P)):
    a size seen at one depth only, paired with one at each other depth, the sizes affine in
    n. Each is rewritten in the runs' logs as ("grow", i) (its size at N1) and ("grow-d", i),
    counted n - N1 times per storage (its growth per unit), so that every number stays linear
    in the live counts; `sizes` gets both."""
    keys = [set(run.sizes) for run in runs]
    alone = [sorted(k - keys[(i + 1) % 3] - keys[(i + 2) % 3], key=lambda k: runs[i].sizes[k].eval(1, 1))
             for i, k in enumerate(keys)]
    if not len(alone[0]) == len(alone[1]) == len(alone[2]):
        raise NotRepeating("storage sizes that do not pair across depths")
    for i, (k1, k2, k3) in enumerate(zip(*alone)):
        p1, p2, p3 = (run.sizes[k] for run, k in zip(runs, (k1, k2, k3)))
        if (p2 - p1).terms != (p3 - p2).terms:
            raise NotRepeating("a storage whose size is not affine in depth")
        sizes["grow", i], sizes["grow-d", i] = p1, p2 - p1
        for run, k, n in zip(runs, (k1, k2, k3), (N1, N2, N3)):
            run.moments = [entry[:4] + (None,) + entry[5:] for entry in run.moments]  # stale `packed`
            for _, _, _, live, _, _ in run.moments:
                for cat, size in [key for key in live if key[1] == k]:
                    c = live.pop((cat, size))
                    live[cat, ("grow", i)] = c
                    if n != N1:
                        live[cat, ("grow-d", i)] = c * (n - N1)


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


def _families(run: StepRun, lay: Layout, n: int) -> tuple[dict, list]:
    """{family key: {unit or None: (label, categories, live storages)}} of a recorded run, and
    the (key, unit) step order."""
    where, cache = _positions(run, lay, n), {}
    out: dict[tuple, dict] = {}
    order = []
    for (phase, micro, w, count), label, cats, live, packed, total in run.moments:
        found = cache.get(w)
        if found is None:  # each mark's place is looked up once per node (forward, backward)
            found = cache[w] = where(w)
        pos, j = found
        key = (phase, micro, pos, count)
        members = out.get(key)
        if members is None:
            members = out[key] = {}
        elif j in members:
            raise NotRepeating(f"two instants at {key}")
        members[j] = (label, cats, live, packed, total)
        order.append((key, j))
    for key, members in out.items():
        if None not in members and any(j not in members for j in range(2, n - 2)):
            raise NotRepeating(f"instant {key} not in every middle unit")
    return out, order


def _absent(members: dict, n: int) -> frozenset:
    """The ENDS units an instant is not in (the first unit's backward prefetches no next group)."""
    return frozenset(e for e in ENDS if e % n not in members)


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
        """(steady moments, first-step moments, parameter shapes) at n units, in step order; the
        storages the recorded runs leave out (DDP buckets, FSDP shards, optimizer temporaries)
        grow with the parameters, so each steady moment's `per_unit` gets their growth to n+1."""
        steady, first, shapes = self._at(n)
        growth = {c: deeper - here for (c, deeper), (_, here) in zip(self._outside(n + 1), self._outside(n))}
        for m in steady:
            for category in getattr(m, "outside", ()):
                if m.per_unit is not None and growth[category]:
                    d = Poly.const(growth[category])
                    m.per_unit.total = m.per_unit.total + d
                    m.per_unit.by_category = {**m.per_unit.by_category,
                                              category: m.per_unit.by_category.get(category, Poly()) + d}
        return steady, first, shapes

    def _outside(self, n: int) -> list[tuple[str, int]]:
        """(category, bytes) of the storages the recorded runs leave out, at n units."""
        before, one, after = self.params
        params = before + one * (n - N1) + after
        regime = self.layout.regime
        sizes = [nbytes for _, _, nbytes in params]
        buckets = sum(sizes) if regime.replicated else 0
        sharded = (regime.master_elt // regime.param_elt) * sum(
            padded_shard_bytes(nbytes, rows, regime.data_parallel) for _, rows, nbytes in params) \
            if regime.fsdp else 0
        temp = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                               sizes) if regime.data_parallel == 1 else 0
        return [("ddp_buckets", buckets), ("weights", sharded), ("temporaries", temp)]

    def _at(self, n: int) -> tuple[list[Moment], list[Moment], list[tuple[int, int]]]:
        before, one, after = self.params
        params = before + one * (n - N1) + after
        (_, buckets), (_, sharded), (_, temp) = self._outside(n)
        out = []
        for families, slope in ((self.steady, True), (self.first, False)):
            moments = []
            for f in families:
                with_temp = [True, False] if temp and f.where == "optimizer" else [False]
                for held in with_temp:  # memcalc.tape.step: temporaries held, then freed
                    m = f.moment(n, self.sizes, slope)
                    if buckets:
                        _add(m, "ddp_buckets", buckets)
                    if sharded:
                        _add(m, "weights", sharded)
                    if temp and f.where == "optimizer":
                        _add(m, "temporaries", temp if held else 0)
                    m.outside = [c for c, on in (("ddp_buckets", buckets), ("weights", sharded),
                                                 ("temporaries", held)) if on]
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


def _derive_moments(runs: list[StepRun], lay: Layout) -> list[Family]:
    """The families of three recorded runs (N1, N2, N3 units), checked; in step order."""
    found = [_families(run, lay, n) for run, n in zip(runs, (N1, N2, N3))]
    (f1, _), (f2, _), (f3, order3) = found
    if set(f1) != set(f2) or set(f1) != set(f3):
        raise NotRepeating("different instants at different depths")
    derived: dict[tuple, Family] = {}
    for key, members in f1.items():
        absent = frozenset() if None in members else _absent(members, N1)
        if None not in members and not absent == _absent(f2[key], N2) == _absent(f3[key], N3):
            raise NotRepeating(f"instant {key} in different units at different depths")
        for end in [None] if None in members else [e for e in ENDS if e not in absent]:
            (l1, c1, v1, p1, t1), (l2, c2, v2, p2, t2), (l3, c3, v3, p3, _) = (
                fams[key][end if end is None else end % n]
                for fams, n in ((f1, N1), (f2, N2), (f3, N3)))
            fam = Family(key[0], key[2], (l1, l2), c1, v1, v2)
            fam.totals = (t1, t2)
            if not _on_line((v1, p1), (v2, p2), (v3, p3), 1, 1, 2) or _label_at(l1, l2, N3) != l3 \
                    or not c1 == c2 == c3:
                raise NotRepeating(f"instant {key} not affine in depth")
            derived[key, end] = fam
    for (fams, _), n in zip(found, (N1, N2, N3)):
        _check_middle(fams, n)
    ends = {end % N3: end for end in ENDS}
    return [derived[key, None if j is None else ends[j]] for key, j in order3 if j is None or j in ends]


def _first_step(steady: list[Family]) -> list[Family]:
    """The first step's instants: the steady state's without the optimizer states before
    optimizer.step() creates them (they are the only 'optimizer' storages alive in forward and
    backward: memcalc.tape.step), the same from there on."""
    out = []
    for fam in steady:
        if fam.phase in ("forward", "backward") and any(k[0] == "optimizer" for k in fam.base):
            fam = Family(fam.phase, fam.where, fam.labels,
                         tuple(c for c in fam.cats if c != "optimizer"),
                         {k: n for k, n in fam.base.items() if k[0] != "optimizer"},
                         {k: n for k, n in fam.second.items() if k[0] != "optimizer"})
        out.append(fam)
    return out


def _unpack_dense(x: int, k: int) -> tuple:
    """The first k balanced digits of a packed total (Memory.packed_total): its coefficient of
    each monomial, in the order of their slots, zeros included.

    >>> _unpack_dense(5 - (3 << Memory.TOTAL_SLOT), 3)
    (5, -3, 0)
    """
    out, slot = [], Memory.TOTAL_SLOT
    mask, half, full = (1 << slot) - 1, 1 << (slot - 1), 1 << slot
    for _ in range(k):
        d = x & mask
        if d >= half:
            d -= full
        out.append(d)
        x = (x - d) >> slot
    return tuple(out)


def _frontier(families: list[Family], sizes: dict, index: dict | None = None) -> list[Family]:
    """The families Memory.mark would keep at every depth of N1 units or more: compared on
    their totals lifted to (b, s, n) (base coefficients, and per-unit ones, which n - N1 >= 0
    multiplies), so a dropped one is below a kept one (or a mix of two) at every depth."""
    k = sum(1 for key in index or {} if key[0] == "mono")
    if index is not None and all(None not in f.totals for f in families):
        dense = [_unpack_dense(t1, k) + _unpack_dense(t2 - t1, k) for t1, t2 in (f.totals for f in families)]
    else:
        terms_of = {size: list(p.terms.items()) for size, p in sizes.items()}
        lifted = []
        for fam in families:
            terms: dict = {}
            for part, v in ((0, fam.base), (1, fam.step)):
                for (_, size), n in v.items():
                    for mono, c in terms_of[size]:
                        terms[mono, part] = terms.get((mono, part), 0) + n * c
            lifted.append(terms)
        columns: dict = {}
        for terms in lifted:
            for key in terms:
                columns.setdefault(key, len(columns))
        dense = [tuple(terms.get(key, 0) for key in columns) for terms in lifted]
    kept = _kept(dense, [fam.phase for fam in families])
    out = [fam for i, fam in enumerate(families) if i in kept]
    for fam in out:
        fam.expanded(sizes)
    return out


def _kept(dense: list[tuple], phases: list[str]) -> set[int]:
    """Indices of the totals memcalc.tape.simulate.replay keeps (dominance, then the convex
    pruning), on dense coefficient tuples: largest first (at b = s = 1, n = N1 + 1) so the
    frontier stays small, equal totals in step order so the earliest is kept, as Memory.mark
    keeps it."""
    frontiers: dict[str, list[int]] = {}
    for i in sorted(range(len(dense)), key=lambda i: -sum(dense[i])):
        frontier, v = frontiers.setdefault(phases[i], []), dense[i]
        if any(all(map(ge, dense[j], v)) for j in frontier):
            continue
        frontier[:] = [j for j in frontier if not all(map(ge, v, dense[j]))] + [i]
        if len(frontier) >= Memory.PRUNE_AT:
            frontier[:] = [frontier[j] for j in prune_convex_dense([dense[j] for j in frontier])]
    return {i for frontier in frontiers.values() for i in frontier}


def _on_line(u: tuple, v: tuple, w: tuple, x: int, y: int, z: int) -> bool:
    """x*u + y*w == z*v for (live storages, packed) instants (v lies on the line through u
    and w), x, y, z >= 0: on the packed integers when all three have one (each count is under
    2**30 and x, y, z small, so no digit carries into the next: equal integers are equal
    counts), else key by key.

    >>> _on_line(({"a": 1}, 1), ({"a": 2}, 2), ({"a": 3}, 3), 1, 1, 2)
    True
    >>> _on_line(({"a": 1}, None), ({"a": 2}, None), ({}, None), 1, 1, 2)
    False
    """
    if u[1] is not None and v[1] is not None and w[1] is not None:
        return x * u[1] + y * w[1] == z * v[1]
    u, v, w = u[0], v[0], w[0]
    get_u, get_v, get_w = u.get, v.get, w.get
    return all(x * get_u(k, 0) + y * get_w(k, 0) == z * get_v(k, 0) for k in {**u, **v, **w})


def _check_middle(fams: dict, n: int) -> None:
    """Every middle unit's instant is the interpolation of the second and the second-last
    unit's: (n-3) * M_j == (n-2-j) * M_1 + (j-1) * M_(n-2), so the largest is at an end."""
    for key, members in fams.items():
        if None in members:
            continue
        if n <= 4:
            continue
        if 1 not in members or n - 2 not in members:
            raise NotRepeating(f"instant {key} in the middle units only")
        first, last = members[1][2:4], members[n - 2][2:4]
        for j in range(2, n - 2):
            if not _on_line(first, members[j][2:4], last, n - 2 - j, j - 1, n - 3):
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


def derive(model: ModelSpec, lay: Layout) -> Derivation | None:
    """The derivation for `model`'s stack layout, or None when its depths do not repeat.

    >>> from memcalc.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="per-layer"))
    >>> model = ModelSpec.preset("gpt2")
    >>> d = derive(model, layout(model, regime))
    >>> steady, first, shapes = d.at(12)
    >>> len(shapes)
    148
    """
    try:  # a spec tied to its depth (no_rope_layers naming layer 7) has no smaller one: simulate
        models = [model.with_(num_layers=lay.depth(n)) for n in (N1, N2, N3)]
    except ValueError:  # memcalc.errors.SpecError, pydantic's ValidationError
        return None
    try:
        index: dict = {}  # one numbering of (category, size) for the three runs' packed counts
        steady = [run_step(m, lay.regime, False, record=index, whole=False) for m in models]
        sizes = {k: p for run in steady for k, p in run.sizes.items()}
        _growing(steady, sizes)
        params = [[(e, rows, nbytes) for (e, rows), nbytes in zip(run.param_shapes, run.param_sizes)]
                  for run in steady]
        kept = _frontier(_derive_moments(steady, lay), sizes, index)
        first = _first_step(kept)  # the same kept instants: every forward and backward one
        for fam in first:  # holds the same states, and the frontier is blind to a common term
            fam.expanded(sizes)
        return Derivation(lay, kept, first, sizes, _derive_shapes(params))
    except NotRepeating:
        return None
