"""The coverage table of traced models (docs/traced.md): per model of the traced topics
(validate/matrices/rows/traced.json, traced-extra.json), its recorded rows, the worst and mean error
of the step's peak and of the first step's, and the seconds each row took (trace + real step).

    python scripts/traced_coverage.py    # reads validate/results/cpu-ci.jsonl, cpu-traced-extra.jsonl
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FILES = ("cpu-ci.jsonl", "cpu-traced-extra.jsonl")


def main() -> int:
    from validate.matrices import get_matrix
    from validate.run.compare import read_jsonl

    records = {}
    for name in FILES:
        path = ROOT / "validate" / "results" / name
        if path.exists():
            records.update({r["key"]: r for r in read_jsonl(path)})
    cases = [c for m in ("ci", "traced-extra") for c in get_matrix(m, "cpu") if c.traced is not None]
    groups: dict[str, list] = {}
    for case in cases:
        groups.setdefault(case.spec.name, []).append((case, records.get(case.key)))
    print("| model | rows (precision/checkpointing/optimizer) | worst | mean abs | first step worst | s/row |")
    print("|---|---|---|---|---|---|")
    for name, items in sorted(groups.items()):
        done = [(c, r) for c, r in items if r and r.get("error_pct") is not None]
        regimes = ", ".join(f"{c.training.precision}/{c.training.checkpointing}/{c.training.optimizer}"
                            for c, _ in done)
        if not done:
            print(f"| {name} | 0 of {len(items)} | | | | |")
            continue
        errs = [r["error_pct"] for _, r in done]
        firsts = [r["first_step"]["error_pct"] for _, r in done]
        walls = [r.get("wall_s") or 0 for _, r in done]
        worst, fworst = max(errs, key=abs), max(firsts, key=abs)
        print(f"| {name} | {len(done)}: {regimes} | {worst:+.4f}% | {sum(map(abs, errs)) / len(errs):.4f}% "
              f"| {fworst:+.4f}% | {sum(walls) / len(walls):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
