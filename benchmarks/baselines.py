"""How the usual rules of thumb fare on the recorded CPU validation runs, beside memcalc.

    PYTHONPATH=. python benchmarks/baselines.py [validate/results/cpu-ci.jsonl]

Baselines: (1) 16 bytes per parameter (fp32 Adam model states, the lecture's rule);
(2) the model states of the regime + Korthikanti et al. 2022 activations (sbh(34 + 5as/h) bytes
per layer for 16-bit activations, doubled for fp32; 2sbh per layer plus one layer under full
recomputation; 34sbh under selective) + the Megatron output-layer term 4sbh(1 + V/h).
"""
from __future__ import annotations

import json
import sys

from memcalc import ModelSpec, TrainingConfig, estimate
from memcalc.formulas.model_states import model_state_bytes


def korthikanti_bytes(spec: ModelSpec, t: TrainingConfig) -> float:
    """Model states + textbook activations + logits, in bytes."""
    b, s, h, a, L, V = t.micro_batch, t.seq_len, spec.hidden_size, spec.num_heads, spec.num_layers, spec.vocab_size
    layer = s * b * h * (34 + 5 * a * s / h)
    act = {"none": L * layer, "selective": L * s * b * h * 34}.get(t.checkpointing, L * 2 * s * b * h + layer)
    act *= 2 if t.precision == "fp32" else 1
    states = model_state_bytes(spec.param_count, precision=t.precision, optimizer=t.optimizer)
    return states + act + 4 * s * b * h * (1 + V / h)


def main(path: str = "validate/results/cpu-ci.jsonl") -> None:
    rows = [json.loads(line) for line in open(path)]
    errors = {"16 B/param": [], "Korthikanti + states + logits": [], "memcalc": []}
    for r in rows:
        spec, t, measured = ModelSpec(**r["model"]), TrainingConfig(**r["training"]), r["measured_peak_bytes"]
        for name, value in (("16 B/param", 16 * spec.param_count),
                            ("Korthikanti + states + logits", korthikanti_bytes(spec, t)),
                            ("memcalc", estimate(spec, t).peak_bytes)):
            errors[name].append((value - measured) / measured * 100)
    print(f"{len(rows)} recorded configurations ({path})")
    for name, errs in errors.items():
        mean = sum(map(abs, errs)) / len(errs)
        print(f"  {name:32s} error {min(errs):+8.2f}% .. {max(errs):+8.2f}%, mean |error| {mean:.3f}%")


if __name__ == "__main__":
    main(*sys.argv[1:])
