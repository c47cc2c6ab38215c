"""What `memcalc estimate` and `memcalc gpus` print (memcalc.cli.main runs the commands)."""
from __future__ import annotations

import argparse

from memcalc.core.units import GIB, MIB


def print_estimate(out: dict, device: str = "cuda") -> None:
    """The first screen of `memcalc estimate`: allocated, reserved and device peaks, then the
    breakdown at the allocated peak, the phases and the first step."""
    print(f"{out['model']} ({out['params']:,} parameters): peak {out['peak_gib']:.3f} GiB "
          f"in {out['peak_phase']} ({out['moment']})")
    if "reserved_peak_bytes" in out:
        if device == "cpu":
            print("  allocated = reserved = device on cpu (no caching allocator, no CUDA context)")
        else:
            a, r, d = out["peak_bytes"], out["reserved_peak_bytes"], out["device_bytes"]
            print(f"  allocated {a / GIB:.3f} GiB | reserved {r / GIB:.3f} GiB (x{r / max(a, 1):.3f}, the caching "
                  f"allocator replayed) | device {d / GIB:.3f} GiB (+ CUDA context)")
    if "attention" in out:
        how = "transformers' default for this model type" if out["attention_assumed"] else "as given"
        print(f"  attention: {out['attention']} ({how})")
    if "moe_routing" in out:
        print(f"  routing: {out['moe_routing']}")
    print("  at the peak:")
    for name, nbytes in out["components"].items():
        if nbytes:
            print(f"    {name:<18} {nbytes / GIB:10.3f} GiB")
    print("  phases:" + ("" if device == "cpu" else "            allocated    reserved"))
    for name, nbytes in out["phases"].items():
        reserved = out.get("reserved_phases", {}).get(name)
        extra = f" {reserved / GIB:10.3f} GiB" if reserved is not None and device != "cpu" else ""
        print(f"    {name:<18} {nbytes / GIB:10.3f} GiB{extra}")
    print(f"  first step:          {out['first_step_peak_bytes'] / GIB:10.3f} GiB")
    ranks = out.get("rank_peak_bytes") or []
    if len(set(ranks)) > 1:  # ranks that differ (pipeline stages, ZeRO-1 partitions, FSDP2 padding)
        more = f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else ""
        shown = ", ".join(f"{n / GIB:.3f}" for n in ranks[:8]) + more
        print(f"  per rank:            {shown} GiB")
    if "formula" in out:
        print(f"  {out['formula_of']} = {out['formula']}")


def cmd_gpus(args: argparse.Namespace) -> dict:
    """Run `gpus`: the catalogue, what a process holds outside the caching allocator by generation
    (memcalc.allocator.outside, each figure with its source), and this machine's GPUs."""
    from memcalc.allocator.outside import OUTSIDE
    from memcalc.inputs.gpus import CONTEXT_MIB, GPUS, local_gpus

    found, note = local_gpus()
    out = {"context_mib": CONTEXT_MIB,
           "catalogue": [dict(name=g.name, total_bytes=g.total_bytes, usable_bytes=g.usable_bytes,
                              tflops_bf16=g.tflops_bf16, tflops_fp16=g.tflops_fp16,
                              tflops_fp32=g.tflops_fp32, source=g.source) for g in GPUS.values()],
           "outside_allocator": [dict(generation=o.generation, gpus=list(o.gpus), context_bytes=o.context_bytes,
                                      applies_to=o.applies_to, source=o.source) for o in OUTSIDE],
           "local": [g.__dict__ for g in found], "local_note": note}
    if not args.json:
        print(f"{'GPU':<11} {'total GiB':>9} {'usable':>7} {'bf16':>7} {'fp16':>7} {'fp32':>6}  "
              f"(TFLOPS dense; usable = total - {CONTEXT_MIB} MiB context)")
        for g in GPUS.values():
            print(f"{g.name:<11} {g.total_bytes / GIB:>9.2f} {g.usable_bytes / GIB:>7.2f} "
                  f"{g.tflops_bf16 or '-':>7} {g.tflops_fp16:>7} {g.tflops_fp32:>6}")
        print("outside the caching allocator (device bytes = reserved + these):")
        for o in OUTSIDE:
            print(f"  {o.generation:<20} CUDA context {o.context_bytes // MIB} MiB; {o.applies_to}; {o.source}")
        for g in found:
            print(f"local GPU {g.index}: {g.name}, {g.total_bytes / GIB:.2f} GiB total, "
                  f"{g.free_bytes / GIB:.2f} GiB free")
        if note:
            print(f"local: {note}")
    return out
