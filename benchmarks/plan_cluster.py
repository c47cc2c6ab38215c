"""Time memcalc.plan_cluster (issue 26: under 10 s for a 70B model on 64 GPUs, under 60 s on 512).

    python benchmarks/plan_cluster.py [--gpus 64xH100-80GB] [--model llama-2-70b]

Cold: a fresh process, empty caches; prints the seconds, the layouts that fit and the fastest.
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-2-70b")
    p.add_argument("--gpus", default="64xH100-80GB")
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--precision", default="bf16-amp")
    args = p.parse_args()
    import memcalc
    from memcalc.queries.cluster import plan_cluster

    model = memcalc.ModelSpec.preset(args.model)
    training = memcalc.TrainingConfig(micro_batch=1, seq_len=args.seq_len, precision=args.precision)
    start = time.perf_counter()
    plans = plan_cluster(model, training, gpus=args.gpus, global_batch=args.global_batch)
    wall = time.perf_counter() - start
    best = plans[0] if plans else None
    print(f"{args.model} on {args.gpus}, global batch {args.global_batch}, s {args.seq_len}: "
          f"{wall:.2f} s, {len(plans)} layouts fit"
          + (f"; fastest dp{best.data_parallel} tp{best.tensor_parallel} {best.sharding} "
             f"{best.checkpointing} micro {best.micro_batch}: {best.step.total_s:.2f} s/step" if best else ""))


if __name__ == "__main__":
    main()
