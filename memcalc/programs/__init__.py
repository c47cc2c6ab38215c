"""Forward programs per implementation, op by op, behind one protocol (memcalc.programs.base),
picked from a registry by (implementation, family)."""
from __future__ import annotations

from memcalc.errors import NotModelledError
from memcalc.programs import (hf_gemma, hf_gpt2, hf_gpt_neox, hf_gpt_oss, hf_granite, hf_llama, hf_moe, hf_olmo2,
                              hf_phi3, ref_gpt2, ref_llama)
from memcalc.programs.base import Program
from memcalc.specs import ModelSpec

PROGRAMS: dict[tuple[str, str], Program] = {
    ("hf", "gpt2"): hf_gpt2.PROGRAM,
    ("hf", "llama"): hf_llama.PROGRAM,  # also Mistral, Qwen2, Qwen3, SmolLM3 (memcalc.hf_config)
    ("hf", "phi3"): hf_phi3.PROGRAM,  # Phi-3, Phi-4
    ("hf", "gpt_neox"): hf_gpt_neox.PROGRAM,  # Pythia
    ("hf", "olmo2"): hf_olmo2.PROGRAM,
    ("hf", "granite"): hf_granite.PROGRAM,
    ("hf", "gemma"): hf_gemma.PROGRAM,
    ("hf", "gemma2"): hf_gemma.PROGRAM,
    ("hf", "gemma3"): hf_gemma.PROGRAM,
    ("reference", "gpt2"): ref_gpt2.PROGRAM,
    ("reference", "llama"): ref_llama.PROGRAM,
    **{("hf", family): program for family, program in hf_moe.PROGRAMS.items()},
    ("hf", "gpt_oss"): hf_gpt_oss.PROGRAM,
}


def program_for(spec: ModelSpec) -> Program:
    """The program of a spec's (implementation, family).

    >>> from memcalc.specs import ModelSpec
    >>> type(program_for(ModelSpec.preset("llama-2-7b"))).__name__
    'HFLlama'
    """
    found = PROGRAMS.get((spec.implementation, spec.family))
    if found is None:
        raise NotModelledError("implementation", f"no program for {spec.implementation} {spec.family}",
                               f"use one of {sorted(PROGRAMS)}")
    return found
