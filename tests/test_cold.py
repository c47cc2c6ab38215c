"""The cold path's shortcut gives what it replaces (memcalc.tape.step.simulate_both against two
simulate_step walks), for every program, precision, optimizer, checkpointing mode and parallel
layout. (The frontier's shortcuts: tests/test_frontier.py.)"""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from strategies import cases

from memcalc.engine.run import regime_for
from memcalc.engine.simulation import run_step, run_steps
from memcalc.tape.moment import Moment


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
    regime = regime_for(model, training)
    steady, first = run_steps(model, regime)
    assert [_steady(m) for m in steady.moments] == [_steady(m) for m in run_step(model, regime, False).moments]
    assert [_first(m) for m in first.moments] == [_first(m) for m in run_step(model, regime, True).moments]
