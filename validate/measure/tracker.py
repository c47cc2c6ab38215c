"""Live-tensor tracker: the CPU (and FakeTensorMode) measurement backend.

Counts the bytes of every tensor storage alive, op by op, with a TorchDispatchMode; storages are
watched through weak references so a free is seen the moment the last reference goes.
Same method as torch.distributed._tools.mem_tracker.MemTracker (which validate cross-checks).

What it sees: every storage returned by an ATen op run while the mode is active (parameters,
buffers, gradients, optimizer state, inputs, activations, temporaries), plus tensors registered
with `track_tensor`. What it cannot see: scratch memory inside one kernel (it never becomes a
tensor), and tensors made under `no_dispatch`. A custom op is one op to the mode (the mode is
off while its kernel runs), so the tensors a Python kernel allocates and frees inside are
unseen; the kernels in SEE_INSIDE are run with the mode on: bitsandbytes' CPU optimizer updates
(Python functions that dequantize the 8-bit states to fp32 temporaries:
bitsandbytes/backends/cpu/ops.py) and its 4-bit and blockwise (de)quantisation ops, whose CPU
kernels are Python too (gemm_4bit: backends/default/ops.py _gemm_4bit_default_impl dequantises
the weight into a temporary and runs F.linear; quantize_4bit caches its code tables for the
process). Checked against the CPU allocator's own alloc/free stream (torch.profiler
profile_memory), which sees every allocation: tests/test_validate_tracker.py. The peak is
checked after every op, when the op's inputs and outputs are alive together: the same moment the
CUDA caching allocator peaks.

Works under FakeTensorMode (enter the fake mode first, then the tracker): fake tensors have
meta storages with real sizes, and those storages are freed (and weakref callbacks fire) like
real ones.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


# custom ops whose CPU kernel is a Python function allocating temporaries the process really holds
SEE_INSIDE = frozenset({"bitsandbytes::optimizer_update_8bit_blockwise",
                        "bitsandbytes::optimizer_update_32bit",
                        "bitsandbytes::gemm_4bit", "bitsandbytes::dequantize_4bit",
                        "bitsandbytes::quantize_4bit", "bitsandbytes::dequantize_blockwise",
                        "bitsandbytes::quantize_blockwise"})
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _plain_cpu(args) -> bool:
    """All tensor arguments are real CPU tensors (not fake, not subclasses)."""
    tensors = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"
               for t in tensors)


class LiveTensorTracker(TorchDispatchMode):
    """Track live storage bytes; `peak` is the maximum seen after any op.

    `granularity` rounds each storage up (512 mimics the CUDA caching allocator's smallest block;
    1, the default, counts exact bytes as the CPU allocator hands them out).

    >>> with LiveTensorTracker() as tr:
    ...     y = torch.ones(1000) * 2
    >>> tr.peak  # the ones and their product, 1000 fp32 each, alive together
    8000
    >>> tr.live  # y is still alive; deleting it frees its storage
    4000
    >>> del y; tr.live
    0
    """

    def __init__(self, record_timeline: bool = False, granularity: int = 1):
        super().__init__()
        self._refs: dict[int, tuple[weakref.ref, int]] = {}
        self.granularity = granularity
        self.live = 0
        self.peak = 0
        self.peak_label = ""
        self.peak_op = ""
        self.record_timeline = record_timeline
        self.timeline: list[tuple[str, int]] = []
        self.label = ""
        self.untracked = 0

    def _size(self, st) -> int:
        g = self.granularity
        return -(-st.nbytes() // g) * g

    def track_tensor(self, t: torch.Tensor) -> None:
        """Start counting a tensor (a no-op for one already counted).

        Needed only for tensors created before the tracker was entered.

        >>> t = torch.zeros(10)
        >>> tr = LiveTensorTracker(); tr.track_tensor(t); tr.live
        40
        """
        if not isinstance(t, torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
            self.untracked += 1
            return
        key = st._cdata
        entry = self._refs.get(key)
        if entry is not None:
            self._maybe_resized(key, entry, st)
            return
        nbytes = self._size(st)
        ref = weakref.ref(st, lambda _r, k=key: self._on_free(k))
        self._refs[key] = (ref, nbytes)
        self.live += nbytes

    def _maybe_resized(self, key: int, entry, st) -> None:
        # Ops with out= arguments (and Tensor.resize_) grow an existing storage in place.
        nbytes = self._size(st)
        if nbytes != entry[1]:
            self.live += nbytes - entry[1]
            self._refs[key] = (entry[0], nbytes)

    def _on_free(self, key: int) -> None:
        entry = self._refs.pop(key, None)
        if entry is not None:
            self.live -= entry[1]

    def reset_peak(self) -> None:
        """Peak := current live bytes (like torch.cuda.reset_peak_memory_stats).

        >>> tr = LiveTensorTracker(); tr.reset_peak(); tr.peak
        0
        """
        self.peak = self.live
        self.peak_label = self.label
        self.peak_op = "<reset>"

    def mark(self, label: str) -> None:
        """Name the phase that the following ops belong to (reported as `peak_label`).

        >>> tr = LiveTensorTracker(); tr.mark("forward"); tr.label
        'forward'
        """
        self.label = label
        self._update(f"<{label}>")

    def _update(self, what: str) -> None:
        if self.live > self.peak:
            self.peak = self.live
            self.peak_label = self.label
            self.peak_op = what
        if self.record_timeline:
            self.timeline.append((what, self.live))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SEE_INSIDE and _plain_cpu(args):
            with self:  # the kernel's own ops are seen (their temporaries count)
                out = func.redispatch(_CPU_KEYS, *args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track_tensor(t)
        self._update(str(func))
        return out
