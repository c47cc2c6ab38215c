"""The engine against independent figures: published parameter counts, and peaks measured by
running the real training step on CPU (validate's live-tensor tracker)."""
import pytest

from memcalc.core.errors import SpecError
from memcalc.queries.estimate import estimate
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

PUBLISHED = {  # model cards / papers
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200, "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192, "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096, "qwen2-0.5b": 494_032_768, "qwen2-1.5b": 1_543_714_304,
    "qwen2-7b": 7_615_616_512,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_match_published(name):
    assert ModelSpec.preset(name).param_count == PUBLISHED[name]


def _gpt2(impl, **kw):
    base = dict(family="gpt2", vocab_size=800, hidden_size=128, num_layers=3, num_heads=4,
                max_position_embeddings=128, embd_dropout=0, attn_dropout=0, resid_dropout=0,
                activation="gelu_tanh" if impl == "reference" else "gelu_new", implementation=impl)
    return ModelSpec.make(**{**base, **kw})


def _llama(impl, **kw):
    base = dict(family="llama", vocab_size=800, hidden_size=128, num_layers=3, num_heads=4,
                num_kv_heads=2, intermediate_size=344, max_position_embeddings=128,
                qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
                tie_embeddings=False, implementation=impl)
    return ModelSpec.make(**{**base, **kw})


CASES = [
    (_gpt2("hf"), dict(precision="fp32", attention="sdpa")),
    (_gpt2("hf", hidden_size=192, vocab_size=300), dict(precision="bf16-amp", attention="eager", seq_len=96)),
    (_gpt2("reference"), dict(precision="bf16", checkpointing="per-layer", optimizer="sgd-momentum")),
    (_llama("hf"), dict(precision="bf16-amp", attention="sdpa", optimizer_impl="foreach")),
    (_llama("reference", qkv_bias=True), dict(precision="fp32", attention="eager", grad_accum=2)),
    (_llama("hf", num_layers=4), dict(precision="fp32", checkpointing="sqrt", optimizer="adam")),
    (_gpt2("reference", attn_dropout=0.1), dict(precision="fp32", attention="sdpa")),  # math kernel
    (_llama("hf", attn_dropout=0.1), dict(precision="bf16-amp", attention="sdpa", grad_accum=2)),
]


@pytest.mark.slow
@pytest.mark.parametrize("spec,fields", CASES, ids=[f"{s.implementation}-{s.family}-{f}" for s, f in CASES])
def test_prediction_within_one_percent_of_measured_cpu_peak(spec, fields):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from validate.measure.backends import measure

    training = TrainingConfig.make(**{"micro_batch": 2, "seq_len": 64, "device": "cpu", **fields})
    measured = measure(spec, training)
    predicted = estimate(spec, training)
    assert abs(predicted.peak_bytes - measured.peak_bytes) <= 0.01 * measured.peak_bytes


def test_bad_spec_names_the_field():
    with pytest.raises(SpecError, match="num_kv_heads"):
        ModelSpec.make(family="llama", vocab_size=10, hidden_size=64, num_layers=1, num_heads=4,
                       num_kv_heads=3, intermediate_size=128)


def test_phases_and_components_are_consistent():
    r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=512))
    assert r.peak_bytes == max(r.phases.values()) == sum(r.components.values())
    assert all(isinstance(v, int) and v >= 0 for v in r.components.values())
    assert r.first_step_peak_bytes <= r.peak_bytes


def test_optimal_segment_size_beats_its_neighbours():
    model = ModelSpec.preset("gpt2").with_(num_layers=16)
    step = TrainingConfig(micro_batch=2, seq_len=512, device="cpu")
    k = __import__("memcalc").optimal_segment_size(model, step)

    def peak(n):
        return estimate(model, step.with_(checkpointing="every-k", checkpoint_every=n)).peak_bytes

    assert all(peak(k) <= peak(n) for n in (k - 1, k + 1) if 1 <= n <= 16)
    assert peak(k) < estimate(model, step).peak_bytes  # any checkpointing beats none here


@pytest.mark.slow
def test_allocator_rounding_matches_a_512_byte_tracker():
    """The CUDA caching allocator's 512-byte rounding, checked on CPU: the live-tensor tracker
    rounding every storage up to 512 B against the engine's rounded candidates."""
    pytest.importorskip("torch")
    from memcalc.queries.estimate import candidates
    from validate.measure.backends import LiveTensorTracker, TrackerMeter, _run_under

    spec = _gpt2("hf", vocab_size=1001, hidden_size=96, num_heads=4)
    training = TrainingConfig.make(micro_batch=3, seq_len=37, device="cpu")
    with LiveTensorTracker(granularity=512) as tracker:
        _, run = _run_under(TrackerMeter(tracker), spec, training, None, 3, 0)
    predicted = max(candidates(spec, training).steady_set.rounded_totals(3, 37, 512))
    assert abs(predicted - run.steady.peak) <= 0.001 * run.steady.peak
