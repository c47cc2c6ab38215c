"""TrainingConfig: how one training step runs (shapes, precision, optimizer, checkpointing)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from pydantic import Field, field_validator, model_validator

from memcalc.core.input_model import FrozenModel
from memcalc.inputs.lora import LoRA

if TYPE_CHECKING:
    from memcalc.inputs.model_fields import ModelFields

Precision = Literal["fp32", "fp16-amp", "bf16-amp", "bf16"]
TorchOptimizer = Literal["sgd", "sgd-momentum", "adam", "adamw"]
# fine-tuning optimizers (memcalc.tape.lowbit): bitsandbytes AdamW8bit, PagedAdamW8bit, PagedAdamW;
# transformers' Adafactor with its defaults
FineTuneOptimizer = Literal["adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor"]
Optimizer = Literal[TorchOptimizer, FineTuneOptimizer]
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
Checkpointing = Literal["none", "per-layer", "sqrt", "every-k", "selective"]
Attention = Literal["eager", "sdpa"]
Device = Literal["cuda", "cpu"]
Sharding = Literal["none", "zero1", "zero2", "zero3"]
AttentionMask = Literal["none", "ones", "padded", "packed"]
Labels = Literal["input_ids", "separate"]
Quantization = Literal["none", "nf4", "nf4-double", "fp4", "int8"]
MoERouting = Literal["worst", "balanced"]
ExpertsImplementation = Literal["grouped_mm", "eager"]
PipelineSchedule = Literal["gpipe", "1f1b", "looped-bfs", "interleaved-1f1b", "interleaved-zero-bubble"]
TRLTrainer = Literal["none", "dpo", "sft", "grpo"]
TRLPhase = Literal["step", "scoring", "generation"]
DPOReference = Literal["model", "precomputed"]

# Every enumeration comes from its Literal type: a new option is one line above plus its rules.
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
TORCH_OPTIMIZERS: tuple[str, ...] = get_args(TorchOptimizer)
"""The torch.optim optimizers (the ci/gpu pairwise axes and the committed tables use these)."""
FINE_TUNE_OPTIMIZERS: tuple[str, ...] = get_args(FineTuneOptimizer)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
CHECKPOINTINGS: tuple[str, ...] = get_args(Checkpointing)
ATTENTIONS: tuple[str, ...] = get_args(Attention)
DEVICES: tuple[str, ...] = get_args(Device)
SHARDINGS: tuple[str, ...] = get_args(Sharding)
ATTENTION_MASKS: tuple[str, ...] = get_args(AttentionMask)
LABELS: tuple[str, ...] = get_args(Labels)
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
MOE_ROUTINGS: tuple[str, ...] = get_args(MoERouting)
EXPERTS_IMPLEMENTATIONS: tuple[str, ...] = get_args(ExpertsImplementation)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
PIPELINE_DEFAULTS = {"pipeline_parallel": 1, "pipeline_schedule": "1f1b", "num_microbatches": None,
                     "pipeline_stages_per_rank": 1, "stage_boundaries": None}
"""The pipeline fields at their defaults: no pipeline (validate's case keys leave them out, so
that rows recorded before the fields existed still match)."""
TRL_TRAINERS: tuple[str, ...] = get_args(TRLTrainer)
DPO_REFERENCES: tuple[str, ...] = get_args(DPOReference)

# torch.optim defaults (adam.py, adamw.py, sgd.py): weight_decay 0 for Adam/SGD, 1e-2 for AdamW;
# bitsandbytes/optim/adamw.py: 1e-2 for AdamW8bit, PagedAdamW, PagedAdamW8bit; transformers
# optimization.py Adafactor: 0.0.
DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "sgd-momentum": 0.0, "adam": 0.0, "adamw": 1e-2,
                        "adamw-8bit": 1e-2, "paged-adamw-8bit": 1e-2, "paged-adamw": 1e-2,
                        "adafactor": 0.0}


class TrainingConfig(FrozenModel):
    """One training step.

    >>> TrainingConfig(micro_batch=4, seq_len=1024, device="cpu").resolved_optimizer_impl
    'for-loop'
    """

    micro_batch: int = Field(gt=0)
    """Sequences per forward/backward pass (b)."""
    seq_len: int = Field(gt=0)
    """Tokens per sequence (s)."""
    grad_accum: int = Field(default=1, gt=0)
    """Micro-steps per optimizer step; gradients stay alive between them."""
    precision: Precision = "fp32"
    """fp32; fp16-amp (autocast fp16 + GradScaler dynamic loss scaling); bf16-amp (autocast bf16);
    bf16 (parameters, gradients and optimizer states in bf16)."""
    optimizer: Optimizer = "adamw"
    """torch.optim.SGD (momentum 0 or 0.9), Adam or AdamW; bitsandbytes AdamW8bit
    ('adamw-8bit'), PagedAdamW8bit ('paged-adamw-8bit'), PagedAdamW ('paged-adamw'); transformers'
    Adafactor with its defaults ('adafactor': factored second moment, relative step, no beta1)."""
    optimizer_impl: OptimizerImpl | None = None
    """foreach, fused or for-loop; None means torch's default on the device (foreach on cuda,
    for-loop on cpu: torch/optim/optimizer.py _default_to_fused_or_foreach). Only for the
    torch.optim optimizers: bitsandbytes and Adafactor have one implementation each (a Python
    loop over parameters), so it must stay None for them."""
    weight_decay: float | None = Field(default=None, ge=0.0)
    """Optimizer weight decay; None means torch's default for the optimizer."""
    checkpointing: Checkpointing = "none"
    """Activation checkpointing: none, per-layer, sqrt (about sqrt(L) segments), every-k, or
    selective (attention core recomputed, Korthikanti et al. 2022)."""
    checkpoint_every: int | None = Field(default=None, gt=0)
    """Layers per checkpointed segment, for checkpointing='every-k'."""
    attention: Attention | None = None
    """eager (explicit softmax(QK^T)V) or sdpa (F.scaled_dot_product_attention); None: the kernel
    transformers picks when the user names none (resolved_attention: the family declaration's
    Supports.default_attention, eager for Gemma-2 and GPT-OSS, sdpa elsewhere and for the
    reference models)."""
    device: Device = "cuda"
    """Where the step runs: cuda (caching allocator rules apply) or cpu."""
    world_size: int = Field(default=1, gt=0)
    """Processes (one accelerator each) training together; the prediction is per rank."""
    sharding: Sharding = "none"
    """Data-parallel memory sharding: none (DDP, full replicas and gradient buckets); zero1
    (optimizer states sharded, ZeroRedundancyOptimizer); zero2 (also gradients: FSDP2
    fully_shard without resharding after forward); zero3 (also parameters: FSDP2 fully_shard)."""
    tensor_parallel: int = Field(default=1, gt=0)
    """Megatron-style tensor-parallel degree (column/row splits of attention and MLP)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout work on s/tensor_parallel tokens."""
    pipeline_parallel: int = Field(default=1, gt=0)
    """Pipeline stages (torch.distributed.pipelining): the schedules (memcalc.parallel.pipeline)
    and each rank's stages (memcalc.parallel.stages, memcalc.parallel.pipeline_peaks)."""
    pipeline_schedule: PipelineSchedule = "1f1b"
    """With pipeline_parallel > 1: torch's schedule (GPipe, 1F1B, LoopedBFS, Interleaved1F1B,
    InterleavedZeroBubble)."""
    num_microbatches: int | None = Field(default=None, gt=0)
    """With pipeline_parallel > 1: micro-batches the schedule splits micro_batch into."""
    pipeline_stages_per_rank: int = Field(default=1, gt=0)
    """With pipeline_parallel > 1: stages per rank (virtual stages; >= 2 for the looped schedules)."""
    stage_boundaries: tuple[int, ...] | None = None
    """With pipeline_parallel > 1: the first decoder layer of each stage after the first (None: an even split)."""
    max_grad_norm: float | None = Field(default=None, gt=0.0)
    """Gradient clipping before optimizer.step(): torch.nn.utils.clip_grad_norm_(params,
    max_grad_norm) after GradScaler.unscale_ under fp16-amp; None means no clipping (the HF
    Trainer's default is 1.0; its 0 means no clipping, which is None here). clip_grad_norm_ runs
    with its default foreach=None (memcalc.tape.optimizer.clip_bytes)."""
    fsdp_mixed_precision: bool = False
    """FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) with
    precision='fp32': fp32 sharded parameters, gradients and optimizer states; all-gathered
    parameters, activations and unsharded gradients in bf16; no autocast."""
    lora: LoRA | None = None
    """LoRA adapters (memcalc.LoRA, as peft runs them) on a frozen base model; None: no adapters."""
    freeze: tuple[str, ...] = ()
    """Parameters to freeze (requires_grad=False), as fnmatch patterns over torch parameter
    names, e.g. "*embed_tokens*" or "model.layers.[0-3].*": no gradient, no optimizer state,
    and no saved input for a weight gradient."""
    quantization: Quantization = "none"
    """Base weights quantised by bitsandbytes (QLoRA): none, nf4, nf4-double (double
    quantisation), fp4, int8 (load_in_8bit)."""

    allocator: str = ""
    """The CUDA caching allocator's settings, as PYTORCH_CUDA_ALLOC_CONF gives them
    ("expandable_segments:True,max_split_size_mb:128"; keys expandable_segments, max_split_size_mb,
    roundup_power2_divisions, garbage_collection_threshold, max_non_split_rounding_mb;
    memcalc.allocator.settings). They change reserved memory (MemoryReport.reserved_peak_bytes),
    never allocated memory; "" is torch's defaults. Refused on device="cpu" (no caching allocator)."""

    @field_validator("allocator")
    @classmethod
    def _allocator(cls, v: str) -> str:
        from memcalc.allocator.settings import AllocatorSettings

        AllocatorSettings.parse(v)  # a bad key or value: one line naming it
        return v

    @field_validator("lora", mode="before")
    @classmethod
    def _lora(cls, v: object) -> object:
        return LoRA(**v) if isinstance(v, dict) else v

    @field_validator("freeze", mode="before")
    @classmethod
    def _freeze(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else tuple(v) if isinstance(v, list) else v

    @field_validator("stage_boundaries", mode="before")
    @classmethod
    def _stage_boundaries(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v  # a JSON row's list

    # ---- the call path: what the training loop passes to an HF model (memcalc.families.call_path)
    use_cache: bool = False
    """HF models only: the forward keeps transformers' default use_cache=True (a train-mode call
    without use_cache=False, as the HF Trainer makes): a DynamicCache holds a copy of every
    layer's keys and values until the forward returns. HF's gradient checkpointing turns it off
    (modeling_layers.GradientCheckpointingLayer), so it changes nothing under per-layer."""
    attention_mask: AttentionMask = "none"
    """HF models only: the attention_mask passed with the batch: none; ones (no padding: SDPA
    still runs is_causal, masking_utils._ignore_causal_mask_sdpa); padded (some token is padding:
    a (b, 1, s, s) boolean mask is built once, and SDPA converts it to a float mask that each
    layer saves, and takes k and v repeated to every head instead of enable_gqa); packed (one
    padding-free row of several sequences, as trl's padding-free collator passes it: no
    attention_mask but (1, s) position_ids restarting per sequence, seq_idx and cu_seq_lens;
    transformers finds the sequences from position_ids and builds a (1, 1, s, s) bool mask that
    SDPA cannot skip, as for a padded batch; needs micro_batch=1 and packed_sequences)."""
    packed_sequences: int = Field(default=0, ge=0)
    """With attention_mask='packed' (padding-free packing: trl.SFTTrainer's packing=True, one
    row of micro_batch=1 x seq_len tokens): the sequences packed into that row. The collator's
    cu_seq_lens_q/_k tensor holds packed_sequences + 1 int32 values; nothing else depends on the
    count (the mask and position_ids are (1, s) or (1, 1, s, s) whatever it is). 0 otherwise."""
    pad_tokens: int = Field(default=0, ge=0)
    """Padding tokens at the end of each sequence with attention_mask='padded' (what the
    validator builds; memory does not depend on how many, only that there are some)."""
    labels: Labels = "input_ids"
    """HF models only: labels=input_ids (the same tensor), or a separate (b, s) int64 labels
    tensor in the batch (a data collator's copy, -100 at ignored positions; measured: the ignored
    positions change no size, the tensor of its own adds b*s*8 bytes)."""
    num_items_in_batch: bool = False
    """HF models only: the loss gets num_items_in_batch (the HF Trainer passes it to models that
    accept loss kwargs): cross-entropy with reduction='sum' divided by that int64 scalar."""
    hf_trainer: bool = False
    """The HF Trainer's own tensors (transformers 5.24 trainer.py, measured): all
    grad_accum micro-batches of a step fetched before the first (get_batch_samples), on CPU
    also accelerate's DataLoaderShard look-ahead batch (on CUDA it stays on the host), two fp32
    scalars (the running _tr_loss and the last micro-step's detached loss), its decay / no-decay
    optimizer groups, and 32-bit bitsandbytes states for nn.Embedding weights."""
    experts_implementation: ExpertsImplementation = "grouped_mm"
    """Mixture-of-experts models: transformers' experts path (config experts_implementation):
    grouped_mm (the default; every tensor sized by tokens*top_k, so routing does not change
    memory) or eager (a loop over the hit experts, tensors sized by each expert's tokens).
    Dense models: no effect."""
    moe_routing: MoERouting | tuple[tuple[int, ...], ...] = "worst"
    """Mixture-of-experts models, eager experts: tokens per expert (memcalc.inputs.moe_routing.token_counts).
    'worst' (an upper bound of the peak over every routing, after the allocator's rounding:
    memcalc.inputs.moe_routing.worst_routings; the default, and what a capacity plan must use), 'balanced'
    (b*s*top_k/E each), or explicit counts, one row per MoE layer, one count per expert, each row
    summing to micro_batch*seq_len*top_k (what validate records with router hooks)."""

    trl: TRLTrainer = "none"
    """The TRL trainer whose step this is (trl 1.16, memcalc.families.trl_dpo): none, or dpo
    (trl.DPOTrainer: chosen and rejected concatenated into one forward, so micro_batch counts
    rows, twice per_device_train_batch_size; TRL's fused LM head computes per-token
    log-probabilities in tiles instead of the logits; a no-grad reference forward between the
    policy's forward and its backward; the sigmoid DPO loss), or sft (trl.SFTTrainer without
    packing: the same fused head on the collator's labels, the NLL of its log-probabilities), or
    grpo (trl.GRPOTrainer: micro_batch counts completions, seq_len is prompt + completion; one
    phase of its step at a time, trl_phase; memcalc.families.trl_grpo). Needs hf_trainer."""
    dpo_reference: DPOReference = "model"
    """trl='dpo' only: where the reference log-probabilities come from. model: a reference
    forward each step (full fine-tuning: a second, frozen copy of the model; with LoRA: the same
    weights with the adapters disabled); precomputed: precompute_ref_log_probs, read from the
    batch (two fp32 values per pair), no reference model held."""
    grpo_completion_len: int = 0
    """trl='grpo' only: max_completion_length, C, the completion tokens at the end of each
    seq_len row (prompt = seq_len - C): generate's new tokens and the scored tail."""
    grpo_reference: bool = False
    """trl='grpo' only: beta != 0, a no-grad reference pass before the step (a frozen copy of the
    model; with LoRA the adapters disabled) whose (b, C) fp32 log-probs the step holds."""
    grpo_old_logps: bool = False
    """trl='grpo' only: num_iterations > 1, the old policy's no-grad log-prob pass and its
    (b, C) fp32 result held by the step."""
    disable_dropout: bool = False
    """Every nn.Dropout set to p=0 before training (TRL's disable_dropout; trl='dpo' implies it)."""
    trl_phase: TRLPhase = "step"
    """trl='grpo' only: the part of a GRPOTrainer step this estimate is (memcalc.queries.grpo runs
    the three): step (the training forward, backward and optimizer step on prompt + completion),
    scoring (the no-grad reference / old-policy passes after generation, with the last step's
    buffered inputs) or generation (generate's prefill, and a floor of its last decode step;
    seq_len is then the prompt length, not prompt + completion)."""

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.checkpointing == "every-k" and self.checkpoint_every is None:
            raise ValueError("checkpointing='every-k' needs checkpoint_every (layers per segment)")
        if self.checkpoint_every is not None and self.checkpointing != "every-k":
            raise ValueError("checkpoint_every is only used with checkpointing='every-k'")
        if self.world_size % self.tensor_parallel:
            raise ValueError(f"tensor_parallel={self.tensor_parallel} must divide "
                             f"world_size={self.world_size}")
        _check_pipeline_fields(self)
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError("sequence_parallel needs tensor_parallel > 1")
        if not isinstance(self.moe_routing, str) and any(n < 0 for row in self.moe_routing for n in row):
            raise ValueError("moe_routing counts must be >= 0 (tokens per expert)")
        if self.fsdp_mixed_precision and (self.sharding not in ("zero2", "zero3")
                                          or self.precision != "fp32"):
            raise ValueError("fsdp_mixed_precision needs sharding zero2 or zero3 and precision "
                             "fp32 (the policy, not autocast, makes the bf16 copies)")
        _check_call_path(self)
        if self.allocator and self.device == "cpu":
            raise ValueError("allocator (PYTORCH_CUDA_ALLOC_CONF) configures the CUDA caching allocator, which "
                             "device='cpu' does not use (reserved = allocated there); drop it or use device='cuda'")
        _check_trl(self)
        if self.optimizer in FINE_TUNE_OPTIMIZERS and self.optimizer_impl is not None:
            raise ValueError(f"optimizer_impl has no meaning for optimizer='{self.optimizer}' (one "
                             "implementation, a loop over parameters); leave optimizer_impl unset")
        return self

    @property
    def data_parallel(self) -> int:
        """Data-parallel degree: world_size / (tensor_parallel x pipeline_parallel)."""
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def resolved_optimizer_impl(self) -> str:
        """The implementation torch runs: the explicit one, else the device default."""
        if self.optimizer_impl is not None:
            return self.optimizer_impl
        if self.optimizer in FINE_TUNE_OPTIMIZERS:
            return "for-loop"  # bitsandbytes' Optimizer8bit.step and Adafactor.step loop over params
        return "foreach" if self.device == "cuda" else "for-loop"

    def resolved_attention(self, model: ModelFields) -> str:
        """The attention kernel the step runs on `model` (a ModelSpec): the explicit one, else
        what transformers picks for its class (Supports.default_attention; the reference models,
        which are not transformers', run sdpa).

        >>> from memcalc.inputs.specs import ModelSpec
        >>> t = TrainingConfig(micro_batch=1, seq_len=8)
        >>> t.resolved_attention(ModelSpec.preset("gemma-2-2b")), t.resolved_attention(ModelSpec.preset("gpt2"))
        ('eager', 'sdpa')
        >>> t.with_(attention="sdpa").resolved_attention(ModelSpec.preset("gemma-2-2b"))
        'sdpa'
        """
        if self.attention is not None:
            return self.attention
        from memcalc.families.registry import declaration

        if model.implementation != "hf":
            return "sdpa"
        return declaration(model.family).supports.default_attention

    @property
    def resolved_weight_decay(self) -> float:
        """Weight decay, with torch's per-optimizer default filled in."""
        if self.weight_decay is not None:
            return self.weight_decay
        return DEFAULT_WEIGHT_DECAY[self.optimizer]

    @classmethod
    def from_trainer_args(cls, args: object, seq_len: int, device: str | None = None, *,
                          world_size: int = 1, attention_mask: str = "ones",
                          pad_tokens: int = 0, trainer: str = "hf",
                          packed_sequences: int | None = None) -> "TrainingConfig":
        """The step an HF Trainer runs (memcalc.inputs.trainers.trainer_args): `args` a dict of
        TrainingArguments fields, the path of the JSON TrainingArguments.to_json_string()
        writes, or the TrainingArguments object; fields not given take transformers' defaults.
        `device` defaults to cpu under use_cpu, else cuda; `attention_mask` says what the data
        collator passes ('ones' for unpadded or packed batches, 'padded' with pad_tokens).
        `trainer='dpo'` reads a trl.DPOConfig (memcalc.inputs.trainers.dpo_args): micro_batch is
        then 2 x per_device_train_batch_size rows (chosen and rejected), attention_mask 'ones';
        `trainer='sft'` an SFTConfig (with packing: one padding-free row of
        per_device_train_batch_size x seq_len tokens, attention_mask 'packed', holding
        `packed_sequences` sequences, by default the most it can: memcalc.inputs.trainers.sft_args);
        `trainer='grpo'` a GRPOConfig
        (memcalc.inputs.trainers.grpo_args: seq_len is prompt + max_completion_length, the step
        phase; memcalc.queries.grpo.grpo_phases gives all three).

        >>> t = TrainingConfig.from_trainer_args({"per_device_train_batch_size": 4, "bf16": True,
        ...     "gradient_checkpointing": True}, seq_len=2048)
        >>> t.micro_batch, t.precision, t.checkpointing, t.optimizer_impl, t.max_grad_norm
        (4, 'bf16-amp', 'per-layer', 'fused', 1.0)
        """
        from memcalc.inputs.trainers.trainer_args import training_fields

        return cls.make(**training_fields(args, seq_len, device, world_size, attention_mask,
                                          pad_tokens, trainer, packed_sequences))

    def with_(self, **changes) -> "TrainingConfig":
        """A copy with some fields changed, validated again.

        >>> TrainingConfig(micro_batch=1, seq_len=8).with_(micro_batch=2).micro_batch
        2
        """
        return type(self).make(**{**self.model_dump(), **changes})


def _check_pipeline_fields(training: TrainingConfig) -> None:
    """The pipeline fields need pipeline_parallel > 1 and num_microbatches; the ranks form
    rows of tensor_parallel x pipeline_parallel."""
    pp = training.pipeline_parallel
    if pp == 1:
        for name, default in PIPELINE_DEFAULTS.items():
            if getattr(training, name) != default:
                raise ValueError(f"{name} needs pipeline_parallel > 1")
        return
    if training.num_microbatches is None:
        raise ValueError("num_microbatches (the schedule's micro-batches) is needed with pipeline_parallel > 1")
    if training.world_size % (pp * training.tensor_parallel):
        raise ValueError(f"world_size={training.world_size} must be a multiple of pipeline_parallel x "
                         f"tensor_parallel = {pp * training.tensor_parallel}")


def _check_call_path(training: TrainingConfig) -> None:
    """Cross-field checks of the call-path fields."""
    if training.attention_mask == "padded" and training.pad_tokens == 0:
        raise ValueError("attention_mask='padded' needs pad_tokens > 0 (padding tokens per "
                         "sequence); with no padding use attention_mask='ones'")
    if (training.attention_mask == "packed") != (training.packed_sequences > 0):
        raise ValueError("attention_mask='packed' goes with packed_sequences >= 1 (sequences "
                         "packed into the row), and packed_sequences only with it")
    if training.attention_mask == "packed" and training.micro_batch != 1:
        raise ValueError("attention_mask='packed' is one padding-free row: micro_batch=1, "
                         "seq_len = the row's tokens")
    if training.pad_tokens and training.attention_mask != "padded":
        raise ValueError("pad_tokens is only used with attention_mask='padded'")
    if training.pad_tokens > training.seq_len:  # no such batch: padding beyond the sequence
        raise ValueError(f"pad_tokens={training.pad_tokens} exceeds seq_len={training.seq_len} "
                         "(padding tokens per sequence); use pad_tokens <= seq_len")


def _check_trl(training: TrainingConfig) -> None:
    """Cross-field checks of the TRL fields."""
    if training.trl != "dpo" and training.dpo_reference != "model":
        raise ValueError("dpo_reference is only used with trl='dpo'")
    grpo_set = training.grpo_completion_len or training.grpo_reference or training.grpo_old_logps \
        or training.trl_phase != "step"
    if training.trl != "grpo" and grpo_set:
        raise ValueError("grpo_completion_len, grpo_reference, grpo_old_logps and trl_phase are only "
                         "used with trl='grpo'")
    if training.trl == "grpo" and training.trl_phase == "generation":
        if training.grpo_completion_len <= 0:
            raise ValueError("trl='grpo' needs grpo_completion_len > 0")
    elif training.trl == "grpo" and not 0 < training.grpo_completion_len < training.seq_len:
        raise ValueError(f"trl='grpo' needs 0 < grpo_completion_len < seq_len (seq_len is prompt + "
                         f"completion); got {training.grpo_completion_len} and {training.seq_len}")
    if training.trl == "none":
        return
    if not training.hf_trainer:
        raise ValueError(f"trl='{training.trl}' runs through the HF Trainer: set hf_trainer=True "
                         "(TrainingConfig.from_trainer_args(..., trainer='dpo') does)")
    if training.trl == "dpo" and training.micro_batch % 2:
        raise ValueError(f"trl='dpo' runs chosen and rejected in one batch: micro_batch "
                         f"{training.micro_batch} counts rows and must be even (2 x pairs)")
