"""Granite (transformers 5.24 modeling_granite.py GraniteForCausalLM: Llama with four scalar
multipliers whose ops run whatever their values)."""
from __future__ import annotations

from memcalc.families.declaration import LLAMA_KEYS, ALL_MASKS, FamilyDeclaration, HFType, Supports
from memcalc.inputs.hf.values import flag, llama_like

GRANITE = FamilyDeclaration(
    "granite", programs={"hf": "hf_granite:PROGRAM"},
    hf_types=(HFType("granite", "GraniteConfig", "GraniteForCausalLM",
                     reader="memcalc.families.declarations.granite:fields",
                     modelled=LLAMA_KEYS | {"embedding_multiplier", "residual_multiplier",
                                            "attention_multiplier", "logits_scaling"}),),
    supports=Supports(trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True, tensor_parallel="all"),
    biases=tuple((q, q, m) for q in (False, True) for m in (False, True)),
    builder="validate.models.hf:granite_config")
DECLARATIONS = (GRANITE,)


def fields(cfg: dict, _model_type: str = "granite") -> dict:
    """GraniteConfig: Llama's biases (attention_bias on q/k/v/o, mlp_bias) plus four multipliers
    whose ops run whatever their values (memcalc.families.hf_granite)."""
    bias = flag(cfg, "attention_bias", False)
    return dict(llama_like(cfg, "granite"), qkv_bias=bias, out_bias=bias,
                mlp_bias=flag(cfg, "mlp_bias", False))
