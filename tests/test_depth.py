"""Depth as a symbol (memcalc.engine.depth): a stack derived from 3, 4 and 5 repeats of its layers gives
the same numbers as simulating every layer (engine.simulated), for every program, precision,
checkpointing mode and parallel layout; programs whose layers do not repeat as declared fall back
to the simulation; the formula in L evaluates to the simulated peak."""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st
from strategies import PROGRAMS as PROGRAM_LIST
from strategies import cases, finetune_steps

from memcalc.engine import run as engine
from memcalc.engine.cache import CACHE
from memcalc.engine.derivation import FINETUNE_OPTIMIZERS
from memcalc.engine.layout import N3, layout, small_model
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.queries.estimate import estimate
from memcalc.families import PROGRAMS
from memcalc.engine.regime import Regime
from memcalc.engine.simulation import run_step
from memcalc.inputs.specs import ModelSpec
from memcalc.core.symbols import L, b, s
from memcalc.tape.graph import Grad
from memcalc.inputs.training import TrainingConfig


def _report(r) -> dict:
    return {"peak": r.peak_bytes, "phase": r.peak_phase, "phases": r.phases, "first": r.first_step_peak_bytes,
            "ranks": list(r.rank_peak_bytes), "components": r.components, "moment": r.moment}


def _features(model: ModelSpec, training: TrainingConfig) -> list[str]:
    """What a case exercises, for hypothesis' statistics (--hypothesis-show-statistics)."""
    defaults = TrainingConfig(micro_batch=1, seq_len=1)
    out = [f"{f}" for f in ("max_grad_norm", "lora", "freeze", "use_cache", "attention_mask", "labels",
                            "num_items_in_batch", "hf_trainer") if getattr(training, f) != getattr(defaults, f)]
    out += [f"optimizer {training.optimizer}"] if training.optimizer in FINETUNE_OPTIMIZERS else []
    out += [f"quantization {training.quantization}"] if training.quantization != "none" else []
    out += ["sliding window"] if model.sliding_window is not None else []
    out += ["NoPE layers"] if model.no_rope_layers else []
    out += ["MoE dense layers" if model.moe.dense_layers else "MoE"] if model.moe is not None else []
    return out


def _event(text: str) -> None:
    """hypothesis.event inside a given test; nothing elsewhere."""
    try:
        event(text)
    except InvalidArgument:
        pass


def _compare(model: ModelSpec, training: TrainingConfig, shapes: list[tuple[int, int]]) -> None:
    CACHE.clear()
    try:  # memcalc.engine.depth serves it where the layers repeat (depth.supported: every regime but
        with engine.forcing_derivation():  # index-tied settings), else the simulation; forced:
            derived = engine.candidates(model, training)  # not simulated directly where cheaper
    except MemcalcError as err:  # a refusal found while simulating (trainable parameters of two
        with pytest.raises(type(err)) as direct:  # dtypes with clipping): the same, by name
            engine.simulated(model, training)
        assert str(direct.value) == str(err)
        _event("refused alike")
        return
    used = any(isinstance(k, tuple) and k[:1] == ("depth",) and v is not None for k, v in CACHE.items())
    for f in _features(model, training) + [model.family]:
        _event(f"{f}: {'derived' if used else 'simulated'}")
    _event(f"prefix {layout(model, Regime.of(training)).prefix}, unit {layout(model, Regime.of(training)).unit}")
    direct = engine.simulated(model, training)
    assert derived.param_shapes == direct.param_shapes
    for bv, sv in shapes:
        s = max(sv, training.pad_tokens + 1)
        if training.sequence_parallel:  # sequence parallelism splits the tokens over the TP ranks
            s = -(-s // training.tensor_parallel) * training.tensor_parallel
        t = training.with_(micro_batch=bv, seq_len=s)
        key = engine.cache_key(model, t)
        if key != engine.cache_key(model, training):  # a shape condition of its own: not these candidates
            continue
        CACHE[key] = derived
        mine = _report(estimate(model, t))
        CACHE[key] = direct
        assert mine == _report(estimate(model, t)), (bv, sv)


@st.composite
def _patterns(draw, model: ModelSpec) -> dict:
    """A layer pattern by index where the family has one: SmolLM3's NoPE layers (every 4th,
    hf_config's default, or every other), Qwen2/Qwen3's max_window_layers (full-attention first
    layers), Qwen-MoE's dense layers (the first k: mlp_only_layers / first_k_dense; or every
    other: decoder_sparse_step 2)."""
    out: dict = {}
    if model.no_rope_layers:
        out["nope_every"] = draw(st.sampled_from([2, 4]))
    if model.max_window_layers is not None:
        out["max_window_layers"] = draw(st.integers(0, 3))
    if model.moe is not None:
        out["dense"] = draw(st.sampled_from(["none", "first1", "first2", "step2"])) \
            if model.family.startswith("qwen") else "none"
    return out


def _patterned(pattern: dict, model: ModelSpec, layers: int) -> ModelSpec:
    """`model` at `layers` layers with the `_patterns` draw."""
    fields: dict = {"num_layers": layers}
    if "nope_every" in pattern:
        fields["no_rope_layers"] = tuple(range(pattern["nope_every"] - 1, layers, pattern["nope_every"]))
    if "max_window_layers" in pattern:
        fields["max_window_layers"] = pattern["max_window_layers"]
    if "dense" in pattern:
        dense = {"none": (), "first1": (0,), "first2": (0, 1), "step2": tuple(range(0, layers, 2))}[pattern["dense"]]
        fields["moe"] = model.moe.model_copy(update={"dense_layers": dense})
    return model.with_(**fields)


@st.composite
def deep_cases(draw, parallel: bool = True, finetune: bool = True, programs=PROGRAM_LIST):
    """A model past N3 units of its layout (prefix, unit: memcalc.engine.layout.repeat over its layer
    pattern) and a step over every program, precision, checkpointing mode, optimizer, parallel
    layout, and, with `finetune`, clipping, bitsandbytes/Adafactor optimizers, LoRA / QLoRA /
    frozen parameters and the HF call paths (strategies.finetune_steps)."""
    model, training = draw(cases(max_layers=1, parallel=parallel, programs=programs))
    if finetune:
        training = draw(finetune_steps(model, training))
    pattern = draw(_patterns(model))
    if training.checkpointing == "sqrt":
        depth = draw(st.sampled_from([36, 40, 42, 45, 48, 56]))  # segments of 6-7, 6+ of them
    else:
        lay = layout(_patterned(pattern, model, 48), Regime.of(training))
        depth = lay.prefix + (N3 + 1 + draw(st.integers(0, 3))) * lay.unit + draw(st.integers(0, lay.unit - 1))
    model = _patterned(pattern, model, depth)
    if training.lora is not None and training.lora.layers is not None:  # every layer, or every other
        every = draw(st.sampled_from([1, 2]))  # (not derived: memcalc.engine.layout.supported)
        training = training.with_(lora=training.lora.model_copy(update={"layers": tuple(range(0, depth, every))}))
    return model, training


FINETUNED = [("gpt2", "hf"), ("llama", "hf")] * 2 + [("gpt2", "reference"), ("llama", "reference")]
"""The programs LoRA, QLoRA, frozen parameters and the HF call paths apply to (memcalc.
finetune_checks, programs.call_path), the HF ones drawn twice as often; the reference ones take
clipping, freeze and the fine-tuning optimizers."""


DEEP = {"all programs": deep_cases(), "finetuned": deep_cases(parallel=False, programs=FINETUNED)}
"""The two draws the depth-equals-simulation tests make: every program with parallel layouts and
fine-tuning, and the fine-tuned programs alone (single process)."""


def _check_depth(data: st.DataObject, kind: str, most_b: int, most_s: int, most_shapes: int) -> None:
    """A `DEEP[kind]` case compared with its simulation at 1..most_shapes (b, s) shapes."""
    model, training = data.draw(DEEP[kind], label="case")
    shapes = data.draw(st.lists(st.tuples(st.integers(1, most_b), st.integers(1, most_s)), min_size=1,
                                max_size=most_shapes), label="shapes")
    _compare(model, training, shapes)


@pytest.mark.parametrize("kind", sorted(DEEP))
@settings(max_examples=8)
@given(data=st.data())
def test_derived_depth_equals_simulation(kind, data):
    _check_depth(data, kind, 8, 128, 3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DEEP))
@settings(max_examples=150)
@given(data=st.data())
def test_derived_depth_equals_simulation_long(kind, data):
    _check_depth(data, kind, 64, 512, 4)


@settings(max_examples=4)  # sympy.Max over the candidates is slow to build
@given(deep_cases(parallel=False), st.integers(1, 8), st.integers(1, 128))
def test_formula_in_depth_is_the_simulated_peak(case, bv, sv):
    _check_formula(case, bv, sv)


@settings(max_examples=3)
@given(deep_cases(parallel=False, programs=FINETUNED), st.integers(1, 8), st.integers(1, 128))
def test_finetuned_formula_in_depth_is_the_simulated_peak(case, bv, sv):
    _check_formula(case, bv, sv)


def _check_formula(case: tuple, bv: int, sv: int) -> None:
    """expr, where it is in L, evaluated at another depth of the same layout (a unit less: the
    layer pattern kept, memcalc.engine.layout.small_model) is that depth's simulated peak (unrounded:
    device cpu)."""
    model, training = case
    training = training.with_(device="cpu", micro_batch=bv, seq_len=max(sv, training.pad_tokens + 1))
    try:
        expr = estimate(model, training).expr
    except MemcalcError as err:  # a refusal found while simulating (trainable parameters of two
        with pytest.raises(type(err)) as direct:  # dtypes with clipping): the same without depth
            engine.simulated(model, training)
        assert str(direct.value) == str(err)
        event("refused alike")
        return
    lay = layout(model, Regime.of(training))
    if L not in expr.free_symbols:  # not derived, or a slope that misses the peak deeper
        event("expr in b and s only")  # (engine._checked_form): nothing to compare
        return
    other = small_model(model, lay, lay.units - 1)
    if training.checkpointing == "sqrt" and layout(other, Regime.of(training)).unit != lay.unit:
        other = model  # the segment size moved: the formula holds for this depth's segments
    if training.lora is not None and training.lora.layers is not None:  # every layer (derived)
        training = training.with_(lora=training.lora.model_copy(update={"layers": tuple(range(other.num_layers))}))
    bv, sv = training.micro_batch, training.seq_len
    engine.check_step(other, training)
    regime = engine.regime_for(other, training)  # a MoE 'worst' eager step: every routing's moments
    peak = max(m.total.eval(bv, sv) for r in engine.routings(other, regime) for m in run_step(other, r, False).moments)
    assert int(expr.xreplace({b: bv, s: sv, L: other.num_layers})) == int(peak)


@pytest.mark.parametrize("family,impl", [("gpt2", "hf"), ("gpt2", "reference"), ("llama", "hf"),
                                         ("llama", "reference")])
def test_repeating_programs_are_derived(family, impl):
    model = ModelSpec.make(family=family, implementation=impl, vocab_size=100, hidden_size=32, num_layers=9,
                           num_heads=2, max_position_embeddings=64,
                           **({"intermediate_size": 64} if family == "llama" else {}))
    for mode in ("none", "per-layer", "selective"):
        CACHE.clear()
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
    CACHE.clear()
    derived = engine.candidates(model, t)
    assert (derived.depth is not None) == (period == 2)
    direct = engine.simulated(model, t)
    assert max(derived.steady_set.rounded_totals(2, 16)) == max(direct.steady_set.rounded_totals(2, 16))
    assert max(derived.first_set.rounded_totals(3, 9)) == max(direct.first_set.rounded_totals(3, 9))
    CACHE.clear()
    if period == 1:  # too deep to simulate layer by layer: refused by name
        with pytest.raises(NotModelledError, match="num_layers"):
            engine.candidates(model.with_(num_layers=200), t)


def test_a_thousand_layers():
    t = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16-amp", checkpointing="per-layer")
    model = ModelSpec.preset("llama-2-7b")
    r32, r1000 = estimate(model, t), estimate(model.with_(num_layers=1000), t)
    per_layer = (estimate(model.with_(num_layers=33), t).peak_bytes - r32.peak_bytes)
    assert r1000.peak_bytes == r32.peak_bytes + (1000 - 32) * per_layer


_LLAMA = ModelSpec.make(family="llama", implementation="hf", vocab_size=100, hidden_size=32, num_layers=9,
                        num_heads=2, intermediate_size=64, max_position_embeddings=256, qkv_bias=False,
                        out_bias=False, mlp_bias=False)
_GPT2 = ModelSpec.make(family="gpt2", implementation="hf", vocab_size=100, hidden_size=32, num_layers=9,
                       num_heads=2, max_position_embeddings=256)


def _moe(family: str, dense: tuple = (), **fields) -> ModelSpec:
    from memcalc.inputs.moe import MoESpec

    return _LLAMA.with_(family=family, num_layers=10, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_size=32,
                                                                  dense_layers=dense, **fields))


def _used(model: ModelSpec, training: TrainingConfig) -> bool:
    CACHE.clear()
    with engine.forcing_derivation():
        engine.candidates(model, training)
    return any(isinstance(k, tuple) and k[:1] == ("depth",) and v is not None for k, v in CACHE.items())


@pytest.mark.parametrize("name,model,fields,derived", [
    ("clip", _LLAMA, dict(max_grad_norm=1.0, device="cuda", precision="fp16-amp"), True),
    ("adamw-8bit cpu", _LLAMA, dict(optimizer="adamw-8bit", device="cpu"), True),
    ("adafactor clip bf16", _LLAMA, dict(optimizer="adafactor", max_grad_norm=1.0, precision="bf16"), True),
    ("lora 8bit clip", _GPT2, dict(lora={"rank": 4, "targets": ["c_attn"]}, optimizer="adamw-8bit",
                                   max_grad_norm=1.0), True),
    ("qlora", _LLAMA, dict(lora={"rank": 4, "targets": "all-linear"}, quantization="nf4", device="cuda",
                           optimizer="paged-adamw-8bit"), True),
    ("freeze", _GPT2, dict(freeze=("*ln_*", "*wte*")), True),
    ("freeze by index", _GPT2, dict(freeze=("*h.1.*",)), False),
    ("lora some layers", _LLAMA, dict(lora={"rank": 4, "layers": [0, 2, 4, 6, 8]}), False),
    ("trainer 8bit", _GPT2, dict(hf_trainer=True, optimizer="adamw-8bit", max_grad_norm=1.0), True),
    ("call path", _LLAMA, dict(use_cache=True, attention_mask="padded", pad_tokens=3, labels="separate",
                               num_items_in_batch=True), True),
    ("qwen2 max_window_layers", _LLAMA.with_(sliding_window=8, max_window_layers=3, num_layers=12),
     dict(attention="eager"), True),
    ("mixtral worst eager", _moe("mixtral"), dict(experts_implementation="eager"), False),
    ("qwen2-moe dense first", _moe("qwen2_moe", (0,), shared_expert_ffn_size=32), dict(moe_routing="balanced"), True),
    ("mixtral uniform counts", _moe("mixtral"), dict(moe_routing=((16, 16, 16, 16),) * 10), True),
    ("mixtral per-layer counts", _moe("mixtral"), dict(moe_routing=((16, 16, 16, 16),) * 9 + ((32, 32, 0, 0),)), False),
])
def test_features_derived(name, model, fields, derived):
    """Each feature derives (or, singling out layers by index, is simulated layer by layer: memcalc.
    depth.supported) and gives the simulation's numbers."""
    training = TrainingConfig(micro_batch=2, seq_len=16, **fields)
    assert _used(model, training) == derived
    _compare(model, training, [(2, 16)] if "counts" in name else [(2, 16), (3, 40)])


def _small_llama(layers: int) -> ModelSpec:
    return ModelSpec.make(family="llama", implementation="hf", vocab_size=100, hidden_size=32, num_layers=layers,
                          num_heads=2, intermediate_size=64, max_position_embeddings=64)


def test_a_stack_simulated_because_cheaper_keeps_its_depth_form():
    """'sqrt' at 36 layers: 6-layer segments, 72 layers to derive, so the engine simulates the
    36 directly (engine._direct_pays); the depth form, derived when read, is the one the
    forced derivation gives, and so are the numbers."""
    model, t = _small_llama(36), TrainingConfig(micro_batch=2, seq_len=16, checkpointing="sqrt")
    CACHE.clear()
    direct = engine.candidates(model, t)
    assert direct._pending is not None  # not derived yet
    lazy = direct.depth
    CACHE.clear()
    with engine.forcing_derivation():
        derived = engine.candidates(model, t)
    def terms(form):
        return [(v.terms, d.terms) for v, d in form.terms()]

    assert lazy is not None and terms(lazy) == terms(derived.depth)
    for name in ("steady_set", "first_set"):
        assert max(getattr(direct, name).rounded_totals(3, 9)) == max(getattr(derived, name).rounded_totals(3, 9))


def test_ddp_and_zero1_share_one_derivation_across_rank_counts():
    """A derivation made at 5 ranks serves 3 (memcalc.engine.cache.shared_layout); every rank's numbers are
    those of simulating every layer at 3 ranks."""
    model = _small_llama(16)  # 12 layers to derive: derived, not simulated
    for sharding in ("none", "zero1"):
        CACHE.clear()
        t5, t3 = (TrainingConfig(micro_batch=2, seq_len=16, world_size=w, sharding=sharding) for w in (5, 3))
        engine.candidates(model, t5)
        derivations = sum(1 for k in CACHE if k[0] == "depth")
        shared = engine.candidates(model, t3)
        assert sum(1 for k in CACHE if k[0] == "depth") == derivations == 1
        key = engine.cache_key(model, t3)
        mine = _report(estimate(model, t3))
        CACHE.clear()
        CACHE[key] = engine.simulated(model, t3)
        assert mine == _report(estimate(model, t3)) and shared.regime.data_parallel == 3


def test_every_depth_of_a_layout_shares_one_derivation():
    """16 and 20 layers (unit 1, no rest): one derivation (memcalc.engine.cache.shared_layout), and each
    depth's numbers are those of simulating every layer."""
    t = TrainingConfig(micro_batch=2, seq_len=16, checkpointing="per-layer")
    CACHE.clear()
    derived = [engine.candidates(_small_llama(n), t) for n in (16, 20)]
    assert sum(1 for k in CACHE if k[0] == "depth") == 1
    for n, c in zip((16, 20), derived):
        direct = engine.simulated(_small_llama(n), t)
        assert max(c.steady_set.rounded_totals(3, 9)) == max(direct.steady_set.rounded_totals(3, 9))
