"""Reading one value of a Hugging Face config dict (`get`, `flag`): the helpers every config
reader shares (memcalc.inputs.hf.config, hf_gemma, hf_gpt_oss), below them so that no reader imports
another (hf_config re-exports both).
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
