"""Read a Hugging Face config.json (a path or a dict) into ModelSpec fields.

Only reads JSON: nothing is downloaded, imported or executed. Field names follow transformers'
configuration_gpt2.py / configuration_llama.py / configuration_mistral.py / configuration_qwen2.py,
with those classes' defaults for absent optional fields.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.errors import SpecError

if TYPE_CHECKING:
    import os

SUPPORTED = ("gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
REFUSED_TYPES = {"gpt_oss": "GPT-OSS's attention sinks, alternating sliding-window layers and clamped "
                            "SwiGLU experts with biases are not modelled"}


def load_config(config: dict | str | os.PathLike) -> dict:
    """A config dict from a dict, or from a path to a config.json.

    >>> load_config({"model_type": "gpt2"})["model_type"]
    'gpt2'
    """
    if isinstance(config, dict):
        return config
    from memcalc.files import read_json_object

    return read_json_object(config)


def _get(cfg: dict, key: str, default: object=None, required: bool = False):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required:
        raise SpecError(f"hf_config.{key}", "missing", f"add {key!r} to the config")
    return default


def _flag(cfg: dict, key: str, default: bool) -> bool:
    """A boolean field: JSON true/false only (a string "false" would be truthy in Python)."""
    value = _get(cfg, key, default)
    if not isinstance(value, bool):
        raise SpecError(f"hf_config.{key}", f"{str(value)[:40]!r} is not a JSON boolean",
                        f"write {key}: true or false, without quotes")
    return value


def _gpt2_fields(cfg: dict) -> dict:
    act = _get(cfg, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
        raise SpecError("hf_config.activation_function", f"{act!r} is not modelled",
                        "use gelu_new, gelu or gelu_pytorch_tanh")
    return dict(family="gpt2", vocab_size=_get(cfg, "vocab_size", 50257),
                hidden_size=_get(cfg, "n_embd", 768), num_layers=_get(cfg, "n_layer", 12),
                num_heads=_get(cfg, "n_head", 12), intermediate_size=_get(cfg, "n_inner"),
                max_position_embeddings=_get(cfg, "n_positions", 1024),
                tie_embeddings=_flag(cfg, "tie_word_embeddings", True),
                activation="gelu_tanh" if act == "gelu_pytorch_tanh" else act,
                embd_dropout=_get(cfg, "embd_pdrop", 0.1), attn_dropout=_get(cfg, "attn_pdrop", 0.1),
                resid_dropout=_get(cfg, "resid_pdrop", 0.1))


def _llama_fields(cfg: dict, model_type: str) -> dict:
    act = _get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use silu")
    qkv_bias = model_type == "qwen2" or _flag(cfg, "attention_bias", False)
    return dict(family="llama", vocab_size=_get(cfg, "vocab_size", required=True),
                hidden_size=_get(cfg, "hidden_size", required=True),
                num_layers=_get(cfg, "num_hidden_layers", required=True),
                num_heads=_get(cfg, "num_attention_heads", required=True),
                num_kv_heads=_get(cfg, "num_key_value_heads"), head_dim=_get(cfg, "head_dim"),
                intermediate_size=_get(cfg, "intermediate_size", required=True),
                max_position_embeddings=_get(cfg, "max_position_embeddings", 2048),
                tie_embeddings=_flag(cfg, "tie_word_embeddings", False), qkv_bias=qkv_bias,
                out_bias=_flag(cfg, "attention_bias", False) and model_type == "llama",
                mlp_bias=_flag(cfg, "mlp_bias", False), activation="silu",
                attn_dropout=_get(cfg, "attention_dropout", 0.0))


MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def _moe_fields(cfg: dict, model_type: str) -> dict:
    """configuration_mixtral.py / qwen2_moe / qwen3_moe / olmoe: the Llama fields, the experts
    (Mixtral and OLMoE experts are intermediate_size wide, Qwen-MoE moe_intermediate_size), and the
    dense layers of Qwen-MoE (mlp_only_layers, and the layers decoder_sparse_step skips:
    modeling_qwen2_moe.py Qwen2MoeDecoderLayer)."""
    fields = _llama_fields(cfg, "llama")
    fields["family"] = model_type
    bias = _flag(cfg, "attention_bias", False)
    fields["qkv_bias"] = _flag(cfg, "qkv_bias", True) if model_type == "qwen2_moe" else bias
    fields["out_bias"] = bias and model_type in ("qwen3_moe", "olmoe")
    fields["mlp_bias"] = False
    E = _get(cfg, "num_local_experts" if model_type == "mixtral" else "num_experts")
    if E is None:
        E = _get(cfg, "num_experts" if model_type == "mixtral" else "num_local_experts", required=True)
    ffn = _get(cfg, "intermediate_size" if model_type in ("mixtral", "olmoe") else "moe_intermediate_size",
               required=True)
    moe = dict(num_experts=E, top_k=_get(cfg, "num_experts_per_tok", 2), expert_ffn_size=ffn,
               norm_topk_prob=model_type == "mixtral" or _flag(cfg, "norm_topk_prob", False))
    if model_type == "qwen2_moe":
        moe["shared_expert_ffn_size"] = _get(cfg, "shared_expert_intermediate_size", required=True)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step, only = _get(cfg, "decoder_sparse_step", 1), _get(cfg, "mlp_only_layers", [])
        if not isinstance(step, int) or step < 1 or not isinstance(only, list):
            raise SpecError("hf_config.decoder_sparse_step", f"{str(step)[:20]!r} / mlp_only_layers "
                            f"{str(only)[:20]!r} are not a step >= 1 and a list", "fix the config")
        moe["dense_layers"] = tuple(i for i in range(fields["num_layers"])
                                    if i in only or (i + 1) % step != 0)
    from memcalc.moe import MoESpec

    fields["moe"] = MoESpec(**moe)
    return fields


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
    if model_type in REFUSED_TYPES:
        from memcalc.errors import NotModelledError

        raise NotModelledError("hf_config.model_type", f"{model_type!r}: {REFUSED_TYPES[model_type]}",
                               f"use one of {', '.join(SUPPORTED)}")
    if model_type not in SUPPORTED:
        raise SpecError("hf_config.model_type", f"{model_type!r} is not supported",
                        f"use one of {', '.join(SUPPORTED)}")
    from memcalc.hf_keys import check_config_keys

    check_config_keys(cfg, model_type)  # every key modelled, known inert, or refused by name
    if model_type == "gpt2":
        fields = _gpt2_fields(cfg)
    elif model_type in MOE_TYPES:
        fields = _moe_fields(cfg, model_type)
    else:
        fields = _llama_fields(cfg, model_type)
    name = cfg.get("_name_or_path") or model_type
    return {"name": str(name), **fields}


# The config key each ModelSpec field comes from, to name the user's key in errors.
CONFIG_KEYS = {
    "gpt2": dict(vocab_size="vocab_size", hidden_size="n_embd", num_layers="n_layer",
                 num_heads="n_head", intermediate_size="n_inner",
                 max_position_embeddings="n_positions", embd_dropout="embd_pdrop",
                 attn_dropout="attn_pdrop", resid_dropout="resid_pdrop", name="_name_or_path"),
    "llama": dict(vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
                  num_heads="num_attention_heads", num_kv_heads="num_key_value_heads",
                  head_dim="head_dim", intermediate_size="intermediate_size",
                  max_position_embeddings="max_position_embeddings",
                  attn_dropout="attention_dropout", name="_name_or_path"),
}


def spec_from_hf(cls: type, config: dict | str | os.PathLike, implementation: str):
    """cls.make(...) of a HF config, with errors naming the config's key (hf_config.n_layer).

    >>> from memcalc.specs import ModelSpec
    >>> spec_from_hf(ModelSpec, {"model_type": "gpt2", "n_layer": "2"}, "hf")
    Traceback (most recent call last):
    ...
    memcalc.errors.SpecError: hf_config.n_layer: Input should be a valid integer
    """
    fields = spec_fields_from_hf(config)
    try:
        return cls.make(implementation=implementation, **fields)
    except SpecError as err:
        key = CONFIG_KEYS.get(fields["family"], CONFIG_KEYS["llama"]).get(err.field.split(".")[0])
        if key is None:
            raise
        raise SpecError(f"hf_config.{key}", err.problem, err.fix) from None
