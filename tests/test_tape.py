"""The simulator's building blocks against second methods: Poly against sympy, candidate pruning
against the unpruned maximum, the fast evaluator against Poly.eval."""
import tests.strategies  # noqa: F401  (registers the hypothesis profiles)
from hypothesis import given, strategies as st

from memcalc.queries.estimate import MomentSet
from memcalc.core.poly import Poly
from memcalc.core.symbols import b, s
from memcalc.tape.moment import Moment, prune_convex_moments

MONOMIALS = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
polys = st.dictionaries(st.sampled_from(MONOMIALS), st.integers(0, 10**6), max_size=6).map(Poly)
shapes = st.tuples(st.integers(1, 64), st.integers(1, 4096))


@given(polys, polys, shapes)
def test_poly_arithmetic_matches_sympy(p, q, shape):
    bv, sv = shape
    expr = (p + q * 3 - p).to_sympy(b, s)
    assert int(expr.subs({b: bv, s: sv})) == (p + q * 3 - p).eval(bv, sv)


@given(polys, polys, shapes)
def test_dominance_is_sound(p, q, shape):
    if p.dominates(q):
        assert p.eval(*shape) >= q.eval(*shape)


@given(st.lists(polys, min_size=1, max_size=12), st.lists(shapes, min_size=1, max_size=5))
def test_pruning_keeps_the_maximum(totals, points):
    moments = [Moment("p", str(i), t, {}) for i, t in enumerate(totals)]
    kept = prune_convex_moments(moments)
    assert kept
    for bv, sv in points:
        assert max(m.total.eval(bv, sv) for m in kept) == max(t.eval(bv, sv) for t in totals)


@given(st.lists(polys, min_size=1, max_size=8), shapes)
def test_fast_evaluator_matches_poly_eval(totals, shape):
    moments = [Moment("forward", "", t, {}) for t in totals]
    assert MomentSet(moments).totals(*shape) == [t.eval(*shape) for t in totals]


def _small_gpt2():
    from memcalc import ModelSpec

    return ModelSpec.preset("gpt2").with_(num_layers=2, hidden_size=128, num_heads=4, vocab_size=1000)


def test_symbolic_peak_is_the_peak_at_every_shape():
    """The sympy Max built at one shape, evaluated at others, equals a fresh simulation there."""
    from memcalc import TrainingConfig, estimate

    model, t = _small_gpt2(), TrainingConfig(micro_batch=3, seq_len=700, device="cpu")
    expr = estimate(model, t).expr
    assert expr.free_symbols == {b, s}
    for bv, sv in [(3, 700), (1, 1), (8, 64), (2, 1024)]:
        peak = estimate(model, t.with_(micro_batch=bv, seq_len=sv)).peak_bytes
        assert int(expr.xreplace({b: bv, s: sv})) == peak


def test_cuda_rounding_adds_less_than_a_block_per_live_tensor():
    from memcalc import TrainingConfig, estimate
    from memcalc.queries.estimate import candidates

    model, t = _small_gpt2(), TrainingConfig(micro_batch=3, seq_len=700)
    r = estimate(model, t)
    component = r.components.get("allocator_rounding", 0)
    # the unrounded maximum (expr) is at most the unrounded total of the rounded peak's moment
    rounding = r.peak_bytes - int(r.expr.xreplace({b: 3, s: 700}))
    assert 0 < component and 0 <= rounding <= component
    # each tensor adds less than one 512-byte block; count the tensors alive at the peak as
    # the parameters, their gradients and AdamW's two states, plus every activation there could be
    tensors = 4 * len(candidates(model, t).param_shapes) + 200
    assert component < 512 * tensors
