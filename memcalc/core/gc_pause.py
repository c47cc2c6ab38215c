"""`gc_paused`: Python's cyclic garbage collector held off while a large object graph is built and
dropped. A step's simulation (memcalc.engine) and an allocator replay (memcalc.allocator.replay)
each make tens of thousands of small objects that reference counting frees; the collector's passes
over them cost a tenth of a cold estimate and a third of a replay (benchmarks/bench_estimate.py,
benchmarks/bench_replay.py). It runs again afterwards.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside the block, back to its state after.

    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
