"""The transformers mixture-of-experts families on the Llama-shaped block (memcalc.families.hf_moe):
Mixtral, Qwen2-MoE (shared expert), Qwen3-MoE (per-head q/k RMSNorm), OLMoE (q/k RMSNorm over the
whole projection). Read by memcalc.inputs.hf.config.moe_fields."""
from __future__ import annotations

from memcalc.families.declaration import LLAMA_KEYS, ALL_MASKS, FamilyDeclaration, HFType, Supports
from memcalc.core import limits
from memcalc.core.errors import SpecError
from memcalc.families.declarations.llama import fields as llama_fields
from memcalc.inputs.hf.values import count, flag, get

_MOE_KEYS = frozenset({"num_experts_per_tok", "num_local_experts", "num_experts", "output_router_logits"})
_QWEN3_KEYS = LLAMA_KEYS | _MOE_KEYS | {"moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                                        "mlp_only_layers"}
_READER = "memcalc.families.declarations.moe:fields"
_BUILDER = "validate.models.hf:moe_config"
_TRAINER_PATH = Supports(moe=True, trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True)
"""With the HF Trainer's call path measured (validate/matrices/rows/call-paths-by-family.json)."""
MIXTRAL = FamilyDeclaration(
    "mixtral", programs={"hf": "hf_moe:MIXTRAL"},
    hf_types=(HFType("mixtral", "MixtralConfig", "MixtralForCausalLM", reader=_READER,
                     modelled=LLAMA_KEYS | _MOE_KEYS | {"router_jitter_noise"}),),
    supports=Supports(moe=True, router_jitter=True,
                      trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True),
    check="memcalc.families.declarations.moe:check_mixtral",
    builder=_BUILDER)
QWEN2_MOE = FamilyDeclaration(
    "qwen2_moe", programs={"hf": "hf_moe:QWEN2_MOE"},
    hf_types=(HFType("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", reader=_READER,
                     modelled=_QWEN3_KEYS | {"shared_expert_intermediate_size", "qkv_bias"},
                     window_key="ignored"),),
    supports=_TRAINER_PATH, biases=((False, False, False), (True, False, False)), builder=_BUILDER)
QWEN3_MOE = FamilyDeclaration(
    "qwen3_moe", programs={"hf": "hf_moe:QWEN3_MOE"},
    hf_types=(HFType("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", reader=_READER,
                     modelled=_QWEN3_KEYS, window_key="ignored"),),
    qk_norm_parameters="head", supports=_TRAINER_PATH, biases=((False, False, False), (True, True, False)),
    builder=_BUILDER)
OLMOE = FamilyDeclaration(
    "olmoe", programs={"hf": "hf_moe:OLMOE"},
    hf_types=(HFType("olmoe", "OlmoeConfig", "OlmoeForCausalLM", reader=_READER,
                     modelled=LLAMA_KEYS | _MOE_KEYS | {"norm_topk_prob"}),),
    qk_norm_parameters="projection", supports=_TRAINER_PATH, biases=((False, False, False), (True, True, False)),
    builder=_BUILDER)
DECLARATIONS = (MIXTRAL, QWEN2_MOE, QWEN3_MOE, OLMOE)


def check_mixtral(spec: object) -> None:
    """MixtralTopKRouter.forward divides router_top_value by its sum whatever the config
    (modeling_mixtral.py; Mixtral has no norm_topk_prob key).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> check_mixtral(ModelSpec.preset("mixtral-8x7b"))
    """
    if spec.moe is not None and not spec.moe.norm_topk_prob:
        raise ValueError("mixtral's router always renormalises the top-k weights; set moe.norm_topk_prob=True")


def fields(cfg: dict, model_type: str) -> dict:
    """configuration_mixtral.py / qwen2_moe / qwen3_moe / olmoe: the Llama fields, the experts
    (Mixtral and OLMoE experts are intermediate_size wide, Qwen-MoE moe_intermediate_size), and the
    dense layers of Qwen-MoE (mlp_only_layers, and the layers decoder_sparse_step skips:
    modeling_qwen2_moe.py Qwen2MoeDecoderLayer)."""
    fields = llama_fields(cfg, "llama")
    fields["family"] = model_type
    bias = flag(cfg, "attention_bias", False)
    fields["qkv_bias"] = flag(cfg, "qkv_bias", True) if model_type == "qwen2_moe" else bias
    fields["out_bias"] = bias and model_type in ("qwen3_moe", "olmoe")
    fields["mlp_bias"] = False
    E = get(cfg, "num_local_experts" if model_type == "mixtral" else "num_experts")
    if E is None:
        E = get(cfg, "num_experts" if model_type == "mixtral" else "num_local_experts", required=True)
    ffn = get(cfg, "intermediate_size" if model_type in ("mixtral", "olmoe") else "moe_intermediate_size",
               required=True)
    moe = dict(num_experts=E, top_k=get(cfg, "num_experts_per_tok", 2), expert_ffn_size=ffn,
               norm_topk_prob=model_type == "mixtral" or flag(cfg, "norm_topk_prob", False))
    moe["output_router_logits"] = flag(cfg, "output_router_logits", False)
    if model_type == "mixtral":
        moe["router_jitter_noise"] = _jitter(cfg)
    if model_type == "qwen2_moe":
        moe["shared_expert_ffn_size"] = get(cfg, "shared_expert_intermediate_size", required=True)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step, only = get(cfg, "decoder_sparse_step", 1), get(cfg, "mlp_only_layers", [])
        if not isinstance(step, int) or step < 1 or not isinstance(only, list):
            raise SpecError("hf_config.decoder_sparse_step", f"{str(step)[:20]!r} / mlp_only_layers "
                            f"{str(only)[:20]!r} are not a step >= 1 and a list", "fix the config")
        layers = count(cfg, "num_hidden_layers", required=True, ceiling=limits.MAX_LAYERS)
        moe["dense_layers"] = tuple(i for i in range(layers)
                                    if i in only or (i + 1) % step != 0)
    from memcalc.inputs.moe import MoESpec

    fields["moe"] = MoESpec(**moe)
    return fields


def _jitter(cfg: dict) -> float:
    """Mixtral's router_jitter_noise: a number >= 0 (0: no jitter).

    >>> _jitter({"router_jitter_noise": 0.01}), _jitter({})
    (0.01, 0.0)
    """
    value = get(cfg, "router_jitter_noise", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise SpecError("hf_config.router_jitter_noise", f"{str(value)[:40]!r} is not a number >= 0",
                        "write a jitter such as 0.0 (none) or 0.01")
    return float(value)
