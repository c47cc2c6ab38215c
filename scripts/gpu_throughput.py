"""Step times for the lecture's throughput claims: the AMP speed-up over fp32 and the recompute
overhead of per-layer activation checkpointing, on one mid-size configuration.

    python scripts/gpu_throughput.py --out OUT/throughput.json            # GPT-2 medium, b8 s1024
    python scripts/gpu_throughput.py --model llama-2-7b --layers 4 --micro-batch 1 --seq-len 4096
    python scripts/gpu_throughput.py --device cpu --tiny --out /tmp/t.json   # a dry run

The validator (validate/) records only whole-run wall times (model build included), so this times
single optimizer steps itself: the same step code (validate.measure.step.build_trainee / train_step),
a fresh model per variant, warm-up steps first (optimizer state, cuBLAS handles, autotuning), then
each timed step between two torch.cuda.Event records; the median is reported. fp32 runs as torch
defaults it (no TF32); 'fp32-tf32' is fp32 with torch.backends.cuda.matmul.allow_tf32 = True.
Expected (memcalc.queries.planner.step_flops): per-layer checkpointing adds one forward, about +33% of the
FLOPs; the AMP speed-up is bounded by the tensor-core/fp32 peak ratio (about 15x on an H200) and
in practice set by the memory-bound, non-matmul kernels. The JSON is rewritten after each variant,
so a run cut short keeps what it timed.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 2**20
# (name, precision, checkpointing, tf32)
VARIANTS = (
    ("fp32", "fp32", "none", False),
    ("fp32+per-layer", "fp32", "per-layer", False),
    ("bf16-amp", "bf16-amp", "none", False),
    ("bf16-amp+per-layer", "bf16-amp", "per-layer", False),
    ("fp32-tf32", "fp32", "none", True),
    ("fp16-amp", "fp16-amp", "none", False),
    ("bf16-amp+selective", "bf16-amp", "selective", False),
)
TINY_VARIANTS = ("fp32", "fp32+per-layer", "bf16-amp", "bf16-amp+per-layer")


class NullMeter:
    """train_step's meter interface, measuring nothing (timing only)."""

    def reset_peak(self):
        pass

    def peak(self):
        return 0

    def mark(self, label):
        pass


def _spec(args):
    from memcalc.inputs.specs import ModelSpec

    spec = ModelSpec.preset(args.model)
    changes = {"implementation": args.implementation}
    if args.layers:
        changes["num_layers"] = args.layers
    if args.tiny:
        changes.update(num_layers=2, hidden_size=128, num_heads=4, vocab_size=1000,
                       **({"intermediate_size": 344} if spec.family == "llama" else {}))
    if args.seq_len > spec.max_position_embeddings:
        changes["max_position_embeddings"] = args.seq_len
    return spec.with_(**changes)


def _timer(device: str):
    import torch

    if device == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return run


def time_variant(spec, args, precision: str, checkpointing: str, tf32: bool) -> dict:
    """Build a fresh trainee, warm up, time args.steps optimizer steps; seconds and peak bytes."""
    import torch

    from memcalc.inputs.training import TrainingConfig
    from validate.measure.step import build_trainee, train_step

    training = TrainingConfig.make(micro_batch=args.micro_batch, seq_len=args.seq_len,
                                   precision=precision, checkpointing=checkpointing,
                                   optimizer=args.optimizer, attention=args.attention,
                                   device=args.device)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    meter, timer = NullMeter(), _timer(args.device)
    record = {"precision": precision, "checkpointing": checkpointing, "tf32": tf32}
    trainee = None
    try:
        t0 = time.perf_counter()
        trainee = build_trainee(spec, training)
        trainee.model.train()
        record["build_s"] = round(time.perf_counter() - t0, 3)
        step = lambda: train_step(trainee, training, meter, spec.vocab_size)  # noqa: E731
        for _ in range(args.warmup):
            timer(step)
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = [timer(step) for _ in range(args.steps)]
        record.update(status="ok", step_s=[round(t, 5) for t in times],
                      median_s=round(statistics.median(times), 5),
                      spread_pct=round((max(times) - min(times)) / statistics.median(times) * 100, 2))
        if args.device == "cuda":
            record["max_memory_allocated"] = torch.cuda.max_memory_allocated()
            record["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    except Exception as err:  # OOM or a broken variant: record it, time the others
        record.update(status="oom" if "out of memory" in str(err).lower() else "error",
                      error=f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
        trainee = None  # free the model (and the step's closure over it) before the next variant
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    record.update(_expected(spec, training))
    return record


def _expected(spec, training) -> dict:
    """FLOPs of the step (memcalc.queries.planner) and the engine's predicted peak, for the record."""
    out = {}
    try:
        from memcalc.queries.planner import step_flops

        out["flops"] = step_flops(spec, training.micro_batch * training.grad_accum,
                                  training.seq_len, training.checkpointing)
    except Exception as err:
        out["flops_error"] = f"{type(err).__name__}: {err}"
    try:
        from memcalc import estimate

        out["predicted_peak_bytes"] = estimate(spec, training).peak_bytes
    except Exception as err:
        out["predicted_error"] = f"{type(err).__name__}: {str(err)[:200]}"
    return out


def _peak_tflops(device_name: str, precision: str, tf32: bool):
    """The catalogue's peak TFLOPS (memcalc.inputs.gpus) for a CUDA device name, or None.

    >>> _peak_tflops("NVIDIA H200", "bf16-amp", False), _peak_tflops("NVIDIA H100 PCIe", "fp32", False)
    (989.4, 51.2)
    """
    if tf32:
        return None  # no TF32 figure in the catalogue
    try:
        from memcalc.inputs.gpus import GPUS
    except Exception:
        return None
    name = device_name.upper()
    found = [g for key, g in GPUS.items() if key.split("-")[0].upper() in name
             and ("PCIE" in key.upper()) == ("PCIE" in name)]
    return found[0].tflops(precision) if found else None


def derived(variants: dict) -> dict:
    """Speed-ups and overheads from the variants' medians (None where one is missing)."""
    def t(name):
        v = variants.get(name) or {}
        return v.get("median_s") if v.get("status") == "ok" else None

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    def overhead(ck, base):
        return round((ck / base - 1) * 100, 1) if ck and base else None

    def flops_overhead(ck, base):
        a, b = (variants.get(ck) or {}).get("flops"), (variants.get(base) or {}).get("flops")
        return round((a / b - 1) * 100, 1) if a and b else None

    return {
        "amp_speedup_bf16_vs_fp32": ratio(t("fp32"), t("bf16-amp")),
        "amp_speedup_fp16_vs_fp32": ratio(t("fp32"), t("fp16-amp")),
        "amp_speedup_bf16_vs_tf32": ratio(t("fp32-tf32"), t("bf16-amp")),
        "tf32_speedup_vs_fp32": ratio(t("fp32"), t("fp32-tf32")),
        "ckpt_overhead_pct_fp32": overhead(t("fp32+per-layer"), t("fp32")),
        "ckpt_overhead_pct_bf16_amp": overhead(t("bf16-amp+per-layer"), t("bf16-amp")),
        "selective_overhead_pct_bf16_amp": overhead(t("bf16-amp+selective"), t("bf16-amp")),
        "ckpt_flops_overhead_pct": flops_overhead("fp32+per-layer", "fp32"),
        "selective_flops_overhead_pct": flops_overhead("bf16-amp+selective", "bf16-amp"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", default="gpt2-medium", help="a memcalc preset")
    parser.add_argument("--implementation", choices=["hf", "reference"], default="hf")
    parser.add_argument("--layers", type=int, help="override num_layers")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--attention", choices=["eager", "sdpa"], default="sdpa")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds; skip variants past it")
    parser.add_argument("--variants", help="comma-separated subset of: " + ", ".join(v[0] for v in VARIANTS))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy model (dry runs on CPU)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.micro_batch, args.seq_len = min(args.micro_batch, 2), min(args.seq_len, 64)
        args.warmup, args.steps = min(args.warmup, 1), min(args.steps, 2)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: CUDA is not available; fix: run on the GPU machine or pass --device cpu",
              file=sys.stderr)
        return 2
    wanted = args.variants.split(",") if args.variants else (
        list(TINY_VARIANTS) if args.tiny else [v[0] for v in VARIANTS])
    unknown = set(wanted) - {v[0] for v in VARIANTS}
    if unknown:
        print(f"gpu_throughput: unknown variants {sorted(unknown)}", file=sys.stderr)
        return 2
    spec = _spec(args)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"model": spec.model_dump(mode="json"), "micro_batch": args.micro_batch,
              "seq_len": args.seq_len, "optimizer": args.optimizer, "attention": args.attention,
              "device": args.device, "device_name": device_name, "torch_version": torch.__version__,
              "warmup": args.warmup, "steps": args.steps, "variants": {}, "skipped": []}
    out = Path(args.out)
    start = time.perf_counter()
    longest = 0.0
    for name, precision, ck, tf32 in VARIANTS:
        if name not in wanted:
            continue
        elapsed = time.perf_counter() - start
        if elapsed + longest > args.budget:
            result["skipped"].append(name)
            print(f"throughput: {name}: skipped (budget {args.budget:.0f} s)", flush=True)
            continue
        t0 = time.perf_counter()
        record = time_variant(spec, args, precision, ck, tf32)
        record["wall_s"] = round(time.perf_counter() - t0, 3)
        longest = max(longest, record["wall_s"])
        peak = _peak_tflops(device_name, precision, tf32) if args.device == "cuda" else None
        if record.get("status") == "ok" and record.get("flops"):
            record["achieved_tflops"] = round(record["flops"] / record["median_s"] / 1e12, 4)
            if peak:
                record["mfu_pct"] = round(record["achieved_tflops"] / peak * 100, 1)
        result["variants"][name] = record
        result["derived"] = derived(result["variants"])
        out.write_text(json.dumps(result, indent=1, sort_keys=True))
        msg = (f"{record['median_s'] * 1000:.1f} ms/step (spread {record['spread_pct']}%)"
               if record.get("status") == "ok" else record.get("error", record.get("status")))
        print(f"throughput: {name}: {msg}", flush=True)
    result["derived"] = derived(result["variants"])
    result["total_s"] = round(time.perf_counter() - start, 2)
    out.write_text(json.dumps(result, indent=1, sort_keys=True))
    for key, value in result["derived"].items():
        print(f"throughput: {key} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
