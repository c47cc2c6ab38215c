"""Tensor parallelism: each rank's parameters against a closed-form count (second method), the
per-rank peak against the degree (property), and the refusals (one-line errors). The measured
gloo runs are checked rank by rank in test_distributed.test_recorded_gloo_runs_match_rank_by_rank
(validate/results/dist-ci.jsonl, rows named *-TP*)."""
import pytest
from hypothesis import given, strategies as st

from memcalc import ModelSpec, TrainingConfig, estimate
from memcalc.core.errors import MemcalcError, NotModelledError, SpecError
from memcalc.queries.estimate import candidates

from tests.closed_form import closed_form_rank_params
from tests.strategies import TP_PROGRAMS, small_models, tensor_parallel_degrees, trainings


@st.composite
def tp_cases(draw):
    """Any program the engine splits (not HF GPT-2), on a single-device step it then splits
    over every rank (world_size = tensor_parallel: no data parallelism)."""
    spec = draw(small_models(max_layers=3, programs=TP_PROGRAMS))
    t = draw(st.sampled_from(tensor_parallel_degrees(spec)))
    training = draw(trainings(model=spec))
    return spec, training.with_(world_size=t, tensor_parallel=t)


@given(tp_cases())
def test_rank_parameters_match_the_closed_form(case):
    spec, training = case
    c = candidates(spec, training)
    assert sum(n for n, _ in c.param_shapes) == closed_form_rank_params(spec, training.tensor_parallel)


@given(tp_cases())
def test_splitting_costs_at_most_one_residual_sized_buffer(case):
    # a rank runs a narrower model plus all-reduce outputs that live beside the partial sums
    # they replace: never more than one (b, s, h) buffer above the single-device peak
    spec, training = case
    one = estimate(spec, training.with_(world_size=1, tensor_parallel=1)).peak_bytes
    rank = estimate(spec, training).peak_bytes
    elt = 2 if training.precision == "bf16" else 4
    residual = training.micro_batch * training.seq_len * spec.hidden_size * elt
    assert rank <= one + residual + 512 * 4  # 512: CUDA rounding of the extra blocks


@pytest.mark.parametrize("preset", ["llama-2-7b", "llama-2-13b"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-amp"])
def test_per_rank_peak_falls_as_the_degree_grows(preset, precision):
    spec = ModelSpec.preset(preset).with_(num_layers=4)  # the published widths; depth is time
    peaks = [estimate(spec, TrainingConfig(micro_batch=1, seq_len=2048, precision=precision,
                                           checkpointing="per-layer", world_size=t,
                                           tensor_parallel=t)).peak_bytes for t in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4


def test_replicated_parts_bound_the_saving():
    # the embedding and LM head are not split, so t ranks hold more than 1/t of the model
    spec = ModelSpec.preset("llama-2-7b")
    full = closed_form_rank_params(spec, 1)
    assert full == spec.param_count
    assert closed_form_rank_params(spec, 8) > full // 8


@pytest.mark.parametrize("changes,error,field", [
    (dict(world_size=3, tensor_parallel=3), SpecError, "tensor_parallel"),
    (dict(world_size=4, tensor_parallel=2), NotModelledError, "sharding"),
    (dict(world_size=4, tensor_parallel=2, sharding="zero1"), NotModelledError, "sharding"),
    (dict(world_size=2, tensor_parallel=2, sequence_parallel=True), NotModelledError,
     "sequence_parallel"),
])
def test_refusals_name_the_field(changes, error, field):
    t = TrainingConfig(micro_batch=1, seq_len=8, **changes)
    with pytest.raises(error) as info:
        estimate(ModelSpec.preset("llama-2-7b"), t)
    assert str(info.value).startswith(f"{field}:")


def test_hf_gpt2_is_refused_with_the_reference_as_the_fix():
    t = TrainingConfig(micro_batch=1, seq_len=8, world_size=2, tensor_parallel=2)
    with pytest.raises(MemcalcError, match="implementation='reference'"):
        estimate(ModelSpec.preset("gpt2"), t)
    assert estimate(ModelSpec.preset("gpt2").with_(implementation="reference"), t).peak_bytes > 0


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_sequence_parallelism_divides_the_norm_and_residual_activations(family):
    # Korthikanti et al. 2022, Table 2: with SP the per-layer activations outside attention and
    # the MLP fall from 10sbh (fp16 bytes) to 10sbh/t; here the forward-phase peak must fall by
    # at least the residual stream of every layer but one (b*s*h*4*(t-1)/t each)
    spec = ModelSpec.make(family=family, implementation="reference", vocab_size=64, hidden_size=256,
                          num_heads=8, num_layers=6, max_position_embeddings=2048,
                          **({"intermediate_size": 512} if family == "llama" else {}))
    base = TrainingConfig(micro_batch=2, seq_len=1024, device="cpu", world_size=4, tensor_parallel=4)
    off = estimate(spec, base).phases["forward"]
    on = estimate(spec, base.with_(sequence_parallel=True)).phases["forward"]
    residual = 2 * 1024 * 256 * 4
    assert off - on >= (spec.num_layers - 1) * residual * 3 // 4


def test_sequence_parallel_needs_whole_token_chunks():
    spec = ModelSpec.preset("gpt2").with_(implementation="reference")
    t = TrainingConfig(micro_batch=1, seq_len=30, world_size=4, tensor_parallel=4,
                       sequence_parallel=True)
    with pytest.raises(SpecError, match="^seq_len:"):
        estimate(spec, t)


@pytest.mark.parametrize("sharding", ["zero2", "zero3"])
def test_fsdp_across_tensor_parallel_groups_shards_the_rank_states(sharding):
    # a (dp, tp) mesh: FSDP2 shards each TP rank's parameters over dp; per-rank memory falls as
    # dp grows, and each TP group's ranks hold the same bytes
    spec = ModelSpec.preset("llama-2-7b").with_(implementation="reference")
    base = TrainingConfig(micro_batch=1, seq_len=1024, precision="bf16", checkpointing="per-layer",
                          world_size=2, tensor_parallel=2, sharding=sharding)
    peaks = []
    for dp in (1, 2, 4):
        r = estimate(spec, base.with_(world_size=2 * dp))
        assert len(r.rank_peak_bytes) == 2 * dp
        assert all(r.rank_peak_bytes[i] == r.rank_peak_bytes[i + 1] for i in range(0, 2 * dp, 2))
        peaks.append(r.peak_bytes)
    assert peaks[0] > peaks[1] > peaks[2]


def test_fewest_gpus_counts_every_tensor_parallel_rank():
    from memcalc.queries.capacity import min_world_size

    spec = ModelSpec.preset("llama-2-13b")
    t = TrainingConfig(micro_batch=1, seq_len=2048, precision="bf16", checkpointing="per-layer",
                       sharding="zero3", tensor_parallel=4, world_size=4)
    r = min_world_size(spec, t, "40GB")
    assert r.fits and r.value % 4 == 0
    assert estimate(spec, t.with_(world_size=r.value)).peak_bytes <= r.budget_bytes
    if r.value > 4:
        assert estimate(spec, t.with_(world_size=r.value - 4)).peak_bytes > r.budget_bytes
