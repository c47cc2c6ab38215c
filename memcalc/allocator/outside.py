"""Device memory a training process holds outside the caching allocator, by GPU generation: what
nvidia-smi (NVML's used memory) shows beyond max_memory_reserved.

- The CUDA context (driver state, the loaded kernel modules of torch, cuBLAS, cuDNN): torch sets
  CUDA_MODULE_LOADING=LAZY when it is unset (torch/cuda/__init__.py _lazy_init, torch >= 1.13 with
  CUDA >= 11.7; CUDA >= 12.2 loads lazily by default on Linux), so only the kernels the step runs are
  loaded. Reported at about 300-500 MiB per process with lazy loading and over 1 GiB without
  (../shared/memory-facts.md, from public reports); memcalc takes 500 MiB (memcalc.inputs.gpus.
  CONTEXT_MIB, the upper end) on every generation: NOT measured here on any GPU (no GPU run yet;
  scripts/gpu_run.sh records NVML's used memory beside max_memory_reserved to measure it).
- Library workspaces: the cuBLAS / cuBLASLt workspace goes through the caching allocator
  (CublasHandlePool.cpp), so it is an allocation in the engine's sequence (memcalc.allocator.rules:
  32 MiB), not part of this figure; NCCL's buffers (multi-GPU runs) are outside the allocator and
  not modelled here (NCCL_BUFFSIZE, 4 MiB per channel and peer).
On device="cpu" there is no device context: device bytes are the allocated bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from memcalc.core.units import MIB

LAZY = "torch >= 1.13, CUDA >= 11.7 (lazy module loading)"
FIGURE_SOURCE = ("assumed: 300-500 MiB reported with lazy module loading (../shared/memory-facts.md; "
                 "torch/cuda/__init__.py _lazy_init sets CUDA_MODULE_LOADING=LAZY); not measured here")


@dataclass(frozen=True)
class Outside:
    """Bytes one process holds on the device outside the caching allocator, on one generation."""

    generation: str
    gpus: tuple[str, ...]
    """memcalc.inputs.gpus catalogue names of this generation."""
    context_bytes: int
    applies_to: str
    source: str


def _row(generation: str, gpus: tuple[str, ...]) -> Outside:
    return Outside(generation, gpus, 500 * MIB, LAZY, FIGURE_SOURCE)


OUTSIDE: tuple[Outside, ...] = (
    _row("Volta (sm70)", ("V100-16GB", "V100-32GB")),
    _row("Ampere (sm80, sm86)", ("A100-40GB", "A100-80GB", "A10G", "RTX-3090")),
    _row("Ada (sm89)", ("L4", "L40S", "RTX-4090")),
    _row("Hopper (sm90)", ("H100-80GB", "H100-PCIe", "H200-141GB")),
)
"""The figures by generation (the MI300X, under ROCm, has none: its HIP runtime is not modelled)."""

DEFAULT = _row("any CUDA GPU (none named)", ())


def outside_for(gpu_name: str | None) -> Outside:
    """The row of a catalogue GPU (its generation's), or DEFAULT when none is named.

    >>> outside_for("H100-80GB").generation, outside_for(None).context_bytes // MIB
    ('Hopper (sm90)', 500)
    """
    if gpu_name:
        key = gpu_name.lower()
        for row in OUTSIDE:
            if any(g.lower() == key for g in row.gpus):
                return row
    return DEFAULT


def outside_bytes(device: str, gpu_name: str | None = None) -> int:
    """Bytes outside the caching allocator on `device` (0 on the CPU).

    >>> outside_bytes("cuda") // MIB, outside_bytes("cpu")
    (500, 0)
    """
    return 0 if device == "cpu" else outside_for(gpu_name).context_bytes
