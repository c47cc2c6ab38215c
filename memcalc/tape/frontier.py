"""The peak frontier: of the totals of one phase (coefficient tuples over the same monomials, or
the same packed into integers), the ones that can set the peak at some shape b, s >= 1 (and, for
memcalc.engine.depth, some depth n >= N1), kept as totals arrive.

Two tests drop a total, each safe at every shape because every monomial is >= 0 there:
- dominance: another total is at least it in every coefficient (pairwise);
- convexity: it lies under a mix lam*x + (1-lam)*y of two others (below_mix), so under the
  larger of x and y; run when PRUNE_AT totals are kept (prune_convex), since most instants of
  a step fall under one kept total and the pairs are costly.

Every frontier of the package is one of these: Frontier (Memory.mark in step order,
memcalc.tape.moment.replay, kept_largest_first for memcalc.engine.depth) on tuples, and
kept_packed on integers with a guard bit per coefficient (memcalc.engine.depth's lifted totals).
tests/test_frontier.py checks each against the pairwise references.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import compress
from operator import ge
from typing import Callable

PRUNE_AT = 24
"""Kept totals of one frontier that trigger the convex pruning."""


class Frontier:
    """The kept totals of one phase and an item for each (a Moment, an index, what Memory.mark
    keeps): `offer` says whether a total joins, dropping the kept ones it is at least; `add`
    puts it in and prunes at `prune_at` kept. Pre-tests that cannot change the answer make the
    common case (a total under one kept before) cheap: the kept total that last covered one is
    tried first (`hint`), and a total at least another coefficient by coefficient has at least
    its sum of coefficients (`sums`).

    >>> f = Frontier()
    >>> for label, v in [("a", (1, 2)), ("b", (0, 1)), ("c", (2, 2)), ("d", (3, 0))]:
    ...     if f.offer(v, sum(v)):
    ...         f.add(v, sum(v), label)
    >>> f.items
    ['c', 'd']
    """

    __slots__ = ("items", "dense", "sums", "hint", "settled", "prune_at")

    def __init__(self, prune_at: int = PRUNE_AT) -> None:
        self.items: list = []
        self.dense: list[tuple] = []
        """The kept totals, as coefficient tuples (Memory widens them as monomials appear)."""
        self.sums: list = []
        """Each kept total's sum of coefficients."""
        self.hint: int | None = None
        """The index of the kept total that last covered an offer, tried first at the next."""
        self.settled = 0
        """How many of the kept totals (the first ones) the last pruning left: no pair of those
        holds one of them under a mix (prune_convex's `settled`)."""
        self.prune_at = prune_at

    def offer(self, total: list | tuple, t: object) -> bool:
        """Whether `total` (sum of coefficients `t`) joins: not when a kept total is at least it
        in every coefficient; else the kept ones it is at least are dropped (add puts it in)."""
        dense, sums = self.dense, self.sums
        hint = self.hint
        if hint is not None and sums[hint] >= t and all(map(ge, dense[hint], total)):
            return False
        below = None
        # one coefficient tried alone first: the one a kept total most often exceeds where it is
        # not below (the first held after the constant's, in practice activations' b*s)
        k = 1 if len(total) > 1 else 0
        tk = total[k] if total else 0  # (no monomial yet: the first kept total, (), is at least it)
        for i, u in enumerate(dense):
            at_least = sums[i]
            if at_least >= t and all(map(ge, u, total)):
                self.hint = i
                return False
            if t >= at_least and tk >= u[k] and all(map(ge, total, u)):
                if below is None:
                    below = [i]
                else:
                    below.append(i)
        if below is not None:
            items = self.items
            for i in reversed(below):
                del items[i], dense[i], sums[i]
            settled = self.settled
            if below[0] < settled:
                self.settled = settled - bisect_left(below, settled)
        return True

    def add(self, v: tuple, t: object, item: object) -> None:
        """Keep `v` (sum `t`), which `offer` accepted, with its item; prune at `prune_at` kept."""
        dense = self.dense
        self.items.append(item)
        dense.append(v)
        self.sums.append(t)
        self.hint = len(dense) - 1
        if len(dense) >= self.prune_at:
            kept = prune_convex(dense, self.settled)
            self.settled = len(kept)
            self.items[:] = [self.items[i] for i in kept]
            dense[:] = [dense[i] for i in kept]
            self.sums[:] = [self.sums[i] for i in kept]
            self.hint = None


def kept_largest_first(dense: list[tuple], phases: list, prune_at: int = PRUNE_AT) -> set[int]:
    """Indices of the totals a Frontier per phase keeps when offered the largest first (by sum of
    coefficients; equal sums in their order, so the earliest is kept), which keeps the frontier
    small (memcalc.engine.depth, whose totals come unordered).

    >>> sorted(kept_largest_first([(1, 2), (3, 0), (2, 2), (0, 1)], ["p", "p", "p", "q"]))
    [1, 2, 3]
    """
    frontiers: dict[object, Frontier] = {}
    for i in sorted(range(len(dense)), key=lambda i: -sum(dense[i])):
        v = dense[i]
        frontier = frontiers.get(phases[i])
        if frontier is None:
            frontier = frontiers[phases[i]] = Frontier(prune_at)
        t = sum(v)
        if frontier.offer(v, t):
            frontier.add(v, t, i)
    return {i for frontier in frontiers.values() for i in frontier.items}


def kept_packed(xs: list[int], sums: list[int], guard: int, tuple_of: Callable[[int], tuple],
                phases: list, prune_at: int = PRUNE_AT) -> set[int]:
    """kept_largest_first on totals packed into integers: each coefficient biased into a slot of
    its own under the slot's top bit, the guard bits `guard` (the top bit of each slot), so that
    x >= v in every coefficient exactly when (x | guard) - v keeps every guard bit (no slot
    borrows from the next); `sums` the sums of coefficients, `tuple_of(i)` total i's tuple (for
    the convex test). The same order, the same dominance test and the same convex pruning
    (_PackedPruning, prune_convex's). A new total is never above a kept one without being equal
    to it (the kept ones' sums are at least its own), so there is nothing kept to drop.

    >>> vecs = [(1, 2), (3, 0), (2, 2), (0, 1)]
    >>> xs = [a + 4 + ((b + 4) << 4) for a, b in vecs]  # biased by 4 in 4-bit slots, guard bit 3
    >>> sorted(kept_packed(xs, [sum(v) for v in vecs], 8 | 8 << 4, vecs.__getitem__, ["p", "p", "p", "q"]))
    [1, 2, 3]
    """
    frontiers: dict[object, _PackedPruning] = {}
    guarded: dict[object, list[int]] = {}  # the frontier's integers, guard bits set
    last: dict[object, int] = {}  # the kept one found above the one before (tried first)
    for i in sorted(range(len(xs)), key=[-t for t in sums].__getitem__):  # (stable: step order among equal sums)
        phase, v = phases[i], xs[i]
        above = guarded.get(phase)
        if above is None:
            above = guarded[phase] = []
            frontiers[phase] = _PackedPruning(xs, guard, tuple_of)
        x = last.get(phase)
        if x is not None and (x - v) & guard == guard:
            continue
        for x in above:
            if (x - v) & guard == guard:
                last[phase] = x
                break
        else:
            frontier = frontiers[phase]
            frontier.kept.append(i)
            above.append(v | guard)
            if len(frontier.kept) >= prune_at:
                frontier.prune()
                above[:] = [xs[j] | guard for j in frontier.kept]
                last.pop(phase, None)  # (it may be gone)
    return {i for frontier in frontiers.values() for i in frontier.kept}


class _PackedPruning:
    """One frontier of kept_packed and its convex pruning, prune_convex's result (the same test
    of each kept total, in the same order, against every pair of the others) without repeating
    what an earlier pruning showed: a total that stayed was under no mix of two others then
    (each pair failed), those that stayed with it are among them, and a frontier only grows
    between prunings, so only the pairs with a total added since are tested again.
    prune_convex's masks of the coefficients where one total is at least another are the guard
    bits of kept_packed's subtraction (one bit per coefficient, in other places)."""

    def __init__(self, xs: list[int], guard: int, tuple_of: Callable[[int], tuple]) -> None:
        self.kept: list[int] = []
        self.settled: set[int] = set()
        """The totals left by the last pruning: no pair of these holds one of them below it."""
        self._xs, self._guard, self._tuple = xs, guard, tuple_of

    def prune(self) -> None:
        """prune_convex on the kept totals (in the same order, the same test, the same ones
        dropped)."""
        kept, xs, full = self.kept, self._xs, self._guard
        i = 0
        while i < len(kept):
            b = kept[i]
            others = kept[:i] + kept[i + 1:]
            v = xs[b]
            if self._below_a_mix(b, others, [((xs[x] | full) - v) & full for x in others]):
                kept.pop(i)
            else:
                i += 1
        self.settled = set(kept)

    def _below_a_mix(self, b: int, others: list[int], covers: list[int]) -> bool:
        """Whether total b is under a mix of two of `others` (`covers`: where each is at least
        b), as prune_convex tests it: the pairs that cover b together, by below_mix (for one
        left by the last pruning, only those with a total added since)."""
        settled, full, tuple_of, n = self.settled, self._guard, self._tuple, len(others)
        fresh = [j for j in range(n) if others[j] not in settled] if b in settled else None
        dense = tuple_of(b)
        for j in range(n):
            cj = covers[j]
            if fresh is not None and others[j] in settled:  # (the pairs of two settled ones failed)
                ms = [m for m in fresh if m > j and cj | covers[m] == full]
            else:
                ms = [m for m in range(j + 1, n) if cj | covers[m] == full]
            if ms:
                tj = tuple_of(others[j])
                for m in ms:
                    if below_mix(dense, tj, tuple_of(others[m])):
                        return True
        return False


def prune_convex(vecs: list[tuple], settled: int = 0) -> list[int]:
    """The indices of `vecs` (coefficient tuples over the same monomials) kept when those lying
    under a mix of two others are dropped (below_mix; e.g. the layers between the first and the
    last of a backward pass, whose totals are affine in the layer index), in order. The first
    `settled` are what a pruning of the same test left (no pair of them holds one of them below: each was tested against
    every pair of the others then), so only their pairs with a later one are tested.

    >>> prune_convex([(0, 10), (5, 5), (10, 0)])
    [0, 2]
    """
    kept = list(range(len(vecs)))
    xs, full = _guarded(vecs)
    i = 0
    while i < len(kept):
        b = kept[i]
        v = vecs[b]
        if _below_near(v, i, kept, vecs):
            kept.pop(i)
            continue
        others = kept[:i] + kept[i + 1:]
        covers = None
        if xs is not None:  # where each other is at least v: the guard bits left by a subtraction
            x = xs[b]
            covers = [((xs[j] | full) - x) & full for j in others]
        fresh = bisect_left(others, settled) if b < settled else 0  # the first of `others` not settled
        if _below_some_mix(v, [vecs[j] for j in others], covers, full, fresh):
            kept.pop(i)
        else:
            i += 1
    return kept


def _below_near(v: tuple, i: int, kept: list[int], vecs: list[tuple]) -> bool:
    """Whether v (vecs[kept[i]]) is under a mix of two kept totals next to it (before and
    after, or the two after it), the pairs that most often hold one below (the
    layers between two others, affine in the layer): pairs _below_some_mix tests (x before y,
    covering v together, max(x, y) >= v), tried first.

    >>> _below_near((5, 5), 1, [0, 1, 2], [(0, 10), (5, 5), (10, 0)])
    True
    """
    n = len(kept)
    for a, b in ((i - 1, i + 1), (i + 1, i + 2)):
        if a >= 0 and b < n:
            x, y = vecs[kept[a]], vecs[kept[b]]
            if all(map(ge, map(max, x, y), v)) and below_mix(v, x, y):
                return True
    return False


def _guarded(vecs: list[tuple]) -> tuple[list[int] | None, int]:
    """Each tuple as one integer, a slot of w + 1 bits per coefficient (its excess over the
    least one, under 2**w), and the guard bits (bit w of each slot): then
    ((x | guard) - y) & guard has the guard bit of each coefficient where x >= y (no slot
    borrows from the next). (None, 0) when a coefficient is not an int, or there is none.

    >>> xs, guard = _guarded([(1, 5), (3, 2)])
    >>> ((xs[0] | guard) - xs[1]) & guard == 1 << 7  # (1, 5) >= (3, 2) in the second only
    True
    """
    if not vecs or not vecs[0]:
        return None, 0
    for v in vecs:
        for c in v:
            if c.__class__ is not int:
                return None, 0
    lo = min(map(min, vecs))
    w = (max(map(max, vecs)) - lo).bit_length()
    slot = w + 1
    shifts = [slot * k for k in range(len(vecs[0]))]
    xs = [sum([(c - lo) << k for c, k in zip(v, shifts)]) for v in vecs]
    return xs, sum(1 << (w + k) for k in shifts)


def _below_some_mix(v: tuple, others: list[tuple], covers: list[int] | None = None, full: int = 0,
                    fresh: int = 0) -> bool:
    """Whether v lies under a mix of some pair of `others` (below_mix(v, x, y), x before
    y), of the pairs whose y is others[fresh] or later. A mix of x and y is at most max(x, y)
    in each coefficient, so only pairs that cover v coefficient by coefficient can hold it
    below (a bit per coefficient, unless `covers` gives each other's bits, `full` all of them):
    the partners of x are those covering what x does not (the same `need` is looked up once).

    >>> _below_some_mix((5, 5), [(0, 10), (9, 0), (10, 0)]), _below_some_mix((5, 5), [(0, 10), (4, 9)])
    (True, False)
    """
    if covers is None:
        full = (1 << len(v)) - 1
        bits = [1 << k for k in range(len(v))]
        covers = [sum(compress(bits, map(ge, x, v))) for x in others]
    partners: dict[int, list[int]] = {}
    for j, cover in enumerate(covers):
        need = full & ~cover
        found = partners.get(need)
        if found is None:
            found = partners[need] = [k for k, c in enumerate(covers) if c & need == need]
        x = others[j]
        for k in found[bisect_right(found, j if j >= fresh else fresh - 1):]:
            if below_mix(v, x, others[k]):
                return True
    return False


def below_mix(v: tuple, v1: tuple, v2: tuple) -> bool:
    """True when v <= lam*v1 + (1-lam)*v2 coefficient by coefficient for some lam in [0, 1]
    (coefficient tuples over the same monomials); then v(b, s) <= max(v1(b, s), v2(b, s)) at
    every shape, so v can never set the peak.

    >>> below_mix((5, 5), (0, 10), (10, 0)), below_mix((6, 5), (0, 10), (10, 0))
    (True, False)
    """
    lo, hi = 0.0, 1.0
    for c, c1, c2 in zip(v, v1, v2):
        slope, need = c1 - c2, c - c2  # lam * slope >= need
        if slope > 0:
            bound = need / slope
            if bound > lo:  # lo = max(lo, bound)
                lo = bound
        elif slope < 0:
            bound = need / slope
            if bound < hi:  # hi = min(hi, bound)
                hi = bound
        elif need > 0:
            return False
        if lo > hi:
            return False
    return True

