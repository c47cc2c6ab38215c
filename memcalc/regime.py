"""The regime of a training step, derived once from TrainingConfig: element sizes, parallel
layout, optimizer and checkpoint segments. Every other module reads these here instead of
re-deciding them from the config's strings.

Element sizes (bytes per element):
- parameters, their gradients and optimizer states take the parameter dtype: fp32 except under
  pure bf16 (`model.to(torch.bfloat16)`); autocast leaves parameters fp32 (torch/amp/autocast_mode.py);
- matmul outputs take the compute dtype: the autocast dtype under fp16-amp/bf16-amp, bf16 under
  pure bf16 (aten/src/ATen/autocast_mode.cpp lower_precision_fp list);
- floating-point buffers follow the parameters (`Module.to` casts them), except under FSDP2's
  MixedPrecisionPolicy, which casts only the all-gathered parameters (buffers stay fp32);
- optimizer states and sharded parameters under MixedPrecisionPolicy(param_dtype=bf16) stay fp32
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: the sharded parameter keeps its dtype).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from memcalc.allocator import granularity
from memcalc.training import TrainingConfig

# optimizer state tensors per parameter, each of the parameter's shape and dtype
# (torch/optim/adam.py, adamw.py: exp_avg, exp_avg_sq; sgd.py: momentum_buffer)
STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}
AUTOCAST_PRECISIONS = ("fp16-amp", "bf16-amp")


def param_element_size(precision: str) -> int:
    """Bytes per parameter element (and per gradient and optimizer-state element).

    >>> param_element_size("bf16-amp"), param_element_size("bf16")
    (4, 2)
    """
    return 2 if precision == "bf16" else 4


def compute_element_size(precision: str) -> int:
    """Bytes per element of a matmul output.

    >>> compute_element_size("fp32"), compute_element_size("fp16-amp")
    (4, 2)
    """
    return 4 if precision == "fp32" else 2


def sqrt_segment_size(num_layers: int) -> int:
    """Layers per segment under 'sqrt' checkpointing: round(sqrt(L)) (Chen et al. 2016, sec. 4).

    >>> sqrt_segment_size(16)
    4
    """
    return max(1, round(math.sqrt(num_layers)))


@dataclass(frozen=True)
class Regime:
    """What a TrainingConfig means for memory, decided once.

    >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, precision="bf16-amp"))
    >>> r.autocast, r.compute_elt, r.param_elt, r.granularity
    (True, 2, 4, 512)
    """

    precision: str
    """The precision the program runs in (bf16 under FSDP2's MixedPrecisionPolicy)."""
    device: str
    autocast: bool
    compute_elt: int
    param_elt: int
    buffer_elt: int
    master_elt: int
    """Bytes per element of optimizer states and FSDP's sharded parameters and gradients."""
    granularity: int
    """Every allocation is rounded up to this many bytes (memcalc.allocator)."""
    tensor_parallel: int
    sequence_parallel: bool
    data_parallel: int
    sharding: str
    optimizer: str
    optimizer_impl: str
    weight_decay: float
    checkpointing: str
    checkpoint_every: int | None
    attention: str
    grad_accum: int
    max_grad_norm: float | None = None
    """Gradient clipping (clip_grad_norm_) before the optimizer step, or None."""

    @classmethod
    def of(cls, training: TrainingConfig) -> "Regime":
        """The regime of a training config."""
        mixed = training.fsdp_mixed_precision
        precision = "bf16" if mixed else training.precision
        param_elt = param_element_size(precision)
        return cls(precision=precision, device=training.device,
                   autocast=precision in AUTOCAST_PRECISIONS,
                   compute_elt=compute_element_size(precision), param_elt=param_elt,
                   buffer_elt=4 if mixed else param_elt, master_elt=4 if mixed else param_elt,
                   granularity=granularity(training.device),
                   tensor_parallel=training.tensor_parallel,
                   sequence_parallel=training.sequence_parallel and training.tensor_parallel > 1,
                   data_parallel=training.data_parallel, sharding=training.sharding,
                   optimizer=training.optimizer, optimizer_impl=training.resolved_optimizer_impl,
                   weight_decay=training.resolved_weight_decay,
                   checkpointing=training.checkpointing, checkpoint_every=training.checkpoint_every,
                   attention=training.attention, grad_accum=training.grad_accum,
                   max_grad_norm=training.max_grad_norm)

    @property
    def fsdp(self) -> bool:
        """Parameters sharded by FSDP2 (zero2/zero3 over more than one data-parallel rank)."""
        return self.data_parallel > 1 and self.sharding in ("zero2", "zero3")

    @property
    def replicated(self) -> bool:
        """Data parallel with every rank holding whole parameters (DDP, ZeRO-1)."""
        return self.data_parallel > 1 and not self.fsdp

    @property
    def states_per_param(self) -> int:
        """Optimizer state tensors per parameter."""
        return STATES_PER_PARAM[self.optimizer]

    @property
    def step_on_device(self) -> bool:
        """Adam's `step` counters are device tensors when fused (or on the CPU device), else CPU
        scalars that device memory does not see (torch/optim/adam.py _init_group)."""
        return self.device == "cpu" or self.optimizer_impl == "fused"

    @property
    def selective(self) -> bool:
        """Only the attention core is checkpointed (Korthikanti et al. 2022)."""
        return self.checkpointing == "selective"

    def segment_starts(self, num_layers: int) -> set[int]:
        """First layer of each checkpointed segment.

        >>> sorted(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="sqrt")).segment_starts(9))
        [0, 3, 6]
        """
        if self.checkpointing in ("none", "selective"):
            return set()
        k = {"per-layer": 1, "every-k": self.checkpoint_every or 1,
             "sqrt": sqrt_segment_size(num_layers)}[self.checkpointing]
        return set(range(0, num_layers, k))
