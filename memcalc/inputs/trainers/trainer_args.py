"""transformers.TrainingArguments -> TrainingConfig: what the HF Trainer (transformers 5.24,
trainer.py, trainer_optimizer.py, training_args.py) does with each field, accounted for.

Every field of TrainingArguments is in exactly one of: READ (mapped onto a TrainingConfig field),
REFUSED_UNLESS_DEFAULT (changes memory in a way memcalc does not model: refused by name unless it
keeps transformers' default), INERT (leaves a training step's device memory unchanged, with why).
A field in none of them is refused, so a new transformers release that adds one turns
tests/test_trainer_args.py red instead of answering silently. No transformers import here:
a TrainingArguments object is read through its to_dict().

The Trainer's call path, whatever the fields: labels from the batch (a tensor of their own),
num_items_in_batch passed to models that accept loss kwargs (HF GPT-2 and Llama do),
model.config.use_cache = args.use_cache (trainer.py, step 11), and the attention_mask the data
collator gives (the caller says whether batches are padded).
"""
from __future__ import annotations

import os
from typing import Any

from memcalc.core.errors import NotModelledError, SpecError, UnknownNameError, closest_names

# transformers 5.24 TrainingArguments defaults of the fields read or refused (training_args.py)
DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": False,
    "fp16": False, "optim": "adamw_torch_fused", "optim_args": None, "weight_decay": 0.0,
    "max_grad_norm": 1.0, "activation_checkpointing": None, "gradient_checkpointing": None,
    "activation_checkpointing_kwargs": None, "gradient_checkpointing_kwargs": None,
    "use_cache": False, "use_cpu": False, "deepspeed": None, "fsdp": None, "fsdp_config": None,
    "label_smoothing_factor": 0.0, "torch_compile": False, "torch_compile_backend": None,
    "torch_compile_mode": None, "use_liger_kernel": False, "liger_kernel_config": None,
    "neftune_noise_alpha": None, "optim_target_modules": None, "parallelism_config": None,
    "debug": "", "full_determinism": False, "accelerator_config": None,
}

READ = {
    "per_device_train_batch_size": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "bf16": "precision (bf16-amp: accelerate's autocast, fp32 parameters)",
    "fp16": "precision (fp16-amp: autocast + GradScaler)",
    "optim": "optimizer and optimizer_impl",
    "optim_args": "SGD momentum (optim='sgd'); refused for other optimizers",
    "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm (0 or None: no clipping)",
    "activation_checkpointing": "checkpointing='per-layer' (HF activation_checkpointing_enable)",
    "gradient_checkpointing": "deprecated alias of activation_checkpointing",
    "activation_checkpointing_kwargs": "use_reentrant must stay False (non-reentrant is modelled)",
    "gradient_checkpointing_kwargs": "deprecated alias of activation_checkpointing_kwargs",
    "use_cache": "use_cache (the Trainer sets model.config.use_cache)",
    "use_cpu": "device='cpu'",
    "deepspeed": "sharding from the ZeRO stage (memcalc.inputs.trainers.deepspeed)",
    "accelerator_config": "split_batches must stay False (per-device batch unchanged)",
}

REFUSED_UNLESS_DEFAULT = {
    "fsdp": "accelerate's FSDP wrapping (not FSDP2 fully_shard as memcalc models it)",
    "fsdp_config": "accelerate's FSDP options",
    "label_smoothing_factor": "the Trainer's LabelSmoother recomputes log_softmax over the logits",
    "torch_compile": "compiled graphs fuse and reorder what eager mode allocates",
    "torch_compile_backend": "sets torch_compile",
    "torch_compile_mode": "sets torch_compile",
    "use_liger_kernel": "Liger's fused kernels replace the modelled ops",
    "liger_kernel_config": "Liger's fused kernels",
    "neftune_noise_alpha": "a forward hook adds a noise tensor to the embeddings",
    "optim_target_modules": "GaLore/APOLLO projections",
    "parallelism_config": "accelerate's tensor/context parallel layout",
    "debug": "underflow/overflow hooks on every module",
    "full_determinism": "sets CUBLAS_WORKSPACE_CONFIG=:4096:8 (another cuBLAS workspace)",
}

_NUMBERS = "a number the optimizer or scheduler uses; no tensor changes size"
_IO = "logging, saving, hub or run bookkeeping on the host; no device tensor"
_EVAL = ("evaluation runs outside the training step (a no-grad forward); memcalc predicts the "
         "training step, not evaluation's own peak")
_DATA = "host-side data loading; the device sees the same batch"
_RUN = "launch and resume bookkeeping; no device tensor"
INERT: dict[str, str] = {
    **{k: _NUMBERS for k in ("num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type",
                             "lr_scheduler_kwargs", "warmup_steps", "adam_beta1", "adam_beta2",
                             "adam_epsilon", "seed", "data_seed")},
    **{k: _IO for k in ("output_dir", "logging_strategy", "logging_steps", "logging_first_step",
                        "log_on_each_node", "log_level", "log_level_replica", "disable_tqdm",
                        "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
                        "trackio_static_space_id", "save_only_model", "save_strategy", "save_steps",
                        "save_on_each_node", "save_total_limit", "enable_jit_checkpoint",
                        "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id",
                        "hub_strategy", "hub_always_push", "hub_revision")},
    **{k: _EVAL for k in ("eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size",
                          "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
                          "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics",
                          "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval",
                          "load_best_model_at_end", "metric_for_best_model", "greater_is_better")},
    **{k: _DATA for k in ("dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
                          "dataloader_persistent_workers", "dataloader_prefetch_factor",
                          "dataloader_multiprocessing_context", "dataloader_in_order",
                          "remove_unused_columns", "label_names", "train_sampling_strategy",
                          "length_column_name", "ignore_data_skip")},
    **{k: _RUN for k in ("do_train", "do_eval", "do_predict", "resume_from_checkpoint", "local_rank",
                         "restore_callback_states_from_checkpoint", "ddp_backend", "ddp_timeout")},
    "tf32": "TF32 matmul math keeps fp32 storage",
    "torch_empty_cache_steps": "empties the allocator's cache: reserved memory, not allocated",
    "auto_find_batch_size": ("halves per_device_train_batch_size after an OOM; the prediction is "
                             "for the batch size the run starts with"),
    "skip_memory_metrics": "reads torch.cuda's statistics; allocates nothing",
    "logging_nan_inf_filter": "one isnan/isinf check of the scalar loss",
    "include_num_input_tokens_seen": "a scalar token count per step",
    "average_tokens_across_devices": "all-reduces the scalar num_items_in_batch",
    "ddp_find_unused_parameters": "a graph traversal after backward; no tensor",
    "ddp_bucket_cap_mb": "bucket boundaries; DDP's buckets hold every gradient once whatever the cap",
    "ddp_broadcast_buffers": "buffers broadcast in place",
    "ddp_static_graph": "DDP's hook scheduling; no tensor",
}

# Trainer optimizer name -> (TrainingConfig.optimizer, optimizer_impl); None: not modelled here.
# adamw_torch passes neither foreach nor fused: torch's default on the device.
# bitsandbytes and Adafactor (trainer_optimizer._get_bitsandbytes_optimizer, _get_adafactor:
# scale_parameter=False, relative_step=False, which change no state size) have one implementation.
OPTIMS: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", None), "adamw_torch_fused": ("adamw", "fused"), "sgd": ("sgd", None),
    "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("paged-adamw-8bit", None), "paged_adamw_32bit": ("paged-adamw", None),
    "adafactor": ("adafactor", None),
}


def trainer_args_dict(args: Any) -> dict:
    """A TrainingArguments as a plain dict: a dict as given, a path to the JSON that
    TrainingArguments.to_json_string() writes, or an object with to_dict().

    >>> trainer_args_dict({"bf16": True})
    {'bf16': True}
    """
    if isinstance(args, dict):
        return dict(args)
    if isinstance(args, (str, os.PathLike)):
        from memcalc.core.files import parse_json_object, read_bounded

        path = os.fspath(args)
        return parse_json_object(read_bounded(path, "trainer_args"), repr(path), "trainer_args")
    to_dict = getattr(args, "to_dict", None)
    fields = to_dict() if callable(to_dict) else None
    if isinstance(fields, dict):  # one level: an object whose to_dict() is no dict is refused below
        return dict(fields)
    raise SpecError("trainer_args", f"expected a dict, a path or a TrainingArguments, got "
                    f"{type(args).__name__}", "pass TrainingArguments, its to_dict() or its JSON file")


def given(fields: dict, name: str) -> Any:
    """The field's value, transformers' default when absent."""
    return fields.get(name, DEFAULTS.get(name))


def check_fields(fields: dict) -> None:
    """Refuse unknown fields, and fields not modelled unless at their defaults."""
    known = set(READ) | set(REFUSED_UNLESS_DEFAULT) | set(INERT)
    for name in fields:
        if name not in known:
            raise UnknownNameError(f"trainer_args.{name}", "is not a TrainingArguments field "
                                   "memcalc knows (transformers 5.24)",
                                   f"remove it, or check the name: {closest_names(name, sorted(known))}")
    for name, why in REFUSED_UNLESS_DEFAULT.items():
        value = given(fields, name)
        if value not in (DEFAULTS[name], None, "", [], {}):
            raise NotModelledError(f"trainer_args.{name}", f"{value!r} is not modelled ({why})",
                                   f"set {name} to {DEFAULTS[name]!r}")


def boolean(fields: dict, name: str) -> bool:
    """A boolean field: JSON true/false (null: the default); a string "false" would be truthy.

    >>> boolean({"bf16": None}, "bf16"), boolean({"use_cpu": True}, "use_cpu")
    (False, True)
    """
    value = given(fields, name)
    if value is None:
        return bool(DEFAULTS.get(name))
    if not isinstance(value, bool):
        raise SpecError(f"trainer_args.{name}", f"{str(value)[:40]!r} is not a JSON boolean",
                        f"write {name}: true or false, without quotes")
    return value


def number(fields: dict, name: str) -> float:
    """A finite number >= 0 (absent: transformers' default; null: 0).

    >>> number({"weight_decay": 0.1}, "weight_decay"), number({}, "max_grad_norm")
    (0.1, 1.0)
    """
    value = given(fields, name)
    if value is None:  # the Trainer: max_grad_norm None means no clipping
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise SpecError(f"trainer_args.{name}", f"{str(value)[:40]!r} is not a number >= 0",
                        f"write {name} as a JSON number such as {DEFAULTS[name]}")
    return float(value)


def _momentum(text: object) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if value != value:
        raise SpecError("trainer_args.optim_args", f"momentum={str(text)[:20]!r} is not a number",
                        "use optim_args='momentum=0.9' or none")
    return value


def precision(fields: dict) -> str:
    """bf16 -> bf16-amp, fp16 -> fp16-amp (accelerate autocast; the model's parameters stay in
    the dtype they were loaded in: fp32 is what memcalc models), else fp32."""
    bf16, fp16 = boolean(fields, "bf16"), boolean(fields, "fp16")
    if bf16 and fp16:
        raise SpecError("trainer_args.fp16", "bf16 and fp16 are both set", "set one of them")
    return "bf16-amp" if bf16 else "fp16-amp" if fp16 else "fp32"


def optimizer(fields: dict) -> dict:
    """TrainingConfig optimizer fields of `optim` (trainer_optimizer._OPTIMIZER_HANDLERS)."""
    name = str(given(fields, "optim"))
    optim_args = _optim_args(given(fields, "optim_args"))
    if name not in OPTIMS:
        raise UnknownNameError("trainer_args.optim", f"{name!r} is not a modelled optimizer",
                               f"use one of {sorted(OPTIMS)}")
    opt, impl = OPTIMS[name]
    if optim_args and name != "sgd":
        raise NotModelledError("trainer_args.optim_args", f"{optim_args} for {name!r}",
                               "drop optim_args")
    momentum = _momentum(optim_args.pop("momentum", 0.0))
    if optim_args or momentum not in (0.0, 0.9):
        raise NotModelledError("trainer_args.optim_args", f"SGD with {optim_args or {'momentum': momentum}}"
                               " (modelled: momentum 0 or 0.9, no other option)",
                               "use optim_args='momentum=0.9' or none")
    out = {"optimizer": "sgd-momentum" if momentum else opt, "optimizer_impl": impl}
    decay = number(fields, "weight_decay")
    return {**out, "weight_decay": decay}


def _optim_args(text: Any) -> dict:
    """optim_args 'momentum=0.9,nesterov=False' -> {'momentum': '0.9', ...} (trainer_optimizer)."""
    if not text:
        return {}
    try:
        return dict(pair.split("=", 1) for pair in str(text).replace(" ", "").split(","))
    except ValueError:
        raise SpecError("trainer_args.optim_args", f"{text!r} is not 'key=value,...'",
                        "write optim_args as 'momentum=0.9'") from None


def checkpointing(fields: dict) -> str:
    """activation_checkpointing (or its deprecated alias) -> per-layer, non-reentrant."""
    name = "activation_checkpointing" if given(fields, "activation_checkpointing") is not None \
        else "gradient_checkpointing"
    on = boolean(fields, name)
    name = "activation_checkpointing_kwargs" if given(fields, "activation_checkpointing_kwargs") \
        is not None else "gradient_checkpointing_kwargs"
    kwargs = given(fields, name)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise SpecError(f"trainer_args.{name}", f"{str(kwargs)[:40]!r} is not a JSON object",
                        "write it as {\"use_reentrant\": false}, or drop it")
    if on and kwargs and kwargs != {"use_reentrant": False}:
        raise NotModelledError("trainer_args.activation_checkpointing_kwargs", f"{kwargs} (memcalc "
                               "models non-reentrant checkpointing, HF's default)",
                               "use {'use_reentrant': False} or none")
    return "per-layer" if on else "none"


def check_unmodelled_run_options(fields: dict) -> None:
    """accelerate's split_batches."""
    accel = given(fields, "accelerator_config") or {}
    if not isinstance(accel, dict):  # to_dict() writes the AcceleratorConfig as an object
        raise SpecError("trainer_args.accelerator_config", f"{str(accel)[:40]!r} is not a JSON "
                        "object", "give accelerator_config as the object to_dict() writes, or drop it")
    if accel.get("split_batches"):
        raise NotModelledError("trainer_args.accelerator_config.split_batches", "True splits the "
                               "batch across devices", "set split_batches False")


def device_of(fields: dict, device: str | None) -> str:
    """use_cpu -> cpu; else the caller's device, cuda by default."""
    if boolean(fields, "use_cpu"):
        if device not in (None, "cpu"):
            raise SpecError("device", f"{device!r} but TrainingArguments.use_cpu is True",
                            "pass device='cpu' or drop use_cpu")
        return "cpu"
    return device or "cuda"


def training_fields(args: Any, seq_len: int, device: str | None = None, world_size: int = 1,
                    attention_mask: str = "ones", pad_tokens: int = 0, trainer: str = "hf",
                    packed_sequences: int | None = None) -> dict:
    """The TrainingConfig fields of a Trainer run (see TrainingConfig.from_trainer_args).

    >>> f = training_fields({"bf16": True}, seq_len=2048)
    >>> f["micro_batch"], f["precision"], f["optimizer_impl"], f["device"], f["max_grad_norm"]
    (8, 'bf16-amp', 'fused', 'cuda', 1.0)
    """
    fields = trainer_args_dict(args)
    if packed_sequences is not None and trainer != "sft":
        raise SpecError("packed_sequences", f"is read only with trainer='sft' and packing, not {trainer!r}",
                        "drop packed_sequences")
    if trainer != "hf":
        return _trl_fields(fields, trainer, seq_len, device, world_size, packed_sequences)
    check_fields(fields)
    check_unmodelled_run_options(fields)
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):  # named as the user wrote them
        value = given(fields, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"trainer_args.{name}", f"{str(value)[:40]!r} is not an integer >= 1",
                            f"write {name} as a JSON integer such as {DEFAULTS[name]}")
    out = {"micro_batch": given(fields, "per_device_train_batch_size"),
           "grad_accum": given(fields, "gradient_accumulation_steps"), "seq_len": seq_len,
           "precision": precision(fields), **optimizer(fields),
           "checkpointing": checkpointing(fields), "device": device_of(fields, device),
           "use_cache": boolean(fields, "use_cache"), "world_size": world_size,
           "max_grad_norm": number(fields, "max_grad_norm") or None,
           # the Trainer's call path (module docstring)
           "attention_mask": attention_mask, "pad_tokens": pad_tokens, "labels": "separate",
           "num_items_in_batch": True, "hf_trainer": True}
    ds = given(fields, "deepspeed")
    if ds:
        from memcalc.inputs.trainers.deepspeed import check_batch, read_deepspeed

        if out["precision"] != "fp32":
            raise NotModelledError("trainer_args.deepspeed", f"with {out['precision'][:4]} on: "
                                   "DeepSpeed's 16-bit mode (16-bit parameters, fp32 master "
                                   "weights) is not modelled", "check it with bf16 and fp16 off")
        out.update(read_deepspeed(ds))
        check_batch(ds, out["micro_batch"], out["grad_accum"], world_size)
    return out


TRAINERS = ("hf", "dpo", "sft", "grpo")
"""What runs the TrainingArguments: the HF Trainer, trl.DPOTrainer with a DPOConfig,
trl.SFTTrainer with an SFTConfig, or trl.GRPOTrainer with a GRPOConfig."""


def _trl_fields(fields: dict, trainer: str, seq_len: int, device: str | None, world_size: int,
                packed_sequences: int | None = None) -> dict:
    """A TRL trainer's config: its own fields (memcalc.inputs.trainers.dpo_args), then
    TrainingArguments' with TRL's defaults, then what the trainer's call path changes."""
    from memcalc.inputs.trainers import grpo_args, sft_args
    from memcalc.inputs.trainers.dpo_args import dpo_fields, split_fields

    if trainer not in TRAINERS:
        raise UnknownNameError("trainer", f"{trainer!r} is not a trainer memcalc models",
                               f"use one of {', '.join(TRAINERS)}")
    if trainer == "sft":
        base, own = split_fields(fields, sft_args.own_names())
        rows = base.get("per_device_train_batch_size", 8)
        rows = rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1 else 1  # checked below
        trl = sft_args.sft_fields(own, seq_len, rows, packed_sequences)
    elif trainer == "grpo":
        base, own = split_fields(fields, grpo_args.own_names())
        trl = grpo_args.grpo_fields(own, seq_len, base.get("per_device_train_batch_size", 8))
    else:
        base, own = split_fields(fields)
        trl = dpo_fields(own, seq_len)
    if given(base, "deepspeed") or world_size != 1:
        raise NotModelledError("trainer_args.deepspeed" if given(base, "deepspeed") else "world_size",
                               f"trl {trainer} across processes (the reference model prepared by "
                               "accelerate or DeepSpeed) is not modelled", "check one process")
    out = training_fields(base, seq_len, device, world_size, "ones", 0)
    if trainer == "grpo":  # memcalc.families.trl_grpo: no collated tensors (identity collator);
        # _compute_loss's cat of prompt and completion ids and masks, labels made from them
        if out["grad_accum"] != 1:
            raise NotModelledError("trainer_args.gradient_accumulation_steps", f"{out['grad_accum']} "
                                   "with trainer='grpo' generates the completions of all the "
                                   "accumulated steps at once (steps_per_generation), not modelled",
                                   "set gradient_accumulation_steps to 1")
        return {**out, **trl, "labels": "input_ids", "num_items_in_batch": False, "use_cache": False,
                "disable_dropout": own.get("disable_dropout", False) is True}
    if trainer == "sft":  # DataCollatorForLanguageModeling: input_ids, attention_mask, labels;
        # the Trainer counts num_items_in_batch; compute_loss sets use_cache=False
        return {**out, **trl, "use_cache": False}
    # DataCollatorForPreference: chosen then rejected rows; no labels, no num_items_in_batch;
    # _compute_loss passes use_cache=False (trl dpo_trainer.py)
    return {**out, **trl, "micro_batch": 2 * out["micro_batch"], "labels": "input_ids",
            "num_items_in_batch": False, "use_cache": False}
