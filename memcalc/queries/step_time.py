"""A stated step-time model for a layout on a cluster: compute, pipeline bubble, tensor- and
data-parallel communication, each term with its source. It ranks layouts; it is not a
measurement (no GPU run has been recorded, README).

    step = compute x (1 + bubble) + tp_comm + dp_comm       (no overlap assumed: an upper estimate)

compute: FLOPs per GPU / (peak TFLOPS of the precision x MFU). FLOPs of one step over the
T = global_batch * seq_len tokens (Kaplan et al. 2020, sec. 2.1: 6N per token for forward +
backward; Korthikanti et al. 2022, appendix: attention adds 12 * L * h_attn * s per token):
the decoder layers' FLOPs are split over the tensor-parallel ranks, the LM head runs whole on
every tensor-parallel rank (memcalc's TP plan replicates it: memcalc.parallel.tensor), and the
data-parallel replicas share the tokens. Recomputation (memcalc.queries.planner.step_flops):
per-layer/sqrt/every-k checkpointing repeat the layers' forward, selective only the attention core.

bubble: pipeline idle fraction, (p - 1) / m for GPipe and 1F1B with m micro-batches on p stages
(Narayanan et al. 2021, sec. 2.2.1), (p - 1) / (v m) for interleaved 1F1B with v stages per rank
(sec. 2.2.2). Only p = 1 is searched until pipeline memory is modelled, so the term is 0.

tp_comm: Megatron tensor parallelism (Shoeybi et al. 2019, sec. 3, Fig. 4) all-reduces the
(b, s, h) activations twice per layer in forward and twice in backward, two more when per-layer
checkpointing repeats the forward (Korthikanti et al. 2022, sec. 5); sequence parallelism swaps each
all-reduce for an all-gather plus a reduce-scatter of the same volume (sec. 4.2.2). A ring
all-reduce of n bytes moves 2 (t - 1) / t * n bytes through each rank's link (NCCL's "bus bandwidth",
nccl-tests doc/PERFORMANCE.md); tensor-parallel groups stay inside a node (NVLink).

dp_comm: per optimizer step, over the data-parallel group of d ranks, each holding P parameters
(one tensor-parallel rank's): DDP all-reduces the gradients once (2 (d - 1) / d * P bytes, as under
no_sync accumulation); ZeRO-1 adds the broadcast of the updated parameters ((d - 1) / d * P,
torch ZeroRedundancyOptimizer._sync_params); FSDP2 all-gathers the parameters and reduce-scatters
the gradients on every micro-step (zero2: 2 (d - 1) / d * P, zero3 gathers again in backward:
3 (d - 1) / d * P; Rajbhandari et al. 2020, sec. 7.2). The link is NVLink while the whole
layout fits in one node, else the node's network link per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.core.errors import MemcalcError

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec

INTRA_NODE_GBPS = 450.0
"""GB/s per GPU and direction inside a node: NVLink 4 on H100 SXM, 900 GB/s bidirectional
(NVIDIA H100 datasheet)."""
INTER_NODE_GBPS = 50.0
"""GB/s per GPU across nodes: one 400 Gb/s ConnectX-7 InfiniBand port per GPU (NVIDIA DGX H100
user guide, networking)."""
GPUS_PER_NODE = 8
"""GPUs per node (DGX/HGX H100)."""
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True)
class Links:
    """The stated bandwidths of a cluster, GB/s (10**9 bytes/s) per GPU and direction."""

    intra_node_gbps: float = INTRA_NODE_GBPS
    inter_node_gbps: float = INTER_NODE_GBPS
    gpus_per_node: int = GPUS_PER_NODE

    def link_gbps(self, gpus_spanned: int) -> float:
        """The bandwidth of a collective over a group spanning `gpus_spanned` consecutive GPUs.

        >>> Links().link_gbps(8), Links().link_gbps(16)
        (450.0, 50.0)
        """
        return self.intra_node_gbps if gpus_spanned <= self.gpus_per_node else self.inter_node_gbps


def layer_and_head_flops(model: ModelSpec, tokens: int, seq_len: int, checkpointing: str) -> tuple[int, int]:
    """(decoder layers', LM head's) FLOPs of forward + backward (+ recomputation) over `tokens`.
    Their sum is memcalc.queries.planner.step_flops less the head's recomputation (the head is
    never checkpointed).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> from memcalc.queries.planner import step_flops
    >>> m = ModelSpec.preset("gpt2")
    >>> sum(layer_and_head_flops(m, 4 * 1024, 1024, "none")) == step_flops(m, 4, 1024, "none")
    True
    """
    from memcalc.queries.planner import matmul_params

    head = model.vocab_size * model.hidden_size
    dense = 2 * (matmul_params(model) - head) * tokens
    attention = 4 * model.num_layers * model.num_heads * model.head_size * seq_len * tokens
    recompute = {"none": 0, "selective": attention}.get(checkpointing, dense + attention)
    return 3 * (dense + attention) + recompute, 3 * 2 * head * tokens


def bubble_fraction(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle fraction of a pipeline step (Narayanan et al. 2021, sec. 2.2).

    >>> bubble_fraction("1f1b", 4, 8), bubble_fraction("interleaved-1f1b", 4, 8, 2), bubble_fraction("1f1b", 1, 1)
    (0.375, 0.1875, 0.0)
    """
    if schedule not in SCHEDULES:
        raise MemcalcError("pipeline_schedule", f"unknown schedule {schedule!r}", f"use one of {SCHEDULES}")
    return (stages - 1) / (microbatches * (virtual if schedule == "interleaved-1f1b" else 1))


def ring_bytes(nbytes: float, group: int, factor: float) -> float:
    """Bytes through each rank's link for a collective of `factor` x (group - 1) / group x nbytes
    (factor 2 for an all-reduce, 1 for an all-gather or a reduce-scatter).

    >>> ring_bytes(100, 4, 2)
    150.0
    """
    return factor * (group - 1) / group * nbytes


def tp_comm_bytes(model: ModelSpec, tokens_per_replica: int, tensor_parallel: int,
                  checkpointing: str, act_elt: int) -> float:
    """Bytes through each tensor-parallel rank's link in one step (module docstring).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> m = ModelSpec.preset("gpt2")
    >>> tp_comm_bytes(m, 1024, 2, "none", 2) == 12 * 4 * 1024 * 768 * 2  # 4 all-reduces of half the bytes x2
    True
    """
    if tensor_parallel == 1:
        return 0.0
    allreduces = 4 + (2 if checkpointing in ("per-layer", "sqrt", "every-k") else 0)
    per_layer = tokens_per_replica * model.hidden_size * act_elt
    return model.num_layers * allreduces * ring_bytes(per_layer, tensor_parallel, 2)


def dp_comm_bytes(params: int, data_parallel: int, sharding: str, grad_accum: int,
                  gather_elt: int, reduce_elt: int) -> float:
    """Bytes through each data-parallel rank's link in one optimizer step (module docstring);
    `params` is one tensor-parallel rank's parameter count.

    >>> dp_comm_bytes(1000, 4, "none", 8, 4, 4), dp_comm_bytes(1000, 4, "zero3", 2, 2, 2)
    (6000.0, 9000.0)
    """
    if data_parallel == 1:
        return 0.0
    gather, reduce = params * gather_elt, params * reduce_elt
    if sharding == "none":
        return ring_bytes(reduce, data_parallel, 2)
    if sharding == "zero1":
        return ring_bytes(reduce, data_parallel, 2) + ring_bytes(gather, data_parallel, 1)
    gathers = 2 if sharding == "zero3" else 1
    return grad_accum * (ring_bytes(gather, data_parallel, gathers) + ring_bytes(reduce, data_parallel, 1))


@dataclass(frozen=True)
class StepTime:
    """A step's time and its terms, seconds."""

    compute_s: float
    bubble_s: float
    tp_comm_s: float
    dp_comm_s: float

    @property
    def total_s(self) -> float:
        """compute + bubble + tensor- and data-parallel communication (no overlap)."""
        return self.compute_s + self.bubble_s + self.tp_comm_s + self.dp_comm_s

    def as_dict(self) -> dict:
        """The terms and the total, for --json."""
        return {"compute_s": self.compute_s, "bubble_s": self.bubble_s, "tp_comm_s": self.tp_comm_s,
                "dp_comm_s": self.dp_comm_s, "total_s": self.total_s}


__all__ = ["Links", "StepTime", "layer_and_head_flops", "bubble_fraction", "tp_comm_bytes",
           "dp_comm_bytes", "ring_bytes", "INTRA_NODE_GBPS", "INTER_NODE_GBPS", "GPUS_PER_NODE"]
