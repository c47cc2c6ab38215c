"""Read a Hugging Face config.json (a path or a dict) into ModelSpec fields.

Only reads JSON: nothing is downloaded, imported or executed. Field names follow transformers'
configuration_gpt2.py / configuration_llama.py / configuration_mistral.py / configuration_qwen2.py /
configuration_qwen3.py (and configuration_gemma*.py, memcalc.inputs.hf.gemma; and, in FAMILY_READERS,
configuration_phi3.py / gpt_neox / olmo2 / granite / smollm3, and configuration_gpt_oss.py in
memcalc.inputs.hf.gpt_oss), with those classes' defaults for
absent optional fields.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.errors import SpecError
from memcalc.core import limits
from memcalc.inputs.hf.values import count, flag, get  # re-exported: readers' shared helpers
from memcalc.inputs.layer_pattern import is_sliding

if TYPE_CHECKING:
    import os

SUPPORTED = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
             "phi3", "gpt_neox", "olmo2", "granite", "smollm3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe",
             "gpt_oss")
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


def _gpt2_fields(cfg: dict) -> dict:
    act = get(cfg, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
        raise SpecError("hf_config.activation_function", f"{act!r} is not modelled",
                        "use gelu_new, gelu or gelu_pytorch_tanh")
    return dict(family="gpt2", vocab_size=get(cfg, "vocab_size", 50257),
                hidden_size=get(cfg, "n_embd", 768), num_layers=get(cfg, "n_layer", 12),
                num_heads=get(cfg, "n_head", 12), intermediate_size=get(cfg, "n_inner"),
                max_position_embeddings=get(cfg, "n_positions", 1024),
                tie_embeddings=flag(cfg, "tie_word_embeddings", True),
                activation="gelu_tanh" if act == "gelu_pytorch_tanh" else act,
                embd_dropout=get(cfg, "embd_pdrop", 0.1), attn_dropout=get(cfg, "attn_pdrop", 0.1),
                resid_dropout=get(cfg, "resid_pdrop", 0.1),
                reorder_and_upcast_attn=flag(cfg, "reorder_and_upcast_attn", False))


def _llama_fields(cfg: dict, model_type: str) -> dict:
    act = get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use silu")
    qkv_bias = model_type == "qwen2" or flag(cfg, "attention_bias", False)
    # Qwen3Attention and LlamaAttention give o_proj bias=attention_bias (modeling_qwen3.py)
    out_bias = flag(cfg, "attention_bias", False) and model_type in ("llama", "qwen3")
    return dict(family="llama", vocab_size=get(cfg, "vocab_size", required=True),
                hidden_size=get(cfg, "hidden_size", required=True),
                num_layers=get(cfg, "num_hidden_layers", required=True),
                num_heads=get(cfg, "num_attention_heads", required=True),
                num_kv_heads=get(cfg, "num_key_value_heads"),
                head_dim=get(cfg, "head_dim", 128 if model_type == "qwen3" else None),  # Qwen3Config's default
                intermediate_size=get(cfg, "intermediate_size", required=True),
                max_position_embeddings=get(cfg, "max_position_embeddings", 2048),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), qkv_bias=qkv_bias,
                out_bias=out_bias, mlp_bias=flag(cfg, "mlp_bias", False), activation="silu",
                attn_dropout=get(cfg, "attention_dropout", 0.0), qk_norm=model_type == "qwen3",
                **_llama_sliding_fields(cfg, model_type))


def _llama_sliding_fields(cfg: dict, model_type: str) -> dict:
    """Mistral: `sliding_window` (default None here: MistralConfig's 4096 default is what a config
    without the key gets, but Hub configs always write it) applies to every layer. Qwen2/Qwen3:
    only with use_sliding_window, to layers >= max_window_layers (configuration_qwen2.py)."""
    if model_type == "mistral":
        return dict(sliding_window=get(cfg, "sliding_window"))
    if model_type in ("qwen2", "qwen3") and flag(cfg, "use_sliding_window", False):
        return dict(sliding_window=get(cfg, "sliding_window", 4096),
                    max_window_layers=get(cfg, "max_window_layers", 28))
    return {}


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


MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def _moe_fields(cfg: dict, model_type: str) -> dict:
    """configuration_mixtral.py / qwen2_moe / qwen3_moe / olmoe: the Llama fields, the experts
    (Mixtral and OLMoE experts are intermediate_size wide, Qwen-MoE moe_intermediate_size), and the
    dense layers of Qwen-MoE (mlp_only_layers, and the layers decoder_sparse_step skips:
    modeling_qwen2_moe.py Qwen2MoeDecoderLayer)."""
    fields = _llama_fields(cfg, "llama")
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
    if model_type not in SUPPORTED:
        raise SpecError("hf_config.model_type", f"{model_type!r} is not supported",
                        f"use one of {', '.join(SUPPORTED)}")
    from memcalc.inputs.hf.keys import check_config_keys

    check_config_keys(cfg, model_type)  # every key modelled, known inert, or refused by name
    if model_type == "gpt2":
        fields = _gpt2_fields(cfg)
    elif model_type in FAMILY_READERS:
        fields = FAMILY_READERS[model_type](cfg)
    elif model_type.startswith("gemma"):
        from memcalc.inputs.hf.gemma import gemma_fields

        fields = gemma_fields(cfg, model_type)
    elif model_type in MOE_TYPES:
        fields = _moe_fields(cfg, model_type)
    else:
        fields = _llama_fields(cfg, model_type)
    if model_type != "gpt2":
        check_layer_types(cfg, fields)
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
                  attn_dropout="attention_dropout", sliding_window="sliding_window",
                  max_window_layers="max_window_layers", name="_name_or_path"),
}
CONFIG_KEYS["phi3"] = dict(CONFIG_KEYS["llama"], resid_dropout="resid_pdrop",
                           rotary_fraction="rope_parameters.partial_rotary_factor")
CONFIG_KEYS["olmo2"] = CONFIG_KEYS["granite"] = CONFIG_KEYS["llama"]
CONFIG_KEYS["gpt_neox"] = dict(CONFIG_KEYS["llama"], resid_dropout="hidden_dropout",
                               embd_dropout="hidden_dropout",
                               rotary_fraction="rope_parameters.partial_rotary_factor")


# ---- families beyond GPT-2 and Llama (transformers 5.24 configuration_phi3.py,
# configuration_gpt_neox.py, configuration_olmo2.py, configuration_granite.py,
# configuration_smollm3.py)
def _partial_rotary_factor(cfg: dict, default: float) -> float:
    """rope_parameters.partial_rotary_factor (5.x), else the legacy top-level key (Phi-3's
    partial_rotary_factor, GPT-NeoX's rotary_pct, which GPTNeoXConfig moves into rope_parameters)."""
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise SpecError("hf_config.rope_parameters", "is not a JSON object", "write it as {...} or drop it")
    for value in (rope.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), cfg.get("rotary_pct")):
        if value is not None:
            return value
    return default


def _llama_like(cfg: dict, family: str, act_default: str = "silu") -> dict:
    """The Llama-shaped fields (sizes, GQA, attention_dropout) of a llama-like config."""
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


def _phi3_fields(cfg: dict) -> dict:
    """Phi3Config: no biases (qkv_proj, o_proj, gate_up_proj, down_proj are bias=False),
    resid_pdrop on both residual branches, partial rotary."""
    return dict(_llama_like(cfg, "phi3"), qkv_bias=False, out_bias=False, mlp_bias=False,
                resid_dropout=get(cfg, "resid_pdrop", 0.0),
                rotary_fraction=_partial_rotary_factor(cfg, 1.0))


def _olmo2_fields(cfg: dict) -> dict:
    """Olmo2Config: attention_bias on q/k/v/o; the MLP has no biases."""
    bias = flag(cfg, "attention_bias", False)
    return dict(_llama_like(cfg, "olmo2"), qkv_bias=bias, out_bias=bias, mlp_bias=False)


def _granite_fields(cfg: dict) -> dict:
    """GraniteConfig: Llama's biases (attention_bias on q/k/v/o, mlp_bias) plus four multipliers
    whose ops run whatever their values (memcalc.families.hf_granite)."""
    bias = flag(cfg, "attention_bias", False)
    return dict(_llama_like(cfg, "granite"), qkv_bias=bias, out_bias=bias,
                mlp_bias=flag(cfg, "mlp_bias", False))


def _smollm3_fields(cfg: dict) -> dict:
    """SmolLM3Config: Llama's program with rotary skipped where no_rope_layers[i] == 0 (by default
    every no_rope_layer_interval-th layer, configuration_smollm3.py)."""
    bias = flag(cfg, "attention_bias", False)
    layers = count(cfg, "num_hidden_layers", required=True, ceiling=limits.MAX_LAYERS)  # a list of it below
    flags = get(cfg, "no_rope_layers")
    if flags is None:
        every = count(cfg, "no_rope_layer_interval", 4)
        flags = [int((i + 1) % every != 0) for i in range(layers)]
    if not isinstance(flags, list) or any(f not in (0, 1) for f in flags) or len(flags) != layers:
        raise SpecError("hf_config.no_rope_layers", f"is not a list of {layers} 0/1 flags",
                        "write one 0 or 1 per layer (num_hidden_layers of them)")
    return dict(_llama_like(cfg, "llama"), qkv_bias=bias, out_bias=bias, mlp_bias=flag(cfg, "mlp_bias", False),
                no_rope_layers=tuple(i for i, f in enumerate(flags) if f == 0))


def _gpt_neox_fields(cfg: dict) -> dict:
    """GPTNeoXConfig: LayerNorm, a GELU MLP with biases, attention_bias on query_key_value and
    dense, hidden_dropout on the embeddings and both residual branches, rotary_pct 0.25."""
    act = get(cfg, "hidden_act", "gelu")
    acts = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh"}
    if not isinstance(act, str) or act not in acts:  # a list is unhashable
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use gelu, gelu_new or gelu_pytorch_tanh")
    bias = flag(cfg, "attention_bias", True)
    drop = get(cfg, "hidden_dropout", 0.0)
    return dict(family="gpt_neox", vocab_size=get(cfg, "vocab_size", 50432),
                hidden_size=get(cfg, "hidden_size", 6144), num_layers=get(cfg, "num_hidden_layers", 44),
                num_heads=get(cfg, "num_attention_heads", 64),
                intermediate_size=get(cfg, "intermediate_size", 24576),
                max_position_embeddings=get(cfg, "max_position_embeddings", 2048),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), qkv_bias=bias, out_bias=bias,
                mlp_bias=True, activation=acts[act], attn_dropout=get(cfg, "attention_dropout", 0.0),
                embd_dropout=drop, resid_dropout=drop,
                parallel_residual=flag(cfg, "use_parallel_residual", True),
                rotary_fraction=_partial_rotary_factor(cfg, 0.25))


FAMILY_READERS = {"phi3": _phi3_fields, "olmo2": _olmo2_fields, "granite": _granite_fields,
                  "smollm3": _smollm3_fields, "gpt_neox": _gpt_neox_fields}
FAMILY_READERS["gpt_oss"] = lambda cfg: _gpt_oss_fields(cfg)


def _gpt_oss_fields(cfg: dict) -> dict:
    """memcalc.inputs.hf.gpt_oss (imported when a GPT-OSS config is first read)."""
    from memcalc.inputs.hf.gpt_oss import gpt_oss_fields

    return gpt_oss_fields(cfg)
CONFIG_KEYS["gemma"] = CONFIG_KEYS["gemma2"] = CONFIG_KEYS["gemma3"] = CONFIG_KEYS["llama"]


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
        key = CONFIG_KEYS.get(fields["family"], CONFIG_KEYS["llama"]).get(err.field.split(".")[0])
        if key is None:
            raise
        raise SpecError(f"hf_config.{key}", err.problem, err.fix) from None
