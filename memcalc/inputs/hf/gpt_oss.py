"""Read a GPT-OSS config.json (transformers 5.24 configuration_gpt_oss.py GptOssConfig) into
ModelSpec fields: the Llama-shaped sizes, attention_bias on q/k/v and o_proj, the experts
(num_local_experts of intermediate_size, num_experts_per_tok), and the alternating
sliding-window layers (sliding_window, layer_types: GptOssConfig's default pattern, every
second layer global, is the one memcalc models; memcalc.inputs.hf.config.check_layer_types refuses
another).
"""
from __future__ import annotations

from memcalc.core.errors import SpecError
from memcalc.inputs.hf.values import flag, get


def gpt_oss_fields(cfg: dict) -> dict:
    """ModelSpec fields of a GptOssConfig dict (its defaults for absent keys).

    >>> f = gpt_oss_fields({"num_hidden_layers": 2, "num_local_experts": 4})
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
