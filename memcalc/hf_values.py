"""Reading one value of a Hugging Face config dict (`get`, `flag`): the helpers every config
reader shares (memcalc.hf_config, hf_gemma, hf_gpt_oss), below them so that no reader imports
another (hf_config re-exports both).
"""
from __future__ import annotations

from memcalc.errors import SpecError


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
