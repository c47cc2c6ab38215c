"""The layout docs/how-it-works.md describes: every import arrow between memcalc's and validate's
modules points one way (scripts/import_cycles.py, imports at any depth), and the engine never
imports torch."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_circles(capsys):
    assert _script().main() == 0, capsys.readouterr().out


def test_the_script_finds_a_circle():
    assert _script().cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_estimate_imports_no_torch():
    code = ("import sys, memcalc; memcalc.estimate(memcalc.ModelSpec.preset('gpt2'), "
            "memcalc.TrainingConfig(micro_batch=1, seq_len=8)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_the_script_counts_annotation_and_function_imports(tmp_path):
    """An import under `if TYPE_CHECKING:` (what the module is written against) and one inside a
    function are arrows as much as a module-level one."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nimport pkg.a\nif TYPE_CHECKING:\n    from pkg.b import X\n"
                    "def f():\n    from pkg import c\n")
    assert _script().imports(path, {"pkg.a", "pkg.b", "pkg.c", "pkg"}) == {"pkg.a", "pkg.b", "pkg.c"}
