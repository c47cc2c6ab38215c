"""accelerate's config YAML (what `accelerate config` writes; accelerate 1.x
commands/config/config_args.py ClusterConfig, cluster.py) -> TrainingConfig fields of the run it
launches. Read with yaml.safe_load only. Every key is read, inert with why, or refused by name;
unknown keys are refused.

Read: distributed_type (NO: one process; MULTI_GPU: DDP over num_processes ranks; FSDP: FSDP2
fully_shard per decoder layer and on the root, as memcalc models it; DEEPSPEED: ZeRO through
memcalc.inputs.trainers.deepspeed), num_processes (all ranks, over every machine), mixed_precision
(no / bf16 / fp16: accelerate's autocast, Accelerator.native_amp), use_cpu, fsdp_config,
deepspeed_config. Refused by name: FSDP1 (fsdp_version 1: FlatParameter layout), FSDP with
mixed_precision (accelerate's FSDP2 sets MixedPrecisionPolicy(param, reduce and output dtype
bf16/fp16) and autocasts too: dataclasses.FullyShardedDataParallelPlugin.set_mixed_precision,
not memcalc's policy), offload, wrap policies other than TRANSFORMER_BASED_WRAP, fp8,
parallelism_config (TP/CP/HSDP), Megatron-LM, torch.compile (dynamo_config), other
distributed types.
"""
from __future__ import annotations

import os
from typing import Any

from memcalc.core.errors import NotModelledError, SpecError, UnknownNameError, closest_names

_LAUNCH = "launch bookkeeping (rendezvous, addresses, process placement); no device tensor"
_TPU = "TPU settings; memcalc predicts CUDA and CPU steps"
INERT: dict[str, str] = {
    **{k: _LAUNCH for k in ("compute_environment", "machine_rank", "main_process_ip", "main_process_port",
                            "rdzv_backend", "same_network", "main_training_function", "enable_cpu_affinity",
                            "gpu_ids", "num_machines", "mpirun_config")},
    **{k: _TPU for k in ("tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands",
                         "tpu_vm", "tpu_env", "downcast_bf16")},
    "debug": "ACCELERATE_DEBUG_MODE checks collective shapes with small gathers of shape lists",
}
READ = ("distributed_type", "num_processes", "mixed_precision", "use_cpu", "fsdp_config", "deepspeed_config")
REFUSED_UNLESS_EMPTY = {
    "fp8_config": "fp8 training (Transformer Engine / torchao / MS-AMP)",
    "parallelism_config": "accelerate's tensor / context / hybrid-shard layout",
    "megatron_lm_config": "Megatron-LM",
    "dynamo_config": "torch.compile (compiled graphs fuse and reorder what eager mode allocates)",
    "ipex_config": "IPEX",
}
DISTRIBUTED = {"NO": "none", "MULTI_GPU": "ddp", "FSDP": "fsdp", "DEEPSPEED": "deepspeed"}
FSDP_INERT = {
    "fsdp_version": "read: 2 is FSDP2 (1 refused)",
    "fsdp_transformer_layer_cls_to_wrap": ("names the decoder layer class each fully_shard wraps (memcalc "
                                           "wraps every decoder layer)"),
    "fsdp_backward_prefetch": "FSDP1's option; FSDP2 prefetches one group ahead, as modelled",
    "fsdp_forward_prefetch": "FSDP1's option; FSDP2 prefetches as modelled",
    "fsdp_state_dict_type": "how checkpoints are saved, outside the step",
    "fsdp_cpu_ram_efficient_loading": "how weights are loaded, before training",
    "fsdp_sync_module_states": "a broadcast of weights at load time, before training",
    "fsdp_use_orig_params": "FSDP1's FlatParameter views; FSDP2 keeps the original parameters",
    "fsdp_min_num_params": "used by SIZE_BASED_WRAP only (refused)",
}
FSDP_READ = ("fsdp_ignored_modules", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_offload_params",
             "fsdp_activation_checkpointing", "fsdp_auto_wrap_policy")
DS_INERT = {
    "zero3_init_flag": "deepspeed.zero.Init builds the model sharded at load time; the step's shards are the same",
    "zero3_save_16bit_model": "saving, outside the step",
    "deepspeed_hostfile": _LAUNCH, "deepspeed_multinode_launcher": _LAUNCH,
    "deepspeed_exclusion_filter": _LAUNCH, "deepspeed_inclusion_filter": _LAUNCH,
    "offload_optimizer_nvme_path": "used with offload to nvme (refused)",
    "offload_param_nvme_path": "used with offload to nvme (refused)",
}
DS_READ = ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
           "gradient_accumulation_steps", "gradient_clipping", "deepspeed_moe_layer_cls_names")


def read_accelerate(config: dict | str | os.PathLike) -> tuple[dict, dict | None]:
    """(TrainingConfig fields, DeepSpeed config or None) of an accelerate config.

    >>> read_accelerate({"distributed_type": "MULTI_GPU", "mixed_precision": "bf16", "num_processes": 2})
    ({'world_size': 2, 'precision': 'bf16-amp'}, None)
    >>> read_accelerate({"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": {"fsdp_version": 2}})[0]
    {'world_size': 4, 'sharding': 'zero3'}
    """
    from memcalc.inputs.trainers.axolotl import read_yaml

    base = os.path.dirname(os.fspath(config)) if isinstance(config, (str, os.PathLike)) else "."
    cfg = config if isinstance(config, dict) else read_yaml(config, "accelerate_config")
    known = set(INERT) | set(READ) | set(REFUSED_UNLESS_EMPTY)
    for key, value in cfg.items():
        if key not in known:
            raise UnknownNameError(f"accelerate.{key}", "is not an accelerate config key memcalc knows",
                                   f"remove it, or check the name: {closest_names(str(key), sorted(known))}")
        if key in REFUSED_UNLESS_EMPTY and value not in (None, {}, [], "") and not _no_dynamo(key, value):
            raise NotModelledError(f"accelerate.{key}", f"{REFUSED_UNLESS_EMPTY[key]} is not modelled", f"drop {key}")
    # YAML 1.1 reads an unquoted NO / no as false (PyYAML): the same value
    kind = "NO" if cfg.get("distributed_type", "NO") is False else str(cfg.get("distributed_type", "NO"))
    if kind not in DISTRIBUTED:
        raise NotModelledError("accelerate.distributed_type", f"{kind!r} is not modelled",
                               f"use one of {', '.join(DISTRIBUTED)}")
    fields: dict = {}
    procs = _count(cfg, "num_processes", 1)
    if kind != "NO":
        fields["world_size"] = procs
    mixed = cfg.get("mixed_precision", "no")
    precision = {"no": "fp32", "bf16": "bf16-amp", "fp16": "fp16-amp"}.get(
        "no" if mixed in (False, None) else str(mixed))
    if precision is None:
        raise NotModelledError("accelerate.mixed_precision", f"{cfg.get('mixed_precision')!r} is not modelled",
                               "use no, bf16 or fp16")
    if precision != "fp32":
        fields["precision"] = precision
    if _flag(cfg, "use_cpu", "accelerate"):
        fields["device"] = "cpu"
    deepspeed = None
    if DISTRIBUTED[kind] == "fsdp":
        if precision != "fp32":
            raise NotModelledError("accelerate.mixed_precision", f"{cfg['mixed_precision']!r} with FSDP: accelerate's "
                                   "FSDP2 casts parameters, gradient reduction and outputs to it and autocasts too; "
                                   "not modelled", "use mixed_precision 'no' (fp32 FSDP2)")
        fields.update(_fsdp(_block(cfg.get("fsdp_config") or {}, "fsdp_config")))
    elif cfg.get("fsdp_config"):
        raise SpecError("accelerate.fsdp_config", f"given with distributed_type {kind}", "drop it, or use FSDP")
    if DISTRIBUTED[kind] == "deepspeed":
        if precision != "fp32":
            raise NotModelledError("accelerate.mixed_precision", f"{cfg['mixed_precision']!r} with DeepSpeed turns on "
                                   "DeepSpeed's 16-bit mode (16-bit parameters, fp32 master weights); not modelled",
                                   "use mixed_precision 'no'")
        from memcalc.inputs.trainers.deepspeed import read_deepspeed

        deepspeed = _deepspeed(_block(cfg.get("deepspeed_config") or {}, "deepspeed_config"), base)
        read_deepspeed(deepspeed)  # every DeepSpeed key read, inert or refused by name
    elif cfg.get("deepspeed_config"):
        raise SpecError("accelerate.deepspeed_config", f"given with distributed_type {kind}",
                        "drop it, or use DEEPSPEED")
    return fields, deepspeed


def _no_dynamo(key: str, value: Any) -> bool:
    """dynamo_config {dynamo_backend: NO} is torch.compile off."""
    return key == "dynamo_config" and isinstance(value, dict) and str(value.get("dynamo_backend", "NO")).upper() == "NO"


def _fsdp(fsdp: dict) -> dict:
    known = set(FSDP_INERT) | set(FSDP_READ)
    for key in fsdp:
        if key not in known:
            raise UnknownNameError(f"accelerate.fsdp_config.{key}", "is not an fsdp_config key memcalc knows",
                                   f"remove it, or check the name: {closest_names(str(key), sorted(known))}")
    if fsdp.get("fsdp_ignored_modules"):
        raise NotModelledError("accelerate.fsdp_config.fsdp_ignored_modules", "modules left unsharded are not "
                               "modelled", "leave it empty")
    if fsdp.get("fsdp_version", 1) != 2:
        raise NotModelledError("accelerate.fsdp_config.fsdp_version", f"{fsdp.get('fsdp_version', 1)!r}: FSDP1's "
                               "FlatParameter layout is not modelled (memcalc models FSDP2 fully_shard)",
                               "set fsdp_version: 2")
    if _flag(fsdp, "fsdp_offload_params", "accelerate.fsdp_config"):
        raise NotModelledError("accelerate.fsdp_config.fsdp_offload_params", "true: CPU offload is not modelled",
                               "set it false")
    policy = fsdp.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if policy != "TRANSFORMER_BASED_WRAP":
        raise NotModelledError("accelerate.fsdp_config.fsdp_auto_wrap_policy", f"{policy!r}: memcalc models "
                               "fully_shard on each decoder layer and the root", "use TRANSFORMER_BASED_WRAP")
    reshard = fsdp.get("fsdp_reshard_after_forward", fsdp.get("fsdp_sharding_strategy", True))
    sharding = {True: "zero3", "FULL_SHARD": "zero3", False: "zero2", "SHARD_GRAD_OP": "zero2"}.get(reshard)
    if sharding is None:
        raise NotModelledError("accelerate.fsdp_config.fsdp_reshard_after_forward", f"{reshard!r} is not modelled",
                               "use true (FULL_SHARD) or false (SHARD_GRAD_OP)")
    out = {"sharding": sharding}
    if _flag(fsdp, "fsdp_activation_checkpointing", "accelerate.fsdp_config"):
        out["checkpointing"] = "per-layer"  # accelerate checkpoints each auto-wrapped (decoder) layer
    return out


def _deepspeed(ds: dict, base: str) -> dict:
    from memcalc.inputs.trainers.deepspeed import _as_dict

    known = set(DS_INERT) | set(DS_READ)
    for key in ds:
        if key not in known:
            raise UnknownNameError(f"accelerate.deepspeed_config.{key}", "is not a deepspeed_config key memcalc "
                                   "knows", f"remove it, or check the name: {closest_names(str(key), sorted(known))}")
    if ds.get("deepspeed_moe_layer_cls_names"):
        raise NotModelledError("accelerate.deepspeed_config.deepspeed_moe_layer_cls_names", "DeepSpeed MoE layers "
                               "are not modelled", "drop it")
    if ds.get("deepspeed_config_file"):
        path = os.path.join(base, str(ds["deepspeed_config_file"]))
        return _as_dict(path)
    out: dict = {"zero_optimization": {"stage": ds.get("zero_stage", 0)}}
    for key in ("offload_optimizer", "offload_param"):
        if ds.get(f"{key}_device") not in (None, "none"):
            out["zero_optimization"][key] = {"device": ds[f"{key}_device"]}
    for key in ("gradient_accumulation_steps", "gradient_clipping"):
        if key in ds:
            out[key] = ds[key]
    return out


def _count(cfg: dict, key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"accelerate.{key}", f"{str(value)[:40]!r} is not an integer >= 1", "write it as a number")
    return value


def _flag(cfg: dict, key: str, where: str) -> bool:
    value = cfg.get(key, False)
    if value is not None and not isinstance(value, bool):
        raise SpecError(f"{where}.{key}", f"{str(value)[:40]!r} is not true or false", "write true or false")
    return bool(value)


def _block(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"accelerate.{name}", f"{str(value)[:40]!r} is not a mapping", f"write {name} as a mapping")
    return value
