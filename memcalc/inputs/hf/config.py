"""Read a Hugging Face config.json (a path or a dict) into ModelSpec fields.

Only reads JSON: nothing is downloaded, imported or executed. The model type picks the family
whose declaration lists it (memcalc.families.registry.hf_type); that declaration's reader
(memcalc.families.declarations.<family>) reads the fields with the config class's defaults for
absent optional fields, after memcalc.inputs.hf.keys has accounted for every key.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.errors import SpecError
from memcalc.families.declaration import resolve
from memcalc.families.registry import MODEL_TYPES, declaration, hf_type
from memcalc.inputs.layer_pattern import is_sliding

if TYPE_CHECKING:
    import os

SUPPORTED = MODEL_TYPES  # every model type a family declares (memcalc.families.registry)
# model types read but refused as a whole, with why (transformers 5.24 modeling files)
REFUSED_TYPES = {
    "ministral": ("MinistralModel builds per-layer-type masks from layer_types (full and sliding) "
                  "and its program is not validated",
                  "use model_type mistral (with or without sliding_window) for a Mistral-shaped model"),
}


def load_config(config: dict | str | os.PathLike) -> dict:
    """A config dict from a dict, or from a path to a config.json.

    >>> load_config({"model_type": "gpt2"})["model_type"]
    'gpt2'
    """
    if isinstance(config, dict):
        return config
    from memcalc.core.files import read_json_object

    return read_json_object(config)


def check_layer_types(cfg: dict, fields: dict) -> None:
    """A config's explicit `layer_types` must be the pattern its other keys give (the one memcalc
    models, ModelSpec.layer_is_sliding); any other per-layer list is refused by name."""
    given = cfg.get("layer_types")
    if given is None:
        return
    layers = fields["num_layers"]
    window = [fields.get(k) for k in ("sliding_window", "max_window_layers", "sliding_window_pattern")]
    if not all(v is None or _whole(v) for v in (layers, *window)) or window[2] == 0:
        return  # ModelSpec validation names the bad key
    if not isinstance(given, list) or len(given) != layers:  # before building `layers` names
        raise SpecError("hf_config.layer_types", f"{str(given)[:40]!r} is not a list of one "
                        f"attention type per layer ({layers} layers)",
                        "drop layer_types, or give one 'full_attention' / 'sliding_attention' per layer")
    expected = ["sliding_attention" if is_sliding(i, *window) else "full_attention" for i in range(layers)]
    if list(given) != expected:
        raise SpecError("hf_config.layer_types", "this per-layer pattern is not the one the model "
                        "type's keys give (the pattern memcalc models)",
                        "drop layer_types, or set sliding_window / use_sliding_window / "
                        "max_window_layers / sliding_window_pattern to give it")


def _whole(value: object) -> bool:
    """An integer >= 0 that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def spec_fields_from_hf(config: dict | str | os.PathLike) -> dict:
    """ModelSpec fields from a HF config.

    >>> spec_fields_from_hf({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
    ...     "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16})["qkv_bias"]
    True
    """
    cfg = load_config(config)
    model_type = cfg.get("model_type")
    if model_type is None:
        raise SpecError("hf_config.model_type", "missing", f"add one of {', '.join(SUPPORTED)}")
    if not isinstance(model_type, str):  # a list or dict is unhashable: no raw TypeError
        raise SpecError("hf_config.model_type", f"expected a string, got {type(model_type).__name__}",
                        f"use one of {', '.join(SUPPORTED)}")
    if model_type in REFUSED_TYPES:
        from memcalc.core.errors import NotModelledError

        why, fix = REFUSED_TYPES[model_type]
        raise NotModelledError("hf_config.model_type", f"{model_type!r}: {why}", fix)
    if model_type == "gemma3":
        raise SpecError("hf_config.model_type", "'gemma3' is the multimodal Gemma-3 (a vision tower "
                        "beside the language model), which is not modelled",
                        "pass its text_config with model_type gemma3_text (the language model alone)")
    if hf_type(model_type) is None:
        raise SpecError("hf_config.model_type", f"{model_type!r} is not supported",
                        f"use one of {', '.join(SUPPORTED)}")
    from memcalc.inputs.hf.keys import check_config_keys

    check_config_keys(cfg, model_type)  # every key modelled, known inert, or refused by name
    fields = resolve(hf_type(model_type)[1].reader)(cfg, model_type)
    if model_type != "gpt2":
        check_layer_types(cfg, fields)
    name = cfg.get("_name_or_path") or model_type
    return {"name": str(name), **fields}


def spec_from_hf(cls: type, config: dict | str | os.PathLike, implementation: str):
    """cls.make(...) of a HF config, with errors naming the config's key (hf_config.n_layer).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> spec_from_hf(ModelSpec, {"model_type": "gpt2", "n_layer": "2"}, "hf")
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: hf_config.n_layer: Input should be a valid integer
    """
    fields = spec_fields_from_hf(config)
    try:
        return cls.make(implementation=implementation, **fields)
    except SpecError as err:
        key = declaration(fields["family"]).config_keys.get(err.field.split(".")[0])
        if key is None:
            raise
        raise SpecError(f"hf_config.{key}", err.problem, err.fix) from None
