"""A DeepSpeed config (the JSON given as TrainingArguments.deepspeed) -> TrainingConfig fields.

zero_optimization.stage 0/1/2/3 maps onto memcalc's torch equivalents (sharding none / zero1 =
ZeroRedundancyOptimizer / zero2, zero3 = FSDP2): the same states are sharded, but DeepSpeed's own
buckets (reduce_bucket_size, allgather_bucket_size, stage3 prefetch) are not DeepSpeed's figures
in memcalc and no DeepSpeed run has been measured. Refused by name: CPU/NVMe offload, DeepSpeed's
16-bit modes (16-bit parameters with fp32 master weights inside the optimizer, not torch
autocast), a DeepSpeed optimizer block, DeepSpeed's own gradient_clipping value.
Every top-level key is read, inert with why, or refused; unknown keys are refused.
"""
from __future__ import annotations

import os
from typing import Any

from memcalc.core.errors import NotModelledError, SpecError, UnknownNameError, closest_names

STAGES = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}
INERT = {
    "train_batch_size": "checked against the Trainer's batch (auto; check_batch)",
    "train_micro_batch_size_per_gpu": "checked against per_device_train_batch_size (auto; check_batch)",
    "gradient_accumulation_steps": "checked against the Trainer's (auto; check_batch)",
    "scheduler": "learning-rate numbers; no tensor",
    "steps_per_print": "logging", "wall_clock_breakdown": "logging", "flops_profiler": "logging",
    "tensorboard": "logging", "wandb": "logging", "csv_monitor": "logging", "comms_logger": "logging",
    "zero_allow_untested_optimizer": "a permission flag", "zero_force_ds_cpu_optimizer": "a permission flag",
    "prescale_gradients": "scales gradients in place", "gradient_predivide_factor": "a number",
}
ZERO_INERT = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
              "allgather_partitions", "allgather_bucket_size", "round_robin_gradients",
              "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_gather_16bit_weights_on_model_save", "sub_group_size",
              "offload_optimizer", "offload_param"}
"""zero_optimization keys: the stage is read, offload is checked; the bucket and prefetch sizes
are DeepSpeed's communication buffers, which memcalc models as torch's (see module docstring)."""


def read_deepspeed(config: Any) -> dict:
    """TrainingConfig fields of a DeepSpeed config (a dict or a JSON path).

    >>> read_deepspeed({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"})
    {'sharding': 'zero2'}
    """
    ds = _as_dict(config)
    known = set(INERT) | {"zero_optimization", "bf16", "fp16", "optimizer", "gradient_clipping",
                          "activation_checkpointing", "amp"}
    for key in ds:
        if key not in known:
            raise UnknownNameError(f"deepspeed.{key}", "is not a DeepSpeed key memcalc knows",
                                   f"remove it, or check the name: {closest_names(key, sorted(known))}")
    for key in ("bf16", "fp16", "amp"):
        if _enabled(_block(ds[key], key) if ds.get(key) is not None else None):
            raise NotModelledError(f"deepspeed.{key}.enabled", "DeepSpeed's 16-bit mode (16-bit "
                                   "parameters, fp32 master weights in the optimizer) is not modelled",
                                   f"set {key}.enabled false (or 'auto' with bf16/fp16 off)")
    if ds.get("optimizer"):
        raise NotModelledError("deepspeed.optimizer", f"{_block(ds['optimizer'], 'optimizer').get('type', '?')!r}: "
                               "DeepSpeed's own optimizer is not modelled",
                               "drop the optimizer block (the Trainer's optim is used)")
    clip = ds.get("gradient_clipping", "auto")
    if clip not in ("auto", 0, 0.0, None):  # DeepSpeed clips its own partitions: not modelled
        raise NotModelledError("deepspeed.gradient_clipping", f"{clip}: DeepSpeed's clipping of "
                               "its partitioned gradients is not modelled",
                               "set it to 'auto' (the Trainer's max_grad_norm) or 0")
    if ds.get("activation_checkpointing"):
        raise NotModelledError("deepspeed.activation_checkpointing", "DeepSpeed's checkpointing "
                               "(partitioned activations) is not modelled",
                               "drop it and use TrainingArguments.activation_checkpointing")
    return _zero(_block(ds.get("zero_optimization") or {}, "zero_optimization"))


def _zero(zero: dict) -> dict:
    for key in zero:
        if key not in ZERO_INERT:
            raise UnknownNameError(f"deepspeed.zero_optimization.{key}", "is not a key memcalc knows",
                                   f"remove it, or check the name: {closest_names(key, sorted(ZERO_INERT))}")
    for key in ("offload_optimizer", "offload_param"):
        device = _block(zero.get(key) or {}, f"zero_optimization.{key}").get("device", "none")
        if device not in ("none", None):
            raise NotModelledError(f"deepspeed.zero_optimization.{key}", f"offload to {device!r} is "
                                   "not modelled", f"set {key}.device to 'none'")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in STAGES:
        raise SpecError("deepspeed.zero_optimization.stage", f"{stage!r} is not 0, 1, 2 or 3",
                        "use a ZeRO stage 0-3")
    return {"sharding": STAGES[stage]} if stage else {}


def check_batch(config: Any, micro_batch: int, grad_accum: int, world_size: int) -> None:
    """The batch keys must be "auto" or the Trainer's own numbers: transformers refuses a mismatch
    (integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_process, fill_match), so
    the run memcalc would predict never starts.

    >>> check_batch({"train_micro_batch_size_per_gpu": 4}, 8, 1, 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: deepspeed.train_micro_batch_size_per_gpu: 4, but the Trainer's is 8 ...
    """
    if not all(type(n) is int for n in (micro_batch, grad_accum, world_size)):
        return  # TrainingConfig refuses these by name
    ds = _as_dict(config)
    trainer = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
               "train_batch_size": micro_batch * grad_accum * world_size}
    for key, value in trainer.items():
        given = ds.get(key, "auto")
        if given != "auto" and (isinstance(given, bool) or given != value):
            raise SpecError(f"deepspeed.{key}", f"{str(given)[:40]}, but the Trainer's is {value} "
                            "(transformers refuses the mismatch)", f'set it to "auto" or {value}')


def _block(value: Any, name: str) -> dict:
    """A block of the config that must be a JSON object."""
    if not isinstance(value, dict):
        raise SpecError(f"deepspeed.{name}", f"{str(value)[:40]!r} is not a JSON object",
                        f"write {name} as an object, as DeepSpeed's config documents it")
    return value


def _enabled(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    value = block.get("enabled", False)
    return value is True or str(value).lower() == "true"


def _as_dict(config: Any) -> dict:
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)):
        from memcalc.core.files import parse_json_object, read_bounded

        path = os.fspath(config)
        return parse_json_object(read_bounded(path, "deepspeed"), repr(path), "deepspeed")
    raise SpecError("deepspeed", f"expected a dict or a JSON path, got {type(config).__name__}",
                    "pass the DeepSpeed config file")
