"""Cross-check (issue 25): every hand-written family's program against the traced program of the
same HF model, on the ci matrix's own shapes.

    python scripts/traced_crosscheck.py                     # 2 ci rows per family
    python scripts/traced_crosscheck.py --per-family 1 --family llama --out x.jsonl

The two are independent derivations of one step: memcalc.families' program, written op by op from
transformers' source, and memcalc.traced's trace of the model the validator builds for the row
(validate.models.hf.build_hf, under FakeTensorMode) on the validator's default call path
(`model(input_ids=ids, labels=ids, use_cache=False).loss`). A row is taken when the traced step
runs it: one process, the HF implementation, the default call path, full training, a precision
other than fp16-amp, an optimizer torch.optim traces (sgd, sgd-momentum, adam, adamw),
checkpointing none or per-layer, grouped_mm experts. Prints, per row, both steady and first-step
peaks and their difference; per family, the worst; exit 1 when one is over --bound (% of the
hand-written peak, default 0.01). Needs torch and transformers; each row traces cold (7 fake steps)
unless memcalc's trace cache ($MEMCALC_TRACE_CACHE) holds it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TRACEABLE = {"micro_batch", "seq_len", "precision", "checkpointing", "optimizer", "optimizer_impl",
             "weight_decay", "grad_accum", "max_grad_norm", "device", "attention"}
"""TrainingConfig fields a cross-check row may set (memcalc.traced.build.TRACED_FIELDS, and the
attention kernel, which the model applies itself: build_hf passes it to transformers)."""


class HandFactory:
    """factory(training): the model validate.models.hf.build_hf makes for the row (its attention
    and checkpointing), keyed for the trace cache by the row's fields (`cfg`, memcalc.traced.disk)."""

    def __init__(self, spec, training, hf_config):
        self.spec, self.training, self.hf_config = spec, training, hf_config
        self.cfg = {"crosscheck": spec.model_dump(mode="json"), "training": training.model_dump(mode="json"),
                    "hf_config": hf_config}

    def __call__(self, training):  # noqa: ARG002 (the row's own TrainingConfig builds it)
        from validate.models.hf import build_hf

        return build_hf(self.spec, self.training, self.hf_config)[0]


def model_type(case) -> str:
    """The HF model type the validator builds for the row (several share one program: Qwen2,
    Mistral, Qwen3 and SmolLM3 are memcalc's llama family with options)."""
    from validate.models.hf import hf_config_dict

    return (case.hf_config or hf_config_dict(case.spec))["model_type"]


def traceable(case) -> bool:
    """Whether the traced step runs this ci row (see the module docstring)."""
    from memcalc.inputs.training import TrainingConfig

    t, default = case.training, TrainingConfig(micro_batch=1, seq_len=1, device="cpu")
    if case.traced is not None or case.trainer_args is not None or case.trl is not None or case.distributed:
        return False
    if case.spec.implementation != "hf" or t.precision == "fp16-amp" or t.checkpointing not in ("none", "per-layer"):
        return False
    if t.optimizer not in ("sgd", "sgd-momentum", "adam", "adamw"):
        return False
    skip = TRACEABLE | ({"moe_routing"} if case.spec.moe is not None else set())
    return all(getattr(t, n) == getattr(default, n) for n in TrainingConfig.model_fields if n not in skip)


def adapted(case):
    """A single-process HF ci row with its shape and model, its other fields made traceable:
    fp16-amp as bf16-amp, other checkpointing as per-layer, other optimizers as adamw, every other
    field at its default (None: not an HF row in one process)."""
    import dataclasses

    from memcalc.inputs.training import TrainingConfig

    if case.traced is not None or case.trainer_args is not None or case.trl is not None or case.distributed:
        return None
    if case.spec.implementation != "hf":
        return None
    t = case.training
    fields = {n: getattr(t, n) for n in TRACEABLE}
    fields["precision"] = "bf16-amp" if t.precision == "fp16-amp" else t.precision
    fields["checkpointing"] = t.checkpointing if t.checkpointing in ("none", "per-layer") else "per-layer"
    fields["optimizer"] = t.optimizer if t.optimizer in ("sgd", "sgd-momentum", "adam", "adamw") else "adamw"
    if fields["optimizer"] != t.optimizer:
        fields["optimizer_impl"] = None
    return dataclasses.replace(case, name=case.name + "*", training=TrainingConfig.make(**fields))


def check(case) -> dict:
    """Both programs' peaks for one row."""
    import memcalc
    from memcalc.traced.hf import hf_loss

    start = time.perf_counter()
    hand = memcalc.estimate(case.spec, case.training)
    traced = memcalc.ModelSpec.from_module(HandFactory(case.spec, case.training, case.hf_config),
                                           inputs=case.spec.vocab_size, loss=hf_loss, name=f"{case.name} traced")
    default = type(case.training).model_fields["moe_routing"].default  # the trace runs the model's own routing
    tr = memcalc.estimate(traced, case.training.with_(attention=None, moe_routing=default))
    pct = lambda a, b: round(100 * (a - b) / b, 6)  # noqa: E731
    return {"name": case.name, "family": model_type(case), "label": case.label,
            "hand": hand.peak_bytes, "traced": tr.peak_bytes, "diff_pct": pct(tr.peak_bytes, hand.peak_bytes),
            "hand_first": hand.first_step_peak_bytes, "traced_first": tr.first_step_peak_bytes,
            "first_diff_pct": pct(tr.first_step_peak_bytes, hand.first_step_peak_bytes),
            "wall_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    from validate.matrices import get_matrix

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-family", type=int, default=2, help="ci rows per family (default 2)")
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    parser.add_argument("--bound", type=float, default=0.01, help="%% of the hand-written peak (default 0.01)")
    parser.add_argument("--out", help="JSON lines file of the rows (appended)")
    args = parser.parse_args(argv)
    taken: dict[str, list] = {}
    for case in get_matrix("ci", "cpu"):
        if case.traced is not None or case.spec.implementation != "hf":
            continue
        fam = model_type(case)
        if traceable(case) and (not args.family or fam in args.family) and len(taken.get(fam, [])) < args.per_family:
            taken.setdefault(fam, []).append(case)
    for case in get_matrix("ci", "cpu"):  # a family with no such row: its first, made traceable
        if case.traced is not None or case.spec.implementation != "hf":
            continue
        fam = model_type(case)
        if fam not in taken and (not args.family or fam in args.family):
            made = adapted(case)
            if made is not None:
                taken[fam] = [made]
    rows, worst = [], {}
    for fam, cases in sorted(taken.items()):
        for case in cases:
            try:
                row = check(case)
            except Exception as err:  # kept and shown: a refusal names its op
                row = {"name": case.name, "family": fam, "label": case.label,
                       "error": f"{type(err).__name__}: {err}"[:400]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if "error" not in row:
                w = max(abs(row["diff_pct"]), abs(row["first_diff_pct"]))
                worst[fam] = max(worst.get(fam, 0.0), w)
    print("\n| family | rows | worst abs diff (steady and first step) |\n|---|---|---|")
    for fam in sorted(taken):
        n = sum(1 for r in rows if r["family"] == fam and "error" not in r)
        print(f"| {fam} | {n} | {worst[fam]:.6f}% |" if fam in worst else f"| {fam} | 0 | refused |")
    failed = [f for f, w in worst.items() if w > args.bound] + [r["family"] for r in rows if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
