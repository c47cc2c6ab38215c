"""The families' declarations (memcalc.families.registry): every reference resolves to what it
names, the transformers classes exist, and no module outside memcalc/families/ lists family
names (what a family supports is read from its declaration, so adding one changes no consumer)."""
import ast
import typing
from pathlib import Path

import pytest

from memcalc.families import PROGRAMS
from memcalc.families.base import DecoderProgram
from memcalc.families.declaration import resolve
from memcalc.families.registry import FAMILIES, FAMILY_NAMES, MODEL_TYPES
from memcalc.inputs.specs import ModelSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_reference_of_a_declaration_resolves(family):
    decl = FAMILIES[family]
    assert all(isinstance(PROGRAMS[impl, family], DecoderProgram) for impl in decl.programs)
    refs = [decl.block_parameters, *(t.reader for t in decl.hf_types)] + ([decl.check] if decl.check else [])
    assert all(callable(resolve(ref)) for ref in refs)
    assert decl.outer_parameters in ("norm", "layernorm", "gpt2")
    assert decl.biases and decl.activations and decl.builder


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_validator_builds_each_declared_class(family):
    transformers = pytest.importorskip("transformers")
    decl = FAMILIES[family]
    assert callable(resolve(decl.builder))
    for t in decl.hf_types:
        assert hasattr(transformers, t.model_class) and hasattr(transformers, t.config_class)
        assert getattr(transformers, t.config_class).model_type == t.model_type


def test_model_spec_accepts_exactly_the_declared_families():
    assert typing.get_args(ModelSpec.model_fields["family"].annotation) == FAMILY_NAMES
    assert len(set(MODEL_TYPES)) == len(MODEL_TYPES)


def _family_lists(path: Path) -> list[int]:
    """Lines of tuple/list/set literals (or `in (...)` tests) of two or more family names."""
    names = set(FAMILY_NAMES)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            found = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(found) >= 2:
                out.append(node.lineno)
    return out


def test_no_module_outside_the_families_lists_family_names():
    """validate/matrices/ holds the matrix rows (data naming the families they measure)."""
    found = {}
    for package in ("memcalc", "validate"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("memcalc/families/", "validate/matrices/")):
                continue
            if lines := _family_lists(path):
                found[rel] = lines
    assert not found, f"family names listed outside memcalc/families/ (read the registry instead): {found}"
