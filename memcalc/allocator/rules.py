"""The device allocator's rules, in one place.

- CUDA's caching allocator hands out multiples of 512 bytes (kMinBlockSize;
  c10/cuda/CUDACachingAllocator.cpp round_size), so every storage is rounded up to 512 B;
  on CPU validate.measure.tracker counts exact storage bytes (granularity 1).
- cuBLAS allocates its workspace through the caching allocator at the first matmul and keeps it:
  CUBLAS_WORKSPACE_CONFIG default ":4096:8" = 4 MiB x 8 on sm90 (4096 KiB*2 + 16 KiB*8 ~ 8 MiB on
  older GPUs; aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize). Not yet validated
  on a GPU.
Block splitting is not modelled (docs/known-gaps.md).
"""
from __future__ import annotations

from memcalc.core.units import MIB

CUDA_BLOCK_BYTES = 512
CUBLAS_WORKSPACE_BYTES = 32 * MIB


def granularity(device: str) -> int:
    """Bytes every allocation is rounded up to on `device`.

    >>> granularity("cuda"), granularity("cpu")
    (512, 1)
    """
    return CUDA_BLOCK_BYTES if device == "cuda" else 1


def round_up(nbytes: int, g: int) -> int:
    """`nbytes` rounded up to a multiple of `g`.

    >>> round_up(513, 512), round_up(0, 512)
    (1024, 0)
    """
    return -(-nbytes // g) * g


def device_constants(device: str) -> dict[str, int]:
    """Allocations held for the whole run by the device's libraries.

    >>> device_constants("cuda")
    {'cublas_workspace': 33554432}
    """
    return {"cublas_workspace": CUBLAS_WORKSPACE_BYTES} if device == "cuda" else {}
