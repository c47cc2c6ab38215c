"""Reserved memory: what reading MemoryReport.reserved_peak_bytes costs (the engine's allocation
sequence at full depth, then the replica's replay to a steady step), and the reserved / allocated
ratios it finds, per preset, with the allocator's default settings and expandable_segments:True.
Wall and CPU seconds (time.process_time: less inflated when other jobs share the machine); the
warm estimate() of allocated memory is benchmarks/bench_estimate.py's figure.

    PYTHONPATH=. python benchmarks/bench_reserved.py
"""
from __future__ import annotations

import datetime
import os
import platform
import time

from memcalc.engine import reserved as reserved_module
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.estimate import estimate

CASES = [
    ("gpt2", TrainingConfig(micro_batch=8, seq_len=1024)),
    ("gpt2", TrainingConfig(micro_batch=8, seq_len=1024, checkpointing="per-layer")),
    ("llama-3.2-1b", TrainingConfig(micro_batch=4, seq_len=2048, precision="bf16-amp")),
    ("qwen2-7b", TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16", checkpointing="per-layer")),
    ("llama-3-8b", TrainingConfig(micro_batch=2, seq_len=4096, precision="bf16", checkpointing="per-layer")),
    ("llama-2-70b", TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16", checkpointing="per-layer",
                                   world_size=8, sharding="zero3")),
]


def _one(name: str, training: TrainingConfig) -> str:
    model = ModelSpec.preset(name)
    report = estimate(model, training)
    reserved_module._SEQUENCES.clear()
    reserved_module._REPLAYS.clear()
    w0, c0 = time.perf_counter(), time.process_time()
    reserved = report.reserved_peak_bytes
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    steps = report.reserved.steps
    expandable = estimate(model, training.with_(allocator="expandable_segments:True")).reserved_peak_bytes
    allocated = report.peak_bytes
    shape = f"b{training.micro_batch} s{training.seq_len} {training.precision} {training.checkpointing}"
    if training.world_size > 1:
        shape += f" {training.sharding} x{training.world_size}"
    return (f"| {name} | {shape} | {allocated / 2**30:.2f} | {reserved / 2**30:.2f} | {reserved / allocated:.3f} | "
            f"{expandable / allocated:.3f} | {steps} | {wall:.2f} / {cpu:.2f} |")


def main() -> None:
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print("| preset | step | allocated GiB | reserved GiB | reserved/allocated | with expandable_segments "
          "| steps replayed | first read of reserved, wall / CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, training in CASES:
        print(_one(name, training), flush=True)
    print(f"load {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
