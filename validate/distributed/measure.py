"""Per-rank peak memory of data-parallel and tensor-parallel training, measured on CPU with
torch.distributed (gloo).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> ranks = measure_distributed(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"),
    ...                             world_size=2, sharding="zero3")
    >>> [r["rank"] for r in ranks], ranks[0]["peak_bytes"] > 0
    ([0, 1], True)

Each configuration runs in `world_size` fresh processes (validate.distributed.launch). Every rank builds the
same model from the spec (validate.measure.step.build_trainee, seed 0), wraps it for the sharding
(validate.distributed.wrap), then runs validate.measure.step.run_steps under validate.distributed.tracker.DistTracker: a
warm-up step, then the steady-state peak over the following steps, phases
forward/backward/optimizer. validate/DISTRIBUTED_MEMORY.md has the bytes of each sharding.
"""
from __future__ import annotations

import gc
import os
import time

from memcalc.core.errors import MemcalcError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.distributed.job import (BACKEND, DDP_BUCKET_CAP_MB, DDP_GRADIENT_AS_BUCKET_VIEW, SHARDINGS,
                               DistJob)
from validate.distributed.meter import DistMeter
from validate.distributed.tracker import DistTracker
from validate.distributed.launch import COLLECTIVE_TIMEOUT_S, GRACE_S, TIMEOUT_S, Launch, launch
from validate.measure.backends import Measurement, cpu_name, sdpa_backend
from validate.measure.step import build_trainee, check_runnable, run_steps
from validate.distributed.wrap import after_run, wrap

_LAUNCH_HOOKS = ("fail_rank", "hang_rank")  # measure_distributed(**test_hooks) for validate.distributed.launch


# ---- what can run ------------------------------------------------------------------------------
def resolve_parallelism(training: TrainingConfig, world_size: int | None,
                        sharding: str | None) -> tuple[int, str]:
    """World size and sharding: the arguments, else TrainingConfig's fields. An argument that
    conflicts with a field set to other than its default is bad input.

    >>> resolve_parallelism(TrainingConfig(micro_batch=1, seq_len=8), 4, "zero3")
    (4, 'zero3')
    >>> resolve_parallelism(TrainingConfig(micro_batch=1, seq_len=8), 2, "zero4")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: sharding: unknown sharding 'zero4'; fix: use one of ('none', ...)
    """
    resolved = []
    for name, given, default in (("world_size", world_size, 1), ("sharding", sharding, "none")):
        own = getattr(training, name)
        if given is not None and own not in (given, default):
            raise MemcalcError(name, f"{given!r} conflicts with TrainingConfig.{name}={own!r}",
                               f"give {name} once")
        resolved.append(own if given is None else given)
    ws, sh = resolved
    if sh not in SHARDINGS:
        raise MemcalcError("sharding", f"unknown sharding {sh!r}", f"use one of {SHARDINGS}")
    if not isinstance(ws, int) or ws < 1:
        raise MemcalcError("world_size", f"must be an integer >= 1, got {ws!r}",
                           "pass --world-size 2")
    return ws, sh


def check_distributed(spec: ModelSpec, training: TrainingConfig, world_size: int,
                      sharding: str) -> None:
    """Refuse, as bad input, what this runner cannot run (before any process starts)."""
    tp = training.tensor_parallel
    if tp > 1 and world_size % tp:
        raise MemcalcError("world_size", f"{world_size} ranks do not form rows of "
                           f"tensor_parallel={tp}", f"use a multiple of {tp}")
    if tp > 1 and world_size > tp and sharding not in ("zero2", "zero3"):
        raise MemcalcError("sharding", f"data parallelism across tensor-parallel groups runs "
                           f"with FSDP2 here, got {sharding!r}", "pass --sharding zero2 or zero3")
    if tp > 1 and training.optimizer.startswith("sgd") and training.optimizer_impl == "fused":
        raise MemcalcError("optimizer_impl", "torch has no DTensor rule for the fused SGD kernel "
                           "(aten._fused_sgd_), so tensor-parallel SGD cannot run fused",
                           "use --optimizer-impl foreach or for-loop")
    if tp > 1:  # what the engine refuses (uneven splits, SP on HF models, HF GPT-2's Conv1D)
        from memcalc.parallel.tensor import check_tensor_parallel

        check_tensor_parallel(spec, training)
    if training.device != "cpu":
        raise MemcalcError("device", f"distributed runs use gloo on CPU, got {training.device!r}",
                           "pass --device cpu")
    if sharding in ("zero2", "zero3") and training.precision == "fp16-amp":
        raise MemcalcError("precision", "fp16-amp needs a sharded grad scaler with FSDP2; not "
                           "measured here", "use fp32, bf16-amp or bf16 with zero2/zero3")
    if world_size > 64:
        raise MemcalcError("world_size", f"{world_size} CPU processes is too many here",
                           "use world_size <= 64")


# ---- the parent --------------------------------------------------------------------------------
def measure_distributed(spec: ModelSpec, training: TrainingConfig, world_size: int | None = None,
                        sharding: str | None = None, steps: int = 3,
                        hf_config: dict | None = None, seed: int = 0,
                        timeout_s: float = TIMEOUT_S, events: bool = False,
                        bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB,
                        gradient_as_bucket_view: bool = DDP_GRADIENT_AS_BUCKET_VIEW,
                        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
                        grace_s: float = GRACE_S, **test_hooks) -> list[dict]:
    """Run one configuration on `world_size` gloo ranks; one result dict per rank, rank order.

    Each dict is a validate.measure.backends.Measurement as a dict (peak_bytes: steady-state peak of live
    tensor bytes on that rank) plus 'rank', 'world_size', 'sharding', 'pid' and, with events=True,
    'events': the rank's allocation timeline [phase, op, +bytes, -bytes, live bytes,
    [[shape, dtype, allocation site], ...]], and per-site breakdowns in extra['peak_at'].
    Raises validate.distributed.launch.RankFailure when any rank fails or the configuration runs past
    `timeout_s`. `test_hooks`: fail_rank, hang_rank (validate.distributed.launch.Launch), fsdp_root_reshard
    (DistJob).
    """
    if training.pipeline_parallel > 1:  # PipelineStage schedules (validate.distributed.pipeline)
        from validate.distributed.pipeline import measure_pipeline

        return measure_pipeline(spec, training, training.pipeline_parallel, training.pipeline_schedule,
                                training.num_microbatches, training.pipeline_stages_per_rank,
                                training.stage_boundaries, steps=steps, timeout_s=timeout_s)
    ws, sh = resolve_parallelism(training, world_size, sharding)
    check_runnable(spec, training)
    check_distributed(spec, training, ws, sh)
    if steps < 2:
        raise MemcalcError("steps", f"need >= 2 steps, got {steps}", "pass steps=3")
    hooks = {k: v for k, v in test_hooks.items() if k in _LAUNCH_HOOKS}
    job = DistJob(spec, training, ws, sh, steps, hf_config, seed, bucket_cap_mb,
                  gradient_as_bucket_view, events,
                  **{k: v for k, v in test_hooks.items() if k not in _LAUNCH_HOOKS})
    ranks = Launch("validate.distributed.measure:run_rank", job.as_fields(), ws,
                   what=f"world_size={ws} sharding={sh}",
                   threads=max(1, (os.cpu_count() or 1) // ws),
                   collective_timeout_s=collective_timeout_s, **hooks)
    start = time.perf_counter()
    results = launch(ranks, timeout_s, grace_s)
    wall = round(time.perf_counter() - start, 3)
    for r in results:
        r["launch_wall_s"] = wall
    return results


# ---- one rank ----------------------------------------------------------------------------------
def run_rank(fields: dict, rank: int) -> dict:
    """validate.distributed.launch's target in each rank: measure_rank on the DistJob given as fields."""
    return measure_rank(DistJob(**fields), rank)


def _import_outside(training: TrainingConfig) -> None:
    """Import peft before the tracker starts, as the single-process runs have it imported: its
    first import makes module-level constants (peft/tuners/loha/layer.py: two 0-dim int64
    tensors; bitsandbytes/backends/utils.py, which it imports: the NF4 and FP4 code tables, 16
    fp32 each), 144 B of CPU tensors that belong to the process, not to the step (measured: a
    LoRA rank 144 B above the prediction in every phase when imported under the tracker)."""
    if training.lora is not None:
        import peft  # noqa: F401


def measure_rank(job: DistJob, rank: int) -> dict:
    """Build, wrap and run the steps on this rank under the DistTracker; the result dict."""
    import torch

    start = time.perf_counter()
    holder: dict = {}
    attribution = {}
    if job.events:  # trace mode: allocation sites and per-site peak breakdowns too
        from validate.distributed.attrib import allocation_site, gradient_keys

        attribution = dict(site_fn=allocation_site,
                           grads_fn=lambda: gradient_keys(holder["model"]) if holder else set())
    _import_outside(job.training)
    tracker = DistTracker(events=job.events, **attribution)
    meter = DistMeter(tracker)
    with tracker:
        gc.collect()
        gc.disable()  # cyclic garbage freed at a random moment would make peaks flaky
        try:
            trainee = build_trainee(job.spec, job.training, job.hf_config, job.seed)
            built = tracker.live
            info = wrap(trainee, job)
            holder["model"] = trainee.model
            gc.collect()  # the unsharded originals, now unreferenced, are freed here
            wrapped = tracker.live
            tracker.mark("wrapped")
            run = run_steps(trainee, job.training, meter, job.spec.vocab_size, job.steps)
            tracker.mark("end")
            info.update(after_run(trainee))
        finally:
            gc.enable()
    m = Measurement(status="ok", backend=BACKEND, device="cpu", device_name=cpu_name(),
                    sdpa_backend=sdpa_backend(job.spec, job.training))
    m.peak_bytes, m.first_step_peak_bytes = run.steady.peak, run.first.peak
    m.phases, m.first_step_phases = dict(run.steady.phases), dict(run.first.phases)
    m.implementation = trainee.implementation
    m.param_dtype = str(next(trainee.model.parameters()).dtype).replace("torch.", "")
    m.extra = {**info, "model_built_bytes": built, "wrapped_bytes": wrapped,
               "end_live_bytes": tracker.live, "late_bytes": tracker.late_bytes,
               "late_ops": tracker.late_ops, "untracked_tensors": tracker.untracked,
               "backend_scratch": {"ops": tracker.scratch_ops, **meter.full_peaks()},
               "peak_at": meter.peak_op(),
               "collectives_unsettled": tracker.unsettled,
               "collectives_pending_at_end": len(tracker._pending),
               "torch_threads": torch.get_num_threads()}
    m.wall_s = round(time.perf_counter() - start, 3)
    out = {**m.to_dict(), "rank": rank, "world_size": job.world_size, "sharding": job.sharding,
           "pid": os.getpid()}
    if job.events:
        out["events"] = [list(e[:5]) + [[list(s) for s in e[5]]] for e in tracker.events]
    return out


__all__ = ["measure_distributed", "measure_rank", "run_rank", "SHARDINGS", "resolve_parallelism",
           "check_distributed"]
