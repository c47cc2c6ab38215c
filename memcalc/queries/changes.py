"""The changes `check` combines (memcalc.queries.preflight), each with what the user gives up.

A change is a set of TrainingConfig fields and a sentence. What it costs the user, cheapest first
(issue 28): NOTHING (the same training, slower or not at all: activation checkpointing, gradient
accumulation that keeps the sequences per optimizer step, another implementation of the same
optimizer); NUMERICS (the same training in other number formats: bf16 autocast, pure bf16
parameters and states, bitsandbytes' 8-bit optimizer states); TRAINING (another training: LoRA or
QLoRA adapters on a frozen base, SGD without optimizer states); HARDWARE (more GPUs with sharded
states, or optimizer states paged to host memory).

Two searched changes carry a number found by the search, not listed here: the micro-batch (the
largest that fits and divides the sequences per optimizer step) and the number of GPUs (the fewest
powers of two that fit).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.inputs.lora import LoRA

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig

NOTHING, NUMERICS, TRAINING, HARDWARE = 0, 1, 2, 3
GIVES_UP = {NOTHING: "nothing", NUMERICS: "numerics", TRAINING: "the training", HARDWARE: "hardware"}

# QLoRA's own recipe (Dettmers et al. 2023, "QLoRA", sec. 4: adapters on every linear layer of the
# block, r=16 in the ablations' default; alpha 2r is peft's and axolotl's usual pairing)
ADAPTER = LoRA(rank=16, alpha=32, targets="all-linear")
ADAPTER_TEXT = "r=16, lora_alpha=32, target_modules='all-linear' (every linear of the blocks, not lm_head)"


@dataclass(frozen=True)
class Option:
    """One change: its search dimension (one option per dimension in a combination), the
    fields it sets, what it costs and a sentence."""

    dimension: str
    fields: dict
    cost: int
    text: str


def options(training: TrainingConfig) -> list[Option]:
    """The listed changes that apply to `training` (the searched micro-batch and GPU count are
    added by the search).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> [o.dimension + ":" + str(o.cost) for o in options(TrainingConfig(micro_batch=1, seq_len=8,
    ...     checkpointing="per-layer", precision="bf16", optimizer="sgd"))]
    ['checkpointing:0', 'checkpointing:0', 'optimizer:0', 'optimizer:0', 'adapters:2', 'adapters:2']
    """
    # the HF Trainer checkpoints per layer only (activation_checkpointing); a plain loop may group layers
    modes = ("per-layer",) if training.hf_trainer else ("per-layer", "sqrt", "selective")
    out = [Option("checkpointing", {"checkpointing": mode, "checkpoint_every": None}, NOTHING,
                  f"checkpointing {mode}{_CKPT[mode]}") for mode in modes if mode != training.checkpointing]
    out += _optimizer_options(training)
    out += _precision_options(training)
    if training.trl != "none":  # DPO's and GRPO's own; LoRA under SFTTrainer is not measured
        own = {"dpo": _dpo_options, "grpo": _grpo_options}.get(training.trl)
        return out + (own(training) if own is not None else [])
    if training.lora is None and not training.freeze:
        # peft's adapters are measured without the HF Trainer's own tensors (refusals.finetune)
        off = {"hf_trainer": False} if training.hf_trainer else {}
        note = " (estimated without the HF Trainer's own tensors, which memcalc measures on full training only)" \
            if off else ""
        out.append(Option("adapters", {"lora": ADAPTER, **off}, TRAINING,
                          f"LoRA {ADAPTER_TEXT}, base frozen{note}"))
        if training.quantization == "none":
            out.append(Option("adapters", {"lora": ADAPTER, "quantization": "nf4", **off}, TRAINING,
                              f"QLoRA: nf4 base (bitsandbytes 4-bit) with LoRA {ADAPTER_TEXT}{note}"))
    elif training.lora is not None and training.quantization == "none":
        out.append(Option("adapters", {"quantization": "nf4"}, TRAINING,
                          "QLoRA: the base quantised to nf4 (bitsandbytes 4-bit) under the same adapters"))
    return out


_CKPT = {"per-layer": " (each decoder layer recomputed in backward)",
         "sqrt": " (about sqrt(L) segments)", "selective": " (attention core recomputed)"}


def _optimizer_options(training: TrainingConfig) -> list[Option]:
    out = []
    if training.hf_trainer and training.optimizer == "adamw":
        # the Trainer's optim names reach two: adamw_torch_fused, and adamw_torch (torch's default)
        out += [Option("optimizer", {"optimizer_impl": impl}, NOTHING, f"optimizer implementation {text}")
                for impl, text in (("fused", "fused (optim adamw_torch_fused)"),
                                   (None, "torch's default (optim adamw_torch)"))
                if impl != training.optimizer_impl]
    elif training.optimizer in ("sgd", "sgd-momentum", "adam", "adamw") and not training.hf_trainer:
        out += [Option("optimizer", {"optimizer_impl": impl}, NOTHING, f"optimizer implementation {impl}")
                for impl in ("foreach", "fused", "for-loop") if impl != training.resolved_optimizer_impl]
    if training.optimizer in ("adam", "adamw"):
        plain = {"optimizer_impl": None, "weight_decay": training.weight_decay}
        out += [Option("optimizer", {"optimizer": "adamw-8bit", **plain}, NUMERICS,
                       "bitsandbytes 8-bit AdamW states (optim adamw_bnb_8bit)"),
                Option("optimizer", {"optimizer": "paged-adamw", **plain}, HARDWARE,
                       "bitsandbytes paged AdamW (optim paged_adamw_32bit): fp32 states in managed "
                       "memory that pages to host RAM when the GPU is full (not in the peak; slower steps)"),
                Option("optimizer", {"optimizer": "sgd", **plain}, TRAINING,
                       "SGD without momentum: no optimizer states (another training)")]
    return out


def _precision_options(training: TrainingConfig) -> list[Option]:
    out = []
    if training.precision == "fp32" and not training.fsdp_mixed_precision:
        out.append(Option("precision", {"precision": "bf16-amp"}, NUMERICS,
                          "bf16 autocast (bf16=True; fp32 parameters and states)"))
    if training.precision != "bf16" and not training.fsdp_mixed_precision:
        out.append(Option("precision", {"precision": "bf16"}, NUMERICS,
                          "pure bf16: the model loaded in bfloat16 (parameters, gradients and "
                          "optimizer states in bf16)"))
    return out


def batch_option(training: TrainingConfig, micro_batch: int) -> Option:
    """Gradient accumulation keeping the sequences per optimizer step.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> batch_option(TrainingConfig(micro_batch=4, seq_len=8), 2).fields
    {'micro_batch': 2, 'grad_accum': 2}
    """
    total = training.micro_batch * training.grad_accum
    accum = total // micro_batch
    return Option("batch", {"micro_batch": micro_batch, "grad_accum": accum}, NOTHING,
                  f"micro-batch {micro_batch} x {accum} accumulation steps ({total} sequences a step, as before)")


def gpus_option(training: TrainingConfig, world_size: int) -> Option:
    """`world_size` GPUs with parameters, gradients and optimizer states sharded (ZeRO-3: FSDP2
    fully_shard), each rank keeping the micro-batch.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> gpus_option(TrainingConfig(micro_batch=4, seq_len=8, max_grad_norm=1.0), 4).fields
    {'world_size': 4, 'sharding': 'zero3'}
    """
    fields = {"world_size": world_size * training.tensor_parallel, "sharding": "zero3"}
    text = (f"{world_size} GPUs with ZeRO-3 sharding (FSDP2 fully_shard or DeepSpeed stage 3); "
            f"each keeps micro-batch {training.micro_batch}, so a step sees {world_size}x the sequences "
            f"unless accumulation is cut")
    if training.max_grad_norm is not None and training.tensor_parallel > 1:  # refusals.step: clipping
        fields["max_grad_norm"] = None  # is modelled under DDP, ZeRO-1 and FSDP2, not tensor parallelism
        text += " (estimated without gradient clipping, which memcalc does not model with tensor parallelism)"
    return Option("gpus", fields, HARDWARE, text)


def cost_key(costs: list[int]) -> tuple[int, ...]:
    """What a combination gives up, as a sortable key: its costs, worst first. One numerics
    change is cheaper than two, which are cheaper than any change of the training.

    >>> sorted([cost_key([TRAINING]), cost_key([NUMERICS, NUMERICS]), cost_key([NUMERICS]),
    ...         cost_key([NOTHING, NUMERICS])])
    [(1,), (1, 0), (1, 1), (2,)]
    """
    return tuple(sorted(costs, reverse=True))



def _grpo_options(training: TrainingConfig) -> list[Option]:
    """trl.GRPOTrainer's own: no reference model (beta=0, TRL's default: no copy, no reference
    pass), completions of half the length (max_completion_length; the prompt kept), and LoRA as
    its peft_config (the reference, with beta, is then the base with adapters disabled). Fewer
    generations at the same prompts is the searched micro-batch (rows are completions).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=8, seq_len=96, hf_trainer=True, trl="grpo", grpo_completion_len=64,
    ...                    grpo_reference=True)
    >>> [(o.dimension, o.fields.get("seq_len")) for o in _grpo_options(t)]
    [('reference', None), ('completions', 64), ('adapters', None)]
    """
    out = []
    if training.grpo_reference:
        out.append(Option("reference", {"grpo_reference": False}, TRAINING,
                          "beta=0: no KL term, so no reference model or reference pass (TRL's default)"))
    half = training.grpo_completion_len // 2
    if half:
        out.append(Option("completions", {"grpo_completion_len": half,
                                          "seq_len": training.seq_len - half}, TRAINING,
                          f"max_completion_length {half} (half): shorter completions, the same prompts"))
    if training.lora is None and not training.freeze:
        out.append(Option("adapters", {"lora": ADAPTER}, TRAINING,
                          f"LoRA {ADAPTER_TEXT} as GRPOTrainer's peft_config, base frozen (a reference, "
                          "with beta: the base with adapters disabled)"))
    return out


def _dpo_options(training: TrainingConfig) -> list[Option]:
    """trl.DPOTrainer's own: reference log-probabilities computed once before training (the same
    values, no reference forward or copy in the step), and LoRA adapters (the reference is then
    the base with adapters disabled: no copy either). QLoRA under DPO is not modelled.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> [o.dimension for o in _dpo_options(TrainingConfig(micro_batch=2, seq_len=8, hf_trainer=True, trl="dpo"))]
    ['reference', 'adapters']
    """
    out = []
    if training.dpo_reference == "model":
        out.append(Option("reference", {"dpo_reference": "precomputed"}, NOTHING,
                          "precompute_ref_log_probs: reference log-probs computed once before training "
                          "(no reference model or forward in the step)"))
    if training.lora is None and not training.freeze:
        out.append(Option("adapters", {"lora": ADAPTER}, TRAINING,
                          f"LoRA {ADAPTER_TEXT} as DPOTrainer's peft_config, base frozen (the reference: "
                          "the base with adapters disabled)"))
    return out
