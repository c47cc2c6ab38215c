"""Speed figures: estimate() warm, `memcalc estimate` cold, estimate_grid throughput, tables.

    PYTHONPATH=. python benchmarks/bench_estimate.py [--tables]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time


def bench_estimate_warm(n: int = 2000) -> float:
    """Microseconds per estimate() call on a cached (model, training) key."""
    from memcalc import ModelSpec, TrainingConfig, estimate

    for name in ("gpt2", "gpt2-xl"):
        model, t = ModelSpec.preset(name), TrainingConfig(micro_batch=4, seq_len=1024)
        estimate(model, t)
        start = time.perf_counter()
        for i in range(n):
            estimate(model, t)
        us = (time.perf_counter() - start) / n * 1e6
        print(f"estimate() warm, {name}: {us:.1f} us/call (target < 50 us)")
    return us


def bench_cli_cold(repeats: int = 5) -> float:
    """Best-of wall seconds of a cold `memcalc estimate` process."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memcalc.cli", "estimate", "--model", "gpt2",
                        "--micro-batch", "4", "--seq-len", "1024"], check=True, capture_output=True, env=env)
        best = min(best, time.perf_counter() - start)
    print(f"memcalc estimate cold: {best:.3f} s (best of {repeats}; target < 1 s)")
    return best


def bench_grid() -> None:
    """Configurations per second of estimate_grid on a 1000 x 1000 grid and on 1e6 random points."""
    import numpy as np

    from memcalc import ModelSpec, TrainingConfig, estimate_grid

    rng = np.random.default_rng(0)
    for name, attention in (("gpt2", "sdpa"), ("gpt2-xl", "eager")):
        model, t = ModelSpec.preset(name), TrainingConfig(micro_batch=1, seq_len=8, attention=attention)
        estimate_grid(model, t)
        cases = {"1000x1000 grid": (np.arange(1, 1001)[:, None], np.arange(1, 1001) * 8),
                 "1e6 random points": (rng.integers(1, 128, 10 ** 6), rng.integers(1, 8192, 10 ** 6))}
        for label, (b, s) in cases.items():
            start = time.perf_counter()
            out = estimate_grid(model, t, micro_batch=b, seq_len=s)
            rate = out.size / (time.perf_counter() - start)
            print(f"estimate_grid {name} {attention}, {label}: {rate / 1e6:.2f} M configs/s (target >= 1)")


def bench_tables() -> None:
    """Seconds to build every table (one simulation per preset x regime x checkpointing)."""
    from memcalc import tables
    from memcalc.presets import PRESETS

    total = 0.0
    for name in PRESETS:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            tables.write(out, [name], plots=False)
        took = time.perf_counter() - start
        total += took
        print(f"tables for {name}: {took:.1f} s")
    print(f"all tables: {total:.1f} s")


if __name__ == "__main__":
    bench_estimate_warm()
    bench_cli_cold()
    bench_grid()
    if "--tables" in sys.argv:
        bench_tables()
