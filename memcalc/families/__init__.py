"""Forward programs per implementation, op by op, behind one protocol (memcalc.families.base),
picked from a registry by (implementation, family)."""
from __future__ import annotations

from importlib import import_module

from memcalc.core.errors import NotModelledError
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
            if isinstance(found, dict):  # hf_moe.PROGRAMS, by family
                found = found[key[1]]
            dict.__setitem__(self, key, found)
        return found

    def get(self, key: tuple[str, str], default: Program | None = None) -> Program | None:
        return self[key] if key in self else default

    def values(self) -> list[Program]:
        return [self[k] for k in self]

    def items(self) -> list[tuple[tuple[str, str], Program]]:
        return [(k, self[k]) for k in self]


PROGRAMS: dict[tuple[str, str], Program] = _Registry({
    ("hf", "gpt2"): "hf_gpt2:PROGRAM",
    ("hf", "llama"): "hf_llama:PROGRAM",  # also Mistral, Qwen2, Qwen3, SmolLM3 (memcalc.inputs.hf.config)
    ("hf", "phi3"): "hf_phi3:PROGRAM",  # Phi-3, Phi-4
    ("hf", "gpt_neox"): "hf_gpt_neox:PROGRAM",  # Pythia
    ("hf", "olmo2"): "hf_olmo2:PROGRAM",
    ("hf", "granite"): "hf_granite:PROGRAM",
    ("hf", "gemma"): "hf_gemma:PROGRAM",
    ("hf", "gemma2"): "hf_gemma:PROGRAM",
    ("hf", "gemma3"): "hf_gemma:PROGRAM",
    ("reference", "gpt2"): "ref_gpt2:PROGRAM",
    ("reference", "llama"): "ref_llama:PROGRAM",
    **{("hf", family): "hf_moe:PROGRAMS" for family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")},
    ("hf", "gpt_oss"): "hf_gpt_oss:PROGRAM",
})


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
