"""Forward programs per implementation, op by op, behind one protocol (memcalc.families.base),
picked by (implementation, family) from the families' declarations (memcalc.families.registry)."""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError
from memcalc.families.registry import program_refs

if TYPE_CHECKING:
    from memcalc.families.base import Program
    from memcalc.inputs.specs import ModelSpec


class _Registry(dict):
    """{(implementation, family): Program}, each program's module imported when first asked for
    (a cold `memcalc estimate` of one model imports one program, not every family's)."""

    def __getitem__(self, key: tuple[str, str]) -> Program:
        found = dict.__getitem__(self, key)
        if isinstance(found, str):
            module, _, name = found.partition(":")
            found = getattr(import_module(f"memcalc.families.{module}"), name)
            dict.__setitem__(self, key, found)
        return found

    def get(self, key: tuple[str, str], default: Program | None = None) -> Program | None:
        return self[key] if key in self else default

    def values(self) -> list[Program]:
        return [self[k] for k in self]

    def items(self) -> list[tuple[tuple[str, str], Program]]:
        return [(k, self[k]) for k in self]


PROGRAMS: dict[tuple[str, str], Program] = _Registry(program_refs())


def program_for(spec: ModelSpec) -> Program:
    """The program of a spec's (implementation, family).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> type(program_for(ModelSpec.preset("llama-2-7b"))).__name__
    'HFLlama'
    """
    found = PROGRAMS.get((spec.implementation, spec.family))
    if found is None:
        raise NotModelledError("implementation", f"no program for {spec.implementation} {spec.family}",
                               f"use one of {sorted(PROGRAMS)}")
    return found
