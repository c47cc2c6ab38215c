"""Snapshot every number the engine gives on a fixed, broad set of configurations, so that a
restructure can be proven to change none of them (no torch needed).

    python scripts/snapshot_predictions.py --out /tmp/before.json     # at the old commit
    python scripts/snapshot_predictions.py --compare /tmp/before.json # after the change: exit 1 on any diff

The set: every configuration of the recorded matrices (validate/results/*.jsonl, single-device
and per-rank), a seeded sample of presets x precisions x checkpointing x attention x optimizers x
implementations x devices x shardings x tensor-parallel degrees, the capacity solvers, the
planner, estimate_grid on cuda and cpu, optimal_segment_size and the symbolic peak.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _report(model, training) -> dict:
    import memcalc

    try:
        r = memcalc.estimate(model, training)
    except memcalc.MemcalcError as err:
        return {"error": str(err)}
    return {"peak": r.peak_bytes, "first": r.first_step_peak_bytes, "phase": r.peak_phase,
            "phases": r.phases, "components": r.components, "moment": r.moment,
            "ranks": list(r.rank_peak_bytes)}


def _recorded() -> dict:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    out = {}
    for path in sorted((ROOT / "validate" / "results").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "key" not in row:  # a run of many steps (cpu-ci-lengths.jsonl), not one configuration
                continue
            key = json.loads(row["key"])
            out[f"recorded {path.name} {row['name']}"] = _report(
                ModelSpec.make(**key["model"]), TrainingConfig.make(**key["training"]))
    return out


PRESETS = ["gpt2", "gpt2-medium", "llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2-0.5b", "qwen2-1.5b"]


def _sampled(n: int) -> dict:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    rng = random.Random(20261201)
    out = {}
    small = [ModelSpec.preset(p) for p in PRESETS] + [
        ModelSpec.make(family="gpt2", implementation="reference", vocab_size=1000, hidden_size=128,
                       num_layers=3, num_heads=4, max_position_embeddings=256, activation="gelu_tanh"),
        ModelSpec.make(family="llama", implementation="reference", vocab_size=1000, hidden_size=96,
                       num_layers=4, num_heads=6, num_kv_heads=2, intermediate_size=256,
                       max_position_embeddings=512, tie_embeddings=True, qkv_bias=False, out_bias=False,
                       mlp_bias=False, activation="silu"),
        ModelSpec.make(family="gpt2", vocab_size=500, hidden_size=64, num_layers=2, num_heads=2,
                       max_position_embeddings=512, tie_embeddings=False, attn_dropout=0.0),
        ModelSpec.make(family="llama", vocab_size=700, hidden_size=64, num_layers=5, num_heads=4,
                       num_kv_heads=1, intermediate_size=160, max_position_embeddings=512,
                       attn_dropout=0.1, qkv_bias=True, out_bias=False, mlp_bias=False, activation="silu"),
    ]
    while len(out) < n:
        model = rng.choice(small)
        ckpt = rng.choice(["none", "per-layer", "sqrt", "every-k", "selective"])
        world = rng.choice([1, 1, 1, 2, 4])
        tp = rng.choice([1, 1, 2]) if world % 2 == 0 else 1
        fields = dict(micro_batch=rng.choice([1, 2, 3, 8]), seq_len=rng.choice([16, 64, 100, 256, 512]),
                      grad_accum=rng.choice([1, 1, 2, 3]),
                      precision=rng.choice(["fp32", "fp16-amp", "bf16-amp", "bf16"]),
                      optimizer=rng.choice(["sgd", "sgd-momentum", "adam", "adamw"]),
                      optimizer_impl=rng.choice([None, "foreach", "fused", "for-loop"]),
                      weight_decay=rng.choice([None, 0.0, 0.1]),
                      checkpointing=ckpt, checkpoint_every=rng.choice([1, 2, 3]) if ckpt == "every-k" else None,
                      attention=rng.choice(["eager", "sdpa"]), device=rng.choice(["cuda", "cpu"]),
                      world_size=world,
                      sharding=rng.choice(["none", "zero1", "zero2", "zero3"]) if world > 1 else "none",
                      tensor_parallel=tp)
        if tp > 1 and model.implementation == "reference" and rng.random() < 0.3:
            fields["sequence_parallel"] = True
            fields["seq_len"] = 64
        if fields["sharding"] in ("zero2", "zero3") and fields["precision"] == "fp32" and rng.random() < 0.3:
            fields["fsdp_mixed_precision"] = True
        try:
            training = TrainingConfig.make(**fields)
        except Exception as err:  # noqa: BLE001 - recorded as part of the snapshot
            out[f"sample {len(out)}"] = {"config_error": str(err)}
            continue
        out[f"sample {len(out)} {model.name} {json.dumps(fields, sort_keys=True)}"] = _report(model, training)
    return out


def _consumers() -> dict:
    import numpy as np

    import memcalc
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    out = {}
    gpt2, llama = ModelSpec.preset("gpt2"), ModelSpec.preset("llama-2-7b")
    for device in ("cuda", "cpu"):
        for model in (gpt2, llama):
            t = TrainingConfig(micro_batch=2, seq_len=1024, precision="bf16-amp",
                               checkpointing="per-layer", device=device)
            lengths = [128, 500, 1024, 2048, 4095][:3 if model.family == "gpt2" else 5]
            grid = memcalc.estimate_grid(model, t, micro_batch=np.arange(1, 40)[:, None], seq_len=np.array(lengths))
            # GPT-2 runs at most 1024 tokens (max_position_embeddings): estimate() refuses more
            out[f"grid {device} {model.name}"] = grid.tolist()
            grid2 = memcalc.estimate_grid(model, t, micro_batch=np.array([1, 2, 4]),
                                          num_layers=np.array([2, 3, 5]))
            out[f"grid layers {device} {model.name}"] = grid2.tolist()
            for solver in ("max_micro_batch", "max_seq_len", "max_layers"):
                c = getattr(memcalc, solver)(model, t, "80GB", **_allocated(getattr(memcalc, solver)))
                out[f"{solver} {device} {model.name}"] = [c.value, c.peak_bytes, c.next_peak_bytes]
            out[f"expr {device} {model.name}"] = str(memcalc.estimate(model, t).expr)
    t = TrainingConfig(micro_batch=4, seq_len=2048, precision="bf16-amp")
    out["optimal_segment_size llama"] = memcalc.optimal_segment_size(llama, t)
    out["optimal_segment_size gpt2"] = memcalc.optimal_segment_size(gpt2, t.with_(seq_len=1024))  # <= 1024 positions
    plans = memcalc.plan(ModelSpec.preset("llama-3-8b"), "H100-80GB", global_batch=256, seq_len=4096,
                         **_allocated(memcalc.plan))
    out["plan llama-3-8b"] = [repr(p) for p in plans[:10]]
    zero3 = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16", checkpointing="per-layer",
                           world_size=8, sharding="zero3")
    from memcalc.queries.capacity import min_world_size

    # (Capacity's basis field, issue 23 item 3, left out: min_world_size answers on allocated memory)
    out["min_world_size 70b"] = repr(min_world_size(ModelSpec.preset("llama-2-70b"), zero3, "80GB")).replace(
        ", basis='allocated'", "")
    return out


def _allocated(fn) -> dict:
    """basis="allocated" for a query that takes a basis (issue 23 item 3: capacity and plan answer on
    device bytes by default; this snapshot holds the allocated figures, comparable across commits)."""
    import inspect

    return {"basis": "allocated"} if "basis" in inspect.signature(fn).parameters else {}


def snapshot(n: int) -> dict:
    """Every number, keyed by what produced it."""
    return {**_recorded(), **_sampled(n), **_consumers()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the snapshot here")
    parser.add_argument("--compare", help="compare with this snapshot; exit 1 on any difference")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--ignore-labels", action="store_true",
                        help="compare numbers only, not the label of the moment that sets the peak")
    args = parser.parse_args(argv)
    data = json.loads(json.dumps(snapshot(args.samples), sort_keys=True, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(data, sort_keys=True, indent=0))
    if args.compare:
        old = json.loads(Path(args.compare).read_text())
        diffs = [k for k in sorted(set(old) | set(data)) if old.get(k) != data.get(k)]
        if args.ignore_labels:  # moment labels name parameters; numbers must still agree
            def numbers(v):
                return {f: x for f, x in v.items() if f != "moment"} if isinstance(v, dict) else v
            diffs = [k for k in diffs if numbers(old.get(k)) != numbers(data.get(k))]
        for k in diffs[:20]:
            print(f"DIFF {k}\n  before {str(old.get(k))[:300]}\n  after  {str(data.get(k))[:300]}")
        print(f"snapshot: {len(data)} entries, {len(diffs)} differ")
        return 1 if diffs else 0
    print(f"snapshot: {len(data)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
