"""A catalogue of training GPUs as data, the GPUs of this machine, and memory budgets.

Memory: `total_mib` is the capacity the driver reports (nvidia-smi memory.total / rocm-smi VRAM
total) on the usual SKU; where a card reserves part of its memory (H100, H200, L4, A10G, L40S) the
figure is below the marketed GB. These figures are from commonly published nvidia-smi outputs and
were not re-measured here, except where `source` says so.
Usable memory: total minus a CUDA context of CONTEXT_MIB (cuda runtime, cuBLAS/cuDNN kernels with
lazy module loading, CUDA >= 11.7: about 300-600 MiB on these cards; 500 MiB is our assumption).
Throughput: peak dense (no 2:4 sparsity) tensor-core TFLOPS for bf16 and fp16, and non-tensor
fp32 (torch runs fp32 matmuls without TF32 by default, torch.backends.cuda.matmul.allow_tf32=False),
from the vendors' datasheets named in `source`.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from memcalc.core.errors import MemcalcError, UnknownNameError, closest_names
from memcalc.core.units import MIB

CONTEXT_MIB = 500


@dataclass(frozen=True)
class GPU:
    """One accelerator model.

    >>> GPUS["H100-80GB"].usable_bytes == (81559 - 500) * 2**20
    True
    """

    name: str
    total_mib: int
    """Memory the driver reports, MiB."""
    tflops_bf16: float | None
    """Peak dense bf16 tensor TFLOPS; None where bf16 is unsupported (V100)."""
    tflops_fp16: float
    """Peak dense fp16 tensor TFLOPS (fp32 accumulate)."""
    tflops_fp32: float
    """Peak fp32 (non-tensor) TFLOPS."""
    source: str
    """Where the throughput figures come from."""

    @property
    def total_bytes(self) -> int:
        """All device memory, bytes."""
        return self.total_mib * MIB

    @property
    def usable_bytes(self) -> int:
        """Memory left for the training step after a CUDA context of CONTEXT_MIB."""
        return (self.total_mib - CONTEXT_MIB) * MIB

    def tflops(self, precision: str) -> float | None:
        """Peak TFLOPS for a TrainingConfig precision (autocast and pure bf16 use the tensor cores).

        >>> GPUS["A100-80GB"].tflops("bf16-amp")
        312.0
        """
        return {"fp32": self.tflops_fp32, "fp16-amp": self.tflops_fp16,
                "bf16-amp": self.tflops_bf16, "bf16": self.tflops_bf16}[precision]


def _gpu(name: str, total_mib: int, bf16: float, fp16: float, fp32: float, source: str) -> tuple[str, GPU]:
    return name, GPU(name, total_mib, bf16, fp16, fp32, source)


GPUS: dict[str, GPU] = dict([
    _gpu("A100-40GB", 40960, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (SXM4)"),
    _gpu("A100-80GB", 81920, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (SXM4)"),
    _gpu("H100-80GB", 81559, 989.4, 989.4, 66.9, "NVIDIA H100 datasheet (SXM5)"),
    _gpu("H100-PCIe", 81559, 756.5, 756.5, 51.2, "NVIDIA H100 datasheet (PCIe)"),
    _gpu("H200-141GB", 143771, 989.4, 989.4, 66.9, "NVIDIA H200 datasheet (SXM)"),
    _gpu("L4", 23034, 121.0, 121.0, 30.3, "NVIDIA L4 datasheet"),
    _gpu("A10G", 23028, 70.0, 70.0, 31.2, "AWS EC2 G5 (A10G) specs; A10 datasheet has 125"),
    _gpu("L40S", 46068, 362.1, 362.1, 91.6, "NVIDIA L40S datasheet"),
    _gpu("V100-16GB", 16160, None, 125.0, 15.7, "NVIDIA V100 datasheet (SXM2)"),
    _gpu("V100-32GB", 32510, None, 125.0, 15.7, "NVIDIA V100 datasheet (SXM2)"),
    _gpu("RTX-3090", 24576, 71.0, 71.0, 35.6, "NVIDIA Ampere GA102 whitepaper (fp32 accumulate)"),
    _gpu("RTX-4090", 24564, 165.2, 165.2, 82.6, "NVIDIA Ada AD102 whitepaper (fp32 accumulate)"),
    _gpu("MI300X", 196592, 1307.4, 1307.4, 163.4, "AMD Instinct MI300X datasheet"),
])
"""The catalogue, by name (lookups are case-insensitive)."""


def gpu(name: str) -> GPU:
    """A catalogue GPU by name, case-insensitive.

    >>> gpu("h100-80gb").name
    'H100-80GB'
    """
    by_lower = {k.lower(): v for k, v in GPUS.items()}
    key = str(name).strip().lower()
    if key not in by_lower:
        close = closest_names(key, list(by_lower)).split(", ")
        hint = ", ".join(by_lower[c].name if c in by_lower else c for c in close)
        raise UnknownNameError("gpu", f"unknown GPU {name!r}", f"use one of: {hint}")
    return by_lower[key]


# ---- this machine's GPUs ----------------------------------------------------------------------
@dataclass(frozen=True)
class LocalGPU:
    """A GPU of this machine, as NVML reports it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int


def local_gpus() -> tuple[list[LocalGPU], str]:
    """The GPUs NVML sees, and a one-line note when there are none (no pynvml, no driver).

    >>> gpus, note = local_gpus()
    >>> bool(gpus) or bool(note)
    True
    """
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return [], "no GPU query: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"no NVIDIA driver found ({err})"
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(LocalGPU(i, name.decode() if isinstance(name, bytes) else name,
                                  int(mem.total), int(mem.free)))
        return found, "" if found else "NVML reports no GPUs"
    finally:
        pynvml.nvmlShutdown()


# ---- budgets --------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]{1,4})?)\s*([a-z]*)$")
_BUDGET_FIX = "pass bytes (80000000000), a size ('80GB', '24GiB'), a GPU name ('H100-80GB') or 'local'"


def parse_budget(budget: int | float | str) -> int:
    """Bytes from an int, a size string, a catalogue GPU (its usable memory) or 'local' (the free
    memory of this machine's GPU 0). Sizes are exact decimals (1e-3GB is 10**6 bytes), floored
    to whole bytes, in [0, memcalc.core.limits.MAX_BUDGET].

    >>> parse_budget("24GiB"), parse_budget("80GB"), parse_budget(1024)
    (25769803776, 80000000000, 1024)
    >>> parse_budget("a100-80gb") == GPUS["A100-80GB"].usable_bytes
    True
    """
    from decimal import Decimal

    if isinstance(budget, GPU):
        return budget.usable_bytes
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Real, str)):
        raise MemcalcError("budget", f"{str(budget)[:40]!r} is not a memory size", _BUDGET_FIX)
    if isinstance(budget, numbers.Real):
        if not math.isfinite(budget):
            raise MemcalcError("budget", f"must be a finite number of bytes, got {budget}", _BUDGET_FIX)
        return _in_range(Decimal(int(budget)) if isinstance(budget, numbers.Integral) else
                         Decimal(float(budget)), budget)
    text = budget.strip().lower()
    if text == "local":
        return local_budget()
    match = _SIZE.match(text)
    if match:
        if match.group(2) not in _UNITS:
            raise MemcalcError("budget", f"unknown unit {match.group(2)!r} in {budget!r}",
                               "use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. '80GB'")
        return _in_range(Decimal(match.group(1)) * _UNITS[match.group(2)], budget)
    if text[:1] in "+-.0123456789" or text in ("nan", "inf", "infinity", "-inf"):
        raise MemcalcError("budget", f"{budget[:40]!r} is not a memory size", _BUDGET_FIX)
    try:
        return gpu(budget).usable_bytes
    except UnknownNameError as err:
        raise MemcalcError("budget", f"{budget[:40]!r} is neither a size nor a known GPU",
                           f"{_BUDGET_FIX}; GPUs: {err.fix.removeprefix('use one of: ')}") from None


def _in_range(nbytes: int, given: str) -> int:
    from memcalc.core.limits import MAX_BUDGET

    if nbytes < 0:
        raise MemcalcError("budget", f"must be >= 0 bytes, got {str(given)[:40]}", _BUDGET_FIX)
    if nbytes > MAX_BUDGET:
        raise MemcalcError("budget", f"{str(given)[:40]} is above memcalc's ceiling of "
                           f"{MAX_BUDGET:,} bytes (1 PiB per rank)", "pass a per-rank budget, e.g. '80GB'")
    return int(nbytes)


def local_budget() -> int:
    """Free memory of this machine's first GPU, bytes; an error naming the fix when there is none."""
    found, note = local_gpus()
    if not found:
        raise MemcalcError("budget", f"'local' needs a GPU: {note}",
                           "pass a GPU name ('H100-80GB') or a size ('80GB') instead")
    return found[0].free_bytes
