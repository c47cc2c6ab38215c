"""The record each model family declares once (memcalc.families.registry lists them): its
programs, the Hugging Face model types it reads, its parameter inventory, what it supports, and
the validator's model builder. Plain data and dotted references ("module:name"), so reading
the registry imports no program and no torch.

>>> d = FamilyDeclaration("toy", programs={"hf": "hf_llama:PROGRAM"}, hf_types=(HFType("toy", "ToyConfig",
...     "ToyForCausalLM", reader="memcalc.inputs.hf.config:llama_fields"),))
>>> d.model_types, d.supports.sdpa_refusal is None, d.supports.default_attention
(('toy',), True, 'sdpa')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from types import MappingProxyType
from typing import Any, Mapping

EMPTY: Mapping = MappingProxyType({})
PRECISIONS = ("fp32", "fp16-amp", "bf16-amp", "bf16")
ALL_MASKS = ("none", "ones", "padded")
"""TrainingConfig.attention_mask's kinds (a declaration's Supports.attention_masks)."""
PACKED_MASKS = ALL_MASKS + ("packed",)
"""ALL_MASKS and a padding-free packed row (measured on the GPT-2 and Llama programs)."""
LLAMA_TP_PLAN = (("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"), ("self_attn.v_proj", "colwise"),
                 ("self_attn.o_proj", "rowwise"), ("mlp.gate_proj", "colwise"), ("mlp.up_proj", "colwise"),
                 ("mlp.down_proj", "rowwise"))
"""The Megatron plan of PyTorch's TP tutorial and torchtitan's parallelize_llama for a decoder
layer with separate q/k/v and a gated MLP."""
LLAMA_KEYS = frozenset({"model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
                        "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "attention_dropout",
                        "_name_or_path"})
"""The keys LlamaConfig's ModelSpec fields come from (memcalc.inputs.hf.config.llama_fields)."""
LLAMA_CONFIG_KEYS = MappingProxyType(dict(
    vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
    num_heads="num_attention_heads", num_kv_heads="num_key_value_heads", head_dim="head_dim",
    intermediate_size="intermediate_size", max_position_embeddings="max_position_embeddings",
    attn_dropout="attention_dropout", sliding_window="sliding_window", max_window_layers="max_window_layers",
    name="_name_or_path"))
"""ModelSpec field -> the LlamaConfig key it comes from, to name the user's key in errors."""


def resolve(ref: str) -> Any:
    """The object a "package.module:name" reference names (imported on first use).

    >>> resolve("memcalc.families.declaration:PRECISIONS")[0]
    'fp32'
    """
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class HFType:
    """One transformers model type a family reads (config.json's model_type).

    `reader(cfg, model_type) -> ModelSpec fields`; every key of a config is in `modelled` (read by
    the reader), in memcalc.inputs.hf.keys.INERT or `inert` (key -> why it changes no memory), or
    refused: by `refused` (key -> (why, fix), whatever its value) or by keys.REFUSED_UNLESS.
    `window_key`: how the type reads `sliding_window` beside its modelled keys: "ignored" (read only
    with use_sliding_window, which is refused), "gated" (ignored while use_sliding_window is off)."""

    model_type: str
    config_class: str
    model_class: str
    reader: str
    modelled: frozenset[str] = LLAMA_KEYS
    inert: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    refused: Mapping[str, tuple[str, str]] = field(default_factory=lambda: EMPTY)
    window_key: str | None = None


@dataclass(frozen=True)
class LoRALayout:
    """peft's view of the model: the decoder layers' prefix, each layer's linear modules, and the
    input embeddings (lora.Embedding is refused)."""

    layers: str
    linears: tuple[str, ...]
    embeddings: tuple[str, ...]


@dataclass(frozen=True)
class Supports:
    """What the family's transformers class runs and memcalc models and measured; each value
    other than these is refused by name (memcalc.refusals, memcalc.inputs.specs)."""

    precisions: tuple[str, ...] = PRECISIONS
    sdpa_refusal: str | None = None
    """Why the class has no SDPA path (None: it has one)."""
    default_attention: str = "sdpa"
    """The kernel transformers runs when the user names none (TrainingConfig.attention=None):
    PreTrainedModel.get_correct_attn_implementation (modeling_utils.py, transformers 5.24) tries
    "sdpa" and falls back to "eager" when _sdpa_can_dispatch raises, as it does for a class whose
    `_supports_sdpa` is False."""
    use_cache: bool = False
    """use_cache=True: the DynamicCache's key/value copies (memcalc.families.call_path.cache_kv)
    modelled and measured."""
    attention_masks: tuple[str, ...] = ("none",)
    """The attention_mask kinds ('none', 'ones', 'padded') modelled and measured."""
    trainer_inputs: bool = False
    """labels='separate', num_items_in_batch and hf_trainer (memcalc.families.call_path:
    batch_inputs, trainer_inputs, divide_by_num_items) modelled and measured."""
    windowed_call_path: bool = False
    """The fields above also with a sliding window (else refused with one)."""
    lora: LoRALayout | None = None
    """LoRA and frozen parameters (None: refused)."""
    quantization: bool = False
    """bitsandbytes 4-bit bases (QLoRA)."""
    tensor_parallel: str = "none"
    """'all' implementations, 'reference' only, or 'none'."""
    tensor_parallel_refusal: tuple[str, str] = ("", "")
    """(why, fix) when an implementation outside `tensor_parallel` asks for it; for 'none', the
    layer that has no plan and why."""
    tensor_parallel_plan: tuple[tuple[str, str], ...] = LLAMA_TP_PLAN
    """Each decoder layer's linears (names relative to the layer) and their style, 'colwise' or
    'rowwise' (torch.distributed.tensor.parallel ColwiseParallel / RowwiseParallel), as
    validate.distributed.tensor_parallel applies them to the HF class."""
    sliding: str = "none"
    """'none', 'optional' (Mistral's every-layer rule or Qwen2's max_window_layers), 'patterned'
    (sliding_window with sliding_window_pattern's local/global alternation, always)."""
    qk_norm: str = "never"
    """'never', 'always', 'optional'."""
    dropouts: frozenset[str] = frozenset({"attn"})
    """Which of embd, attn, resid dropout the class has."""
    partial_rotary: bool = False
    """rotary_fraction < 1."""
    parallel_residual: bool = False
    no_rope_layers: bool = False
    upcast_attention: bool = False
    """GPT-2's reorder_and_upcast_attn."""
    grouped_query: bool = True
    attn_softcap: bool = False
    logit_softcap: bool = False
    moe: bool = False
    router_jitter: bool = False
    learned_positions: str | None = None
    """The name of a fixed position table the sequence must fit (None: rotary, computed per call)."""
    intermediate_required: bool = True


@dataclass(frozen=True)
class FamilyDeclaration:
    """One model family (ModelSpec.family), declared once.

    - programs: implementation -> "module:NAME" in memcalc.families, imported on first use;
    - hf_types: the transformers model types read into this family;
    - config_keys: ModelSpec field -> config key, to name the user's key in errors;
    - block_parameters: "module:function" (spec, h, f, q, kv) -> [(name, numel)] of one decoder
      layer in registration order; outer_parameters: what sits outside the layers ('norm':
      a final RMSNorm, 'layernorm': a final LayerNorm with bias, 'gpt2': wpe and ln_f);
      qk_norm_parameters / sandwich_norms / expert_biases: variants of the Llama-shaped block;
    - supports: see Supports; activations and biases ((qkv, out, mlp) the class can build) as the
      HF class runs them; check: "module:function" (spec) raising ValueError for what the class
      cannot build beyond Supports;
    - builder: "module:function" (spec) -> a transformers config dict (with model_type) that
      builds the spec's architecture (validate.models.hf resolves it and instantiates
      hf_types' model_class)."""

    name: str
    programs: Mapping[str, str]
    hf_types: tuple[HFType, ...]
    config_keys: Mapping[str, str] = field(default_factory=lambda: LLAMA_CONFIG_KEYS)
    block_parameters: str = "memcalc.formulas.parameters:llama_block"
    outer_parameters: str = "norm"
    qk_norm_parameters: str | None = None
    sandwich_norms: bool = False
    expert_biases: bool = False
    supports: Supports = field(default_factory=Supports)
    activations: tuple[str, ...] = ("silu",)
    biases: tuple[tuple[bool, bool, bool], ...] = ((False, False, False),)
    check: str | None = None
    builder: str = ""

    @property
    def model_types(self) -> tuple[str, ...]:
        """The transformers model types read into this family."""
        return tuple(t.model_type for t in self.hf_types)
