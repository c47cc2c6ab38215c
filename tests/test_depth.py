"""Depth as a symbol (memcalc.depth): a stack derived from 3, 4 and 5 repeats of its layers gives
the same numbers as simulating every layer (engine.simulated), for every program, precision,
checkpointing mode and parallel layout; programs whose layers do not repeat as declared fall back
to the simulation; the formula in L evaluates to the simulated peak."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import cases

from memcalc import engine
from memcalc.depth import N3, layout, supported
from memcalc.errors import NotModelledError
from memcalc.estimate import estimate
from memcalc.programs import PROGRAMS
from memcalc.regime import Regime
from memcalc.specs import ModelSpec
from memcalc.symbols import L, b, s
from memcalc.tape.graph import Grad
from memcalc.training import TrainingConfig


def _report(r) -> dict:
    return {"peak": r.peak_bytes, "phase": r.peak_phase, "phases": r.phases, "first": r.first_step_peak_bytes,
            "ranks": list(r.rank_peak_bytes), "components": r.components, "moment": r.moment}


def _derived_depth(draw, model: ModelSpec, training: TrainingConfig) -> int:
    """A depth past N3 units of the layout (so that memcalc.depth serves it), a few units more
    and a short last segment at random."""
    if training.checkpointing == "sqrt":
        return draw(st.sampled_from([36, 40, 42, 45, 48, 56]))  # segments of 6-7, 6+ of them
    unit = layout(model, Regime.of(training)).unit
    return (N3 + 1 + draw(st.integers(0, 3))) * unit + draw(st.integers(0, unit - 1))


def _compare(model: ModelSpec, training: TrainingConfig, shapes: list[tuple[int, int]]) -> None:
    engine._CACHE.clear()
    with engine.forcing_derivation():  # not simulated directly where that would be cheaper
        derived = engine.candidates(model, training)  # memcalc.depth serves it where the layers
    # repeat and the optimizer phase is derived (depth.supported), else the simulation does
    direct = engine.simulated(model, training)
    assert derived.param_shapes == direct.param_shapes
    key = (model, engine._regime_key(training))
    for bv, sv in shapes:
        t = training.with_(micro_batch=bv, seq_len=sv)
        engine._CACHE[key] = derived
        mine = _report(estimate(model, t))
        engine._CACHE[key] = direct
        assert mine == _report(estimate(model, t)), (bv, sv)


@st.composite
def deep_cases(draw, parallel: bool = True):
    model, training = draw(cases(max_layers=1, parallel=parallel))
    return model.with_(num_layers=_derived_depth(draw, model, training)), training


@settings(max_examples=8)
@given(deep_cases(), st.lists(st.tuples(st.integers(1, 8), st.integers(1, 128)), min_size=1, max_size=3))
def test_derived_depth_equals_simulation(case, shapes):
    model, training = case
    _compare(model, training, shapes)


@pytest.mark.slow
@settings(max_examples=150)
@given(deep_cases(), st.lists(st.tuples(st.integers(1, 64), st.integers(1, 512)), min_size=1, max_size=4))
def test_derived_depth_equals_simulation_long(case, shapes):
    model, training = case
    _compare(model, training, shapes)


@settings(max_examples=4)  # sympy.Max over the candidates is slow to build
@given(deep_cases(parallel=False), st.integers(1, 8), st.integers(1, 128))
def test_formula_in_depth_is_the_simulated_peak(case, bv, sv):
    """expr, evaluated at another depth of the same layout, is that depth's simulated peak
    (unrounded: device cpu)."""
    model, training = case
    training = training.with_(device="cpu", micro_batch=bv, seq_len=sv)
    assume(supported(Regime.of(training), model) and not model.no_rope_layers)  # steps memcalc.depth derives
    expr = estimate(model, training).expr
    assert L in expr.free_symbols
    unit = layout(model, Regime.of(training)).unit
    other = model.with_(num_layers=model.num_layers + unit)
    if training.checkpointing == "sqrt" and layout(other, Regime.of(training)).unit != unit:
        other = model  # the segment size moved: the formula holds for this depth's segments
    peak = max(engine.simulated(other, training).steady_set.totals(bv, sv))
    assert int(expr.xreplace({b: bv, s: sv, L: other.num_layers})) == peak


@pytest.mark.parametrize("family,impl", [("gpt2", "hf"), ("gpt2", "reference"), ("llama", "hf"),
                                         ("llama", "reference")])
def test_repeating_programs_are_derived(family, impl):
    model = ModelSpec.make(family=family, implementation=impl, vocab_size=100, hidden_size=32, num_layers=9,
                           num_heads=2, max_position_embeddings=64,
                           **({"intermediate_size": 64} if family == "llama" else {}))
    for mode in ("none", "per-layer", "selective"):
        engine._CACHE.clear()
        assert engine.candidates(model, TrainingConfig(micro_batch=1, seq_len=8, checkpointing=mode)).depth


def test_activation_formula_is_linear_in_depth_without_checkpointing():
    t = TrainingConfig(micro_batch=1, seq_len=1024, precision="bf16-amp")
    r = estimate(ModelSpec.preset("gpt2"), t)
    form = r.formula("activations")
    assert form.free_symbols == {b, s, L}
    grow = [int(form.xreplace({b: 1, s: 1024, L: n})) for n in (20, 40, 60)]
    assert grow[2] - grow[1] == grow[1] - grow[0] > 0


class _Alternating(type(PROGRAMS["reference", "gpt2"])):
    """Reference GPT-2 with one more saved op in every odd layer: the layers repeat every 2."""

    period = 1

    def block(self, ops, spec, regime, x, layer, context):
        x = super().block(ops, spec, regime, x, layer, context)
        if layer % 2:
            x = ops.g.op("extra", [x], x.size, saves=[x], backward=[Grad(0)])
        return x

    def layer_period(self, _spec):
        return self.period


@pytest.mark.parametrize("period", [1, 2])
def test_layers_that_do_not_repeat_fall_back(monkeypatch, period):
    """Declared period 1 for an alternating stack: the check at 5 repeats fails and the engine
    simulates every layer; declared 2: derived. Both give the simulation's numbers."""
    program = _Alternating()
    program.period = period
    monkeypatch.setitem(PROGRAMS, ("reference", "gpt2"), program)
    model = ModelSpec.make(family="gpt2", implementation="reference", vocab_size=100, hidden_size=32,
                           num_layers=17, num_heads=2, max_position_embeddings=64)
    t = TrainingConfig(micro_batch=2, seq_len=16, device="cuda")
    engine._CACHE.clear()
    derived = engine.candidates(model, t)
    assert (derived.depth is not None) == (period == 2)
    direct = engine.simulated(model, t)
    assert max(derived.steady_set.rounded_totals(2, 16)) == max(direct.steady_set.rounded_totals(2, 16))
    assert max(derived.first_set.rounded_totals(3, 9)) == max(direct.first_set.rounded_totals(3, 9))
    engine._CACHE.clear()
    if period == 1:  # too deep to simulate layer by layer: refused by name
        with pytest.raises(NotModelledError, match="num_layers"):
            engine.candidates(model.with_(num_layers=200), t)


def test_a_thousand_layers():
    t = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16-amp", checkpointing="per-layer")
    model = ModelSpec.preset("llama-2-7b")
    r32, r1000 = estimate(model, t), estimate(model.with_(num_layers=1000), t)
    per_layer = (estimate(model.with_(num_layers=33), t).peak_bytes - r32.peak_bytes)
    assert r1000.peak_bytes == r32.peak_bytes + (1000 - 32) * per_layer


def _small_llama(layers: int) -> ModelSpec:
    return ModelSpec.make(family="llama", implementation="hf", vocab_size=100, hidden_size=32, num_layers=layers,
                          num_heads=2, intermediate_size=64, max_position_embeddings=64)


def test_a_stack_simulated_because_cheaper_keeps_its_depth_form():
    """'sqrt' at 36 layers: 6-layer segments, 72 layers to derive, so the engine simulates the
    36 directly (engine._direct_pays); the depth form, derived when read, is the one the
    forced derivation gives, and so are the numbers."""
    model, t = _small_llama(36), TrainingConfig(micro_batch=2, seq_len=16, checkpointing="sqrt")
    engine._CACHE.clear()
    direct = engine.candidates(model, t)
    assert direct._pending is not None  # not derived yet
    lazy = direct.depth
    engine._CACHE.clear()
    with engine.forcing_derivation():
        derived = engine.candidates(model, t)
    def terms(form):
        return [(v.terms, d.terms) for v, d in form.terms()]

    assert lazy is not None and terms(lazy) == terms(derived.depth)
    for name in ("steady_set", "first_set"):
        assert max(getattr(direct, name).rounded_totals(3, 9)) == max(getattr(derived, name).rounded_totals(3, 9))


def test_ddp_and_zero1_share_one_derivation_across_rank_counts():
    """A derivation made at 5 ranks serves 3 (engine._shared_layout); every rank's numbers are
    those of simulating every layer at 3 ranks."""
    model = _small_llama(16)  # 12 layers to derive: derived, not simulated
    for sharding in ("none", "zero1"):
        engine._CACHE.clear()
        t5, t3 = (TrainingConfig(micro_batch=2, seq_len=16, world_size=w, sharding=sharding) for w in (5, 3))
        engine.candidates(model, t5)
        derivations = sum(1 for k in engine._CACHE if k[0] == "depth")
        shared = engine.candidates(model, t3)
        assert sum(1 for k in engine._CACHE if k[0] == "depth") == derivations == 1
        key = (model, engine._regime_key(t3))
        mine = _report(estimate(model, t3))
        engine._CACHE.clear()
        engine._CACHE[key] = engine.simulated(model, t3)
        assert mine == _report(estimate(model, t3)) and shared.regime.data_parallel == 3


def test_every_depth_of_a_layout_shares_one_derivation():
    """16 and 20 layers (unit 1, no rest): one derivation (engine._shared_layout), and each
    depth's numbers are those of simulating every layer."""
    t = TrainingConfig(micro_batch=2, seq_len=16, checkpointing="per-layer")
    engine._CACHE.clear()
    derived = [engine.candidates(_small_llama(n), t) for n in (16, 20)]
    assert sum(1 for k in engine._CACHE if k[0] == "depth") == 1
    for n, c in zip((16, 20), derived):
        direct = engine.simulated(_small_llama(n), t)
        assert max(c.steady_set.rounded_totals(3, 9)) == max(direct.steady_set.rounded_totals(3, 9))
