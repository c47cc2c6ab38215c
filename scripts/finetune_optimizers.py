"""Print the planning table of docs/fine-tuning.md for the fine-tuning optimizers: optimizer-state
bytes per parameter on the device allocator and the steady-state peak (CUDA, micro-batch 1, s 2048,
per-layer checkpointing), plus the managed (paged) bytes outside the allocator.

    PYTHONPATH=. python scripts/finetune_optimizers.py
"""
from __future__ import annotations

import memcalc
from memcalc.engine.run import candidates
from memcalc.tape.finetune_optim import paged_state_bytes
from memcalc.core.units import GIB

OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor")


def main() -> None:
    """One row per (model, precision, optimizer)."""
    print("| model | precision | optimizer | state B/param | peak GiB | paged GiB (managed) |")
    print("|---|---|---|---:|---:|---:|")
    for name in ("llama-3-8b", "qwen2-0.5b"):
        model = memcalc.ModelSpec.preset(name)
        for precision in ("bf16-amp", "bf16"):
            for opt in OPTIMIZERS:
                t = memcalc.TrainingConfig(micro_batch=1, seq_len=2048, precision=precision,
                                           optimizer=opt, checkpointing="per-layer")
                r = memcalc.estimate(model, t)
                numels = [n for n, _ in candidates(model, t).param_shapes]
                states = r.components.get("optimizer", 0) / model.param_count
                paged = paged_state_bytes(opt, numels, "cuda") / GIB
                print(f"| {name} | {precision} | {opt} | {states:.3f} | {r.peak_bytes / GIB:.2f} "
                      f"| {paged:.2f} |")


if __name__ == "__main__":
    main()
