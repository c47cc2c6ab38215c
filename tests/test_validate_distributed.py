"""Distributed measurement on gloo: ranks are cleaned up, failures are reported, peaks behave.

Each test that launches ranks costs a few seconds (fresh interpreters importing torch); the
model is tiny so the steps themselves are quick.
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from memcalc.core.errors import MemcalcError  # noqa: E402
from memcalc.inputs.specs import ModelSpec  # noqa: E402
from memcalc.inputs.training import TrainingConfig  # noqa: E402
from validate.distributed.formulas import Layout, component_misses, phase_peaks  # noqa: E402
from validate.matrices import topic_cases  # noqa: E402
from validate.distributed.tracker import DistTracker  # noqa: E402
from validate.distributed.measure import measure_distributed, resolve_parallelism  # noqa: E402
from validate.distributed.launch import RankFailure  # noqa: E402
from validate.measure.backends import measure  # noqa: E402


def dist_model(kind: str) -> ModelSpec:
    """The dist-ci rows' gpt2-ref or llama-ref (validate/matrices/rows/data-parallel.json)."""
    return next(c.spec for c in topic_cases("data-parallel", "cpu") if c.name == f"{kind}-W2-none")


if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SPEC = ModelSpec.make(family="gpt2", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                      max_position_embeddings=64, implementation="reference")
TRAIN = TrainingConfig(micro_batch=2, seq_len=32, device="cpu")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---- tracker (no processes) --------------------------------------------------------------------
def test_tracker_counts_wrapper_subclass_inner_tensors_not_the_wrapper():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    with DistTracker() as tr:
        a, b = torch.zeros(100), torch.zeros(100)
        t = two_tensor.TwoTensor(a, b)
        tr.track_tensor(t)
        assert tr.live == 800  # a and b, once each; the wrapper has no memory of its own
        del a, b, t
    assert tr.live == 0


def test_tracker_sees_storage_resize_and_restores_resize_after_exit():
    original = torch.UntypedStorage.resize_
    with DistTracker() as tr:
        t = torch.empty(256)
        t.untyped_storage().resize_(0)  # FSDP2's free_storage
        assert tr.live == 0
        t.untyped_storage().resize_(1024)  # FSDP2's alloc_storage
        assert tr.live == 1024 and tr.peak == 1024
    assert torch.UntypedStorage.resize_ == original


def test_parallelism_from_arguments_or_training_config():
    assert resolve_parallelism(TRAIN, None, None) == (1, "none")
    assert resolve_parallelism(TRAIN, 4, "zero2") == (4, "zero2")
    if "world_size" in TrainingConfig.model_fields:  # memcalc's own fields, when it has them
        own = TRAIN.with_(world_size=2, sharding="zero3")
        assert resolve_parallelism(own, None, None) == (2, "zero3")
        with pytest.raises(Exception, match="conflicts with TrainingConfig.world_size"):
            resolve_parallelism(own, 4, None)


@pytest.mark.slow
# ---- launcher ----------------------------------------------------------------------------------
def test_failing_rank_is_reported_with_its_error_and_all_ranks_end():
    with pytest.raises(RankFailure) as info:
        measure_distributed(SPEC, TRAIN, 2, "zero3", fail_rank=1, timeout_s=60, grace_s=5)
    err = info.value
    assert "ValueError: injected failure on rank 1" in err.errors[1]
    assert "rank 1: ValueError: injected failure on rank 1" in str(err)
    assert 0 in err.errors  # the peer either failed in its collective or was killed
    assert "injected failure" in err.details  # the failing rank's traceback
    assert all(_gone(pid) for pid in err.pids)


@pytest.mark.slow
def test_hanging_rank_is_killed_at_the_timeout_never_a_hang():
    with pytest.raises(RankFailure) as info:
        measure_distributed(SPEC, TRAIN, 2, "none", hang_rank=1, timeout_s=8,
                            collective_timeout_s=120)
    err = info.value
    assert "timed out after 8 s" in str(err)
    assert "killed" in err.errors[1]
    assert all(_gone(pid) for pid in err.pids)


@pytest.mark.slow
# ---- peaks -------------------------------------------------------------------------------------
def test_zero3_per_rank_peak_falls_as_world_size_grows_and_breakdown_adds_up():
    # the dist-ci GPT-2 (h=128, L=3, V=1000, s=64): its forward peak is at the loss, where the
    # forward formula of DISTRIBUTED_MEMORY.md 6.3 applies
    spec, train = dist_model("gpt2-ref"), TrainingConfig(micro_batch=2, seq_len=64, device="cpu")
    two = measure_distributed(spec, train, 2, "zero3", events=True)
    four = measure_distributed(spec, train, 4, "zero3")
    assert len({r["peak_bytes"] for r in two}) == 1  # no padding: ranks are identical
    assert max(r["peak_bytes"] for r in four) < min(r["peak_bytes"] for r in two)
    # the per-site breakdown at the peak accounts for every byte, FSDP's buffers included
    at = two[0]["extra"]["peak_at"]
    assert sum(at["breakdown"].values()) == two[0]["peak_bytes"]
    assert {"fsdp.sharded_param", "fsdp.unsharded_param", "optimizer.state"} <= set(at["breakdown"])
    # the sharded parameters are exactly 1/W of the model (every dim-0 here divides by 2 and 4)
    assert two[0]["extra"]["fsdp2"]["local_param_bytes"] * 2 == 4 * spec.param_count
    assert four[0]["extra"]["fsdp2"]["local_param_bytes"] * 4 == 4 * spec.param_count
    # second method: every buffer's size from the parameter shapes alone, and the forward and
    # optimizer peaks as shifts of the single-process peaks (DISTRIBUTED_MEMORY.md 5 and 6.3)
    layout = Layout(spec, train)
    assert component_misses(layout, two[0]) == {}
    single = measure(spec, train).phases
    for ranks in (two, four):
        want = phase_peaks(single, layout, len(ranks), "zero3", 0)
        assert ranks[0]["phases"]["forward"] == want["forward"]
        assert ranks[0]["phases"]["optimizer"] == want["optimizer"]
        assert ranks[0]["phases"]["backward"] >= want["backward_floor"]


@pytest.mark.slow
def test_ddp_peak_is_single_process_peak_plus_one_bucket_copy_of_the_parameters():
    single = measure(SPEC, TRAIN)
    ranks = measure_distributed(SPEC, TRAIN, 2, "none")
    assert all(r["peak_bytes"] >= single.peak_bytes for r in ranks)
    # gradient_as_bucket_view=False: the reducer's flat buckets (4 bytes a parameter) are the
    # only addition; activations and model states are those of one process
    assert ranks[0]["peak_bytes"] - single.peak_bytes == 4 * SPEC.param_count
    assert ranks[0]["extra"]["late_bytes"] < 1024  # nothing sizeable made outside the tracker


@pytest.mark.parametrize("changes,field", [
    (dict(optimizer="sgd-momentum", optimizer_impl="fused"), "optimizer_impl"),
    (dict(sequence_parallel=True, seq_len=30), "seq_len"),
])
def test_tensor_parallel_runs_refuse_what_torch_or_the_split_cannot_do(changes, field):
    from validate.distributed.measure import check_distributed

    spec = ModelSpec.make(family="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                          intermediate_size=64, implementation="reference")
    t = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", world_size=4, tensor_parallel=4)
    with pytest.raises(MemcalcError) as info:
        check_distributed(spec, t.with_(**changes), 4, "none")
    assert str(info.value).startswith(f"{field}:")


def _tp_losses(rank, world, port, sequence_parallel, queue):
    import torch.distributed as dist

    from validate.models.reference import build_reference
    from validate.distributed.tensor_parallel import apply_tensor_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = []
    for spec in (dist_model("gpt2-ref"), dist_model("llama-ref")):
        spec = spec.with_(num_layers=2)
        t = TrainingConfig(micro_batch=2, seq_len=8, device="cpu", world_size=world,
                           tensor_parallel=world, sequence_parallel=sequence_parallel)
        torch.manual_seed(0)
        model = build_reference(spec, t)
        ids = torch.randint(0, spec.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
        single = model(ids, ids).item()
        apply_tensor_parallel(model, spec, world, sequence_parallel)
        out.append((single, model(ids, ids).item()))
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_plans_compute_the_single_device_loss(sequence_parallel):
    # a second method for the runner: the sharded models (GPT-2's fused QKV rows reordered per
    # rank, SP's chunked trunk) must compute what one process computes
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_tp_losses, args=(2, port, sequence_parallel, queue), nprocs=2,
                       start_method="spawn")
    for single, parallel in queue.get():
        assert parallel == pytest.approx(single, rel=1e-5)
