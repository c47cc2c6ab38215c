"""The peak frontier (memcalc.tape.frontier) in every variant its callers use, against pairwise
references written here without the shortcuts: Frontier in step order (Memory.mark, replay) and
largest first (kept_largest_first, memcalc.engine.depth), on tuples of ints and of Fractions, and
kept_packed on the packed totals of record mode (memcalc.tape.record.lifted), at pruning
thresholds that make the convex pruning run often, once, or never."""
from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc.core.poly import Poly
from memcalc.tape.frontier import PRUNE_AT, Frontier, below_mix, kept_largest_first, kept_packed, prune_convex
from memcalc.tape.graph import Storage
from memcalc.tape.ledger import Memory
from memcalc.tape.moment import Moment, prune_convex_moments, replay
from memcalc.tape.record import TOTAL_SLOT, lifted, unpack_dense


# ---- the references ----------------------------------------------------------------------------
def _at_least(u: tuple, v: tuple) -> bool:
    return all(a >= b for a, b in zip(u, v))


def _below_mix_exact(v: tuple, x: tuple, y: tuple) -> bool:
    """Whether some lam in [0, 1] has v <= lam*x + (1-lam)*y in every coefficient, in Fractions:
    each coefficient bounds lam from one side (or not at all), and the bounds must meet."""
    lo, hi = Fraction(0), Fraction(1)
    for c, a, b in zip(v, x, y):
        slope, need = Fraction(a) - b, Fraction(c) - b  # lam * slope >= need
        if slope > 0:
            lo = max(lo, need / slope)
        elif slope < 0:
            hi = min(hi, need / slope)
        elif need > 0:
            return False
    return lo <= hi


def _prune_pairwise(vecs: list[tuple], items: list) -> list:
    """The convex pruning as defined: each item in turn dropped when under a mix of some pair of
    the others left (every pair tried)."""
    kept = list(range(len(vecs)))
    i = 0
    while i < len(kept):
        others = kept[:i] + kept[i + 1:]
        if any(_below_mix_exact(vecs[kept[i]], vecs[a], vecs[b]) for n, a in enumerate(others) for b in others[n + 1:]):
            kept.pop(i)
        else:
            i += 1
    return [items[j] for j in kept]


def _frontier_reference(vecs: list[tuple], phases: list, order: list[int], prune_at: int) -> dict:
    """{phase: kept indices}: offered in `order`, a total under a kept one (pairwise) is not
    kept; else the kept ones under it go and it joins; at prune_at kept, _prune_pairwise."""
    out: dict = {}
    for i in order:
        kept = out.setdefault(phases[i], [])
        if any(_at_least(vecs[j], vecs[i]) for j in kept):
            continue
        kept[:] = [j for j in kept if not _at_least(vecs[i], vecs[j])] + [i]
        if len(kept) >= prune_at:
            kept[:] = _prune_pairwise([vecs[j] for j in kept], kept)
    return out


def _maximal(vecs: list[tuple], phases: list, order: list[int]) -> set[int]:
    """Without the convex pruning, the frontier is the totals no other of their phase is at least
    (strictly, or equal and offered earlier): O(n^2) over every pair."""
    rank = {i: n for n, i in enumerate(order)}
    return {i for i in order if not any(
        j != i and phases[j] == phases[i] and _at_least(vecs[j], vecs[i])
        and (vecs[j] != vecs[i] or rank[j] < rank[i]) for j in order)}


def _largest_first(vecs: list[tuple]) -> list[int]:
    return sorted(range(len(vecs)), key=lambda i: -sum(vecs[i]))


# ---- the data ----------------------------------------------------------------------------------
def _vectors(k: int, coefficients: st.SearchStrategy) -> st.SearchStrategy:
    trading = st.builds(lambda a, e, f, g: (a, 40 - a + e, f, g)[:k], st.integers(0, 40), st.integers(-3, 3),
                        st.integers(0, 3), st.integers(0, 2))  # few dominate: the convex pruning works
    return st.lists(st.one_of(trading, st.tuples(*[coefficients] * k)), min_size=0, max_size=60)


_ints = st.integers(-3, 12)
_fractions = st.one_of(_ints, st.fractions(Fraction(-3), Fraction(12), max_denominator=4))
_cases = st.integers(2, 4).flatmap(lambda k: st.tuples(_vectors(k, _ints), st.sampled_from([3, 5, PRUNE_AT, 10 ** 6]),
                                                       st.lists(st.sampled_from("ab"), min_size=60, max_size=60)))
_fraction_cases = st.integers(2, 4).flatmap(lambda k: st.tuples(_vectors(k, _fractions),
                                                                st.sampled_from([3, PRUNE_AT])))


def _offer_all(vecs: list[tuple], phases: list, order: list[int], prune_at: int) -> dict:
    frontiers: dict = {}
    for i in order:
        f = frontiers.setdefault(phases[i], Frontier(prune_at))
        if f.offer(vecs[i], sum(vecs[i])):
            f.add(vecs[i], sum(vecs[i]), i)
    return {p: f.items for p, f in frontiers.items()}


# ---- the tests ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.tuples(*[st.tuples(*[_fractions] * k)] * 3)))
def test_below_mix_is_the_exact_test(vs):
    """below_mix (floats for ints, exact for Fractions) answers as the Fraction reference."""
    assert below_mix(*vs) == _below_mix_exact(*vs)


@settings(max_examples=200, deadline=None)
@given(_cases)
def test_frontier_in_step_order_is_the_pairwise_reference(case):
    """Frontier offered totals in step order (Memory.mark, replay), its shortcuts (the hint, the
    sums, one coefficient first, pruning that skips the pairs a pruning left) and all, keeps
    what the pairwise reference keeps, in the same order; without pruning, the maximal totals."""
    vecs, prune_at, phases = case
    order = list(range(len(vecs)))
    assert _offer_all(vecs, phases, order, prune_at) == _frontier_reference(vecs, phases, order, prune_at)
    if prune_at > len(vecs):
        assert {i for kept in _offer_all(vecs, phases, order, prune_at).values() for i in kept} == \
            _maximal(vecs, phases, order)


@settings(max_examples=100, deadline=None)
@given(_fraction_cases)
def test_frontier_on_fractions_is_the_pairwise_reference(case):
    """The same on Fraction coefficients (sequence parallelism's b*s/t sizes), in step order and
    largest first (memcalc.engine.depth's tuples when its totals are not packed)."""
    vecs, prune_at = case
    phases, order = ["p"] * len(vecs), list(range(len(vecs)))
    assert _offer_all(vecs, phases, order, prune_at) == _frontier_reference(vecs, phases, order, prune_at)
    expected = _frontier_reference(vecs, phases, _largest_first(vecs), prune_at).get("p", [])
    assert kept_largest_first(vecs, phases, prune_at) == set(expected)


@settings(max_examples=200, deadline=None)
@given(_cases)
def test_largest_first_and_packed_are_the_pairwise_reference(case):
    """kept_largest_first (memcalc.engine.depth on tuples) and kept_packed on record mode's packed
    totals (lifted: each total as its coefficients at N1 units and per unit, k monomials each)
    keep what the pairwise reference keeps offered largest first."""
    vecs, prune_at, phases = case
    vecs = [v + v for v in vecs]  # (base, per unit): 2k coefficients over k monomials
    order = _largest_first(vecs)
    expected = {i for kept in _frontier_reference(vecs, phases, order, prune_at).values() for i in kept}
    assert kept_largest_first(vecs, phases, prune_at) == expected
    k = len(vecs[0]) // 2 if vecs else 1
    totals = []
    for v in vecs:
        t1 = sum(c << (TOTAL_SLOT * n) for n, c in enumerate(v[:k]))
        totals.append((t1, t1 + sum(c << (TOTAL_SLOT * n) for n, c in enumerate(v[k:]))))
    assert [unpack_dense(t1, k) + unpack_dense(t2 - t1, k) for t1, t2 in totals] == vecs
    packed = lifted(totals, k)
    assert packed is not None
    assert kept_packed(*packed, vecs.__getitem__, phases, prune_at) == expected
    if prune_at > len(vecs):
        assert expected == _maximal(vecs, phases, order)


@settings(max_examples=150, deadline=None)
@given(_cases, st.integers(0, 60))
def test_prune_convex_with_settled_is_the_pairwise_pruning(case, cut):
    """prune_convex keeps what the pairwise pruning keeps, also when told that a prefix is what
    an earlier pruning left (`settled`: only pairs with a later total tested for those)."""
    vecs, _, _ = case
    assert prune_convex(vecs) == _prune_pairwise(vecs, list(range(len(vecs))))
    first = [vecs[i] for i in prune_convex(vecs[:cut])]
    both = first + vecs[cut:]
    assert prune_convex(both, len(first)) == _prune_pairwise(both, list(range(len(both))))


@settings(max_examples=150, deadline=None)
@given(_cases, st.integers(1, 60), st.lists(st.lists(st.integers(0, 50), min_size=4, max_size=4), max_size=5))
def test_memory_mark_and_replay_keep_the_pairwise_reference(case, switch, points):
    """Memory.mark (the ledger, one storage of each total held at a time) and replay (Moments)
    keep the pairwise reference's moments, phase by phase; and nothing dropped is above every kept
    moment at any point with monomials >= 0 (a mix is at most the larger of its two)."""
    vecs, _, _ = case
    monos = [(0, 0), (1, 1), (1, 2), (2, 2)]
    totals = [Poly(dict(zip(monos, v))) for v in vecs]
    phases = ["forward" if i < switch else "backward" for i in range(len(vecs))]
    mem, held = Memory(), None
    for i, total in enumerate(totals):
        storage = Storage(total, "activations", str(i))
        mem.hold(storage)
        if held is not None:
            mem.release(held)
        held, mem.phase = storage, phases[i]
        mem.mark(str(i))
    order = list(range(len(vecs)))
    reference = _frontier_reference(vecs, phases, order, PRUNE_AT)
    expected = [(p, str(i)) for p, kept in reference.items() for i in kept]
    assert [(m.phase, m.label) for m in mem.moments] == expected
    moments = [Moment(p, str(i), t, {}) for i, (p, t) in enumerate(zip(phases, totals))]
    assert [(m.phase, m.label) for m in replay(moments)] == expected
    for w in points:
        for phase, kept in reference.items():
            value = [sum(c * x for c, x in zip(vecs[i], w)) for i in order if phases[i] == phase]
            assert max(sum(c * x for c, x in zip(vecs[i], w)) for i in kept) == max(value)


def test_prune_convex_moments_is_prune_convex_on_totals():
    """The Moment form of the pruning reads their totals over the monomials they use."""
    a, b, c = (Moment("p", str(k), Poly({(0, 0): k, (1, 1): 10 - k}), {}) for k in (0, 5, 10))
    assert [m.label for m in prune_convex_moments([a, b, c])] == ["0", "10"]
