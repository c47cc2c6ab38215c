"""Read a Gemma, Gemma-2 or Gemma-3 text config.json (model_type gemma, gemma2, gemma3_text)
into ModelSpec fields, with transformers 5.24's defaults for absent keys
(models/gemma/configuration_gemma.py, gemma2/configuration_gemma2.py,
gemma3/configuration_gemma3.py Gemma3TextConfig).
"""
from __future__ import annotations

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.inputs.hf.values import count, flag, get

FAMILY = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}
# GemmaConfig reads `hidden_act`; Gemma2Config and Gemma3TextConfig `hidden_activation`
ACTIVATION_KEY = {"gemma": "hidden_act", "gemma2": "hidden_activation", "gemma3_text": "hidden_activation"}
# GemmaConfig.__post_init__ turns the legacy "gelu" of the first releases into the tanh GELU
TANH_GELU = {"gemma": ("gelu_pytorch_tanh", "gelu"), "gemma2": ("gelu_pytorch_tanh",),
             "gemma3_text": ("gelu_pytorch_tanh",)}
# Gemma-2 alternates sliding and global layers; Gemma-3 has one global layer in 6 unless the
# config's `sliding_window_pattern` (read by Gemma3TextConfig.__post_init__) says otherwise
DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6}


def gemma_fields(cfg: dict, model_type: str) -> dict:
    """ModelSpec fields of a Gemma-generation config.

    >>> f = gemma_fields({"model_type": "gemma2", "vocab_size": 10, "hidden_size": 8,
    ...     "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16}, "gemma2")
    >>> f["family"], f["head_dim"], f["sliding_window"], f["attn_softcap"], f["logit_softcap"]
    ('gemma2', 256, 4096, True, True)
    """
    act_key = ACTIVATION_KEY[model_type]
    act = get(cfg, act_key, "gelu_pytorch_tanh")
    if act not in TANH_GELU[model_type]:
        raise SpecError(f"hf_config.{act_key}", f"{act!r} is not modelled", "use gelu_pytorch_tanh")
    if flag(cfg, "use_bidirectional_attention", False):
        raise NotModelledError("hf_config.use_bidirectional_attention", "bidirectional masks are "
                               "not modelled (a causal LM step is)", "set it to false")
    bias = flag(cfg, "attention_bias", False)  # q, k, v and o_proj alike (GemmaAttention)
    fields = dict(family=FAMILY[model_type], vocab_size=get(cfg, "vocab_size", required=True),
                  hidden_size=get(cfg, "hidden_size", required=True),
                  num_layers=get(cfg, "num_hidden_layers", required=True),
                  num_heads=get(cfg, "num_attention_heads", required=True),
                  num_kv_heads=get(cfg, "num_key_value_heads"), head_dim=get(cfg, "head_dim", 256),
                  intermediate_size=get(cfg, "intermediate_size", required=True),
                  max_position_embeddings=get(cfg, "max_position_embeddings", 8192),
                  tie_embeddings=flag(cfg, "tie_word_embeddings", True), qkv_bias=bias,
                  out_bias=bias, mlp_bias=False, activation="gelu_tanh",
                  attn_dropout=get(cfg, "attention_dropout", 0.0),
                  qk_norm=model_type == "gemma3_text")
    if model_type == "gemma":
        return fields
    count(cfg, "hidden_size", required=True), count(cfg, "num_attention_heads", required=True)
    if fields["hidden_size"] % fields["num_heads"]:  # Gemma2Config / Gemma3TextConfig.validate_architecture
        raise SpecError("hf_config.num_attention_heads", f"{fields['num_heads']} does not divide "
                        f"hidden_size={fields['hidden_size']} (transformers refuses this config)",
                        "use a divisor of hidden_size")
    pattern = get(cfg, "sliding_window_pattern", None) or get(cfg, "_sliding_window_pattern", None)
    gemma2 = model_type == "gemma2"
    fields.update(sliding_window=get(cfg, "sliding_window", 4096),
                  sliding_window_pattern=pattern or DEFAULT_PATTERN[model_type],
                  logit_softcap=get(cfg, "final_logit_softcapping", 30.0 if gemma2 else None) is not None,
                  # Gemma3Attention stores attn_logit_softcapping but does not pass it to the
                  # attention function (modeling_gemma3.py, 5.24): no op for it there
                  attn_softcap=gemma2 and get(cfg, "attn_logit_softcapping", 50.0) is not None)
    return fields
