"""Model states from a parameter count alone: weights + gradients + optimizer states.

Bytes per parameter as torch allocates them (torch/optim/adam.py, adamw.py, sgd.py: states take the
parameter's dtype; autocast leaves parameters, hence gradients and states, in fp32):

    regime                       weights  grads  states (adam/adamw | sgd-momentum | sgd)
    fp32, fp16-amp, bf16-amp     4        4      8 | 4 | 0
    bf16 (pure)                  2        2      4 | 2 | 0

Fine-tuning optimizers, from a count alone, as one tensor of that many elements, by the
bitsandbytes state-size rule the engine uses too (memcalc.tape.bnb_states.optimizer_bytes):
below min_8bit_size (4096 elements) two fp32 states, 8 bytes/param; from it, adamw-8bit 2
bytes/param (uint8 state1, state2) + 8 bytes per block of 256 (fp32 absmax1, absmax2) + the two
shared qmaps (2 x 1 KiB: on CPU from construction, on CUDA with the first 8-bit parameter);
paged-adamw-8bit and paged-adamw the same, less state1/state2 on CUDA from 1e5 elements (managed
memory that torch's allocator does not count; paging is off on CPU); adafactor 0 (its factored
states, 4 x (rows + cols) per matrix, need the shapes: a lower bound; estimate() counts them,
and the fp32 states of small tensors).

Adam's per-tensor `step` counters are a few bytes per tensor, not per parameter, and are left out
(estimate() counts them). The ZeRO paper's mixed-precision figure (fp16 weights and grads plus fp32
master weights, momentum and variance: 2 + 2 + 12 = 16 bytes, Rajbhandari et al. 2020, sec. 3.1)
is `zero_paper_mixed_precision_bytes`; torch's autocast keeps no fp16 copy, so it is not a regime
of model_state_bytes.
"""
from __future__ import annotations

from memcalc.core.errors import MemcalcError, UnknownNameError, closest_names
from memcalc.engine.regime import STATES_PER_PARAM, param_element_size
from memcalc.inputs.training import FINE_TUNE_OPTIMIZERS, PRECISIONS, SHARDINGS
from memcalc.tape.bnb_states import optimizer_bytes

# bytes per element of the parameters (and so of their gradients and optimizer states)
PARAM_BYTES = {p: param_element_size(p) for p in PRECISIONS}
ZERO_PAPER_BYTES_PER_PARAM = 2 + 2 + 12


def _check_params(params: int) -> int:
    if isinstance(params, bool) or not isinstance(params, int) or params < 0:
        raise MemcalcError("params", f"must be a non-negative int, got {params!r}",
                           "pass the parameter count, e.g. ModelSpec.preset('gpt2').param_count")
    return params


def _lookup(table: dict, name: str, field: str) -> int:
    if name not in table:
        raise UnknownNameError(field, f"unknown {field} {name!r}",
                               f"use one of: {closest_names(str(name), list(table))}")
    return table[name]


def model_state_bytes(params: int, precision: str = "fp32", optimizer: str = "adam",
                      device: str = "cuda") -> int:
    """Weights + gradients + optimizer states of `params` parameters, in bytes.

    >>> model_state_bytes(7_000_000_000, precision="fp32", optimizer="adam")  # 16 bytes/param
    112000000000
    >>> model_state_bytes(1_000, precision="bf16", optimizer="sgd")
    4000
    >>> model_state_bytes(1_024, precision="bf16", optimizer="adamw-8bit")  # < 4096: fp32 states
    12288
    >>> model_state_bytes(8_192, precision="bf16", optimizer="adamw-8bit")  # 2+2 + 2 + 8/256 + qmaps
    51456
    """
    elt = _lookup(PARAM_BYTES, precision, "precision")
    _check_params(params)
    if optimizer in FINE_TUNE_OPTIMIZERS:
        return params * 2 * elt + fine_tune_state_bytes(params, optimizer, device)
    states = _lookup(STATES_PER_PARAM, optimizer, "optimizer")
    return params * elt * (2 + states)


def fine_tune_state_bytes(params: int, optimizer: str, device: str = "cuda") -> int:
    """Optimizer-state bytes of a fine-tuning optimizer from a parameter count alone, as one
    tensor (module docstring; a lower bound for adafactor).

    >>> fine_tune_state_bytes(4096, "adamw-8bit"), fine_tune_state_bytes(4096, "paged-adamw", "cpu")
    (10368, 32768)
    >>> fine_tune_state_bytes(4095, "adamw-8bit"), fine_tune_state_bytes(200_000, "paged-adamw")
    (32760, 0)
    """
    if optimizer == "adafactor" or params == 0:  # no parameter, no optimizer (torch refuses one)
        return 0
    return optimizer_bytes(optimizer, [params], device)


def zero_paper_mixed_precision_bytes(params: int) -> int:
    """The ZeRO paper's 16 bytes/param: fp16 weights and grads, fp32 master copy and Adam states.

    >>> zero_paper_mixed_precision_bytes(7_500_000_000)  # ZeRO sec. 3.1: 120 GB for 7.5B params
    120000000000
    """
    return _check_params(params) * ZERO_PAPER_BYTES_PER_PARAM


ZERO_STAGES = SHARDINGS


def zero_model_state_bytes(params: int, stage: str, world_size: int, k: int = 12) -> float:
    """Per-device model states as the ZeRO paper divides 16 bytes/param (Rajbhandari et al. 2020,
    sec. 5.1, Figure 1): 2 bytes of fp16 weights, 2 of fp16 gradients and K=12 of fp32 master
    weights, momentum and variance; stage 1 shards the K bytes, stage 2 also the gradients,
    stage 3 also the weights.

    >>> round(zero_model_state_bytes(7_500_000_000, "zero1", 64) / 1e9, 1)  # Figure 1: 31.4 GB
    31.4
    """
    _check_params(params)
    if world_size < 1:
        raise MemcalcError("world_size", f"must be >= 1, got {world_size}", "pass a positive rank count")
    sharded = {"none": 0, "zero1": k, "zero2": k + 2, "zero3": k + 4}[
        stage if stage in ZERO_STAGES else _lookup({s: 0 for s in ZERO_STAGES}, stage, "sharding")]
    return params * ((2 + 2 + k - sharded) + sharded / world_size)
