"""Recompute 'worst' and 'balanced' on the MoE ci rows from their recorded configs (no torch)."""
import json, sys
from memcalc import ModelSpec, TrainingConfig, estimate
rows = [json.loads(l) for l in open("validate/results/cpu-ci-moe.jsonl")]
for r in rows:
    spec = ModelSpec.model_validate(r["model"]) if hasattr(ModelSpec, "model_validate") else None
    t = TrainingConfig(**r["training"])
    m = r["measured_peak_bytes"]
    old = r["extra"]["moe"]["worst_peak_bytes"]
    new = estimate(spec, t.with_(moe_routing="worst")).peak_bytes
    bal = estimate(spec, t.with_(moe_routing="balanced")).peak_bytes
    print(r["name"], t.experts_implementation, spec.moe.num_experts, spec.moe.top_k, m, old, new, new - old,
          f"{100*(old-m)/m:+.2f}% {100*(new-m)/m:+.2f}% bal {100*(bal-m)/m:+.2f}% (rec {r['extra']['moe']['balanced_peak_bytes']==bal})")
