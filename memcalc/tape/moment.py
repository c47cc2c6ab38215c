"""A moment of a step (live bytes at one instant, by category, with the live sizes the allocator
rounds) and the peak frontier over Moments (memcalc.tape.frontier on their totals).
"""
from __future__ import annotations

from dataclasses import dataclass

from memcalc.core.poly import Poly
from memcalc.tape.frontier import Frontier, prune_convex


@dataclass
class Moment:
    """Live bytes at one instant, with the breakdown by category."""

    phase: str
    label: str
    total: Poly
    by_category: dict[str, Poly]
    sizes: tuple = ()  # (size Poly, how many live storages have it): for allocator rounding
    per_unit: "Moment | None" = None
    """What each repeat of the layer stack adds (memcalc.engine.depth), when derived."""


def _dense(moments: list[Moment]) -> list[tuple]:
    """The moments' totals as coefficient tuples over the monomials they use, in first-use order."""
    monos = list({mono: None for m in moments for mono in m.total.terms})
    return [tuple([m.total.terms.get(mono, 0) for mono in monos]) for m in moments]


def replay(moments: list[Moment]) -> list[Moment]:
    """The moments Memory.mark keeps of `moments` (in step order), phase by phase: a Frontier
    per phase (memcalc.tape.frontier) on their totals.

    >>> m = [Moment("forward", str(k), Poly.bs(k), {}) for k in (1, 3, 2)]
    >>> [x.label for x in replay(m)]
    ['3']
    """
    frontiers: dict[str, Frontier] = {}
    for m, v in zip(moments, _dense(moments)):
        frontier = frontiers.get(m.phase)
        if frontier is None:
            frontier = frontiers[m.phase] = Frontier()
        t = sum(v)
        if frontier.offer(v, t):
            frontier.add(v, t, m)
    return [m for frontier in frontiers.values() for m in frontier.items]


def prune_convex_moments(moments: list[Moment]) -> list[Moment]:
    """The moments not lying under a mix of two others (memcalc.tape.frontier.prune_convex on
    their totals), in order.

    >>> a, b, c = (Moment("p", "", Poly({(0, 0): k, (1, 1): 10 - k}), {}) for k in (0, 5, 10))
    >>> [m.total.terms[(0, 0)] for m in prune_convex_moments([a, b, c]) if (0, 0) in m.total.terms]
    [10]
    """
    return [moments[j] for j in prune_convex(_dense(moments))]
