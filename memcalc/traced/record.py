"""The dispatch-level recorder of a traced step (imports torch: used by memcalc.traced.runner only).

Every storage an ATen op returns is numbered in the order it is first seen and its bytes noted;
its free is seen through a weak reference the moment the last reference goes; after every op an
instant is noted. The same method as the validator's live-tensor tracker
(validate/measure/tracker.py) and torch.distributed._tools.mem_tracker.MemTracker, kept as an
event stream rather than a running total so that memcalc.traced.fit can line up the streams of
runs at several shapes and fit each storage's size as a polynomial in b and s.

Events: ("a", sid, nbytes) a storage born, ("f", sid) freed, ("i", op) an instant after an op,
("m", label) a phase or step mark. Ops tracing cannot follow raise memcalc.core.errors
NotModelledError naming the op (memcalc.traced.refusals).
"""
from __future__ import annotations

import weakref
from functools import cache
from typing import Any

from memcalc.traced.fake_kernels import fake_kernel
from memcalc.traced.refusals import check_op


def new_recorder():
    """A Recorder (a TorchDispatchMode; torch is imported here, not with this module).

    >>> import torch
    >>> with new_recorder() as rec:
    ...     y = torch.ones(10) * 2
    >>> del y; [e[0] for e in rec.events]
    ['a', 'i', 'a', 'i', 'f', 'f']
    """
    return _recorder_class()()


@cache
def _recorder_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    return type("Recorder", (_Methods, TorchDispatchMode), {"_torch": torch, "_flatten": staticmethod(tree_flatten)})


class _Methods:
    """Record storage births, frees and op instants (the body of the Recorder class)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []
        self._live: dict[int, tuple[weakref.ref, int]] = {}  # storage _cdata -> (ref, sid)
        self._next = 0

    def sid(self, t: Any) -> int | None:
        """The recorded id of a live tensor's storage (None: not seen)."""
        try:
            entry = self._live.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return None
        return None if entry is None else entry[1]

    def track(self, t: Any) -> None:
        """Start following a tensor's storage (a no-op for one already followed)."""
        if not isinstance(t, self._torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st._cdata
        if key in self._live:
            return
        sid, self._next = self._next, self._next + 1
        ref = weakref.ref(st, lambda _r, k=key: self._freed(k))
        self._live[key] = (ref, sid)
        self.events.append(("a", sid, st.nbytes()))

    def _freed(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.events.append(("f", entry[1]))

    def mark(self, label: str) -> None:
        """Note a phase or step boundary."""
        self.events.append(("m", label))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        check_op(func, args, kwargs)
        out = fake_kernel(func, args, kwargs)
        if out is None:
            out = func(*args, **(kwargs or {}))
        for t in self._flatten(out)[0]:
            if isinstance(t, self._torch.Tensor):
                self.track(t)
        self.events.append(("i", func._schema.name))
        return out
