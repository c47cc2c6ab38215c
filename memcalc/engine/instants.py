"""An instant of the step at every depth (memcalc.engine.depth): its live storages
{(category, size terms): how many} at N1 units and what each unit more adds. Every number of a
moment (total, each category, storages per size) is linear in these counts, so an instant's
moment at n units is affine in n.
"""
from __future__ import annotations

import re

from memcalc.core.poly import Poly
from memcalc.engine.layout import N1, NotRepeating
from memcalc.tape.moment import Moment

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


def expand(v: Vec, cats: tuple[str, ...], sizes: dict,
           terms_of: dict | None = None) -> tuple[Poly, dict[str, Poly], dict]:
    """(total, bytes per category in `cats` order, {size terms: storages}) of live storages
    (`terms_of`: each size's terms as pairs, size_terms(sizes), when already made).

    >>> expand({("activations", ((1, 1),)): 3}, ("weights", "activations"), {((1, 1),): Poly.bs(2)})
    (Poly(6*b*s), {'weights': Poly(0), 'activations': Poly(6*b*s)}, {((1, 1),): 3})
    """
    if terms_of is None:
        terms_of = size_terms(sizes)
    total: dict = {}
    by_cat: dict[str, dict] = {c: {} for c in cats}
    counts: dict[tuple, int] = {}
    for (cat, size), n in v.items():
        _add_storages(total, by_cat, counts, cat, size, n, terms_of)
    return _poly(total), {c: _poly(terms) for c, terms in by_cat.items()}, counts


def _expand_pair(base: Vec, second: Vec, cats: tuple[str, ...], terms_of: dict) -> tuple[tuple, tuple, Vec]:
    """(expand(base), expand(step), step) with step = combine(second, base, 1, -1), in one pass
    over each: step's storages in combine's order (second's, then those of base alone), each
    added up in that order as expand adds them up.

    >>> sizes = {((1, 1),): Poly.bs(2), ((0, 0),): Poly.const(4)}
    >>> base, second = {("w", ((0, 0),)): 1, ("a", ((1, 1),)): 2}, {("a", ((1, 1),)): 3, ("g", ((0, 0),)): 1}
    >>> _, (total, by_cat, counts), step = _expand_pair(base, second, ("w", "a"), size_terms(sizes))
    >>> step == combine(second, base, 1, -1), total, by_cat["w"], counts
    (True, Poly(2*b*s), Poly(-4), {((1, 1),): 1, ((0, 0),): 0})
    """
    step: dict = {}
    total: dict = {}
    by_cat: dict[str, dict] = {c: {} for c in cats}
    counts: dict[tuple, int] = {}
    get = base.get
    for key, c2 in second.items():
        n = c2 - get(key, 0)
        if not n:
            continue
        step[key] = n
        _add_storages(total, by_cat, counts, *key, n, terms_of)
    b_total: dict = {}
    b_by_cat: dict[str, dict] = {c: {} for c in cats}
    b_counts: dict[tuple, int] = {}
    for key, n in base.items():
        _add_storages(b_total, b_by_cat, b_counts, *key, n, terms_of)
        if key in second or not n:
            continue
        step[key] = -n  # (only in base: combine's 0 - n, after second's storages)
        _add_storages(total, by_cat, counts, *key, -n, terms_of)
    return ((_poly(b_total), {c: _poly(t) for c, t in b_by_cat.items()}, b_counts),
            (_poly(total), {c: _poly(t) for c, t in by_cat.items()}, counts), step)


def _add_storages(total: dict, by_cat: dict, counts: dict, cat: str, size: tuple, n: int,
                  terms_of: dict) -> None:
    """Add n storages of one (category, size) to a total's, its category's and the size's
    counts (expand's sums, in its order; by_cat gains the category when first added).

    >>> total, by_cat, counts = {}, {}, {}
    >>> _add_storages(total, by_cat, counts, "a", "k", 2, {"k": (((1, 1), 3),)})
    >>> total, by_cat, counts
    ({(1, 1): 6}, {'a': {(1, 1): 6}}, {'k': 2})
    """
    terms = by_cat.get(cat)
    if terms is None:
        terms = by_cat[cat] = {}
    for mono, c in terms_of[size]:
        c *= n
        total[mono] = total.get(mono, 0) + c
        terms[mono] = terms.get(mono, 0) + c
    counts[size] = counts.get(size, 0) + n


def size_terms(sizes: dict) -> dict:
    """Each size's terms as (monomial, coefficient) pairs, by its key in `sizes` (expand).

    >>> size_terms({"k": Poly.bs(2)})
    {'k': (((1, 1), 2),)}
    """
    return {k: tuple(p.terms.items()) for k, p in sizes.items()}


def _poly(terms: dict) -> Poly:
    """Poly(terms), taken as is where no coefficient is 0 (Poly._of)."""
    return Poly(terms) if 0 in terms.values() else Poly._of(terms)


def label_at(first: str, second: str, n: int) -> str:
    """A label at n units from its labels at N1 and N2: numbers that differ (a layer's index in
    an FSDP group name) move by their difference per unit.

    >>> label_at("layers.2 backward", "layers.3 backward", 7)
    'layers.6 backward'
    """
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


class Instant:
    """One instant of the step (before the stack, in one of the ENDS units, after it) at every
    depth: its live storages at N1 units and what each unit more adds."""

    __slots__ = ("phase", "where", "labels", "cats", "_vecs", "totals", "_step_vec", "_numbers")

    def __init__(self, phase: str, where: object, labels: tuple[str, str], cats: tuple[str, ...],
                 base: Vec | tuple, second: Vec | tuple, totals: tuple = (None, None)) -> None:
        self.phase, self.where, self.labels = phase, where, labels
        self.cats = cats
        """The categories seen so far, in the order they were first held (a freed one stays at 0)."""
        self._vecs = [base, second]
        """`base` and `second`, each a Vec or, recorded, (StepRun.live, stamp, packed): read
        back when first needed (most instants fall under others and never need theirs)."""
        self.totals = totals
        """Packed totals at N1 and N2 units (RecordingMemory.packed_total), when every size is integral."""
        self._step_vec: Vec | None = None
        self._numbers: tuple = ()

    def _vec(self, i: int) -> Vec:
        v = self._vecs[i]
        if not isinstance(v, dict):
            read, stamp, packed = v
            v = self._vecs[i] = read(stamp, packed)
        return v

    @property
    def base(self) -> Vec:
        """Its live storages at N1 units."""
        return self._vec(0)

    @property
    def second(self) -> Vec:
        """Its live storages at N2 units: `step` is what each unit more adds (computed when
        first read)."""
        return self._vec(1)

    @property
    def step(self) -> Vec:
        """What each unit more adds to its live storages."""
        found = self._step_vec
        if found is None:
            found = self._step_vec = combine(self.second, self.base, 1, -1)
        return found

    def vec(self, n: int) -> Vec:
        """Its live storages at n units."""
        return combine(self.base, self.step, 1, n - N1)

    def expanded(self, sizes: dict, terms_of: dict | None = None) -> None:
        """Precompute the numbers of `base` and `step` (what `moment` adds up; `terms_of`:
        size_terms(sizes), when already made)."""
        if terms_of is None:
            terms_of = size_terms(sizes)
        if self._step_vec is None:  # `step` made on the way (_expand_pair)
            base, step, self._step_vec = _expand_pair(self.base, self.second, self.cats, terms_of)
            self._numbers = (base, step)
        else:
            self._numbers = (expand(self.base, self.cats, sizes, terms_of),
                             expand(self.step, self.cats, sizes, terms_of))

    @property
    def is_expanded(self) -> bool:
        """Whether `expanded` has run (what `moment` and `total` read)."""
        return bool(self._numbers)

    def moment(self, n: int, sizes: dict, slope: bool = True) -> Moment:
        """The instant at n units (with its growth per unit, `per_unit`, for the formula in L)."""
        ((total, cats, _), (d_total, d_cats, _)), x = self._numbers, n - N1
        m = Moment(self.phase, label_at(*self.labels, n), _affine(total, d_total, x),
                   {c: _affine(p, d_cats[c], x) for c, p in cats.items()},
                   _storages(self._live(x), sizes, x))
        if slope:
            m.per_unit = Moment(self.phase, m.label, d_total, d_cats)
        return m

    def _live(self, x: int) -> dict:
        """Its live storages per size x units past N1; NotRepeating where a count would be
        negative."""
        counts, d_counts = self._numbers[0][2], self._numbers[1][2]
        live = {k: counts.get(k, 0) + x * d_counts.get(k, 0) for k in {**counts, **d_counts}} if x else counts
        if any(c < 0 for c in live.values()):
            raise NotRepeating("a negative number of storages")
        return live

    def total(self, n: int) -> Poly:
        """Its total at n units (`moment`'s, without the moment: the same NotRepeating)."""
        (total, _, _), (d_total, _, _) = self._numbers
        self._live(n - N1)
        return _affine(total, d_total, n - N1)


def _affine(p: Poly, d: Poly, x: int) -> Poly:
    """p + d * x (p itself where d * x is zero: a Poly is never changed in place).

    >>> _affine(Poly.const(3), Poly.bs(2), 2), _affine(Poly.const(3), Poly(), 2)
    (Poly(3 + 4*b*s), Poly(3))
    """
    if not x or not d.terms:
        return p
    out = dict(p.terms)
    for mono, c in d.terms.items():
        out[mono] = out.get(mono, 0) + c * x
    return Poly(out)


def _storages(live: dict, sizes: dict, x: int) -> tuple:
    """(size, live storages of it) for the allocator's rounding: a growing storage (one whose
    size grows with depth, pair_growing) at its size x units past N1; its growth key is no storage."""
    out = []
    for k, c in live.items():  # k: size terms (pairs), ("grow", i) or ("grow-d", i)
        if not c or not k:
            continue
        head = k[0]
        if head == "grow":
            out.append((sizes[k] + sizes["grow-d", k[1]] * x, c))
        elif head != "grow-d":
            out.append((sizes[k], c))
    return tuple(out)
