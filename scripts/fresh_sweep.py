"""Validate memcalc on configurations nobody tuned for: (model, training) pairs drawn at random over
every program by the test suite's own strategies (tests/strategies.cases, with the fine-tuning,
clipping and call-path fields of finetune_steps on a share of them), each measured on CPU by the
validator (validate.run.runner.run_case: the real training step under the live-tensor tracker; a MoE
step predicted with the routing it measured) and compared with memcalc's prediction.

The draws are reproducible (hypothesis with a fixed seed, generation only, five times as many
as asked and a seeded sample of them, since hypothesis draws neighbours in a row); none of them is in the
ci matrix or was looked at before the run. Rows go to a JSON-lines file (resumable: a row already
there is not measured again), and the summary prints worst and mean error per group.

    PYTHONPATH=. python scripts/fresh_sweep.py --n 60 --seed 1 --out validate/results/fresh-sweep.jsonl

The standing job: `--fresh` draws a new seed from the OS (printed first, so any run can be drawn
again with --seed), and the run exits 1 naming the seed and every row off by more than
--report-over percent (0.01 by default) or not compared.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def draw_cases(n: int, seed: int, finetune_share: float = 0.4, programs: list | None = None) -> list:
    """n Cases drawn over every program, or over `programs` ((family, implementation) pairs: a
    past sweep's, to draw it again once the registry has more), device cpu: the step is measured
    on this CPU."""
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st
    from hypothesis import seed as seeded

    from tests.strategies import cases, finetune_steps
    from validate.run.case import Case

    drawn: list = []

    @seeded(seed)
    @settings(max_examples=5 * n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        model, training = data.draw(cases() if programs is None else cases(programs=programs))
        training = training.with_(device="cpu")
        if data.draw(st.floats(0, 1)) < finetune_share:
            training = data.draw(finetune_steps(model, training))
        # the validator's own loop runs no transformers.Trainer (validate.measure.step.check_runnable
        # refuses hf_trainer there): a draw with it would measure a step without the Trainer's
        # look-ahead batch and loss scalars (fresh1202-008: +1,424 B, +0.18%); the Trainer's tensors
        # are measured through transformers.Trainer by the ci rows tr00-07, cpf48-49
        training = training.with_(hf_trainer=False)
        if training.checkpoint_every is not None and training.checkpoint_every > model.num_layers:
            # validate.measure.step.check_runnable refuses a segment longer than the model (the
            # strategies draw it independently of num_layers): one segment of every layer instead
            training = training.with_(checkpoint_every=model.num_layers)
        drawn.append((model, training))

    collect()  # hypothesis draws neighbours in a row: a seeded sample of five times as many
    out, seen = [], set()
    for i, (model, training) in enumerate(random.Random(seed).sample(drawn, len(drawn))):
        case = Case(f"fresh{seed}-{i:03d}", model, training)
        if case.key not in seen:
            seen.add(case.key)
            out.append(case)
    return out[:n]


def group(row: dict) -> str:
    """A row's group for the summary: MoE, fine-tuning (LoRA/QLoRA/freeze/8-bit/Adafactor), call
    path, else the family."""
    model, training = row["model"], row["training"]
    if model.get("moe"):
        return "moe"
    if training.get("lora") or training.get("freeze") or training.get("quantization") not in (None, "none") \
            or training.get("optimizer") in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor"):
        return "fine-tuning"
    return model["family"]


def summarise(rows: list[dict]) -> None:
    """Worst and mean |error| per group and overall; rows that errored or were not predicted."""
    ok = [r for r in rows if r.get("error_pct") is not None]
    bad = [r for r in rows if r.get("error_pct") is None]
    groups: dict[str, list[float]] = {}
    for r in ok:
        groups.setdefault(group(r), []).append(r["error_pct"])
    for name, errs in sorted(groups.items()) + [("all", [r["error_pct"] for r in ok])]:
        if errs:
            worst = max(errs, key=abs)
            print(f"{name:>12}: {len(errs):3d} rows, worst {worst:+.4f}%, mean |err| "
                  f"{statistics.mean(abs(e) for e in errs):.4f}%")
    for r in sorted(ok, key=lambda r: -abs(r["error_pct"]))[:5]:
        print(f"  {r['error_pct']:+.4f}% {r['label']}")
    for r in bad:
        print(f"  no comparison: {r['label']}: {r.get('error') or r.get('no_prediction')}")


def rows_over(rows: list[dict], percent: float) -> list[dict]:
    """The rows off by more than `percent`, or with no comparison (an error, no prediction).

    >>> rows_over([{"error_pct": 0.002}, {"error_pct": -0.03}, {"error_pct": None}], 0.01)
    [{'error_pct': -0.03}, {'error_pct': None}]
    """
    return [r for r in rows if r.get("error_pct") is None or abs(r["error_pct"]) > percent]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="a new seed from the OS (printed)")
    parser.add_argument("--report-over", type=float, default=0.01, help="percent (0.01)")
    parser.add_argument("--out", default="validate/results/fresh-sweep.jsonl")
    args = parser.parse_args()
    from validate.run.runner import run_cases

    seed = random.SystemRandom().randrange(2**31) if args.fresh else args.seed
    print(f"fresh sweep: seed {seed}, {args.n} rows", flush=True)
    cases = draw_cases(args.n, seed)
    rows = run_cases(cases, args.out, progress=lambda c: print(c.label, flush=True))
    summarise(rows)
    over = rows_over(rows, args.report_over)
    for r in over:
        print(f"seed {seed}: {r['label']}: {r.get('error_pct')}% (over {args.report_over}%)")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
