"""The reserved comparison again, from stored sequences: no row is run again.

`python -m validate run --reserved --sequences DIR` keeps each row's recorded allocation sequence
(validate.measure.sequence.save_run). After a change to the engine's sequence,

    python -m validate.run.recompare RESULTS.jsonl --sequences DIR [--rows a,b] [--out NEW.jsonl]

recomputes each row's reserved fields (validate.run.reserved.reserved_fields: the replica's replay of
the stored sequence against the current engine's) and writes the rows back (to RESULTS.jsonl, or
--out), with the markdown report beside them (its reserved section replaced). A row whose sequence
is not in DIR keeps its fields. Prints validate.run.reserved's summary.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def recompare_row(row: dict, sequences: str | Path, steps: int = 3) -> dict:
    """`row` with its reserved fields recomputed from its stored sequence (unchanged without one).

    >>> recompare_row({"key": "none", "name": "x"}, "/nonexistent")["name"]
    'x'
    """
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    from validate.measure.sequence import load_run
    from validate.run.reserved import reserved_fields

    stored = load_run(sequences, row["key"])
    if stored is None:
        return row
    events, marks, ops = stored
    spec, training = ModelSpec(**row["model"]), TrainingConfig(**row["training"])
    out = {k: v for k, v in row.items() if k not in ("reserved", "predicted_reserved_bytes",
                                                      "reserved_error_pct", "no_reserved")}
    try:
        out.update(reserved_fields(events, marks, spec, training, steps, ops=ops))
    except Exception as err:  # kept in the row, as validate.run.runner does
        out["no_reserved"] = f"{type(err).__name__}: {err}"[:500]
    return out


def _md(src: Path, path: Path, rows: list[dict]) -> None:
    """Write `path`: the table part of `src` (the .md a --reserved run wrote) and the new reserved part."""
    from validate.run.reserved import markdown, summary, summary_lines

    old = src.read_text() if src.is_file() else ""
    head = old.split("\nreserved", 1)[0].rstrip("\n") if old else f"# validate --reserved: {path.stem}"
    path.write_text(head + "\n\n" + "\n".join(summary_lines(summary(rows))) + "\n" + markdown(rows))


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc)."""
    from memcalc.core.errors import MemcalcError
    from validate.run.compare import read_jsonl
    from validate.run.reserved import summary, summary_lines

    p = argparse.ArgumentParser(prog="python -m validate.run.recompare")
    p.add_argument("results")
    p.add_argument("--sequences", required=True, help="the folder --sequences kept the runs in")
    p.add_argument("--rows", help="only these rows (names, comma-separated)")
    p.add_argument("--out", help="write here instead of RESULTS (a .md beside it)")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    src = Path(args.results)
    if not src.is_file() or not Path(args.sequences).is_dir():
        print(f"validate.run.recompare: {src if not src.is_file() else args.sequences} does not exist; "
              "fix: give the results file and --sequences folder of python -m validate run --reserved",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    only = {n.strip() for n in args.rows.split(",")} if args.rows else None
    rows = list({r["key"]: r for r in read_jsonl(src)}.values())
    try:
        rows = [recompare_row(r, args.sequences, args.steps) if only is None or r.get("name") in only else r
                for r in rows]
    except MemcalcError as err:
        print(f"validate.run.recompare: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = Path(args.out) if args.out else src
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    _md(src.with_suffix(".md"), out.with_suffix(".md"), rows)
    print("\n".join(summary_lines(summary(rows))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
