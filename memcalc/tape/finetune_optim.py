"""Fine-tuning optimizers: bitsandbytes 0.50.2 AdamW8bit / PagedAdamW8bit / PagedAdamW and
transformers' Adafactor (defaults), state tensors and step temporaries, parameter by parameter.

bitsandbytes (bitsandbytes/optim/optimizer.py Optimizer2State.init_state, update_step):
- states and the shared qmaps: the one rule of memcalc.tape.bnb_states (min_8bit_size, fp32
  absmax per 256-element block, paged states outside the allocator: memcalc predicts the
  allocator's peak and leaves them out; paged_state_bytes gives their size).
- CUDA step: one fused kernel per parameter, no temporaries (backends/cuda/ops.py). CPU step
  (backends/cpu/ops.py, Python): 8-bit: both states dequantised to fp32, grad.float() * 1.0,
  sqrt and its quotient: 5 x 4n alive together (+4n p.float() for bf16 parameters); 32-bit:
  g.float() * 1.0, sqrt, + eps and the quotient: 3 x 4n (+4n for bf16). Freed when the kernel
  returns (measured with validate.measure.tracker seeing inside the kernel).

Adafactor (transformers/optimization.py Adafactor.step; beta1=None, relative_step=True):
- states fp32 (`.to(grad)` with grad upcast to fp32): exp_avg_sq_row = zeros(shape[:-1]) and
  exp_avg_sq_col = zeros(shape[:-2] + shape[-1:]) (dims 0 and 1 of a 2-D parameter; E*R and E*C
  of a 3-D (E, R, C) MoE expert weight: factored over the last two dims), or exp_avg_sq (n) for
  1-D; `RMS`, a 0-dim fp32 tensor.
- temporaries, per parameter, fp32 (bf16 parameters add the fp32 copies of the grad and of the
  parameter, bound to locals until the next parameter rebinds them): `update = grad**2 + eps`
  (2 x 4n, while the previous parameter's `update` is still bound); factored, `_approx_sq_grad`'s
  row and column factors (the states' sizes) and their product beside the old update: 2 x 4n + 4(rows + cols);
  `p.add_(-update)`: 2 x 4n; the learning rate is a 0-dim tensor (param_scale = RMS when RMS >
  eps[1] = 1e-3, the weights' case) alive across the loop: 4 bytes counted always.
"""
from __future__ import annotations

from memcalc.allocator.rules import round_up
from memcalc.tape import bnb_states
from memcalc.tape.bnb_states import BNB, BNB_8BIT, MIN_8BIT_SIZE, QMAP_BYTES  # noqa: F401  (re-exported)

THIRTY_TWO_BIT = {"adamw-8bit": "adamw-32bit", "paged-adamw-8bit": "paged-adamw"}
"""The same optimizer with optim_bits=32 for one parameter (GlobalOptimManager's module override,
which the HF Trainer registers for nn.Embedding weights): 'adamw-32bit' is internal, two fp32
states and the 32-bit update's temporaries."""
SCALAR = 4  # a 0-dim fp32 tensor


def factored(numel: int, rows: int, last2: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """Elements of Adafactor's (exp_avg_sq_row, exp_avg_sq_col) for a parameter of `numel`
    elements, dim 0 `rows` (== numel when 1-D) and, at >= 3 dims, last two dims `last2`: shape[:-1]
    and shape[:-2] + shape[-1:] (transformers/optimization.py Adafactor.step); None when 1-D.

    >>> factored(6000, 100), factored(4 * 128 * 64, 4, (128, 64)), factored(200, 200)
    ((100, 60), (512, 256), None)
    """
    if last2 is not None:
        r, c = last2
        return numel // c, numel // r
    return (rows, numel // rows) if rows != numel else None


def state_allocations(optimizer: str, numel: int, rows: int, device: str,
                      last2: tuple[int, int] | None = None) -> list[int]:
    """Bytes of each state tensor a parameter of `numel` elements (dim 0 `rows`, == numel when
    1-D; last two dims `last2` at >= 3 dims) gets on the device, in creation order (paged CUDA
    states excluded). bitsandbytes sizes by numel only: memcalc.tape.bnb_states.state_bytes.

    >>> state_allocations("adamw-8bit", 4096 * 2, 64, "cpu")
    [8192, 8192, 128, 128]
    >>> state_allocations("adamw-8bit", 100, 100, "cpu")
    [400, 400]
    >>> state_allocations("adafactor", 6000, 100, "cpu"), state_allocations("adafactor", 200, 200, "cpu")
    ([400, 240, 4], [800, 4])
    >>> state_allocations("adafactor", 4 * 128 * 64, 4, "cpu", (128, 64))
    [2048, 1024, 4]
    >>> state_allocations("paged-adamw", 200_000, 200, "cuda")
    []
    """
    if optimizer == "adafactor":
        sq = factored(numel, rows, last2)
        if sq is not None:
            return [4 * sq[0], 4 * sq[1], SCALAR]
        return [4 * numel, SCALAR]
    return bnb_states.state_bytes(optimizer, numel, device)


def paged_state_bytes(optimizer: str, numels: list[int], device: str) -> int:
    """Bytes of unified (managed) memory the paged optimizers hold, outside torch's allocator
    (memcalc.tape.bnb_states.paged_bytes).

    >>> paged_state_bytes("paged-adamw-8bit", [200_000, 100], "cuda")
    400000
    """
    return bnb_states.paged_bytes(optimizer, numels, device)


def shared_allocations(optimizer: str, numels: list[int], device: str) -> list[int]:
    """The qmaps of an 8-bit optimizer (memcalc.tape.bnb_states.shared_bytes).

    >>> shared_allocations("adamw-8bit", [10], "cpu"), shared_allocations("adamw-8bit", [10], "cuda")
    ([1024, 1024], [])
    """
    return bnb_states.shared_bytes(optimizer, numels, device)


def _bnb_temporaries(optimizer: str, numel: int, param_elt: int, device: str) -> list[int]:
    if device == "cuda":
        return []
    copies = 5 if bnb_states.eight_bit(optimizer, numel) else 3
    return [4 * numel] * (copies + (param_elt != 4))


def _adafactor_moments(numel: int, sq: tuple[int, int] | None, param_elt: int,
                       prev: tuple[int, int]) -> list[list[int]]:
    """Allocations alive at each candidate moment of one parameter's update (`sq`: the factored
    states' elements, None when 1-D); `prev` is the previous parameter's (update, fp32
    parameter copy) bytes still bound to locals."""
    full = 4 * numel
    copies = [full, full] if param_elt != 4 else []  # grad.float(), p.float()
    prev_update, prev_copy = prev
    moments = [[prev_update, full, full] + copies,  # update = grad**2 + eps
               [full, full] + copies]  # -update (and the 1-D rsqrt)
    if param_elt != 4:
        moments.append([prev_update, prev_copy, full])  # grad.float(), before p is rebound
    if sq is not None:  # _approx_sq_grad: r_factor and c_factor are the states' sizes
        moments.append([full, 4 * sq[0], 4 * sq[1], full] + copies)
    return [m + [SCALAR] for m in moments]  # the lr tensor


def step_temporaries(optimizer: str, shapes: list[tuple], param_elt: int,
                     device: str, g: int) -> list[int]:
    """Peak temporaries (each allocation rounded to `g`) while each parameter is updated, in
    model.parameters() order; `shapes`: (elements, dim 0[, last two dims or None]) each.

    >>> step_temporaries("adamw-8bit", [(8192, 64)], 4, "cpu", 1)
    [163840]
    >>> step_temporaries("adamw-8bit", [(8192, 64)], 4, "cuda", 512)
    [0]
    >>> step_temporaries("adafactor", [(6000, 100), (200, 200)], 4, "cpu", 1)
    [48644, 25604]
    >>> step_temporaries("adafactor", [(4 * 128 * 64, 4, (128, 64))], 4, "cpu", 1)
    [265220]
    """
    out = []
    prev = (0, 0)
    for numel, rows, *last2 in shapes:
        if optimizer == "adafactor":
            moments = _adafactor_moments(numel, factored(numel, rows, *last2), param_elt, prev)
            out.append(max(sum(round_up(a, g) for a in m) for m in moments))
            prev = (4 * numel, 4 * numel if param_elt != 4 else 0)
        else:
            out.append(sum(round_up(a, g) for a in _bnb_temporaries(optimizer, numel, param_elt, device)))
    return out
