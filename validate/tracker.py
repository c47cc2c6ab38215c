"""Live-tensor tracker: the CPU measurement backend.

Counts the bytes of every tensor storage alive, op by op, with a TorchDispatchMode; storages are
watched through weak references so a free is seen the moment the last reference goes.
Same method as torch.distributed._tools.mem_tracker.MemTracker (which validate cross-checks).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorTracker(TorchDispatchMode):
    """Track live storage bytes; `peak` is the maximum seen after any op.

    >>> with LiveTensorTracker() as tr:  # doctest: +SKIP
    ...     y = torch.ones(1000) * 2
    >>> tr.peak >= 8000  # doctest: +SKIP
    True
    """

    def __init__(self, record_timeline: bool = False):
        super().__init__()
        self._refs: dict[int, tuple[weakref.ref, int]] = {}
        self.live = 0
        self.peak = 0
        self.peak_label = ""
        self.record_timeline = record_timeline
        self.timeline: list[tuple[str, int]] = []
        self.label = ""

    def track_tensor(self, t: torch.Tensor) -> None:
        """Start counting a tensor created outside the mode (parameters, optimizer state)."""
        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self._refs:
            return
        nbytes = st.nbytes()
        ref = weakref.ref(st, lambda _r, k=key: self._on_free(k))
        self._refs[key] = (ref, nbytes)
        self.live += nbytes

    def _on_free(self, key: int) -> None:
        entry = self._refs.pop(key, None)
        if entry is not None:
            self.live -= entry[1]

    def reset_peak(self) -> None:
        """Peak := current live bytes."""
        self.peak = self.live
        self.peak_label = self.label

    def mark(self, label: str) -> None:
        """Name the phase that following ops belong to."""
        self.label = label
        self._update(f"<{label}>")

    def _update(self, what: str) -> None:
        if self.live > self.peak:
            self.peak = self.live
            self.peak_label = self.label
        if self.record_timeline:
            self.timeline.append((what, self.live))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track_tensor(t)
        self._update(str(func))
        return out
