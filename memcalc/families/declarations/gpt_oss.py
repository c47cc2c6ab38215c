"""GPT-OSS (transformers 5.24 modeling_gpt_oss.py GptOssForCausalLM: attention sinks, alternating
sliding-window layers, biased experts with a clamped SwiGLU: memcalc.families.hf_gpt_oss). Read
by memcalc.inputs.hf.gpt_oss."""
from __future__ import annotations

from memcalc.families.declaration import ALL_MASKS, LLAMA_KEYS, FamilyDeclaration, HFType, Supports
from memcalc.core.errors import SpecError
from memcalc.inputs.hf.values import flag, get

GPT_OSS = FamilyDeclaration(
    "gpt_oss", programs={"hf": "hf_gpt_oss:PROGRAM"},
    hf_types=(HFType(
        "gpt_oss", "GptOssConfig", "GptOssForCausalLM", reader="memcalc.families.declarations.gpt_oss:fields",
        # no mlp_bias or hidden_act read (see inert); sliding_window and layer_types give the
        # alternating local/global layers
        modelled=(LLAMA_KEYS - {"mlp_bias", "hidden_act"}) | {"num_experts_per_tok", "num_local_experts",
                                                             "num_experts", "output_router_logits",
                                                             "sliding_window", "layer_types"},
        inert={"hidden_act": ("not read by modeling_gpt_oss.py: GptOssExperts._apply_gate is its own "
                              "clamped SwiGLU whatever the value"),
               "swiglu_alpha": "the sigmoid's gain in the clamped SwiGLU: a Python scalar in `gate * alpha`",
               "swiglu_limit": "the clamp bounds of the clamped SwiGLU: Python scalars in the modelled clamps",
               "experts_per_token": ("the original release's name, written beside num_experts_per_tok; "
                                     "no transformers 5.24 module reads it"),
               "initial_context_length": ("the original release's name for YaRN's original context "
                                          "(rope_parameters); no transformers 5.24 module reads it")},
        refused={"quantization_config": (
            "the published MXFP4 weights; training runs on the dequantised model "
            "(from_pretrained(..., quantization_config=Mxfp4Config(dequantize=True))), which memcalc models",
            "remove quantization_config and choose the training dtype with precision (bf16 is the "
            "dequantised dtype)")}),),
    block_parameters="memcalc.formulas.parameters:gpt_oss_block", expert_biases=True,
    supports=Supports(sdpa_refusal="transformers' GPT-OSS runs no SDPA path (GptOssPreTrainedModel."
                                   "_supports_sdpa is False: SDPA has no attention sinks)",
                      default_attention="eager",  # modeling_gpt_oss.py: _supports_sdpa = False
                      sliding="patterned", moe=True,
                      trainer_inputs=True, attention_masks=ALL_MASKS, windowed_call_path=True,
                      use_cache=True),
    biases=((False, False, True), (True, True, True)), check="memcalc.families.declarations.gpt_oss:check",
    builder="validate.models.hf:gpt_oss_config")
DECLARATIONS = (GPT_OSS,)


def check(spec: object) -> None:
    """GptOssForCausalLM's fixed structure: attention_bias sets the q/k/v and o_proj biases
    together; the experts always carry biases (mlp_bias=True stands for them); no shared expert,
    no dense layers; the router's softmax over the top-k logits sums to 1 (norm_topk_prob=True).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> check(ModelSpec.preset("gpt-oss-20b"))
    """
    moe = spec.moe
    if spec.qkv_bias != spec.out_bias or not spec.mlp_bias:
        raise ValueError("gpt_oss's attention_bias sets q/k/v and o_proj biases together and its "
                         "experts always have biases; set qkv_bias = out_bias and mlp_bias=True")
    if moe is not None and (moe.shared_expert_ffn_size is not None or moe.dense_layers or not moe.norm_topk_prob):
        raise ValueError("gpt_oss has no shared expert and no dense layers, and its router's softmax "
                         "over the top-k normalises them; drop those moe fields")


def fields(cfg: dict, _model_type: str = "gpt_oss") -> dict:
    """ModelSpec fields of a GptOssConfig dict (its defaults for absent keys).

    >>> f = fields({"num_hidden_layers": 2, "num_local_experts": 4})
    >>> f["family"], f["sliding_window"], f["moe"].num_experts, f["moe"].top_k
    ('gpt_oss', 128, 4, 4)
    """
    from memcalc.inputs.moe import MoESpec

    window = get(cfg, "sliding_window", 128)
    if cfg.get("sliding_window", 128) is None:
        raise SpecError("hf_config.sliding_window", "is null, but GptOssModel builds a sliding mask "
                        "for its sliding_attention layers", "set sliding_window (128 in gpt-oss)")
    bias = flag(cfg, "attention_bias", True)
    E = get(cfg, "num_local_experts", get(cfg, "num_experts", 128))
    f = get(cfg, "intermediate_size", 2880)
    return dict(family="gpt_oss", vocab_size=get(cfg, "vocab_size", 201088),
                hidden_size=get(cfg, "hidden_size", 2880), num_layers=get(cfg, "num_hidden_layers", 36),
                num_heads=get(cfg, "num_attention_heads", 64), num_kv_heads=get(cfg, "num_key_value_heads", 8),
                head_dim=get(cfg, "head_dim", 64), intermediate_size=f,
                max_position_embeddings=get(cfg, "max_position_embeddings", 131072),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), qkv_bias=bias, out_bias=bias,
                mlp_bias=True, activation="silu", attn_dropout=get(cfg, "attention_dropout", 0.0),
                sliding_window=window, sliding_window_pattern=2,
                moe=MoESpec(num_experts=E, top_k=get(cfg, "num_experts_per_tok", 4), expert_ffn_size=f,
                            output_router_logits=flag(cfg, "output_router_logits", False)))
