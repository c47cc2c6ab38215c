"""OLMo-2 (transformers 5.24 modeling_olmo2.py Olmo2ForCausalLM: post-norms, q/k RMSNorm over the
whole projection, attention_bias on q/k/v/o)."""
from __future__ import annotations

from memcalc.families.declaration import ALL_MASKS, FamilyDeclaration, HFType, Supports
from memcalc.inputs.hf.values import flag, llama_like

OLMO2 = FamilyDeclaration(
    "olmo2", programs={"hf": "hf_olmo2:PROGRAM"},
    hf_types=(HFType("olmo2", "Olmo2Config", "Olmo2ForCausalLM", reader="memcalc.families.declarations.olmo2:fields"),),
    block_parameters="memcalc.formulas.parameters:olmo2_block", supports=Supports(
        trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True,
        # Olmo2Attention's q_norm/k_norm are RMSNorms over the whole q_proj/k_proj width
        # (heads * head_dim, modeling_olmo2.py): a column shard of q_proj would normalise over one
        # rank's heads only, a different function, so no plan splits them
        tensor_parallel_refusal=("OLMo-2's self_attn.q_norm / k_norm normalise over every head's "
                                 "features at once (RMSNorm of heads * head_dim), which a column "
                                 "split of q_proj/k_proj cannot keep: no tensor-parallel plan for them",
                                 "use tensor_parallel=1 (data parallelism and FSDP are modelled)")),
    biases=((False, False, False), (True, True, False)), builder="validate.models.hf:olmo2_config")
DECLARATIONS = (OLMO2,)


def fields(cfg: dict, _model_type: str = "olmo2") -> dict:
    """Olmo2Config: attention_bias on q/k/v/o; the MLP has no biases."""
    bias = flag(cfg, "attention_bias", False)
    return dict(llama_like(cfg, "olmo2"), qkv_bias=bias, out_bias=bias, mlp_bias=False)
