"""Speed figures of the engine, each measured in this one run on this machine (medians of
several repeats), with the machine and the date:

- estimate() warm on a NEW shape (random micro_batch and seq_len, the simulation cached), cuda
  and cpu, and on a repeated key;
- the first (cold) estimate of a model and regime: the simulation itself (7B, 80 layers), wall
  and CPU time of this process (time.process_time: less inflated when other jobs share the
  machine);
- estimate_grid: its first call, then configurations per second on cuda (exact rounding);
- `memcalc estimate` as a cold process, with the bytecode cache and compiling from source;
  `memcalc tables` (with --tables), over every CPU and over one process, wall and CPU time.

The load average before and after the run is printed with the machine and the date.

    PYTHONPATH=. python benchmarks/bench_estimate.py [--tables] [--grid] [--repeats 5]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _median(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def _medians(fn, repeats: int) -> tuple[float, float]:
    """Medians of (wall, CPU) milliseconds of fn() over `repeats` runs."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - wall) * 1e3)
        cpus.append((time.process_time() - cpu) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def bench_warm_new_shape(repeats: int, n: int = 2000) -> None:
    """Microseconds per estimate() at a shape not seen before (the (model, regime) simulated)."""
    from memcalc import ModelSpec, TrainingConfig, estimate

    model = ModelSpec.preset("llama-2-7b")
    for device in ("cuda", "cpu"):
        base = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16-amp",
                              checkpointing="per-layer", device=device)
        estimate(model, base)
        rng = random.Random(0)

        def run() -> float:
            configs = [base.with_(micro_batch=rng.randint(1, 512), seq_len=rng.randint(1, 4096))
                       for _ in range(n)]  # built outside the timed loop
            start = time.perf_counter()
            for t in configs:
                estimate(model, t).peak_bytes
            return (time.perf_counter() - start) / n * 1e6

        print(f"estimate() warm, new shape, llama-2-7b {device}: {_median(run, repeats):.1f} us (target <= 10)")
    t = base.with_(device="cuda")

    def repeated() -> float:
        start = time.perf_counter()
        for _ in range(n):
            estimate(model, t).peak_bytes
        return (time.perf_counter() - start) / n * 1e6

    print(f"estimate() warm, repeated key, llama-2-7b cuda: {_median(repeated, repeats):.1f} us")


def bench_cold(repeats: int) -> None:
    """Milliseconds of the first estimate of a model and regime (memcalc.engine.depth's derivation, or
    the simulation), cache cleared; beside it, in the same run, simulating every layer
    (engine.simulated, what the engine did before memcalc.engine.depth)."""
    from memcalc import ModelSpec, TrainingConfig, estimate
    from memcalc.engine import run as engine
    from memcalc.engine.cache import CACHE

    t = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16-amp", checkpointing="per-layer")
    for name, layers, target in (("llama-2-7b", None, 30), ("llama-2-70b", None, 50),
                                 ("llama-2-70b", 1000, None)):
        model = ModelSpec.preset(name)
        model = model.with_(num_layers=layers) if layers else model

        def run() -> None:
            CACHE.clear()
            estimate(model, t)

        cold, cpu = _medians(run, repeats)
        direct = ""
        if layers is None:
            wall_d, cpu_d = _medians(lambda: engine.simulated(model, t), repeats)
            direct = f", every layer simulated {wall_d:.0f} ms (CPU {cpu_d:.0f} ms)"
        goal = f" (target <= {target})" if target else ""
        print(f"estimate() cold, {name} ({model.num_layers} layers): {cold:.0f} ms (CPU {cpu:.0f} ms)"
              f"{goal}{direct}")


def bench_grid(repeats: int) -> None:
    """estimate_grid on cuda: the first call (a new model and regime already simulated), then
    configurations per second on 1e6 random points: the first such call (which learns the
    moments that can win in each cell, memcalc.queries.grid_cells), then the median of `repeats` calls,
    by wall time and by this process's CPU time (less inflated on a shared machine)."""
    import numpy as np

    from memcalc import ModelSpec, TrainingConfig, estimate, estimate_grid

    model = ModelSpec.preset("llama-2-7b")
    t = TrainingConfig(micro_batch=1, seq_len=8, precision="bf16-amp")
    estimate(model, t)
    start, cpu_start = time.perf_counter(), time.process_time()
    estimate_grid(model, t, micro_batch=np.arange(1, 9)[:, None], seq_len=np.array([1024, 4096]))
    print(f"estimate_grid first call (simulation cached): {(time.perf_counter() - start) * 1e3:.1f} ms "
          f"(target <= 50), by CPU time {(time.process_time() - cpu_start) * 1e3:.1f} ms")
    rng = np.random.default_rng(0)
    b, s = rng.integers(1, 128, 10**6), rng.integers(1, 8192, 10**6)

    def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = estimate_grid(model, t, micro_batch=b, seq_len=s)
        return out.size / (time.perf_counter() - wall) / 1e6, out.size / (time.process_time() - cpu) / 1e6

    first = run()
    rates = [run() for _ in range(repeats)]
    wall, cpu = (statistics.median(r[i] for r in rates) for i in (0, 1))
    print(f"estimate_grid cuda, 1e6 random points: {wall:.1f} M configs/s (target >= 10), by CPU time "
          f"{cpu:.1f} M/s; the first call on them {first[0]:.1f} M/s")


def bench_cli_cold(repeats: int) -> None:
    """Wall seconds of a cold `memcalc estimate` process (a new interpreter each time): with
    Python's default bytecode cache (written by a first run, as an installed package has it),
    and with PYTHONDONTWRITEBYTECODE=1 (as this sandbox sets it: memcalc, an editable install
    without __pycache__, is compiled at every start; the installed packages' bytecode is used)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.getcwd()
    argv = [sys.executable, "-m", "memcalc.cli", "estimate", "--model", "gpt2", "--micro-batch", "4",
            "--seq-len", "1024"]

    def run(extra: dict) -> float:
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env={**env, **extra})
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as cache:
        cached = {"PYTHONPYCACHEPREFIX": cache}
        run(cached)  # writes the bytecode
        warm = _median(lambda: run(cached), repeats)
    source = _median(lambda: run({"PYTHONDONTWRITEBYTECODE": "1"}), repeats)
    print(f"memcalc estimate, cold process: {warm:.3f} s with bytecode cached, {source:.3f} s with "
          "PYTHONDONTWRITEBYTECODE=1 (the installed packages' bytecode only) (target <= 0.2)")


def bench_tables(repeats: int) -> None:
    """Seconds of `memcalc tables` (everything it writes, plots included), one command over the
    CPUs it may use (memcalc.queries.jobs), and one over a single process (--jobs 1); wall and the CPU
    time of the command and its workers, medians of `repeats` runs each."""
    for jobs in ([], ["--jobs", "1"]):
        runs = [_tables_once(jobs) for _ in range(repeats)]
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        how = " ".join(jobs) or f"{_cpus()} processes"
        target = "" if jobs else " (target <= 10)"
        print(f"memcalc tables ({how}): {wall:.1f} s (CPU {cpu:.1f} s){target}; runs "
              + ", ".join(f"{r[0]:.1f}" for r in runs) + " s")


def _tables_once(jobs: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one `memcalc tables` command into a fresh folder."""
    with tempfile.TemporaryDirectory() as out:
        start, child = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "memcalc.cli", "tables", "--out", out, *jobs], check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (time.perf_counter() - start,
                after.ru_utime + after.ru_stime - child.ru_utime - child.ru_stime)


def _cpus() -> int:
    from memcalc.queries.jobs import available_cpus

    return available_cpus()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", action="store_true", help="also time `memcalc tables`")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--grid", action="store_true", help="only time estimate_grid")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {datetime.date.today().isoformat()}; medians of {args.repeats} runs; "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.grid:
        bench_grid(args.repeats)
        print(f"# load average at the end {os.getloadavg()[0]:.1f}")
        return
    bench_warm_new_shape(args.repeats)
    bench_cold(args.repeats)
    bench_grid(args.repeats)
    bench_cli_cold(args.repeats)
    if args.tables:
        bench_tables(args.repeats)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
