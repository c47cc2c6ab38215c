"""Speed of memcalc.check's search (memcalc/queries/preflight.py), each figure measured in this run
on this machine: wall and CPU time (time.process_time: less inflated when other jobs share the
machine) and the number of estimate() calls, for the issue-28 cases (Llama-3-8B, bf16 autocast,
per-layer checkpointing, fused AdamW, batch 4 x 2,048) on an RTX 4090 and an H100-80GB, and a
hopeless one (Llama-2-70B on an RTX 4090). Each case runs in a fresh process (cold caches), as
`memcalc check` does.

    PYTHONPATH=. python benchmarks/bench_check.py
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys

CASES = [("llama-3-8b", "RTX-4090"), ("llama-3-8b", "H100-80GB"), ("llama-2-70b", "RTX-4090")]
ARGS = {"per_device_train_batch_size": 4, "bf16": True, "gradient_checkpointing": True, "optim": "adamw_torch_fused"}
CHILD = """
import json, sys, time
import memcalc
from memcalc.queries import preflight
calls = [0]
real = preflight.estimate
def counted(*a, **k):
    calls[0] += 1
    return real(*a, **k)
preflight.estimate = counted
model = memcalc.ModelSpec.preset(sys.argv[1])
training = memcalc.TrainingConfig.from_trainer_args(json.loads(sys.argv[3]), seq_len=2048)
w, c = time.perf_counter(), time.process_time()
v = memcalc.check(model, training, sys.argv[2])
print(json.dumps({"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c, "estimates": calls[0],
                  "shown": len(v.changes)}))
"""


def main() -> None:
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    for model, gpu in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, model, gpu, json.dumps(ARGS)], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        r = json.loads(out.stdout)
        print(f"{model} on {gpu}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, {r['estimates']} estimate() "
              f"calls, {r['shown']} shown")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
