"""memcalc.queries.grid_cells against brute force on random moment sets (any polynomials, signs and
live-storage sizes), and its cell partition."""
import numpy as np
from hypothesis import assume, given, strategies as st

from memcalc.engine.codegen import MomentSet
from memcalc.queries.grid_cells import CellEvaluator, cell_of, cell_range
from memcalc.core.poly import Poly
from memcalc.tape.moment import Moment

import tests.strategies  # noqa: F401 (the shared hypothesis profiles: quick/long, no deadline)

MONOS = [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (2, 0), (0, 2)]
polys = st.dictionaries(st.sampled_from(MONOS), st.integers(-2 ** 20, 2 ** 20), max_size=4).map(Poly)
sizes = st.dictionaries(st.sampled_from(MONOS), st.integers(1, 4096), min_size=1, max_size=3).map(Poly)
moments = st.builds(lambda total, live: Moment("forward", "", total, {}, tuple(live)),
                    polys, st.lists(st.tuples(sizes, st.integers(1, 40)), max_size=4))


@given(st.lists(moments, min_size=1, max_size=12), st.integers(0, 2 ** 32 - 1), st.sampled_from([1, 64, 512]))
def test_cell_evaluator_is_exact(found, seed, g):
    ms = MomentSet(found, g)
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 2 ** rng.integers(1, 12), 300)
    s = rng.integers(1, 2 ** rng.integers(1, 14), 300)
    ev = CellEvaluator(np, ms, g)
    assume(ev.fits_int64(int(b.max()), int(s.max())))  # else estimate_grid takes Python ints
    got = ev.peaks(b, s)
    assert got.tolist() == [max(ms.rounded_totals(int(x), int(y))) for x, y in zip(b, s)]
    again = ev.peaks(b[::-1].copy(), s[::-1].copy())  # the cells learned, in another order
    assert again.tolist() == got[::-1].tolist()


@given(st.integers(1, 2 ** 40))
def test_cells_partition_the_integers(v):
    arr = np.array([v])
    lo, hi = cell_range(np, cell_of(np, arr))
    assert lo[0] <= v <= hi[0] and 8 * (hi[0] - lo[0] + 1) <= max(v, 8)  # 8 cells an octave
    assert cell_of(np, lo)[0] == cell_of(np, hi)[0] == cell_of(np, arr)[0]
    if lo[0] > 1:
        assert cell_of(np, lo - 1)[0] < cell_of(np, arr)[0]
    assert cell_of(np, hi + 1)[0] > cell_of(np, arr)[0]


def test_beyond_int64_is_refused():
    ms = MomentSet([Moment("forward", "", Poly({(2, 2): 2 ** 30}), {}, ((Poly.bs(3), 1),))], 512)
    assert not CellEvaluator(np, ms, 512).fits_int64(2 ** 20, 2 ** 20)
