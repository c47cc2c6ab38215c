"""The cold path's shortcuts give what they replace (memcalc.tape.step.simulate_both against two
simulate_step walks; prune_convex_dense against the pairwise _below_mix test), for every program,
precision, optimizer, checkpointing mode and parallel layout."""
from __future__ import annotations

from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import cases

from memcalc.engine.core import _regime
from memcalc.core.poly import Poly
from memcalc.engine.simulation import run_step, run_steps
from memcalc.tape.graph import Storage
from memcalc.tape.simulate import Memory, Moment, _below_mix, prune_convex, prune_convex_dense, replay


def _sizes(m: Moment) -> Counter:
    out: Counter = Counter()
    for p, n in m.sizes:
        out[tuple(sorted(p.terms.items()))] += n
    return out


def _steady(m: Moment) -> tuple:
    return (m.phase, m.label, m.total.terms, [(c, p.terms) for c, p in m.by_category.items()], _sizes(m))


def _first(m: Moment) -> tuple:  # the first step's categories are not read (memcalc.estimate)
    return (m.phase, m.label, m.total.terms, _sizes(m))


@settings(max_examples=25, deadline=None)
@given(cases(max_layers=3, parallel=True))
def test_one_walk_gives_both_steps(case):
    """run_steps (one walk through forward and backward) gives the steady and the first step
    that two run_step walks give: every kept moment, its total, categories and live sizes."""
    model, training = case
    regime = _regime(model, training)
    steady, first = run_steps(model, regime)
    assert [_steady(m) for m in steady.moments] == [_steady(m) for m in run_step(model, regime, False).moments]
    assert [_first(m) for m in first.moments] == [_first(m) for m in run_step(model, regime, True).moments]


def _prune_pairwise(moments: list[Moment]) -> list[Moment]:
    """prune_convex as it was: _below_mix over every pair of the others."""
    kept = list(moments)
    i = 0
    while i < len(kept):
        others = kept[:i] + kept[i + 1:]
        if any(_below_mix(kept[i].total, x.total, y.total) for j, x in enumerate(others) for y in others[j + 1:]):
            kept.pop(i)
        else:
            i += 1
    return kept


_coefficient = st.one_of(st.integers(-3, 12), st.fractions(Fraction(-3), Fraction(12), max_denominator=4))
_polys = st.dictionaries(st.sampled_from([(0, 0), (1, 1), (1, 2), (2, 2)]), _coefficient, max_size=4).map(Poly)


@settings(max_examples=200, deadline=None)
@given(st.lists(_polys, max_size=30))
def test_dense_pruning_is_the_pairwise_test(totals):
    """prune_convex (dense tuples, pairs that cannot cover a moment skipped) keeps exactly what
    the pairwise _below_mix test keeps; replay's dominance on tuples is Poly.dominates."""
    moments = [Moment("forward" if i % 3 else "backward", str(i), t, {}) for i, t in enumerate(totals)]
    assert prune_convex(moments) == _prune_pairwise(moments)
    monos = sorted({mono for t in totals for mono in t.terms})
    vecs = [tuple(t.terms.get(mono, 0) for mono in monos) for t in totals]
    assert [moments[i] for i in prune_convex_dense(vecs)] == _prune_pairwise(moments)
    frontiers: dict = {}
    for m in moments:  # replay as it was: keep() on Polys, then the pairwise pruning
        frontier = frontiers.setdefault(m.phase, [])
        if not any(k.total.dominates(m.total) for k in frontier):
            frontier[:] = [k for k in frontier if not m.total.dominates(k.total)] + [m]
            if len(frontier) >= 24:
                frontier[:] = _prune_pairwise(frontier)
    assert replay(moments) == [m for kept in frontiers.values() for m in kept]


def _trading(a: int, e: int, f: int, g: int) -> Poly:
    """A total trading one coefficient for another (backward: gradients for activations), so
    that few dominate others and the convex pruning runs again and again."""
    return Poly({(0, 0): a, (1, 1): 40 - a + e, (1, 2): f, (2, 2): g})


_trades = st.builds(_trading, st.integers(0, 40), st.integers(-3, 3), st.integers(0, 3), st.integers(0, 2))
_int_polys = st.dictionaries(st.sampled_from([(0, 0), (1, 1), (1, 2), (2, 2)]), st.integers(-3, 12),
                             max_size=4).map(Poly)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_trades, _int_polys), min_size=40, max_size=120), st.integers(1, 80))
def test_memory_keeps_what_the_pairwise_test_keeps(totals, switch):
    """Memory.mark (its sum and one-coefficient pre-tests, the hint, convex pruning that skips
    the pairs of totals a pruning left and tries the pairs next to a total first) keeps the
    moments that keep() and the pairwise pruning keep, phase by phase. (Int coefficients: once
    a storage of a fractional size was held, Memory's coefficients stay Fractions, whose mixes
    _below_mix_dense tests exactly rather than in floats.)"""
    mem, held = Memory(), None
    frontiers: dict = {}
    for i, total in enumerate(totals):
        phase = "forward" if i < switch else "backward"
        st = Storage(total, "activations", str(i))
        mem.hold(st)  # the instant's total is this storage alone
        if held is not None:
            mem.release(held)
        held, mem.phase = st, phase
        mem.mark(str(i))
        frontier = frontiers.setdefault(phase, [])
        m = Moment(phase, str(i), total, {})
        if not any(k.total.dominates(total) for k in frontier):
            frontier[:] = [k for k in frontier if not total.dominates(k.total)] + [m]
            if len(frontier) >= Memory.PRUNE_AT:
                frontier[:] = _prune_pairwise(frontier)
    expected = [(m.phase, m.label, m.total.terms) for kept in frontiers.values() for m in kept]
    assert [(m.phase, m.label, m.total.terms) for m in mem.moments] == expected
    replayed = replay([Moment("forward" if i < switch else "backward", str(i), t, {}) for i, t in enumerate(totals)])
    assert [(m.phase, m.label, m.total.terms) for m in replayed] == expected
