"""Phi-3 and Phi-4 (transformers 5.24 modeling_phi3.py Phi3ForCausalLM: fused qkv_proj and
gate_up_proj, partial rotary, resid_pdrop)."""
from __future__ import annotations

from types import MappingProxyType

from memcalc.families.declaration import (
    ALL_MASKS, LLAMA_CONFIG_KEYS, LLAMA_KEYS, FamilyDeclaration, HFType, Supports)
from memcalc.inputs.hf.values import get, llama_like, partial_rotary_factor

PHI3 = FamilyDeclaration(
    "phi3", programs={"hf": "hf_phi3:PROGRAM"},
    hf_types=(HFType("phi3", "Phi3Config", "Phi3ForCausalLM", reader="memcalc.families.declarations.phi3:fields",
                     # rope_parameters: its partial_rotary_factor sets the rotated width (the rest is inert)
                     modelled=LLAMA_KEYS | {"resid_pdrop", "partial_rotary_factor", "rope_parameters"},
                     inert={"embd_pdrop": "not read by modeling_phi3.py in transformers 5.24 (Phi3Model has "
                                          "no embedding dropout)",
                            "original_max_position_embeddings": "read only by the longrope rotary type to "
                                                                "pick its factors: the cos/sin tables keep "
                                                                "their shape",
                            "attention_bias": "modeling_phi3.py builds qkv_proj and o_proj with bias=False "
                                              "whatever its value"}),),
    config_keys=MappingProxyType(dict(LLAMA_CONFIG_KEYS, resid_dropout="resid_pdrop",
                                      rotary_fraction="rope_parameters.partial_rotary_factor")),
    block_parameters="memcalc.formulas.parameters:phi3_block",
    supports=Supports(
        trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True, dropouts=frozenset({"attn", "resid"}),
        partial_rotary=True,
        # Phi3Attention slices the fused qkv_proj output at config.num_attention_heads * head_dim
        # and Phi3MLP chunks gate_up_proj in two (modeling_phi3.py): a column shard of either
        # fused weight breaks those offsets
        tensor_parallel_refusal=("Phi-3's fused self_attn.qkv_proj (split at the config's head "
                                 "counts) and mlp.gate_up_proj have no tensor-parallel plan",
                                 "use tensor_parallel=1 (data parallelism and FSDP are modelled)")),
    builder="validate.models.hf:phi3_config")
DECLARATIONS = (PHI3,)


def fields(cfg: dict, _model_type: str = "phi3") -> dict:
    """Phi3Config: no biases (qkv_proj, o_proj, gate_up_proj, down_proj are bias=False),
    resid_pdrop on both residual branches, partial rotary."""
    return dict(llama_like(cfg, "phi3"), qkv_bias=False, out_bias=False, mlp_bias=False,
                resid_dropout=get(cfg, "resid_pdrop", 0.0),
                rotary_fraction=partial_rotary_factor(cfg, 1.0))
