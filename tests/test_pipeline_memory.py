"""Pipeline stages' memory (memcalc.parallel.stages, memcalc.parallel.pipeline_peaks): schedule
invariants and refusals. The per-rank peaks measured on gloo ranks (dist-ci topic 'pipeline',
validate/results/dist-ci.jsonl) are held to their bound by tests/test_recorded_rows.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

import memcalc
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import PIPELINE_DEFAULTS, TrainingConfig

def _spec(family: str = "gpt2", layers: int = 4) -> ModelSpec:
    extra = {"intermediate_size": 64} if family == "llama" else {}
    return ModelSpec.make(family=family, vocab_size=96, hidden_size=32, num_layers=layers, num_heads=2,
                          implementation="reference", tie_embeddings=False, **extra)


def _training(schedule: str, m: int, pp: int = 2, per_mb: int = 1, **extra) -> TrainingConfig:
    return TrainingConfig(micro_batch=m * per_mb, seq_len=16, device="cpu", world_size=pp, pipeline_parallel=pp,
                          pipeline_schedule=schedule, num_microbatches=m, **extra)


@settings(max_examples=12, deadline=None)
@given(family=st.sampled_from(["gpt2", "llama"]), m=st.sampled_from([2, 4, 6]), pp=st.sampled_from([2, 3]),
       per_mb=st.sampled_from([1, 2]))
def test_gpipe_holds_at_least_what_1f1b_holds(family, m, pp, per_mb):
    """GPipe keeps every micro-batch in flight, 1F1B at most pp - rank of them: on every rank
    GPipe's peak is at least 1F1B's, and the first rank's forward grows with m under GPipe only."""
    if m < pp:
        return
    spec = _spec(family, 6)
    gpipe = memcalc.estimate(spec, _training("gpipe", m, pp, per_mb)).rank_peak_bytes
    one_f = memcalc.estimate(spec, _training("1f1b", m, pp, per_mb)).rank_peak_bytes
    assert all(g >= f for g, f in zip(gpipe, one_f))


@pytest.mark.parametrize("change,field", [
    (dict(model=dict(implementation="hf")), "pipeline_parallel"),
    (dict(model=dict(tie_embeddings=True)), "pipeline_parallel"),
    (dict(training=dict(world_size=4)), "pipeline_parallel"),
    (dict(training=dict(pipeline_schedule="interleaved-zero-bubble", pipeline_stages_per_rank=2)),
     "pipeline_schedule"),
    (dict(training=dict(checkpointing="sqrt")), "checkpointing"),
    (dict(model=dict(family="llama", implementation="hf", intermediate_size=64, no_rope_layers=(1,))),
     "no_rope_layers"),
    (dict(model=dict(family="llama", implementation="hf", intermediate_size=64), training=dict(precision="bf16-amp")),
     "precision"),
])
def test_what_is_not_modelled_is_refused_by_name(change, field):
    """Refused with the field named (NotModelledError), never a silent number."""
    spec = _spec().with_(**change.get("model", {}))
    t = _training("1f1b", 4).with_(**change.get("training", {}))
    with pytest.raises(NotModelledError) as err:
        memcalc.estimate(spec, t)
    assert err.value.field == field


def test_bad_input_is_refused_by_name():
    """More stages than layers, and micro-batches the schedule cannot take."""
    with pytest.raises(MemcalcError) as err:
        memcalc.estimate(_spec(layers=2), _training("1f1b", 4, pp=2, pipeline_stages_per_rank=1).with_(
            pipeline_schedule="interleaved-1f1b", pipeline_stages_per_rank=2, world_size=2))
    assert err.value.field == "pipeline_parallel"
    with pytest.raises(MemcalcError) as err:
        memcalc.estimate(_spec(), _training("1f1b", 1, pp=2))
    assert err.value.field == "num_microbatches"


@pytest.mark.parametrize("implementation", ["reference", "hf"])
def test_the_planner_keeps_the_pipeline_layouts_that_fit(implementation):
    """plan_cluster's pipeline layouts (allocated basis) carry estimate()'s rank peaks, all within the
    budget; a budget between two layouts' peaks keeps the smaller and drops the larger (the
    reference GPT-2 and the HF Llama program)."""
    from memcalc.queries.cluster import plan_cluster

    spec = _spec() if implementation == "reference" else _spec("llama").with_(implementation="hf")
    t = TrainingConfig(micro_batch=1, seq_len=16, precision="fp32")
    plans = [x for x in plan_cluster(spec, t, gpus="2xA100-80GB", global_batch=4, basis="allocated")
             if x.pipeline_parallel == 2]
    assert {x.pipeline_schedule for x in plans} == {"gpipe", "1f1b", "interleaved-1f1b"}
    for x in plans:
        again = t.with_(world_size=2, pipeline_parallel=2, pipeline_schedule=x.pipeline_schedule,
                        num_microbatches=x.num_microbatches, micro_batch=4, checkpointing=x.checkpointing,
                        pipeline_stages_per_rank=2 if x.pipeline_schedule == "interleaved-1f1b" else 1)
        assert memcalc.estimate(spec, again).rank_peak_bytes == x.rank_peak_bytes
    peaks = sorted({max(x.rank_peak_bytes) for x in plans})
    budget = (peaks[0] + peaks[-1]) // 2
    kept = [x for x in plan_cluster(spec, t, gpus="2xA100-80GB", global_batch=4, basis="allocated",
                                    budget=budget) if x.pipeline_parallel == 2]
    assert kept and all(max(x.rank_peak_bytes) <= budget for x in kept) and len(kept) < len(plans)


@pytest.mark.slow
def test_pipeline_layouts_the_planner_keeps_run_within_the_budget_on_gloo():
    """An untied reference GPT-2 on 2 gloo ranks: with the budget between two pipeline layouts'
    peaks, the largest layout the planner keeps runs within it (every rank measured) and the
    smallest it drops goes over it."""
    pytest.importorskip("torch.distributed")
    from memcalc.queries.cluster import plan_cluster
    from validate.distributed.measure import measure_distributed

    spec = _spec()
    t = TrainingConfig(micro_batch=1, seq_len=16, device="cpu", precision="fp32")
    kw = dict(gpus="2xH100-80GB", global_batch=4, basis="allocated", checkpointing=("none", "per-layer"))

    def key(x):
        return x.pipeline_schedule, x.num_microbatches, x.checkpointing

    every = [x for x in plan_cluster(spec, t, **kw) if x.pipeline_parallel == 2]
    peaks = sorted({x.peak_bytes for x in every})
    i = len(peaks) // 2
    budget = (peaks[i - 1] + peaks[i]) // 2
    fits = [x for x in plan_cluster(spec, t, budget=budget, **kw) if x.pipeline_parallel == 2]
    said = {key(x) for x in fits}
    over = min((x for x in every if key(x) not in said), key=lambda x: x.peak_bytes)
    for x, inside in ((max(fits, key=lambda x: x.peak_bytes), True), (over, False)):
        run = t.with_(world_size=2, pipeline_parallel=2, pipeline_schedule=x.pipeline_schedule,
                      num_microbatches=x.num_microbatches, micro_batch=4, checkpointing=x.checkpointing,
                      pipeline_stages_per_rank=2 if x.pipeline_schedule == "interleaved-1f1b" else 1)
        measured = [r["peak_bytes"] for r in measure_distributed(spec, run)]
        assert (max(measured) <= budget) == inside, (key(x), measured, budget)


@pytest.mark.parametrize("implementation", ["hf", "reference"])
def test_a_stage_profile_depends_on_its_layer_count_only_when_layers_are_alike(implementation):
    """The planner's cache walks one profile per layer count (pipeline_peaks._layer_key): the
    profile of a stage walked with its own layer indices is the same, for every stage of an uneven
    5-stage split of an HF and a reference Llama."""
    from memcalc.parallel.pipeline import stage_layers
    from memcalc.parallel.pipeline_peaks import _profiles
    from memcalc.parallel.stages import stage_profile

    spec = _spec("llama", 7).with_(implementation=implementation)
    t = _training("1f1b", 5, pp=5, per_mb=2, checkpointing="per-layer")
    one = t.with_(**PIPELINE_DEFAULTS, world_size=1, micro_batch=2)
    recv = None
    for i, (layers, cached) in enumerate(zip(stage_layers(7, 5, None), _profiles(spec, t))):
        direct = stage_profile(spec, one, layers, i == 0, i == 4, recv)
        recv = (direct.output.eval(2, 16), direct.output_elt)
        assert replace(direct, output=None) == replace(cached, output=None)
        assert direct.output.eval(3, 5) == cached.output.eval(3, 5)
