"""torchtitan's job config TOML (torchtitan/config/job_config.py JobConfig at 238fa99, the last
commit with TOML train_configs; `--job.config_file`) -> TrainingConfig fields. Read with tomllib
(tomli before Python 3.11); every section and key is read, inert with why, or refused by name;
unknown ones are refused.

Read: training.local_batch_size (older files: batch_size) -> micro_batch, seq_len,
global_batch_size (gradient accumulation = global / (local x data-parallel ranks)), max_norm,
dtype (bfloat16: pure bf16), mixed_precision_param (bfloat16 on one device or DDP: torch.autocast,
torchtitan distributed/utils.py maybe_enable_amp); optimizer name (AdamW, Adam), implementation,
weight_decay; activation_checkpoint.mode (none; full: every TransformerBlock wrapped, memcalc's
per-layer); parallelism.data_parallel_replicate_degree (DDP ranks, torchtitan's replicate).
Refused by name: pipeline parallelism (pipeline_parallel_degree > 1: the stages of torchtitan's
own model, with FSDP/TP, are not modelled), FSDP
(data_parallel_shard_degree > 1: torchtitan shards the embeddings and [norm, output] as groups
of their own and keeps the output group unsharded after forward, infra/parallelize.py apply_fsdp;
memcalc's FSDP2 layout is decoder layers + root), tensor parallelism (torchtitan's plan also
shards the embeddings and the output, with sequence-parallel norms and loss parallel; memcalc's
TP keeps them whole), context and expert parallelism, selective and memory-budget activation
checkpointing (op-level SAC policies and every-k-th-block wrapping differ from memcalc's
selective / every-k), model converters (float8, mx), torch.compile, CPU offload, fault tolerance,
custom imports, early optimizer steps in backward.

The model's shapes come from --model / --hf-config (model.name / flavor name torchtitan's own
model registry); memcalc predicts the step as its HF (or reference) program runs it, not
torchtitan's model code, which has not been measured.
"""
from __future__ import annotations

import os
from memcalc.core.errors import MemcalcError, NotModelledError, SpecError, UnknownNameError, closest_names

_IO = "logging, profiling, checkpoint saving or run bookkeeping; no device tensor in the step"
_NUM = "a number the optimizer or scheduler uses; no tensor changes size"
_PP = "used with pipeline_parallel_degree > 1 only"
_CP = "used with context_parallel_degree > 1 only"
_EP = "used with expert parallelism only"
INERT_SECTIONS = {"job": _IO, "profiling": _IO, "metrics": _IO, "checkpoint": _IO, "comm": _IO,
                  "lr_scheduler": _NUM,
                  "validation": "evaluation runs outside the training step",
                  "memory_estimation": "a FakeTensorMode estimate before training; the step is unchanged",
                  "quantize": "configures model.converters only (read: converters must be empty)",
                  "float8": "configures model.converters only (read: converters must be empty)"}
KEYS: dict[str, dict[str, str]] = {
    "model": {"name": "names torchtitan's model; shapes come from --model / --hf-config",
              "flavor": "names torchtitan's model size; shapes come from --model / --hf-config",
              "hf_assets_path": "tokenizer and weights location", "tokenizer_path": "tokenizer location",
              "converters": "READ", "print_after_conversion": _IO},
    "optimizer": {"name": "READ", "implementation": "READ", "weight_decay": "READ", "lr": _NUM, "eps": _NUM,
                  "beta1": _NUM, "beta2": _NUM, "early_step_in_backward": "READ"},
    "training": {"local_batch_size": "READ", "batch_size": "READ", "global_batch_size": "READ",
                 "seq_len": "READ", "max_norm": "READ", "dtype": "READ", "mixed_precision_param": "READ",
                 "mixed_precision_reduce": "READ", "enable_cpu_offload": "READ", "compile": "READ",
                 "steps": _NUM, "dataset": "host-side data", "dataset_path": "host-side data",
                 "gc_freq": "when Python's garbage collector runs between steps",
                 "gc_debug": "garbage-collector logging", "dataloader": "host-side data loading",
                 "warmup_steps": _NUM, "seed": _NUM, "deterministic": "READ"},
    "parallelism": {"data_parallel_replicate_degree": "READ", "data_parallel_shard_degree": "READ",
                    "fsdp_reshard_after_forward": "used with FSDP only (refused)",
                    "tensor_parallel_degree": "READ", "disable_loss_parallel": "used with tensor parallelism only",
                    "enable_async_tensor_parallel": "used with tensor parallelism only",
                    "pipeline_parallel_degree": "READ", "module_fqns_per_model_part": _PP,
                    "pipeline_parallel_first_stage_less_layers": _PP, "pipeline_parallel_last_stage_less_layers": _PP,
                    "pipeline_parallel_layers_per_stage": _PP, "pipeline_parallel_schedule": _PP,
                    "pipeline_parallel_schedule_csv": _PP, "pipeline_parallel_microbatch_size": _PP,
                    "pipeline_parallel_expert_parallel_overlap": _PP, "pipeline_parallel_split_points": _PP,
                    "context_parallel_degree": "READ", "context_parallel_load_balancer": _CP,
                    "context_parallel_rotate_method": _CP, "expert_parallel_degree": "READ",
                    "expert_tensor_parallel_degree": "READ", "expert_parallel_comm_backend": _EP},
    "activation_checkpoint": {"mode": "READ", "selective_ac_option": "used with mode selective only (refused)",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns": "used with mode selective only",
                              "early_stop": "used with mode selective only", "memory_budget": "used with mode "
                              "memory_budget only (refused)", "visualize_memory_budget_pareto": _IO,
                              "preserve_rng_state": "a small CPU RNG state per checkpointed block",
                              "determinism_check": "compares recomputed metadata; no tensor kept",
                              "debug": "checkpoint logging"},
    "compile": {"enable": "READ", "components": "used with compile enabled only",
                "backend": "used with compile enabled only"},
    "fault_tolerance": {"enable": "READ", "process_group": "torchft only", "process_group_timeout_ms": "torchft only",
                        "replica_id": "torchft only", "group_size": "torchft only",
                        "min_replica_size": "torchft only", "semi_sync_method": "torchft only"},
    "experimental": {"custom_import": "READ", "custom_args_module": "READ"},
    "debug": {"seed": _NUM, "deterministic": "READ", "deterministic_warn_only": "used with deterministic",
              "moe_force_load_balance": "READ"},
}
# TrainingConfig optimizers of torchtitan's optimizer names (components/optimizer.py: torch.optim)
OPTIMIZERS = {"AdamW": "adamw", "Adam": "adam"}


def read_toml(path: str | os.PathLike) -> dict:
    """The tables of a TOML file (bounded read; tomllib, tomli on Python 3.10).

    >>> read_toml(b"x.toml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: torchtitan_config: expected a dict or a path, got bytes; fix: ...
    """
    from memcalc.core.files import read_bounded

    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise MemcalcError("torchtitan_config", "reading TOML on Python 3.10 needs tomli",
                               "pip install tomli (Python 3.11 has tomllib)") from None
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError("torchtitan_config", f"expected a dict or a path, got {type(path).__name__}",
                        "give a torchtitan job config TOML")
    path = os.fspath(path)
    try:
        return tomllib.loads(read_bounded(path, "torchtitan_config").decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise SpecError("torchtitan_config", f"{path!r} is not valid TOML ({str(err).splitlines()[0][:80]})",
                        "give a torchtitan job config TOML") from None


def read_torchtitan(config: dict | str | os.PathLike, world_size: int = 1) -> dict:
    """TrainingConfig fields of a torchtitan job config run on `world_size` ranks.

    >>> read_torchtitan({"training": {"local_batch_size": 2, "seq_len": 4096},
    ...                  "activation_checkpoint": {"mode": "full"}})["checkpointing"]
    'per-layer'
    """
    cfg = config if isinstance(config, dict) else read_toml(config)
    _check_keys(cfg)
    par = cfg.get("parallelism", {})
    degrees = {k: _int(par, k, 1, "parallelism") for k in ("pipeline_parallel_degree", "tensor_parallel_degree",
                                                            "context_parallel_degree", "expert_parallel_degree",
                                                            "expert_tensor_parallel_degree",
                                                            "data_parallel_replicate_degree")}
    _refuse_parallelism(degrees)
    shard = _int(par, "data_parallel_shard_degree", -1, "parallelism", minimum=-1)
    replicate = degrees["data_parallel_replicate_degree"]
    shard = world_size // replicate if shard == -1 else shard
    if shard * replicate != world_size:
        raise SpecError("torchtitan.parallelism.data_parallel_shard_degree", f"{shard} x replicate {replicate} "
                        f"is not the {world_size} ranks", f"pass --world-size {shard * replicate}, or fix the degrees")
    if shard > 1:
        raise NotModelledError("torchtitan.parallelism.data_parallel_shard_degree", f"{shard}: torchtitan's FSDP "
                               "wraps the embeddings and [norm, output] as groups of their own (the output "
                               "unsharded after forward); memcalc's FSDP2 layout is decoder layers + root",
                               "check with data_parallel_shard_degree 1 (DDP via data_parallel_replicate_degree)")
    fields = {"world_size": world_size, **_training(cfg.get("training", {}), replicate, shard),
              **_optimizer(cfg.get("optimizer", {})), **_checkpointing(cfg.get("activation_checkpoint", {})),
              "labels": "separate"}  # torchtitan's batches carry labels of their own
    _refuse_features(cfg)
    return fields


def _check_keys(cfg: dict) -> None:
    known = set(INERT_SECTIONS) | set(KEYS)
    for section, table in cfg.items():
        if section not in known:
            raise UnknownNameError(f"torchtitan.{section}", "is not a torchtitan config section memcalc knows",
                                   f"remove it, or check the name: {closest_names(str(section), sorted(known))}")
        if not isinstance(table, dict):
            raise SpecError(f"torchtitan.{section}", f"{str(table)[:40]!r} is not a table", f"write [{section}]")
        if section in KEYS:
            for key in table:
                if key not in KEYS[section]:
                    raise UnknownNameError(f"torchtitan.{section}.{key}", "is not a key memcalc knows",
                                           "remove it, or check the name: "
                                           f"{closest_names(str(key), sorted(KEYS[section]))}")


def _refuse_parallelism(degrees: dict) -> None:
    why = {"pipeline_parallel_degree": "pipeline parallelism is modelled for the reference models only, not "
           "torchtitan's stages combined with FSDP/TP",
           "tensor_parallel_degree": "torchtitan's TP plan also shards the embeddings and the output (sequence-"
                                     "parallel norms, loss parallel); memcalc's TP keeps them whole",
           "context_parallel_degree": "context parallelism is not modelled",
           "expert_parallel_degree": "expert parallelism is not modelled",
           "expert_tensor_parallel_degree": "expert tensor parallelism is not modelled"}
    for key, problem in why.items():
        if degrees[key] > 1:
            raise NotModelledError(f"torchtitan.parallelism.{key}", f"{degrees[key]}: {problem}", f"set {key} = 1")


def _training(t: dict, replicate: int, shard: int) -> dict:
    b = _int(t, "local_batch_size", _int(t, "batch_size", 8, "training"), "training")
    s = _int(t, "seq_len", 2048, "training")
    dp = replicate * shard
    g = _int(t, "global_batch_size", -1, "training", minimum=-1)
    if g != -1 and g % (b * dp):
        raise SpecError("torchtitan.training.global_batch_size", f"{g} is not a multiple of local_batch_size {b} x "
                        f"{dp} data-parallel ranks", "use a multiple, or -1")
    out = {"micro_batch": b, "seq_len": s, "grad_accum": 1 if g == -1 else g // (b * dp)}
    norm = t.get("max_norm", 1.0)
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or norm < 0:
        raise SpecError("torchtitan.training.max_norm", f"{norm!r} is not a number >= 0", "write e.g. 1.0")
    out["max_grad_norm"] = float(norm) if 0 < norm < float("inf") else None  # torchtitan: clip_grad_norm_(max_norm)
    dtype, param = t.get("dtype", "float32"), t.get("mixed_precision_param", "bfloat16")
    if dtype not in ("float32", "bfloat16") or param not in ("float32", "bfloat16"):
        raise SpecError("torchtitan.training.dtype", f"{dtype!r} / mixed_precision_param {param!r}",
                        "use float32 or bfloat16")
    # pure bf16 weights; else autocast to mixed_precision_param on one device or DDP (maybe_enable_amp)
    out["precision"] = "bf16" if dtype == "bfloat16" else "bf16-amp" if param == "bfloat16" else "fp32"
    if t.get("mixed_precision_reduce", "float32") != "float32":
        raise SpecError("torchtitan.training.mixed_precision_reduce", f"{t['mixed_precision_reduce']!r}",
                        "torchtitan accepts float32 only")
    for key, why in (("enable_cpu_offload", "CPU offload"), ("compile", "torch.compile"),
                     ("deterministic", "deterministic algorithms (other kernels and workspaces)")):
        if t.get(key):
            raise NotModelledError(f"torchtitan.training.{key}", f"true: {why} is not modelled", f"set {key} = false")
    return out


def _optimizer(o: dict) -> dict:
    name = o.get("name", "AdamW")
    if name not in OPTIMIZERS:
        raise NotModelledError("torchtitan.optimizer.name", f"{name!r} is not modelled",
                               f"use one of {sorted(OPTIMIZERS)}")
    impl = o.get("implementation", "fused")
    if impl not in ("for-loop", "foreach", "fused"):
        raise SpecError("torchtitan.optimizer.implementation", f"{impl!r}", "use for-loop, foreach or fused")
    if o.get("early_step_in_backward"):
        raise NotModelledError("torchtitan.optimizer.early_step_in_backward", "true: optimizer steps inside "
                               "backward hooks are not modelled", "set it false")
    decay = o.get("weight_decay", 0.1)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or decay < 0:
        raise SpecError("torchtitan.optimizer.weight_decay", f"{decay!r} is not a number >= 0", "write e.g. 0.1")
    return {"optimizer": OPTIMIZERS[name], "optimizer_impl": impl, "weight_decay": float(decay)}


def _checkpointing(ac: dict) -> dict:
    mode = ac.get("mode", "selective")
    if mode == "none":
        return {"checkpointing": "none"}
    if mode == "full":
        return {"checkpointing": "per-layer"}
    raise NotModelledError("torchtitan.activation_checkpoint.mode", f"{mode!r} (option "
                           f"{ac.get('selective_ac_option', '2')!r}): torchtitan's selective AC (an op-level save "
                           "policy, or full AC on every k-th block) and memory-budget AC are not memcalc's "
                           "selective / every-k", "use mode 'full' or 'none'")


def _refuse_features(cfg: dict) -> None:
    if cfg.get("model", {}).get("converters"):
        raise NotModelledError("torchtitan.model.converters", f"{cfg['model']['converters']!r}: float8 / mx "
                               "linears are not modelled", "use converters = []")
    for section, key, why in (("compile", "enable", "torch.compile"), ("fault_tolerance", "enable", "torchft"),
                              ("debug", "deterministic", "deterministic algorithms"),
                              ("debug", "moe_force_load_balance", "forced MoE routing")):
        if cfg.get(section, {}).get(key):
            raise NotModelledError(f"torchtitan.{section}.{key}", f"true: {why} is not modelled", f"set {key} = false")
    for key in ("custom_import", "custom_args_module"):
        if cfg.get("experimental", {}).get(key):
            raise NotModelledError(f"torchtitan.experimental.{key}", "user code that may change the model or step",
                                   f"drop {key}")


def _int(table: dict, key: str, default: int, section: str, minimum: int = 1) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value == 0:
        raise SpecError(f"torchtitan.{section}.{key}", f"{str(value)[:40]!r} is not an integer >= {minimum}",
                        "write it as a whole number")
    return value
