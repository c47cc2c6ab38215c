"""The optimizer step's memory (torch/optim/adam.py, adamw.py, sgd.py, torch 2.x).

States (created lazily at the first step, same dtype as the parameter): Adam/AdamW exp_avg and
exp_avg_sq, plus a 4-byte `step` tensor per parameter (on the device when fused); SGD with momentum
one momentum_buffer (grad.clone() at the first step).
Temporaries in steady state:
- for-loop Adam(W): `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: two
  parameter-sized tensors at once, for one parameter at a time (the largest sets the peak);
  Adam with weight decay also makes `grad.add(param)` (one more);
- foreach Adam(W): `torch._foreach_sqrt(exp_avg_sqs)`: one copy of every state tensor of the
  group at once; Adam with weight decay first makes `_foreach_add(grads, params)`, another full
  copy, deleted (`del device_grads`) before the sqrt (torch 2.13 adam.py _multi_tensor_adam;
  measured: the optimizer phase of Adam foreach with weight decay 0.1 equals its peak without,
  fp32 and pure bf16: one parameter-sized copy alive at a time, not two);
- fused: none at Python level (one kernel);
- SGD: for-loop/foreach with weight decay copy the grads (`grad.add(param)` / `_foreach_add`);
  otherwise in place.
"""
from __future__ import annotations

from memcalc.engine.regime import STATES_PER_PARAM


def state_bytes_per_param(optimizer: str, param_elt: int) -> int:
    """Bytes of optimizer state per parameter element.

    >>> state_bytes_per_param("adamw", 4)
    8
    """
    return STATES_PER_PARAM[optimizer] * param_elt


def step_scalar_bytes(optimizer: str, n_tensors: int) -> int:
    """Adam's per-parameter `step` counters (float32 scalars).

    >>> step_scalar_bytes("adam", 10)
    40
    """
    return 4 * n_tensors if optimizer in ("adam", "adamw") else 0


def _loop_peak(sizes: list[int], per_param: int, carried: int) -> int:
    """Peak temporaries of a per-parameter Python loop: `per_param` copies of the current
    parameter plus `carried` copies of the previous one still bound to a loop variable."""
    return max((per_param * s + carried * prev for prev, s in zip([0] + sizes, sizes)), default=0)


def transient_bytes(optimizer: str, impl: str, weight_decay: float, sizes: list[int]) -> int:
    """Peak temporaries of one optimizer.step() in steady state, over parameter byte sizes in
    model.parameters() order. For-loop Adam's `denom` of the previous parameter stays bound
    until the next assignment (measured with validate.measure.tracker), so it overlaps the next one's.

    >>> transient_bytes("adamw", "foreach", 0.01, [100, 300])
    400
    >>> transient_bytes("adamw", "for-loop", 0.01, [100, 300])
    700
    """
    total, largest = sum(sizes), max(sizes, default=0)
    coupled_wd = weight_decay > 0 and optimizer in ("adam", "sgd", "sgd-momentum")
    if impl == "fused":
        return 0
    if optimizer in ("adam", "adamw"):
        if impl == "foreach":  # the weight-decay copy is deleted before the sqrt's (module doc)
            return total
        return _loop_peak(sizes, 3 if coupled_wd else 2, 1)
    if coupled_wd:
        return total if impl == "foreach" else largest
    return 0


CUDA_CHUNK = 65536  # aten/src/ATen/native/cuda/MultiTensorApply.cuh kChunkSize


def clip_bytes(numels: list[int], grad_elt: int, device: str, g: int) -> int:
    """Peak temporaries of torch.nn.utils.clip_grad_norm_ (torch/nn/utils/clip_grad.py, its
    default foreach=None) over gradients of `numels` elements, `grad_elt` bytes each, every
    allocation rounded to `g`. _get_total_norm: the per-gradient norms, their torch.stack and
    the total norm; on CPU the norms are one 0-dim tensor each (torch._foreach_norm's CPU path
    and the foreach=False loop of linalg.vector_norm alike, measured); on CUDA _foreach_norm
    (ForeachReduceOp.cu) fills one (N,) tensor whose views it returns, after fp32 partial sums
    of N x max chunks (65536 elements a chunk) freed at its return. Then
    _clip_grads_with_norm_ holds the total, `total + 1e-6`, its reciprocal and the product
    (clip_coef) before clamp; `_foreach_mul_` scales in place. All in the gradients' dtype
    (measured on CPU with validate.measure.tracker). GradScaler.unscale_ before it (fp16-amp)
    unscales in place (torch._amp_foreach_non_finite_check_and_unscale_); its 0-dim found_inf
    and inv_scale are, like the scaler's other scalars, not modelled. Not selectable: foreach=False
    on CUDA (N 0-dim norms, at most N x 512 B more).

    >>> clip_bytes([10] * 28, 4, "cpu", 1)
    228
    >>> clip_bytes([10, 10], 4, "cuda", 512), clip_bytes([70_000] * 300, 4, "cuda", 512)
    (2048, 4096)
    """
    def r(nbytes: int) -> int:
        return -(-nbytes // g) * g

    n = len(numels)
    scalar, stacked = r(grad_elt), r(n * grad_elt)
    if device == "cuda":
        chunks = max((-(-k // CUDA_CHUNK) for k in numels), default=0)
        norms = max(r(4 * n * chunks) + stacked, stacked + stacked + scalar)
    else:
        norms = n * scalar + stacked + scalar
    return max(norms, 4 * scalar)
