"""The regime of a training step, derived once from TrainingConfig: element sizes, parallel
layout, optimizer and checkpoint segments. Every other module reads these here instead of
re-deciding them from the config's strings.

Element sizes (bytes per element):
- parameters, their gradients and optimizer states take the parameter dtype: fp32 except under
  pure bf16 (`model.to(torch.bfloat16)`); autocast leaves parameters fp32 (torch/amp/autocast_mode.py);
- matmul outputs take the compute dtype: the autocast dtype under fp16-amp/bf16-amp, bf16 under
  pure bf16 (aten/src/ATen/autocast_mode.cpp lower_precision_fp list);
- floating-point buffers follow the parameters (`Module.to` casts them), except under FSDP2's
  MixedPrecisionPolicy, which casts only the all-gathered parameters (buffers stay fp32);
- optimizer states and sharded parameters under MixedPrecisionPolicy(param_dtype=bf16) stay fp32
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: the sharded parameter keeps its dtype).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from fnmatch import fnmatchcase

from memcalc.allocator.rules import granularity
from memcalc.inputs.lora import LoRA
from memcalc.inputs.training import TrainingConfig

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec

# optimizer state tensors per parameter, each of the parameter's shape and dtype
# (torch/optim/adam.py, adamw.py: exp_avg, exp_avg_sq; sgd.py: momentum_buffer)
STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}
AUTOCAST_PRECISIONS = ("fp16-amp", "bf16-amp")


def param_element_size(precision: str) -> int:
    """Bytes per parameter element (and per gradient and optimizer-state element).

    >>> param_element_size("bf16-amp"), param_element_size("bf16")
    (4, 2)
    """
    return 2 if precision == "bf16" else 4


def compute_element_size(precision: str) -> int:
    """Bytes per element of a matmul output.

    >>> compute_element_size("fp32"), compute_element_size("fp16-amp")
    (4, 2)
    """
    return 4 if precision == "fp32" else 2


def sqrt_segment_size(num_layers: int) -> int:
    """Layers per segment under 'sqrt' checkpointing: round(sqrt(L)) (Chen et al. 2016, sec. 4).

    >>> sqrt_segment_size(16)
    4
    """
    return max(1, round(math.sqrt(num_layers)))


@dataclass(frozen=True)
class Regime:
    """What a TrainingConfig means for memory, decided once.

    >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, precision="bf16-amp"))
    >>> r.autocast, r.compute_elt, r.param_elt, r.granularity
    (True, 2, 4, 512)
    """

    precision: str
    """The precision the program runs in (bf16 under FSDP2's MixedPrecisionPolicy)."""
    device: str
    autocast: bool
    compute_elt: int
    param_elt: int
    buffer_elt: int
    master_elt: int
    """Bytes per element of optimizer states and FSDP's sharded parameters and gradients."""
    granularity: int
    """Every allocation is rounded up to this many bytes (memcalc.allocator.rules)."""
    tensor_parallel: int
    sequence_parallel: bool
    data_parallel: int
    sharding: str
    optimizer: str
    optimizer_impl: str
    weight_decay: float
    checkpointing: str
    checkpoint_every: int | None
    attention: str
    grad_accum: int
    use_cache: bool = False
    attention_mask: str = "none"
    packed_sequences: int = 0
    """TrainingConfig.packed_sequences (cu_seq_lens' size with attention_mask='packed')."""
    labels: str = "input_ids"
    num_items_in_batch: bool = False
    hf_trainer: bool = False
    experts_implementation: str = "grouped_mm"
    moe_routing: object = "worst"
    """TrainingConfig.moe_routing: 'worst', 'balanced' or counts per MoE layer and expert."""
    max_grad_norm: float | None = None
    """Gradient clipping (clip_grad_norm_) before the optimizer step, or None."""
    sliding_window_reached: bool = False
    """seq_len >= the model's sliding_window: transformers then materialises the sliding layers'
    mask for SDPA (masking_utils._ignore_causal_mask_sdpa). A function of the shape, not of the
    TrainingConfig's other fields: memcalc.engine.run.candidates sets it and caches per value."""
    single_sequence: bool = False
    """micro_batch == 1, where programs read it (eager attention: memcalc.engine.run.single_sequence):
    torch.matmul's reshape of a (1, heads, s, d) operand laid out (1, s, heads, d) to (heads, s, d)
    merges a size-1 dimension, so it is a view, where any larger batch needs a copy
    (aten/src/ATen/native/LinearAlgebra.cpp _matmul_impl; TensorUtils.cpp computeStride). A
    shape condition like sliding_window_reached: memcalc.engine.run.candidates caches per value."""
    lora: LoRA | None = None
    freeze: tuple[str, ...] = ()
    quantization: str = "none"
    quant_elt: int = 0
    """Bytes per element of a quantised weight's dequantised copy (the dtype it was quantised
    from: bf16 when the model was loaded in bf16, else fp32); 0 without quantisation."""
    trl: str = "none"
    """TrainingConfig.trl: the TRL trainer whose step this is (memcalc.families.trl_dpo)."""
    dpo_reference: str = "model"
    """TrainingConfig.dpo_reference: a reference forward each step, or precomputed."""
    grpo_completion_len: int = 0
    """TrainingConfig.grpo_completion_len: C, the completion tokens of a GRPO row."""
    grpo_reference: bool = False
    """TrainingConfig.grpo_reference: a reference log-prob pass (beta != 0)."""
    grpo_old_logps: bool = False
    """TrainingConfig.grpo_old_logps: an old-policy log-prob pass (num_iterations > 1)."""
    trl_phase: str = "step"
    """TrainingConfig.trl_phase: the part of a GRPO step the program builds."""
    positions_batched: bool = False
    """The caller passes (b, s) position_ids (transformers' generate: attention_mask.cumsum - 1),
    so position embeddings (GPT-2's wpe) and rotary tables are per row, not (1, s): set by
    memcalc.families.trl_grpo's generation phase only."""
    fused_rows_capped: bool = False
    """trl: the fused LM head's b*(s-1) rows exceed one 4096-row token chunk (a shape condition,
    memcalc.families.trl_dpo.rows_capped; memcalc.engine.run.candidates caches per value)."""
    bnb_compute_elt: int = 0
    """bnb_4bit_compute_dtype: the dtype Linear4bit computes in (fp32 under fp32, else the
    half dtype: bf16, fp16 under fp16-amp)."""

    @classmethod
    def of(cls, training: TrainingConfig, model: ModelSpec | None = None) -> "Regime":
        """The regime of a training config; attention=None is the kernel transformers picks for
        `model` (TrainingConfig.resolved_attention), sdpa where no model is given.

        >>> from memcalc.inputs.specs import ModelSpec
        >>> t = TrainingConfig(micro_batch=1, seq_len=8)
        >>> Regime.of(t).attention, Regime.of(t, ModelSpec.preset("gemma-2-2b")).attention
        ('sdpa', 'eager')
        """
        attention = training.resolved_attention(model) if model is not None else training.attention or "sdpa"
        mixed = training.fsdp_mixed_precision
        precision = "bf16" if mixed else training.precision
        param_elt = param_element_size(precision)
        quantized = training.quantization != "none"
        if quantized:  # prepare_model_for_kbit_training casts every other parameter to fp32
            param_elt = 4
        return cls(precision=precision, device=training.device,
                   autocast=precision in AUTOCAST_PRECISIONS,
                   compute_elt=compute_element_size(precision), param_elt=param_elt,
                   buffer_elt=4 if mixed else param_element_size(precision),
                   master_elt=4 if mixed else param_elt,
                   granularity=granularity(training.device),
                   tensor_parallel=training.tensor_parallel,
                   sequence_parallel=training.sequence_parallel and training.tensor_parallel > 1,
                   data_parallel=training.data_parallel, sharding=training.sharding,
                   optimizer=training.optimizer, optimizer_impl=training.resolved_optimizer_impl,
                   weight_decay=training.resolved_weight_decay,
                   checkpointing=training.checkpointing, checkpoint_every=training.checkpoint_every,
                   attention=attention, grad_accum=training.grad_accum,
                   use_cache=training.use_cache, attention_mask=training.attention_mask,
                   packed_sequences=training.packed_sequences,
                   labels=training.labels, num_items_in_batch=training.num_items_in_batch,
                   hf_trainer=training.hf_trainer, max_grad_norm=training.max_grad_norm,
                   lora=training.lora, freeze=training.freeze, quantization=training.quantization,
                   quant_elt=param_element_size(precision) if quantized else 0,
                   bnb_compute_elt=compute_element_size(precision) if quantized else 0,
                   experts_implementation=training.experts_implementation,
                   moe_routing=training.moe_routing, trl=training.trl,
                   dpo_reference=training.dpo_reference,
                   grpo_completion_len=training.grpo_completion_len,
                   grpo_reference=training.grpo_reference, grpo_old_logps=training.grpo_old_logps,
                   trl_phase=training.trl_phase)

    @property
    def fsdp(self) -> bool:
        """Parameters sharded by FSDP2 (zero2/zero3 over more than one data-parallel rank)."""
        return self.data_parallel > 1 and self.sharding in ("zero2", "zero3")

    @property
    def replicated(self) -> bool:
        """Data parallel with every rank holding whole parameters (DDP, ZeRO-1)."""
        return self.data_parallel > 1 and not self.fsdp

    @property
    def states_per_param(self) -> int:
        """Optimizer state tensors per parameter."""
        return STATES_PER_PARAM[self.optimizer]

    @property
    def step_on_device(self) -> bool:
        """Adam's `step` counters are device tensors when fused (or on the CPU device), else CPU
        scalars that device memory does not see (torch/optim/adam.py _init_group)."""
        return self.device == "cpu" or self.optimizer_impl == "fused"

    @property
    def kv_cache(self) -> bool:
        """A DynamicCache copies each layer's keys and values: use_cache without HF's per-layer
        gradient checkpointing, which passes cache=None to its layers (modeling_layers.py)."""
        return self.use_cache and self.checkpointing == "none"

    @property
    def selective(self) -> bool:
        """Only the attention core is checkpointed (Korthikanti et al. 2022)."""
        return self.checkpointing == "selective"

    def segment_starts(self, num_layers: int) -> set[int]:
        """First layer of each checkpointed segment.

        >>> sorted(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="sqrt")).segment_starts(9))
        [0, 3, 6]
        """
        if self.checkpointing in ("none", "selective"):
            return set()
        k = {"per-layer": 1, "every-k": self.checkpoint_every or 1,
             "sqrt": sqrt_segment_size(num_layers)}[self.checkpointing]
        return set(range(0, num_layers, k))

    @property
    def fine_tuning(self) -> bool:
        """Some base parameters are frozen (LoRA, or TrainingConfig.freeze patterns)."""
        return self.lora is not None or bool(self.freeze)

    def trainable(self, label: str) -> bool:
        """Whether the parameter `label` (its torch name in the base model, adapters under
        `<module>.lora_A.default.weight`) requires grad: peft freezes every base parameter
        (tuners_utils.BaseTuner._mark_only_adapters_as_trainable) except biases under bias='all'
        (any name containing "bias") or 'lora_only' (the targeted linears' biases); then
        TrainingConfig.freeze patterns freeze what they match.

        >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, freeze=("*embed*",)))
        >>> r.trainable("model.embed_tokens.weight"), r.trainable("lm_head.weight")
        (False, True)
        """
        if any(fnmatchcase(label, p) for p in self.freeze):
            return False
        if self.lora is None or is_adapter(label) or ".modules_to_save." in label:
            return True
        if ".original_module." in label:
            return False
        module = label.rsplit(".", 1)[0]
        if self.lora.bias == "all":
            return "bias" in label
        if self.lora.bias == "lora_only":
            return label.endswith(".bias") and self.lora.targets_module(module, layer_of(module))
        return False


QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The nn.Linear modules bitsandbytes replaces (every linear but lm_head, transformers'
get_keys_to_not_convert)."""


def quantized_weight(regime: "Regime", label: str) -> bool:
    """Whether `label` is the weight of a linear that is a bitsandbytes Linear4bit.

    >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, quantization="nf4"))
    >>> quantized_weight(r, "model.layers.0.mlp.up_proj.weight"), quantized_weight(r, "lm_head.weight")
    (True, False)
    """
    if regime.quantization == "none" or not label.endswith(".weight") or is_adapter(label):
        return False
    return label.rsplit(".", 2)[-2] in QUANTIZED_LINEARS


_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The decoder layer index in a module or parameter name (None outside the layers).

    >>> layer_of("model.layers.12.self_attn.q_proj"), layer_of("transformer.h.3.attn.c_attn"), layer_of("lm_head")
    (12, 3, None)
    """
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def is_adapter(label: str) -> bool:
    """A LoRA adapter parameter (peft's names: <module>.lora_A.default.weight, lora_B ...).

    >>> is_adapter("model.layers.0.self_attn.q_proj.lora_B.default.weight")
    True
    """
    return ".lora_A." in label or ".lora_B." in label
