"""An axolotl YAML config -> the TrainingArguments fields axolotl hands the HF Trainer
(axolotl's core/builders: micro_batch_size -> per_device_train_batch_size, optimizer -> optim,
...), the sequence length, and how batches are padded. Read with yaml.safe_load only (no tags,
nothing executed). Every key is mapped, inert with why, or refused by name; unknown keys are
refused.
"""
from __future__ import annotations

import os

from memcalc.core.errors import MemcalcError, NotModelledError, SpecError, UnknownNameError, closest_names

TO_TRAINER = {"micro_batch_size": "per_device_train_batch_size",
              "gradient_accumulation_steps": "gradient_accumulation_steps", "optimizer": "optim",
              "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm", "bf16": "bf16",
              "fp16": "fp16", "gradient_checkpointing": "gradient_checkpointing",
              "gradient_checkpointing_kwargs": "gradient_checkpointing_kwargs",
              "deepspeed": "deepspeed", "tf32": "tf32"}
READ_HERE = {"sequence_len": "seq_len", "pad_to_sequence_len": "attention_mask (padded batches)",
             "sdp_attention": "attention: sdpa (memcalc's default)"}
# refused unless falsy / absent: what memcalc does not model yet
REFUSED = {
    "adapter": ("LoRA/QLoRA adapters from axolotl's lora_* keys (not passed on by this reader; "
                "memcalc models them: estimate --lora-config / --lora-rank)"),
    "load_in_8bit": "8-bit base weights (not passed on by this reader; memcalc models them: --quantization int8)",
    "load_in_4bit": "4-bit base weights (not passed on by this reader; memcalc models them: --quantization nf4)",
    "sample_packing": "packed sequences (position_ids-based masks)",
    "flash_attention": "flash_attention_2 kernels", "xformers_attention": "xformers kernels",
    "s2_attention": "shifted sparse attention", "fsdp": "accelerate FSDP", "fsdp_config": "accelerate FSDP",
    "torch_compile": "compiled graphs", "neftune_noise_alpha": "embedding noise hook",
    "unfrozen_parameters": "partly frozen models", "liger_kernel": "Liger kernels",
    "plugins": "axolotl plugins (Liger, cut cross-entropy, ...)",
}
_IO = "logging, saving, hub and run bookkeeping"
_DATA = "dataset preparation on the host; the step sees micro_batch_size x sequence_len tokens"
_NUM = "a number the optimizer or scheduler uses; no tensor changes size"
_EVAL = "evaluation runs outside the training step"
_MODEL = "names the model; its shapes come from --hf-config"
INERT: dict[str, str] = {
    **{k: _MODEL for k in ("base_model", "base_model_config", "model_type", "tokenizer_type",
                           "tokenizer_config", "trust_remote_code", "is_llama_derived_model",
                           "is_mistral_derived_model", "is_qwen_derived_model", "strict")},
    **{k: _DATA for k in ("datasets", "dataset_prepared_path", "chat_template", "train_on_inputs",
                          "group_by_length", "special_tokens", "tokens", "shuffle_merged_datasets",
                          "dataset_processes", "remove_unused_columns")},
    **{k: _NUM for k in ("learning_rate", "lr_scheduler", "warmup_steps", "warmup_ratio",
                         "num_epochs", "max_steps", "seed", "adam_beta1", "adam_beta2", "adam_epsilon",
                         "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                         "lora_target_linear", "lora_fan_in_fan_out", "lora_model_dir")},
    **{k: _EVAL for k in ("val_set_size", "eval_steps", "evals_per_epoch", "eval_sample_packing",
                          "eval_batch_size", "eval_table_size", "early_stopping_patience")},
    **{k: _IO for k in ("output_dir", "logging_steps", "save_steps", "saves_per_epoch",
                        "save_strategy", "save_total_limit", "hub_model_id", "resume_from_checkpoint",
                        "local_rank", "debug", "wandb_project", "wandb_entity", "wandb_watch",
                        "wandb_name", "wandb_log_model", "wandb_run_id", "report_to")},
}
# lora_* keys are inert only when no adapter is set (an adapter is refused above)


def read_yaml(path: str | os.PathLike, field: str = "axolotl") -> dict:
    """The mapping in a YAML file, read with yaml.safe_load (bounded read, no tags executed);
    errors name `field`."""
    from memcalc.core.files import read_bounded

    try:
        import yaml
    except ImportError:
        raise MemcalcError(field, "reading YAML needs PyYAML", "pip install 'memcalc[config]'") from None
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError(field, f"expected a dict or a path, got {type(path).__name__}",
                        _what(field))
    path = os.fspath(path)
    try:
        value = yaml.safe_load(read_bounded(path, field).decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise SpecError(field, f"{path!r} is not valid YAML ({str(err).splitlines()[0][:80]})",
                        _what(field)) from None
    except RecursionError:  # PyYAML's parser recurses once per nesting level
        raise SpecError(field, f"{path!r} nests YAML too deeply", _what(field)) from None
    if not isinstance(value, dict):
        raise SpecError(field, f"{path!r} does not hold a YAML mapping", _what(field))
    return value


def _what(field: str) -> str:
    return {"axolotl": "give an axolotl config.yml"}.get(field, f"give the {field.replace('_', ' ')} YAML file")


def axolotl_fields(config: dict | str | os.PathLike) -> tuple[dict, int | None, str]:
    """(TrainingArguments fields, sequence_len, attention_mask) of an axolotl config.

    >>> axolotl_fields({"micro_batch_size": 2, "sequence_len": 4096, "bf16": "auto",
    ...                 "optimizer": "adamw_torch_fused", "pad_to_sequence_len": True})
    ({'per_device_train_batch_size': 2, 'bf16': True, 'optim': 'adamw_torch_fused'}, 4096, 'padded')
    """
    cfg = config if isinstance(config, dict) else read_yaml(config)
    known = set(TO_TRAINER) | set(READ_HERE) | set(REFUSED) | set(INERT)
    for key, value in cfg.items():
        if key not in known:
            raise UnknownNameError(f"axolotl.{key}", "is not an axolotl key memcalc knows",
                                   f"remove it, or check the name: {closest_names(str(key), sorted(known))}")
        if key in REFUSED and value not in (None, False, "", [], {}):
            raise NotModelledError(f"axolotl.{key}", f"{value!r}: {REFUSED[key]} is not modelled",
                                   f"drop {key}")
    if cfg.get("sdp_attention") is False:
        raise NotModelledError("axolotl.sdp_attention", "false: the attention kernel is then eager, "
                               "which memcalc models but this reader does not pass on", "drop it")
    _check_types(cfg)
    fields = {TO_TRAINER[k]: v for k, v in cfg.items() if k in TO_TRAINER and v is not None}
    for flag in ("bf16", "fp16", "tf32"):
        if fields.get(flag) == "auto":  # axolotl: bf16 when the GPU supports it (memcalc assumes so)
            fields[flag] = flag != "fp16"
    mask = "padded" if cfg.get("pad_to_sequence_len") else "ones"
    return fields, cfg.get("sequence_len"), mask


COUNTS = ("micro_batch_size", "gradient_accumulation_steps", "sequence_len")
FLAGS = ("bf16", "fp16", "tf32", "gradient_checkpointing", "pad_to_sequence_len", "sdp_attention")


def _check_types(cfg: dict) -> None:
    """Counts are integers >= 1 and flags booleans (bf16/fp16/tf32 also 'auto'), named by the
    axolotl key (a string "false" would be truthy; a float batch is no batch).

    >>> _check_types({"micro_batch_size": "2"})
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: axolotl.micro_batch_size: '2' is not an integer >= 1; fix: write it without quotes
    """
    for key in COUNTS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(f"axolotl.{key}", f"{str(value)[:40]!r} is not an integer >= 1",
                            "write it without quotes")
    for key in FLAGS:
        value = cfg.get(key)
        auto = key in ("bf16", "fp16", "tf32")
        if value is not None and not isinstance(value, bool) and not (auto and value == "auto"):
            raise SpecError(f"axolotl.{key}", f"{str(value)[:40]!r} is not true or false",
                            "write true or false" + (" (or auto)" if auto else ""))
