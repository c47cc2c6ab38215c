"""The llama family: transformers' LlamaForCausalLM and the classes that run its program with
other sizes or options (Mistral's sliding window, Qwen2's q/k/v biases and max_window_layers,
Qwen3's per-head q/k norms, SmolLM3's NoPE layers); validate.models.reference.ReferenceLlama."""
from __future__ import annotations

from memcalc.families.declaration import PACKED_MASKS, LLAMA_KEYS, FamilyDeclaration, HFType, LoRALayout, Supports
from memcalc.core import limits
from memcalc.core.errors import SpecError
from memcalc.inputs.hf.values import count, flag, get, llama_like

_SLIDING = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
_READER = "memcalc.families.declarations.llama:fields"
LLAMA = FamilyDeclaration(
    "llama", programs={"hf": "hf_llama:PROGRAM", "reference": "ref_llama:PROGRAM"},
    hf_types=(HFType("llama", "LlamaConfig", "LlamaForCausalLM", reader=_READER),
              HFType("mistral", "MistralConfig", "MistralForCausalLM", reader=_READER,
                     modelled=LLAMA_KEYS | {"sliding_window"}),
              HFType("qwen2", "Qwen2Config", "Qwen2ForCausalLM", reader=_READER, modelled=LLAMA_KEYS | _SLIDING),
              HFType("qwen3", "Qwen3Config", "Qwen3ForCausalLM", reader=_READER, modelled=LLAMA_KEYS | _SLIDING),
              HFType("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM",
                     reader="memcalc.families.declarations.llama:smollm3_fields",
                     modelled=LLAMA_KEYS | {"no_rope_layers", "no_rope_layer_interval"}, window_key="gated")),
    supports=Supports(use_cache=True, attention_masks=PACKED_MASKS, trainer_inputs=True, windowed_call_path=True,
                      quantization=True, tensor_parallel="all",
                      lora=LoRALayout("model.layers", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                       "mlp.down_proj"), ("model.embed_tokens",)),
                      sliding="optional", qk_norm="optional", no_rope_layers=True),
    # Llama/Mistral none, Qwen2 q/k/v, Llama's attention_bias and/or mlp_bias
    biases=((False, False, False), (True, False, False), (True, True, False), (False, False, True),
            (True, True, True)),
    builder="validate.models.hf:llama_config")
DECLARATIONS = (LLAMA,)


def fields(cfg: dict, model_type: str) -> dict:
    """LlamaConfig's fields, and Mistral's, Qwen2's, Qwen3's options."""
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


def smollm3_fields(cfg: dict, _model_type: str = "smollm3") -> dict:
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
    return dict(llama_like(cfg, "llama"), qkv_bias=bias, out_bias=bias, mlp_bias=flag(cfg, "mlp_bias", False),
                no_rope_layers=tuple(i for i, f in enumerate(flags) if f == 0))
