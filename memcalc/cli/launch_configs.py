"""`memcalc check --accelerate-config F` and `--torchtitan-config F`: the step of a run launched
with accelerate's config YAML (memcalc.inputs.trainers.accelerate; with the HF Trainer's
arguments of --trainer-args, transformers' defaults otherwise) or a torchtitan job TOML
(memcalc.inputs.trainers.torchtitan)."""
from __future__ import annotations

import argparse
from typing import Any

from memcalc.core.errors import SpecError


def add_launch_config_args(p: argparse.ArgumentParser) -> None:
    """The two flags.

    >>> p = argparse.ArgumentParser(); add_launch_config_args(p)
    >>> p.parse_args(["--torchtitan-config", "llama3_8b.toml"]).torchtitan_config
    'llama3_8b.toml'
    """
    p.add_argument("--accelerate-config", help="accelerate's config YAML (`accelerate config`): ranks, "
                   "DDP / FSDP2 / DeepSpeed, mixed precision")
    p.add_argument("--torchtitan-config", help="torchtitan job config TOML (instead of --trainer-args; "
                   "gives --seq-len)")


def training_from_launch_configs(args: argparse.Namespace, trainer: Any) -> Any:
    """The TrainingConfig of `check` when a launch config is given (None otherwise).

    >>> training_from_launch_configs(argparse.Namespace(accelerate_config=None, torchtitan_config=None), {}) is None
    True
    """
    from memcalc.inputs.training import TrainingConfig

    accel, titan = getattr(args, "accelerate_config", None), getattr(args, "torchtitan_config", None)
    if titan is not None:
        from memcalc.inputs.trainers.torchtitan import read_torchtitan

        for name in ("trainer_args", "axolotl", "deepspeed", "accelerate_config"):
            if getattr(args, name, None) is not None:
                raise SpecError("torchtitan_config", f"given with --{name.replace('_', '-')}",
                                "a torchtitan run has no TrainingArguments: drop one")
        fields = read_torchtitan(titan, args.world_size)
        if args.seq_len is not None:
            fields["seq_len"] = args.seq_len
        return TrainingConfig.make(**fields, device=args.device or "cuda")
    if accel is None:
        return None
    from memcalc.inputs.trainers.accelerate import read_accelerate
    from memcalc.inputs.trainers.trainer_args import trainer_args_dict

    fields, deepspeed = read_accelerate(accel)
    world = fields.pop("world_size", 1)
    if args.world_size not in (1, world):
        raise SpecError("world_size", f"{args.world_size}, but the accelerate config runs {world} processes",
                        "drop --world-size (the config's num_processes is used)")
    trainer = trainer_args_dict(trainer)
    if deepspeed is not None:
        if trainer.get("deepspeed"):
            raise SpecError("deepspeed", "given in the TrainingArguments and in the accelerate config", "keep one")
        trainer["deepspeed"] = deepspeed
    training = TrainingConfig.from_trainer_args(trainer, seq_len=args.seq_len, device=args.device, world_size=world,
                                                attention_mask=args.attention_mask, pad_tokens=args.pad_tokens)
    precision = fields.pop("precision", None)
    if precision is not None and training.precision not in ("fp32", precision):
        raise SpecError("accelerate.mixed_precision", f"{precision}, but the TrainingArguments say "
                        f"{training.precision}", "make them agree")
    if precision is not None:
        fields["precision"] = precision
    if fields.get("checkpointing") == "per-layer" and training.checkpointing != "none":
        fields.pop("checkpointing")
    if "device" in fields and args.device not in (None, "cpu"):
        raise SpecError("device", f"{args.device}, but the accelerate config says use_cpu", "drop --device")
    return training.with_(**fields) if fields else training
