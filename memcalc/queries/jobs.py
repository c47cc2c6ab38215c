"""Independent tasks over worker processes: `memcalc tables` computes its ~400 rows, each from its
own simulations, on every CPU the process may use. A task is a module-level function and its
arguments (memcalc's own: nothing the user gives is pickled); results come back in task order,
so the output does not depend on the number of processes.
"""
from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable

Task = tuple[Callable[..., Any], tuple]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform says, else the count).

    >>> available_cpus() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def run_all(tasks: list[Task], jobs: int | None = None) -> list:
    """fn(*args) of every (fn, args), in order, over `jobs` forked processes (default: the
    available CPUs). One job, one task, or a platform without fork: in this process. Tasks are
    handed out one at a time as workers free up, so list the longest first.

    Python's cyclic collector is held off while the tasks run: memcalc's tasks make no cyclic
    garbage worth collecting (reference counting frees a simulation's objects), while each
    pass walks every candidate cached so far (memcalc.engine.cache). Held off here, a forked
    worker (which inherits the collector's state) never runs one, and this process runs one at
    the end. Measured (`memcalc tables --no-plots`, 2 processes, two runs each): CPU 17.4-17.9 s
    with the collector on, 17.0 s held off; wall 9.0-9.2 s -> 8.8 s; peak RSS 163 MB either way.

    >>> run_all([(pow, (2, 3)), (pow, (3, 2))], jobs=2)
    [8, 9]
    """
    from memcalc.core.gc_pause import gc_paused

    jobs = min(available_cpus() if jobs is None else jobs, len(tasks))
    with gc_paused():
        if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            return [fn(*args) for fn, args in tasks]
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            pending = [pool.apply_async(fn, args) for fn, args in tasks]
            return [p.get() for p in pending]
