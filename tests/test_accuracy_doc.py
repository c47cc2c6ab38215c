"""docs/accuracy.md's accuracy tables are the recorded results (scripts/accuracy_tables.py): the
check fails when a recorded row changes and the doc is not regenerated, and the tables cover every
case of the CI matrices (counted here from the matrices themselves)."""
from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path

from validate.matrices import MATRICES, get_matrix

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "accuracy.md"


def _script():
    spec = importlib.util.spec_from_file_location("accuracy_tables", ROOT / "scripts" / "accuracy_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


TABLES = _script()
ROWS = TABLES.recorded_rows()


def test_the_doc_matches_the_recorded_results():
    """Regenerate with: python scripts/accuracy_tables.py --write docs/accuracy.md"""
    assert TABLES.main(["--check", str(DOC)]) == 0


def test_the_check_fails_on_a_stale_doc(tmp_path, capsys):
    text = DOC.read_text()
    count = sum(r.matrix == "ci" for r in ROWS)  # as if one row were added and the doc not rewritten
    stale = text.replace(f"**{count}**", f"**{count - 1}**", 1)
    assert stale != text
    (tmp_path / "accuracy.md").write_text(stale)
    assert TABLES.main(["--check", str(tmp_path / "accuracy.md")]) == 1
    assert "stale" in capsys.readouterr().err


def test_the_tables_hold_every_case_of_the_ci_matrices():
    for matrix in TABLES.MATRICES_SHOWN:
        names = [c.name for c in get_matrix(matrix)]
        assert sorted(r.name for r in ROWS if r.matrix == matrix) == sorted(names), matrix
        assert {r.topic for r in ROWS if r.matrix == matrix} == set(MATRICES[matrix]["topics"])
    call_path_rows = [r for r in ROWS if r.topic in TABLES.CALL_PATH_TOPICS]
    groups = TABLES.grouped(call_path_rows, lambda r: (r.family, r.call_path))
    assert sum(len(g) for g in groups.values()) == len(call_path_rows) > 0


def test_the_scripts_doctests():
    assert doctest.testmod(TABLES, optionflags=doctest.ELLIPSIS).failed == 0
