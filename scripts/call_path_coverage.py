"""Which call-path combinations each hand-written family has recorded rows for (issue 24's done-when:
use_cache both ways, mask none/ones/padded, SDPA and eager, with and without checkpointing).

A row counts when it is in the `ci` matrix and its result is recorded in the matrix's results file
(the last record of its case key, as scripts/accuracy_tables.py reads them) within `--bound` %.
Each row is placed in four dimensions: use_cache (True/False), the attention mask (none/ones/padded),
the kernel transformers runs (TrainingConfig.resolved_attention: SDPA or eager), and checkpointing
(none, or any checkpointing); a family without an SDPA path (Supports.sdpa_refusal) has no SDPA
cells. For each family this prints the pairs of values (any two dimensions) no recorded row covers,
and how many cells of the whole grid are covered.

    python scripts/call_path_coverage.py            # gaps per family; exit 1 when any pair is missing
    python scripts/call_path_coverage.py --grid     # also list the whole grid's uncovered cells
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DIMENSIONS = ("use_cache", "mask", "kernel", "checkpointing")
"""The four dimensions of the done-when, in the order a cell lists them."""

Cell = tuple[bool, str, str, bool]
"""(use_cache, mask, kernel, checkpointed)."""


def family_cells(kernels: tuple[str, ...]) -> list[Cell]:
    """Every cell of the grid for a family running `kernels`.

    >>> len(family_cells(("sdpa", "eager"))), len(family_cells(("eager",)))
    (24, 12)
    """
    return list(itertools.product((False, True), ("none", "ones", "padded"), kernels, (False, True)))


def missing_pairs(covered: set[Cell], cells: list[Cell]) -> list[str]:
    """Each pair of dimension values that some cell of `cells` has and no covered cell has.

    >>> cells = family_cells(("eager",))
    >>> missing_pairs(set(cells), cells)
    []
    >>> missing_pairs({c for c in cells if not (c[0] and c[3])}, cells)
    ['use_cache=True & checkpointing=True']
    """
    out = []
    for i, j in itertools.combinations(range(len(DIMENSIONS)), 2):
        wanted = sorted({(c[i], c[j]) for c in cells}, key=str)
        have = {(c[i], c[j]) for c in covered}
        out += [f"{DIMENSIONS[i]}={a} & {DIMENSIONS[j]}={b}" for a, b in wanted if (a, b) not in have]
    return out


def recorded_cells(bound_pct: float) -> dict[str, dict[Cell, list[str]]]:
    """Per hf family: each covered cell and the rows that cover it (ci matrix, recorded, within bound)."""
    from validate.matrices import MATRICES, get_matrix
    from validate.run.compare import read_jsonl

    records = {r["key"]: r for r in read_jsonl(ROOT / "validate" / "results" / MATRICES["ci"]["results"])}
    out: dict[str, dict[Cell, list[str]]] = {}
    for case in get_matrix("ci"):
        record = records.get(case.key)
        if case.spec.implementation != "hf" or record is None or record.get("measured_peak_bytes") is None:
            continue
        err = (record["predicted_peak_bytes"] - record["measured_peak_bytes"]) * 100 / record["measured_peak_bytes"]
        if abs(err) > bound_pct:
            continue
        t = case.training
        cell = (t.use_cache, t.attention_mask, t.resolved_attention(case.spec), t.checkpointing != "none")
        out.setdefault(case.spec.family, {}).setdefault(cell, []).append(case.name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bound", type=float, default=0.01, help="a row counts within this |error| in %%")
    parser.add_argument("--grid", action="store_true", help="also list each family's uncovered grid cells")
    args = parser.parse_args(argv)
    from memcalc.families.registry import declaration, families_with

    covered = recorded_cells(args.bound)
    gaps = 0
    for family in families_with():
        decl = declaration(family)
        if "hf" not in decl.programs:
            continue
        kernels = ("eager",) if decl.supports.sdpa_refusal else ("sdpa", "eager")
        cells = family_cells(kernels)
        have = set(covered.get(family, {}))
        missing = missing_pairs(have, cells)
        gaps += len(missing)
        print(f"{family}: {len(have & set(cells))}/{len(cells)} cells, "
              f"{'all pairs covered' if not missing else str(len(missing)) + ' pairs missing'}")
        for pair in missing:
            print(f"    missing {pair}")
        if args.grid:
            for cell in cells:
                if cell not in have:
                    print(f"    cell {dict(zip(DIMENSIONS, cell))}")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
