"""Per-rank optimizer memory of data-parallel training (world_size > 1).

- sharding='none' is DistributedDataParallel: every rank holds the full model, and the Reducer
  allocates gradient buckets at construction that together hold one copy of every gradient
  (torch/csrc/distributed/c10d/reducer.cpp initialize_buckets; gradient_as_bucket_view=False),
  alive for the whole run (memcalc.engine.run counts them).
- sharding='zero1' is ZeroRedundancyOptimizer over DDP: optimizer states and the step's
  temporaries only for the rank's own parameters, assigned greedily, largest first, to the rank
  with the fewest elements so far (torch/distributed/optim/zero_redundancy_optimizer.py
  _partition_parameters); updated parameters are broadcast in place.
- sharding='zero2'/'zero3' is FSDP2: each rank's optimizer works on its own unpadded shards.
Measured on gloo CPU processes by validate.distributed.measure (validate/results/dist-ci.md).
"""
from __future__ import annotations

from memcalc.allocator.rules import round_up
from memcalc.parallel.fsdp import rank_elements, shard_rows
from memcalc.engine.regime import Regime
from memcalc.tape.optimizer import step_scalar_bytes, transient_bytes

__all__ = ["zero1_partition", "rank_optimizer_bytes", "ownership", "rank_optimizer_bytes_all"]


def zero1_partition(numels: list[int], world_size: int) -> list[list[int]]:
    """Parameter indices per rank, in the order the rank's optimizer visits them.

    >>> zero1_partition([10, 40, 30, 20], 2)
    [[1, 0], [2, 3]]
    """
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)  # stable
    owned: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in order:
        rank = load.index(min(load))
        owned[rank].append(i)
        load[rank] += numels[i]
    return owned


def rank_optimizer_bytes(param_bytes: list[int], regime: Regime, owned: list[int]) -> tuple[int, int]:
    """(state bytes, peak step temporaries) of the optimizer on one rank's parameters; each
    state tensor is its own allocation (rounded on its own).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> rank_optimizer_bytes([400, 800], Regime.of(TrainingConfig(micro_batch=1, seq_len=1, device="cpu")), [1])
    (1604, 1600)
    """
    g = regime.granularity
    mine = [param_bytes[i] for i in owned]
    states = sum(regime.states_per_param * round_up(b, g) for b in mine)
    if regime.step_on_device:
        states += len(mine) * round_up(step_scalar_bytes(regime.optimizer, 1), g)
    temps = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay, mine)
    return states, temps


def ownership(param_bytes: list[int], param_elt: int, regime: Regime) -> list[list[int]]:
    """Which parameters each rank optimizes: all of them under DDP, its partition under zero1.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=1, world_size=2, sharding="zero1")
    >>> ownership([40, 80, 40], 4, Regime.of(t))
    [[1], [0, 2]]
    """
    if regime.sharding == "zero1":
        return zero1_partition([b // param_elt for b in param_bytes], regime.data_parallel)
    return [list(range(len(param_bytes)))] * regime.data_parallel


def rank_optimizer_bytes_all(shapes: list[tuple[int, int]], param_elt: int,
                             regime: Regime) -> list[tuple[int, int]]:
    """(state bytes, step temporaries) per rank, from (elements, dim 0) of each parameter in
    module order; `param_elt` is the optimizer's bytes per element. FSDP2: Adam states are
    zeros_like of the local unpadded shard, so a rank holding a short last chunk holds less
    (validate/DISTRIBUTED_MEMORY.md 5.4).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=1, device="cpu", world_size=2, sharding="zero3")
    >>> rank_optimizer_bytes_all([(6, 3)], 4, Regime.of(t))
    [(36, 32), (20, 16)]
    """
    world = regime.data_parallel
    if regime.fsdp:
        # ranks below `whole` hold a whole chunk of every parameter: the same bytes, computed once
        whole = min((rows // shard_rows(rows, world) for _, rows in shapes if rows), default=world)
        out, same = [], None
        for rank in range(world):
            if rank < whole and same is not None:
                out.append(same)
                continue
            local = [rank_elements(n, rows, world, rank) * param_elt for n, rows in shapes]
            out.append(rank_optimizer_bytes(local, regime, list(range(len(local)))))
            same = out[-1] if rank < whole else same
        return out
    param_bytes = [n * param_elt for n, _ in shapes]
    return [rank_optimizer_bytes(param_bytes, regime, owned)
            for owned in ownership(param_bytes, param_elt, regime)]
