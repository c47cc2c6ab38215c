"""The engine's orchestration: a model's program (memcalc.families) walked through one training
step (memcalc.tape) into the candidate moments that can set the peak, checked first
(memcalc.refusals.step), derived from a few small depths where the stack repeats and that pays
(memcalc.engine.depth), else simulated, and cached (memcalc.engine.cache).

Every size is a polynomial in b (micro_batch) and s (seq_len), so one simulation of a
(model, regime) serves every shape; memcalc.queries read the candidates.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from operator import attrgetter
from typing import Iterator

from memcalc.core.errors import NotModelledError
from memcalc.core.limits import MAX_SIMULATED_LAYERS
from memcalc.core.gc_pause import gc_paused
from memcalc.engine.cache import CACHE, cached_derivation, has_derivation
from memcalc.engine.candidates import Candidates, DepthForm
from memcalc.engine.derivation import Derivation
from memcalc.engine.layout import N1, N2, N3, Layout, layout, supported
from memcalc.engine.regime import Regime
from memcalc.engine.simulation import run_steps
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.refusals.step import check_step, check_supported
from memcalc.tape.moment import replay

_SHAPE_FIELDS = ("micro_batch", "seq_len")
regime_key = attrgetter(*(f for f in TrainingConfig.model_fields if f not in _SHAPE_FIELDS))


def candidates(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The simulated candidate moments of (model, training), checked first (memcalc.refusals.step); the
    shape fields micro_batch and seq_len are free symbols, so one simulation serves every shape.

    >>> c = candidates(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> {m.phase for m in c.steady} == {"forward", "backward", "optimizer"}
    True
    """
    traced = getattr(model, "traced_candidates", None)
    if traced is not None:  # a program traced from the user's nn.Module (memcalc.traced)
        return traced(training)
    if getattr(training, "trl", "none") == "dpo" or getattr(training, "disable_dropout", False):
        # DPOTrainer's disable_dropout=True (GRPOTrainer's when set): every p = 0
        from memcalc.families.trl_dpo import without_dropout

        model = without_dropout(model)
    try:
        key = cache_key(model, training)
        found = CACHE.get(key)
    except (AttributeError, TypeError):  # not a TrainingConfig, or an unhashable model
        found = None
    if found is None:
        check_step(model, training)  # types, ceilings, runnable (memcalc.refusals.step)
        check_supported(model, training)
        if len(CACHE) > 512:
            CACHE.clear()
        with gc_paused():
            found = CACHE[key] = _simulate(model, regime_for(model, training))
    return found


def cache_key(model: ModelSpec, training: TrainingConfig) -> tuple:
    """The key of (model, training)'s candidates in memcalc.engine.cache.CACHE: every field but the
    shape's, and the shape conditions a program branches on.

    >>> t = TrainingConfig(micro_batch=1, seq_len=8)
    >>> cache_key(ModelSpec.preset("gpt2"), t) == cache_key(ModelSpec.preset("gpt2"), t.with_(seq_len=64))
    True
    >>> cache_key(ModelSpec.preset("gpt2"), t.with_(grad_accum=2)) == cache_key(ModelSpec.preset("gpt2"),
    ...                                                                         t.with_(grad_accum=64))
    True
    """
    if training.grad_accum > 2 and not training.hf_trainer:
        # micro-steps >= 2 are alike (memcalc.tape.step); only the HF Trainer's held batches
        # (memcalc.families.call_path.held_batches) read the count itself
        training = training.with_(grad_accum=2)
    return (model, regime_key(training), window_reached(model, training.seq_len), single_sequence(training, model),
            fused_rows_capped(training))


def regime_for(model: ModelSpec, training: TrainingConfig) -> Regime:
    """The regime of `training`, with the shape conditions a program branches on.

    >>> t = TrainingConfig(micro_batch=1, seq_len=8192, attention="eager")
    >>> regime_for(ModelSpec.preset("gemma-2-2b"), t).sliding_window_reached
    True
    """
    return replace(Regime.of(training, model), sliding_window_reached=window_reached(model, training.seq_len),
                   single_sequence=single_sequence(training, model),
                   fused_rows_capped=fused_rows_capped(training))


def fused_rows_capped(training: TrainingConfig) -> bool:
    """A TRL step's fused LM head fills whole 4096-row tiles (memcalc.families.trl_dpo.rows_capped).

    >>> fused_rows_capped(TrainingConfig(micro_batch=64, seq_len=4096))  # no TRL: no fused head
    False
    """
    if training.trl == "none":
        return False
    from memcalc.families.trl_dpo import rows_capped

    return rows_capped(training.micro_batch, training.seq_len)


def single_sequence(training: TrainingConfig, model: ModelSpec | None = None) -> bool:
    """micro_batch == 1 under eager attention or SDPA's CPU math kernel (attention dropout on
    CPU: memcalc.families.attention.sdpa_math), whose bmm operands are then views rather than
    copies, and for the HF models, whose shifted labels are then a view
    (memcalc.engine.regime.Regime.single_sequence; loss.hf_causal_lm_loss); elsewhere no program reads
    it, and one simulation serves every batch size.

    >>> single_sequence(TrainingConfig(micro_batch=1, seq_len=8, attention="eager"))
    True
    >>> eager = TrainingConfig(micro_batch=2, seq_len=8, attention="eager")
    >>> single_sequence(eager), single_sequence(TrainingConfig(micro_batch=1, seq_len=8))
    (False, False)
    >>> cpu, gpt2 = TrainingConfig(micro_batch=1, seq_len=8, device="cpu"), ModelSpec.preset("gpt2")
    >>> ref = gpt2.with_(implementation="reference")
    >>> single_sequence(cpu, ref.with_(attn_dropout=0.1)), single_sequence(cpu, ref.with_(attn_dropout=0.0))
    (True, False)
    >>> single_sequence(cpu, gpt2.with_(attn_dropout=0.0))
    True
    """
    math = model is not None and training.device == "cpu" and model.attn_dropout > 0
    hf_loss = model is not None and model.implementation == "hf"  # loss.hf_causal_lm_loss's shift
    eager = (training.attention if model is None else training.resolved_attention(model)) == "eager"
    return training.micro_batch == 1 and (eager or math or hf_loss)


def window_reached(model: ModelSpec, seq_len: int) -> bool:
    """Whether a sequence of seq_len tokens reaches the model's sliding window, the one shape
    condition a program branches on (memcalc.engine.regime.Regime.sliding_window_reached).

    >>> window_reached(ModelSpec.preset("gemma-2-2b"), 4096), window_reached(ModelSpec.preset("gpt2"), 10**6)
    (True, False)
    """
    return model.sliding_window is not None and seq_len >= model.sliding_window


def simulated(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The candidates of simulating every layer of this depth (no memcalc.engine.depth, no cache): what
    the derivation is tested against (a MoE 'worst' routing: every routing's moments, as
    candidates takes them).

    >>> t = TrainingConfig(micro_batch=2, seq_len=64)
    >>> m = ModelSpec.preset("gpt2")
    >>> max(simulated(m, t).steady_set.rounded_totals(2, 64)) == max(candidates(m, t).steady_set.rounded_totals(2, 64))
    True
    """
    check_step(model, training)
    check_supported(model, training)
    regime = regime_for(model, training)
    with gc_paused():
        runs = [run_steps(model, r) for r in routings(model, regime)]
    return Candidates(regime, [m for steady, _ in runs for m in steady.moments],
                      [m for _, first in runs for m in first.moments], runs[0][0].param_shapes, regime.master_elt)


def depth_form(model: ModelSpec, training: TrainingConfig) -> DepthForm | None:
    """How the steady-state peak grows with depth, or None where memcalc.engine.depth does not hold
    (fewer than N1 units, layers that do not repeat).

    >>> depth_form(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8)).layout.units
    12
    """
    c = candidates(model, training)
    if getattr(model, "traced_candidates", None) is not None:
        return None  # a traced program is fitted at its own depth (memcalc.traced)
    if c.depth is None:
        forms = []
        for regime in routings(model, c.regime):  # a MoE 'worst' routing: the union of a few
            lay = layout(model, regime)
            derivation = cached_derivation(model, lay) if lay.units >= N1 and supported(regime, model) else None
            forms.append(None if derivation is None else
                         _checked_form(DepthForm(lay, derivation.at(lay.units)[0]), derivation))
        c.depth = _union(forms)
    return c.depth


def _union(forms: list["DepthForm | None"]) -> "DepthForm | None":
    """One form of several routings' steps (their moments together), if each is derived."""
    if not forms or any(f is None for f in forms):
        return None
    return DepthForm(forms[0].layout, [m for f in forms for m in f.moments])


_FORM_SHAPES = ((1, 1), (3, 4), (2, 64), (8, 512))


def _checked_form(form: DepthForm, derivation: Derivation) -> DepthForm | None:
    """The form, if its terms give the derived peak one and two units deeper at a few shapes
    (every moment and category of those depths is itself verified by memcalc.engine.depth); else None,
    so that MemoryReport.expr stays in b and s rather than show a wrong slope in L. (Found: the
    per-unit slopes of some steps, such as HF GPT-2 selective checkpointing with accumulation,
    miss the moment that peaks deeper.)"""
    units = form.layout.units
    terms = form.terms()
    for extra in (1, 2):
        deeper = derivation.steady_totals(units + extra)  # at(units + extra)'s steady totals
        for b, s in _FORM_SHAPES:
            if max(v.eval(b, s) + extra * d.eval(b, s) for v, d in terms) != max(t.eval(b, s) for t in deeper):
                return None
    return form



def _simulate(model: ModelSpec, regime: Regime) -> Candidates:
    """Every moment of the steady and the first step. A MoE model's 'worst' routing on the eager
    experts path is the largest of several routings (memcalc.inputs.moe_routing.worst_routings), each expert's
    storages counted with their largest rounding: the union of their moments, so that every query
    (peak, grid, capacity) takes their maximum, a bound over every routing."""
    regimes = routings(model, regime)
    if len(regimes) == 1:
        return _simulate_one(model, regime)
    runs = [_simulate_one(model, r) for r in regimes]
    out = Candidates(regime, [m for c in runs for m in c.steady], [m for c in runs for m in c.first],
                     runs[0].param_shapes, regime.master_elt)
    out.depth = _union([c.depth for c in runs])
    return out


def routings(model: ModelSpec, regime: Regime) -> list[Regime]:
    """The regimes whose steps together make this one's: a MoE model's 'worst' routing on the
    eager experts path, one per memcalc.inputs.moe_routing.worst_routings; else the regime itself.

    >>> t = TrainingConfig(micro_batch=1, seq_len=8, experts_implementation="eager")
    >>> [r.moe_routing for r in routings(ModelSpec.preset("mixtral-8x7b"), Regime.of(t))][:2]
    [('worst', 0), ('worst', 1)]
    """
    if not (model.moe is not None and regime.experts_implementation == "eager" and regime.moe_routing == "worst"):
        return [regime]
    from memcalc.inputs.moe_routing import worst_routings

    count = len(worst_routings(model.moe.num_experts, model.moe.top_k))
    return [replace(regime, moe_routing=("worst", i)) for i in range(count)]


def _simulate_one(model: ModelSpec, regime: Regime) -> Candidates:
    """The candidates from memcalc.engine.depth when the stack is deep enough for it to pay (derived
    once per layout and reused at every depth), else from simulating this depth."""
    lay = layout(model, regime)
    derivable = lay.units > N3 and supported(regime, model)
    if derivable and not _direct_pays(model, lay):
        derivation = cached_derivation(model, lay)
        if derivation is not None:
            steady, first, shapes = derivation.at(lay.units)
            out = Candidates(regime, replay(steady), replay(first), shapes, regime.master_elt)
            out._pending = lambda: _checked_form(DepthForm(lay, steady), derivation)
            return out
        derivable = False  # the layers do not repeat: simulate them (or refuse) below
    if model.num_layers > MAX_SIMULATED_LAYERS:
        raise NotModelledError("num_layers", f"{model.num_layers:,} layers that memcalc.engine.depth cannot "
                               f"derive from a few (they do not repeat with layer_period {lay.unit} "
                               "here) would be simulated one by one",
                               f"use num_layers <= {MAX_SIMULATED_LAYERS} (memcalc.core.limits)")
    steady, first = run_steps(model, regime)
    out = Candidates(regime, steady.moments, first.moments, steady.param_shapes, regime.master_elt)
    if derivable:  # simulated directly because that is cheaper: the depth form when first read
        out._pending = lambda: _lazy_form(model, lay)
    return out


_FORCE_DERIVATION = False
"""True: memcalc.engine.depth serves every stack it supports, however short (tests/test_depth.py checks
the derivation against the simulation at depths where simulating directly would be cheaper)."""


@contextmanager
def forcing_derivation() -> Iterator[None]:
    """Candidates derived (memcalc.engine.depth) wherever the derivation holds, not simulated directly
    where that would be cheaper; for tests that compare the two.

    >>> from memcalc.engine import run
    >>> with forcing_derivation():
    ...     run._FORCE_DERIVATION
    True
    >>> run._FORCE_DERIVATION
    False
    """
    global _FORCE_DERIVATION
    before, _FORCE_DERIVATION = _FORCE_DERIVATION, True
    try:
        yield
    finally:
        _FORCE_DERIVATION = before


def _direct_pays(model: ModelSpec, lay: Layout) -> bool:
    """Whether simulating the stack directly costs less than deriving it: the derivation walks
    N1 + N2 + N3 units (and the short last segment three times) in record mode, about as costly
    a layer as the direct walk of the steady and the first step together or a little more
    (measured, CPU medians of 3: Llama-2-70B under 'sqrt', 9-layer segments, 132 layers derived
    against 80 direct, 0.24 s against 0.13 s in bf16; 'per-layer' stacks of Llama widths, 12
    layers derived against 8-32 direct, break even near 16), so the direct walk pays when it is
    the shorter one, and a derivation already made is reused. Either gives the same numbers
    (tests/test_depth.py compares them, forcing_derivation).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> m = ModelSpec.preset("llama-2-7b")
    >>> [_direct_pays(m, layout(m, regime_for(m, TrainingConfig(micro_batch=1, seq_len=8, checkpointing=c))))
    ...  for c in ("per-layer", "sqrt")]
    [False, True]
    """
    if _FORCE_DERIVATION or model.num_layers > MAX_SIMULATED_LAYERS:
        return False
    derived_layers = sum(lay.depth(n) for n in (N1, N2, N3))
    if derived_layers <= model.num_layers:
        return False
    return not has_derivation(model, lay)


def _lazy_form(model: ModelSpec, lay: Layout) -> "DepthForm | None":
    """The depth form of a stack simulated directly: derived when first read (MemoryReport.expr,
    capacity.max_layers), as depth_form derives it."""
    derivation = cached_derivation(model, lay)
    return None if derivation is None else _checked_form(DepthForm(lay, derivation.at(lay.units)[0]), derivation)
