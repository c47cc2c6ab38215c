"""Wrap a built Trainee for a sharding, inside one gloo rank (validate/DISTRIBUTED_MEMORY.md has
the bytes of each):

- 'none':  DistributedDataParallel(bucket_cap_mb=None, gradient_as_bucket_view=False): torch's
           defaults, recorded in each result's extra.
- 'zero1': DDP as above + torch.distributed.optim.ZeroRedundancyOptimizer (optimizer states
           partitioned, parameters_as_bucket_view=False, the default).
- 'zero2': FSDP2 fully_shard(layer, reshard_after_forward=False) per decoder layer and on the
           root: unsharded parameters stay alive from forward to backward, gradients and
           optimizer states are sharded (FSDP2's closest equivalent to ZeRO-2).
- 'zero3': FSDP2 fully_shard(layer, reshard_after_forward=True) per decoder layer and on the
           root (also True on the root, unlike torch's default None, which keeps the root's
           parameters unsharded after forward).
- tensor_parallel > 1: validate.distributed.tensor_parallel inside each row of a (dp, tp) mesh, then FSDP2
  across the rows when world_size > tensor_parallel.

torch is imported inside the functions, where it always was: they run under the rank's tracker.
"""
from __future__ import annotations

from collections.abc import Callable

from validate.distributed.job import DistJob
from validate.models.layers import decoder_layers
from validate.measure.step import Trainee, make_optimizer, optimizer_class, optimizer_kwargs
from validate.distributed.tensor_parallel import apply_tensor_parallel


def wrap(trainee: Trainee, job: DistJob) -> dict:
    """Wrap trainee.model for job.sharding and replace its optimizer; returns what was used."""
    # build_trainee's optimizer holds the unsharded parameters: drop it before sharding
    trainee.optimizer = None
    tp = job.training.tensor_parallel
    tp_info, dp_mesh = {}, None
    if tp > 1:  # 2-D when world_size > tp: TP inside each row of a (dp, tp) mesh, FSDP across
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (job.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        tp_info = apply_tensor_parallel(trainee.model, job.spec, tp,
                                        job.training.sequence_parallel, mesh["tp"])
        if job.world_size == tp:
            trainee.optimizer = make_optimizer(_trained(trainee.model), job.training)
            return tp_info
        dp_mesh = mesh["dp"]
    if job.sharding in ("none", "zero1"):
        return wrap_ddp(trainee, job)
    return {**tp_info, **wrap_fsdp2(trainee, job, dp_mesh)}


def wrap_ddp(trainee: Trainee, job: DistJob) -> dict:
    """DDP ('none'), with ZeroRedundancyOptimizer for 'zero1'; what was used, for extra."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(trainee.model, bucket_cap_mb=job.bucket_cap_mb,
              gradient_as_bucket_view=job.gradient_as_bucket_view)
    trainee.model = ddp
    trainee.loss_fn = _loss_through(ddp, trainee.implementation, job.training)
    config = getattr(ddp, "_bucket_config", None)
    info = {"ddp": {"bucket_cap_mb": job.bucket_cap_mb,
                    "bucket_bytes_cap": ddp.bucket_bytes_cap,
                    "first_bucket_bytes_cap": getattr(config, "first_bucket_bytes_cap", None),
                    "gradient_as_bucket_view": job.gradient_as_bucket_view,
                    "broadcast_buffers": ddp.broadcast_buffers}}
    if job.sharding == "none":
        trainee.optimizer = make_optimizer(_trained(ddp), job.training)
    else:
        trainee.optimizer, info["zero1"] = _zero_optimizer(ddp, job)
    return info


def wrap_fsdp2(trainee: Trainee, job: DistJob, mesh=None) -> dict:
    """FSDP2 fully_shard per decoder layer and on the root ('zero2', 'zero3'), over `mesh` (by
    default all ranks); what was used, for extra."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = trainee.model
    mesh = mesh if mesh is not None else init_device_mesh("cpu", (job.world_size,))
    reshard = job.sharding == "zero3"
    root = reshard if job.fsdp_root_reshard == "same" else None  # None: torch picks False
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, **_mp(job))
    fully_shard(model, mesh=mesh, reshard_after_forward=root, **_mp(job))
    trainee.optimizer = make_optimizer(_trained(model), job.training)
    return {"fsdp2": {"reshard_after_forward": reshard, "root_reshard_after_forward": root,
                      "groups": len(decoder_layers(model)) + 1,
                      "local_param_bytes": _local_param_bytes(model)}}


def after_run(trainee: Trainee) -> dict:
    """Facts only known after the steps: DDP's rebuilt buckets (bytes each, in all-reduce order)."""
    data = getattr(trainee.model, "_get_ddp_logging_data", None)
    if data is None:
        return {}
    logged = data()
    return {"ddp_buckets": {"bucket_sizes": logged.get("bucket_sizes"),
                            "rebuilt_bucket_sizes": logged.get("rebuilt_bucket_sizes"),
                            "has_rebuilt_buckets": logged.get("has_rebuilt_buckets")}}


def _trained(model) -> list:
    """The parameters the optimizer gets: those that require grad (frozen ones and LoRA's base
    weights left out, as validate.measure.step.build_trainee and the HF Trainer pass them)."""
    return [p for p in model.parameters() if p.requires_grad]


def _loss_through(module, implementation: str, training) -> Callable:
    if implementation.startswith("hf"):
        from validate.measure.step import hf_call_kwargs

        return lambda ids, **batch: module(**hf_call_kwargs(training, ids, batch)).loss
    return lambda ids: module(ids, ids)


def _mp(job: DistJob) -> dict:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) when the TrainingConfig
    asks for it (fsdp_mixed_precision)."""
    if not job.training.fsdp_mixed_precision:
        return {}
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                              reduce_dtype=torch.float32)}


def _local_param_bytes(model) -> int:
    """Bytes of this rank's padded parameter shards (one storage per parameter)."""
    seen, total = set(), 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        st = local.untyped_storage()
        if st._cdata not in seen:
            seen.add(st._cdata)
            total += st.nbytes()
    return total


def _zero_optimizer(ddp, job: DistJob) -> tuple[object, dict]:
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer_class(job.training.optimizer),
                                  parameters_as_bucket_view=False,
                                  **optimizer_kwargs(job.training))
    parts = opt._partition_parameters()  # private, read only: which parameters each rank steps
    numels = [sum(p.numel() for g in groups for p in g["params"]) for groups in parts]
    return opt, {"parameters_as_bucket_view": False, "partition_numels": numels,
                 "local_numel": numels[dist.get_rank()]}


__all__ = ["wrap", "wrap_ddp", "wrap_fsdp2", "after_run"]
