"""A traced program: the fitted event streams of a step, walked into the engine's candidate
moments (issue 25; no torch).

The engine's own programs are walked by memcalc.tape.simulate; a traced one was walked by torch
itself under FakeTensorMode (memcalc.traced.runner), so its moments come straight from the stream:
after every op, the live storages' fitted sizes (memcalc.traced.fit) summed, by category, in the
phases forward (the batch's creation included), backward and optimizer, for the first step and
the two steady ones. memcalc.engine.candidates.Candidates holds them as it holds a hand-written
program's, so every query (estimate, expr, capacity, grid, plan, tables, check) reads them unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

from memcalc.core.poly import Poly
from memcalc.tape.moment import Moment, replay

PHASE_OF = {"inputs": "forward", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}


@dataclass
class FittedStep:
    """One shape condition's program: the stream (sizes left out), each storage's Poly and category."""

    events: list[tuple]
    sizes: dict[int, Poly]
    categories: dict[int, str]


def moments(fitted: FittedStep) -> tuple[list[Moment], list[Moment]]:
    """(steady, first) moments of the stream: one per op and mark, kept if they can set a peak.

    >>> ev = [("m", "step 0"), ("m", "forward"), ("a", 0), ("i", "aten::mul"), ("f", 0),
    ...       ("m", "step 1"), ("m", "forward"), ("a", 1), ("i", "aten::mul")]
    >>> steady, first = moments(FittedStep(ev, {0: Poly.bs(4), 1: Poly.bs(8)}, {}))
    >>> [m.total for m in steady], [m.total for m in first]
    ([Poly(8*b*s)], [Poly(4*b*s)])
    """
    live: dict[int, tuple[Poly, str]] = {}
    total, by_cat = Poly(), {}
    phase, step = None, -1
    steady, first = [], []
    for e in fitted.events:
        kind = e[0]
        if kind == "a":
            size = fitted.sizes[e[1]]
            cat = fitted.categories.get(e[1]) or ("temporaries" if phase == "optimizer" else "activations")
            live[e[1]] = (size, cat)
            total = total + size
            by_cat[cat] = by_cat.get(cat, Poly()) + size
            continue
        if kind == "f":
            size, cat = live.pop(e[1])
            total = total - size
            by_cat[cat] = by_cat[cat] - size
            continue
        if kind == "m":
            label = e[1]
            if label.startswith("step "):
                step = int(label[5:])
            elif label in PHASE_OF:
                phase = PHASE_OF[label]
            elif label == "end":
                phase = None
        if phase is not None and step >= 0:
            m = Moment(phase, e[1], total, {k: v for k, v in by_cat.items() if v.terms})
            (first if step == 0 else steady).append(m)
    return replay(steady), replay(first)
