"""Reading one value of a Hugging Face config dict (`get`, `flag`): the helpers every config
reader shares (memcalc.inputs.hf.config and the readers of memcalc.families.declarations), below
them so that no reader imports another.
"""
from __future__ import annotations

from memcalc.core.errors import SpecError


def get(cfg: dict, key: str, default: object = None, required: bool = False):
    """cfg[key] unless absent or null, else `default` (or a SpecError naming the key).

    >>> get({"n_layer": None}, "n_layer", 12)
    12
    """
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required:
        raise SpecError(f"hf_config.{key}", "missing", f"add {key!r} to the config")
    return default


def flag(cfg: dict, key: str, default: bool) -> bool:
    """A boolean field: JSON true/false only (a string "false" would be truthy in Python).

    >>> flag({"tie_word_embeddings": False}, "tie_word_embeddings", True)
    False
    """
    value = get(cfg, key, default)
    if not isinstance(value, bool):
        raise SpecError(f"hf_config.{key}", f"{str(value)[:40]!r} is not a JSON boolean",
                        f"write {key}: true or false, without quotes")
    return value


def count(cfg: dict, key: str, default: object = None, required: bool = False, ceiling: int | None = None) -> int:
    """A size the reader itself computes with (a range over the layers, a divisibility check)
    before ModelSpec validates it: a JSON integer >= 1 (not a boolean), at most `ceiling`.

    >>> count({"num_hidden_layers": 2}, "num_hidden_layers")
    2
    >>> count({"num_hidden_layers": "2"}, "num_hidden_layers")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: hf_config.num_hidden_layers: '2' is not a JSON integer >= 1; fix: ...
    """
    value = get(cfg, key, default, required)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"hf_config.{key}", f"{str(value)[:40]!r} is not a JSON integer >= 1",
                        "write a positive integer, without quotes")
    if ceiling is not None and value > ceiling:
        raise SpecError(f"hf_config.{key}", f"{value:,} is above memcalc's ceiling of {ceiling:,}",
                        f"use {key} <= {ceiling:,} (memcalc.core.limits)")
    return value


def partial_rotary_factor(cfg: dict, default: float) -> float:
    """rope_parameters.partial_rotary_factor (5.x), else the legacy top-level key (Phi-3's
    partial_rotary_factor, GPT-NeoX's rotary_pct, which GPTNeoXConfig moves into rope_parameters)."""
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise SpecError("hf_config.rope_parameters", "is not a JSON object", "write it as {...} or drop it")
    for value in (rope.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), cfg.get("rotary_pct")):
        if value is not None:
            return value
    return default


def llama_like(cfg: dict, family: str, act_default: str = "silu") -> dict:
    """The Llama-shaped fields (sizes, GQA, attention_dropout) of a llama-like config.

    >>> llama_like({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    ...             "intermediate_size": 16}, "olmo2")["max_position_embeddings"]
    2048
    """
    act = get(cfg, "hidden_act", act_default)
    if act != "silu":
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use silu")
    return dict(family=family, vocab_size=get(cfg, "vocab_size", required=True),
                hidden_size=get(cfg, "hidden_size", required=True),
                num_layers=get(cfg, "num_hidden_layers", required=True),
                num_heads=get(cfg, "num_attention_heads", required=True),
                num_kv_heads=get(cfg, "num_key_value_heads"), head_dim=get(cfg, "head_dim"),
                intermediate_size=get(cfg, "intermediate_size", required=True),
                max_position_embeddings=get(cfg, "max_position_embeddings", 2048),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), activation="silu",
                attn_dropout=get(cfg, "attention_dropout", 0.0))
