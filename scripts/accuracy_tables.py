"""docs/accuracy.md's accuracy tables, generated from the recorded results of the CI matrices
(validate/results/cpu-ci.jsonl, dist-ci.jsonl): by topic (the row file, which names the bound in
validate/matrices/tolerances.py), by model family, and for the call-path rows (call-paths-by-family,
call-paths-grid, call-paths, trainer) by family and call path. Each error is (predicted - measured) / measured of the
step's peak as recorded (each rank's peak on distributed rows); only rows of the current `ci` and
`dist-ci` matrices count, the last record of each case key (a resumed run appends).

    python scripts/accuracy_tables.py                          # print the tables
    python scripts/accuracy_tables.py --write docs/accuracy.md # replace the generated regions
    python scripts/accuracy_tables.py --check docs/accuracy.md # exit 1 when the doc is stale

A generated region sits between `<!-- begin generated: NAME -->` and `<!-- end generated: NAME -->`
(NAME one of REGIONS); everything outside the markers is hand-written.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MATRICES_SHOWN = ("ci", "dist-ci")
"""The matrices CI runs (.ci/run) and whose results are recorded."""
CALL_PATH_TOPICS = ("call-paths-by-family", "call-paths-grid", "call-paths", "trainer")
"""The topics whose rows leave the validator's own call path (a mask, use_cache, the Trainer)."""


@dataclass(frozen=True)
class Row:
    """One recorded row of a CI matrix, with what the tables group it by."""

    name: str
    topic: str
    matrix: str
    family: str
    call_path: str
    kernel: str
    checkpointing: str
    errors: tuple[tuple[float, int], ...]
    """(error in %, predicted - measured in bytes) of the step's peak; one per rank when distributed."""


def error(predicted: int, measured: int) -> tuple[float, int]:
    """(error in % of the measurement, the difference in bytes).

    >>> error(999_996, 1_000_000)
    (-0.0004, -4)
    """
    return (predicted - measured) * 100 / measured, predicted - measured


def row_errors(record: dict) -> tuple[tuple[float, int], ...]:
    """A recorded row's step-peak errors: each rank's when the row has ranks, else the step's.

    >>> row_errors({"predicted_peak_bytes": 96, "measured_peak_bytes": 100})
    ((-4.0, -4),)
    >>> row_errors({"predicted_rank_peak_bytes": [10, 8], "measured_rank_peak_bytes": [10, 10]})
    ((0.0, 0), (-20.0, -2))
    """
    if record.get("measured_rank_peak_bytes"):
        pairs = zip(record["predicted_rank_peak_bytes"], record["measured_rank_peak_bytes"])
    else:
        pairs = [(record["predicted_peak_bytes"], record["measured_peak_bytes"])]
    return tuple(error(p, m) for p, m in pairs)


def call_path(attention_mask: str, use_cache: bool, hf_trainer: bool) -> str:
    """A row's call path in words: the mask it passes, use_cache, and whether transformers.Trainer ran it.

    >>> call_path("none", False, False), call_path("padded", True, False), call_path("ones", False, True)
    ('mask none', 'mask padded, use_cache', 'mask ones, Trainer')
    """
    return ", ".join([f"mask {attention_mask}"] + ["use_cache"] * use_cache + ["Trainer"] * hf_trainer)


def family_label(family: str, implementation: str, name: str = "") -> str:
    """The family column: ModelSpec.family, the project's reference models marked as such, a
    traced model (memcalc.traced) by its name.

    >>> family_label("llama", "hf"), family_label("gpt2", "reference"), family_label("traced", "traced", "phi (traced)")
    ('llama', 'reference gpt2', 'phi (traced)')
    """
    if implementation == "traced":
        return name
    return family if implementation == "hf" else f"{implementation} {family}"


def latest(path: Path) -> dict[str, dict]:
    """A results file's rows by case key, the last of each key (as tests/test_recorded_rows.py reads them)."""
    from validate.run.compare import read_jsonl

    return {r["key"]: r for r in read_jsonl(path)}


def recorded_rows(matrices: Iterable[str] = MATRICES_SHOWN) -> list[Row]:
    """The recorded rows of the current matrices, in matrix order (a case not yet recorded is left out;
    tests/test_recorded_rows.py fails on it)."""
    from validate.matrices import MATRICES, get_matrix

    out = []
    for matrix in matrices:
        records = latest(ROOT / "validate" / "results" / MATRICES[matrix]["results"])
        for case in get_matrix(matrix):
            record = records.get(case.key)
            if record is None or record.get("measured_peak_bytes") is None:
                continue
            training = case.training
            family = family_label(case.spec.family, case.spec.implementation, case.spec.name)
            out.append(Row(case.name, case.topic, matrix, family,
                           call_path(training.attention_mask, training.use_cache, training.hf_trainer),
                           training.resolved_attention(case.spec), training.checkpointing, row_errors(record)))
    return out


def pct(value: float, digits: int = 4) -> str:
    """A percentage as the tables print it; a nonzero value too small for `digits` says so.

    >>> pct(-0.00061), pct(0.0), pct(-0.00001), pct(0.00002, 5)
    ('-0.0006%', '0%', '-<0.0001%', '+0.00002%')
    """
    if value == 0:
        return "0%"
    if round(value, digits) == 0:
        return f"{'-' if value < 0 else '+'}<{10 ** -digits:.{digits}f}%"
    return f"{value:+.{digits}f}%"


def summary_cells(rows: list[Row]) -> tuple[str, str, str]:
    """(rows, worst with its bytes and row, mean |error|) of a group of rows; a distributed group
    counts its rank peaks too.

    >>> a = Row("a1", "t", "ci", "llama", "mask none", "sdpa", "none", ((-0.0006, -48),))
    >>> b = Row("a2", "t", "ci", "llama", "mask none", "sdpa", "none", ((0.0002, 16),))
    >>> summary_cells([a, b])
    ('2', '-0.0006% (-48 B, `a1`)', '0.00040%')
    """
    errors = [(e, b, r.name) for r in rows for e, b in r.errors]
    worst = max(errors, key=lambda e: abs(e[0]))
    count = str(len(rows)) if len(errors) == len(rows) else f"{len(rows)} ({len(errors)} rank peaks)"
    mean = statistics.mean(abs(e) for e, _, _ in errors)
    return count, f"{pct(worst[0])} ({worst[1]:+d} B, `{worst[2]}`)".replace("+0 B", "0 B"), \
        f"{mean:.5f}%" if mean else "0%"


def grouped(rows: list[Row], key: Callable[[Row], tuple[str, ...]]) -> dict[tuple[str, ...], list[Row]]:
    """Rows by `key`, groups in order of first appearance.

    >>> r = Row("a1", "t", "ci", "llama", "mask none", "sdpa", "none", ((0.0, 0),))
    >>> list(grouped([r, r], lambda x: (x.topic,)))
    [('t',)]
    """
    out: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        out.setdefault(key(row), []).append(row)
    return out


def table(header: list[str], lines: list[list[str]], right: int) -> str:
    """A markdown table; the last `right` columns right-aligned.

    >>> print(table(["a", "b"], [["x", "1"]], 1))
    | a | b |
    |---|---:|
    | x | 1 |
    """
    rule = "|" + "---|" * (len(header) - right) + "---:|" * right
    return "\n".join(["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(cells) + " |" for cells in lines])


def topics_table(rows: list[Row]) -> str:
    """Per matrix and topic: its bound (validate/matrices/tolerances.py), rows, worst, mean |error|;
    each matrix's total after its topics."""
    from validate.matrices.tolerances import bound

    lines = []
    for (matrix,), in_matrix in grouped(rows, lambda r: (r.matrix,)).items():
        for (topic,), group in grouped(in_matrix, lambda r: (r.topic,)).items():
            lines.append([f"`{matrix}`", f"{topic}", f"{bound(topic).peak_pct:g}%", *summary_cells(group)])
        lines.append([f"**`{matrix}`**", "**all**", "", *(f"**{c}**" for c in summary_cells(in_matrix))])
    return table(["matrix", "topic (`validate/matrices/rows/`)", "bound", "rows", "worst (row)", "mean abs"], lines, 4)


def families_table(rows: list[Row]) -> str:
    """Per model family (ModelSpec.family) over the single-process rows, most rows first."""
    groups = grouped([r for r in rows if r.matrix == "ci"], lambda r: (r.family,))
    order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return table(["family", "rows", "worst (row)", "mean abs"], [[f, *summary_cells(g)] for (f,), g in order], 3)


def call_paths_table(rows: list[Row]) -> str:
    """Per family and call path over the call-path topics, with the kernels and checkpointing they ran."""
    chosen = [r for r in rows if r.topic in CALL_PATH_TOPICS]
    groups = grouped(chosen, lambda r: (r.family, r.call_path))
    lines = []
    for (family, path), group in sorted(groups.items()):
        kernels = ", ".join(sorted({r.kernel for r in group}))
        ckpt = ", ".join(sorted({r.checkpointing for r in group}))
        lines.append([family, path, kernels, ckpt, *summary_cells(group)])
    return table(["family", "call path", "kernels", "checkpointing", "rows", "worst (row)", "mean abs"], lines, 3)


REGIONS: dict[str, Callable[[list[Row]], str]] = {
    "topics": topics_table, "families": families_table, "call-paths": call_paths_table}
"""Generated region name -> the table it holds."""


def replace_regions(text: str, blocks: dict[str, str]) -> str:
    """`text` with each region's contents between its markers replaced by its block.

    >>> doc = "a\\n<!-- begin generated: t -->\\nold\\n<!-- end generated: t -->\\nb\\n"
    >>> print(replace_regions(doc, {"t": "new"}), end="")
    a
    <!-- begin generated: t -->
    new
    <!-- end generated: t -->
    b
    """
    for name, block in blocks.items():
        pattern = re.compile(rf"(<!-- begin generated: {re.escape(name)} -->\n).*?(<!-- end generated: "
                             rf"{re.escape(name)} -->)", re.S)
        if len(pattern.findall(text)) != 1:
            raise SystemExit(f"the doc needs exactly one '<!-- begin generated: {name} -->' ... "
                             f"'<!-- end generated: {name} -->' region")
        text = pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)
    return text


def blocks(rows: list[Row]) -> dict[str, str]:
    """Each region's generated contents."""
    return {name: make(rows) for name, make in REGIONS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", type=Path, metavar="DOC", help="replace DOC's generated regions")
    what.add_argument("--check", type=Path, metavar="DOC", help="exit 1 when DOC's generated regions are stale")
    args = parser.parse_args(argv)
    generated = blocks(recorded_rows())
    doc = args.write or args.check
    if doc is None:
        print("\n\n".join(f"{name}:\n{block}" for name, block in generated.items()))
        return 0
    text = doc.read_text()
    fresh = replace_regions(text, generated)
    if args.write:
        doc.write_text(fresh)
        return 0
    if fresh != text:
        print(f"{doc} is stale: run python scripts/accuracy_tables.py --write {doc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["Row", "REGIONS", "recorded_rows", "blocks", "replace_regions", "main"]


if __name__ == "__main__":
    sys.exit(main())

