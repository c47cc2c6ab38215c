"""Worst and mean |error| per group of a validator results file (JSON lines from `python -m
validate run`), the figures of docs/accuracy.md's tables: a row's group is its name up to its
first digit (ci00-ci70 together as `ci`), and `all` is every row with a comparison.

    python scripts/summarise_results.py validate/results/cpu-ci.jsonl [--phases]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def group_of(name: str) -> str:
    """The group of a row name: what comes before its first digit ('ci-opt-03' -> 'ci-opt',
    'cifb04-gpt_neox' -> 'cifb').

    >>> group_of("ci07"), group_of("ci-opt-11"), group_of("cifb04-gpt_neox"), group_of("head10")
    ('ci', 'ci-opt', 'cifb', 'head')
    """
    return re.split(r"\d", name, maxsplit=1)[0].rstrip("-")


def latest_rows(path: Path) -> list[dict]:
    """The last row of each configuration (a resumed run appends), in file order."""
    rows: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row.get("key", row.get("name"))] = row
    return list(rows.values())


def summary(rows: list[dict], field: str = "error_pct") -> list[tuple[str, int, float, float, str]]:
    """(group, rows, worst error, mean |error|, worst row's name) per group, then 'all'.

    >>> summary([{"name": "a1", "error_pct": -0.5}, {"name": "a2", "error_pct": 0.1}])
    [('a', 2, -0.5, 0.3, 'a1'), ('all', 2, -0.5, 0.3, 'a1')]
    """
    groups: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        if r.get(field) is not None:
            groups.setdefault(group_of(r["name"]), []).append((r[field], r["name"]))
    every = [e for errs in groups.values() for e in errs]
    out = []
    for name, errs in list(groups.items()) + ([("all", every)] if every else []):
        worst = max(errs, key=lambda e: abs(e[0]))
        out.append((name, len(errs), worst[0], round(statistics.mean(abs(e) for e, _ in errs), 4), worst[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [r for f in args.files for r in latest_rows(f)]
    failed = [r["name"] for r in rows if r.get("error_pct") is None]
    print("| rows | worst | mean abs |\n|---|---:|---:|")
    for name, n, worst, mean, at in summary(rows):
        print(f"| `{name}` ({n}) | {worst:+.4f}% (`{at}`) | {mean:.4f}% |")
    if failed:
        print(f"no comparison: {', '.join(failed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
