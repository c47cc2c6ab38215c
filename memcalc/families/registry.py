"""Every model family memcalc models, declared once (memcalc.families.declaration.FamilyDeclaration),
one module of memcalc.families.declarations per family. Everything that depends on the family
reads it here: ModelSpec's validation (memcalc.inputs.specs), the refusals (memcalc.refusals,
memcalc.parallel.tensor, memcalc.families.call_path), the config readers (memcalc.inputs.hf),
the parameter count (memcalc.formulas.parameters), the programs (memcalc.families.program_for),
the validator's model construction (validate.models.hf) and the property tests' draws
(tests/strategies.py). Adding a family: docs/adding-a-family.md.

>>> declaration("gemma2").supports.sliding, hf_type("qwen3")[0].name
('patterned', 'llama')
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.families.declaration import FamilyDeclaration, HFType

DECLARATION_MODULES = ("gpt2", "llama", "phi3", "gpt_neox", "olmo2", "granite", "gemma", "moe", "gpt_oss",
                       "stablelm")
"""The modules of memcalc.families.declarations, in the order families are listed to users."""


def _load() -> dict[str, FamilyDeclaration]:
    found = {}
    for name in DECLARATION_MODULES:
        for decl in import_module(f"memcalc.families.declarations.{name}").DECLARATIONS:
            assert decl.name not in found, f"family {decl.name} declared twice"
            found[decl.name] = decl
    return found


FAMILIES: dict[str, FamilyDeclaration] = _load()
"""family name (ModelSpec.family) -> its declaration."""
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
_TYPES: dict[str, tuple[FamilyDeclaration, HFType]] = {t.model_type: (d, t) for d in FAMILIES.values()
                                                       for t in d.hf_types}
MODEL_TYPES: tuple[str, ...] = tuple(_TYPES)
"""Every transformers model_type memcalc reads."""


def declaration(family: str) -> FamilyDeclaration:
    """The declaration of a family (ModelSpec.family is one of FAMILY_NAMES).

    >>> declaration("llama").model_types
    ('llama', 'mistral', 'qwen2', 'qwen3', 'smollm3')
    """
    return FAMILIES[family]


def hf_type(model_type: str) -> tuple[FamilyDeclaration, HFType] | None:
    """(family declaration, model type) of a transformers model_type, None if none reads it.

    >>> hf_type("gemma3_text")[0].name, hf_type("bert")
    ('gemma3', None)
    """
    return _TYPES.get(model_type)


def program_refs() -> dict[tuple[str, str], str]:
    """{(implementation, family): "module:NAME"} of every program.

    >>> program_refs()["reference", "gpt2"]
    'ref_gpt2:PROGRAM'
    """
    return {(impl, d.name): ref for d in FAMILIES.values() for impl, ref in d.programs.items()}


def families_with(**supports: object) -> tuple[str, ...]:
    """The families whose Supports have these values, in FAMILY_NAMES order.

    >>> families_with(parallel_residual=True)
    ('gpt_neox', 'stablelm')
    """
    return tuple(d.name for d in FAMILIES.values()
                 if all(getattr(d.supports, k) == v for k, v in supports.items()))
