"""Pipeline schedules (memcalc.parallel.pipeline) against torch.distributed.pipelining's own:
the order of each rank's compute actions, the micro-batches in flight, the refusals."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from memcalc.core.errors import MemcalcError
from memcalc.parallel.pipeline import MULTI, SCHEDULES, check_pipeline, in_flight, rank_actions, stage_layers

def torch_actions(schedule: str, p: int, m: int, v: int) -> list[list[tuple[int, str, int]]]:
    """Each rank's compute actions as torch orders them (_schedule_visualizer.get_schedule_ops)."""
    pytest.importorskip("torch.distributed")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(SCHEDULES[schedule], p, m, num_stages_per_rank=v if schedule in MULTI else None)
    return [[(a.stage_index, _short(str(a.computation_type)), a.microbatch_index) for a in rank
             if a is not None and a.microbatch_index is not None]  # REDUCE_GRAD: no micro-batch
            for rank in ops]


def ours(schedule, p, m, v):
    return [rank_actions(schedule, p, m, r, v) for r in range(p)]


CASES = [(s, p, m, v) for s in ("looped-bfs", "interleaved-1f1b", "interleaved-zero-bubble")
         for p in (2, 3, 4) for m in (1, 2, 4, 6, 8) for v in (2, 3)]


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_multi_stage_orders_are_torchs(schedule, p, m, v):
    try:
        check_pipeline(p * v, p, schedule, m, v)
    except MemcalcError:
        with pytest.raises(Exception):
            torch_actions(schedule, p, m, v)
        return
    assert ours(schedule, p, m, v) == torch_actions(schedule, p, m, v)


def _short(kind: str) -> str:
    """torch's _ComputationType as one letter (F, B = FULL_BACKWARD, I, W)."""
    return {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}.get(
        kind.split(".")[-1], kind)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_gpipe_order_is_torchs(p, m):
    assert ours("gpipe", p, m, 1) == torch_actions("gpipe", p, m, 1)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_1f1b_in_flight_is_torchs_warmup(p, m):
    """Schedule1F1B._step_microbatches: min(m, stages - stage) warm-up forwards, then 1B1F."""
    assert in_flight("1f1b", p, m) == [min(m, p - r) for r in range(p)]


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 32), v=st.integers(2, 4),
       schedule=st.sampled_from(["gpipe", "1f1b", "looped-bfs", "interleaved-1f1b", "interleaved-zero-bubble"]))
def test_in_flight_bounds(p, m, v, schedule):
    """Every forward has its backward, on its own stage; no rank holds more than all its
    micro-batches; GPipe holds them all; the first rank holds the most."""
    v = v if schedule in MULTI else 1
    try:
        check_pipeline(p * v, p, schedule, m, v)
    except MemcalcError:
        return
    held = in_flight(schedule, p, m, v)
    assert all(1 <= h <= m * v for h in held)
    assert held[0] == max(held)
    if schedule in ("gpipe", "looped-bfs"):
        assert held == [m * v] * p
    for r in range(p):
        acts = rank_actions(schedule, p, m, r, v)
        fwd = sorted((s, i) for s, k, i in acts if k == "F")
        assert fwd == sorted((s, i) for s in range(r, p * v, p) for i in range(m))
        ends = "W" if schedule == "interleaved-zero-bubble" else "B"
        assert sorted((s, i) for s, k, i in acts if k == ends) == fwd


def test_refusals():
    for args, field in (((4, 8, "1f1b", 8), "pipeline_parallel"), ((32, 4, "1f1b", 3), "num_microbatches"),
                        ((32, 4, "interleaved-1f1b", 9, 2), "num_microbatches"),
                        ((32, 4, "zb", 4), "pipeline_schedule"),
                        ((32, 4, "interleaved-1f1b", 8, 1), "pipeline_stages_per_rank"),
                        ((32, 4, "gpipe", 0), "num_microbatches"),
                        ((32, 4, "gpipe", 4, 1, [8, 8, 16]), "stage_boundaries"),
                        ((32, 4, "gpipe", 4, 1, [8, 16]), "stage_boundaries")):
        with pytest.raises(MemcalcError) as err:
            check_pipeline(*args)
        assert err.value.field == field and err.value.fix


@given(n=st.integers(1, 200), k=st.integers(1, 64))
def test_even_split(n, k):
    if k > n:
        return
    parts = stage_layers(n, k)
    assert [i for r in parts for i in r] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1 and len(parts[0]) >= len(parts[-1])


@pytest.mark.slow
@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved-zero-bubble", 2)])
def test_split_computes_the_models_loss_on_gloo(schedule, v):
    """The hand split (validate.distributed.pipeline) runs under torch's schedule on 2 gloo
    ranks and its micro-batch losses average to the unsplit model's loss (1e-5)."""
    torch = pytest.importorskip("torch")
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from validate.distributed.pipeline import measure_pipeline
    from validate.models.reference import build_reference

    spec = ModelSpec.make(family="llama", vocab_size=96, hidden_size=32, num_layers=4, num_heads=2,
                          intermediate_size=64, implementation="reference", tie_embeddings=False)
    training = TrainingConfig(micro_batch=4, seq_len=16, device="cpu")
    torch.manual_seed(0)
    whole = build_reference(spec, training)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
    expected = float(whole(ids, ids).detach())
    ranks = measure_pipeline(spec, training, 2, schedule, 4 // v, stages_per_rank=v)
    losses = ranks[-1]["losses"] if ranks[-1]["losses"] else ranks[0]["losses"]
    assert len(losses) == 4 // v and sum(losses) / len(losses) == pytest.approx(expected, abs=1e-5)
    assert all(r["peak_bytes"] >= r["built_bytes"] for r in ranks)


def test_training_config_pipeline_fields():
    """estimate() refuses bad pipeline input by name, and an HF program's stages as not modelled (one line)."""
    import memcalc

    gpt2 = memcalc.ModelSpec.preset("gpt2")
    base = dict(micro_batch=8, seq_len=64, world_size=4, pipeline_parallel=4)
    for extra, field in (({"num_microbatches": 8}, "pipeline_parallel"), ({"num_microbatches": 2}, "num_microbatches"),
                         ({"num_microbatches": 3}, "num_microbatches"),
                         ({"num_microbatches": 8, "stage_boundaries": (3, 6)}, "stage_boundaries"),
                         ({"num_microbatches": 8, "pipeline_parallel": 16, "world_size": 16}, "pipeline_parallel")):
        with pytest.raises(MemcalcError) as err:
            memcalc.estimate(gpt2, memcalc.TrainingConfig(**{**base, **extra}))
        assert err.value.field == field, (extra, err.value)
    for fields, field in (({"micro_batch": 1, "seq_len": 8, "num_microbatches": 2}, "num_microbatches"),
                          ({**base}, "num_microbatches"),
                          ({**base, "num_microbatches": 4, "world_size": 6}, "world_size")):
        with pytest.raises(MemcalcError) as err:
            memcalc.TrainingConfig(**fields)
        assert err.value.field == field
