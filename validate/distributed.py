"""Per-rank peak memory of data-parallel training, measured on CPU with torch.distributed (gloo).

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> ranks = measure_distributed(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"),
    ...                             world_size=2, sharding="zero3")
    >>> [r["rank"] for r in ranks], ranks[0]["peak_bytes"] > 0
    ([0, 1], True)

Each configuration runs in `world_size` fresh Python processes joined by one gloo process group
on 127.0.0.1; the parent holds the TCPStore on a port the OS picks (bound to port 0), so ranks
never race for a port. Every rank builds the same model from the spec
(validate.step.build_trainee, seed 0), wraps it for the sharding, then runs
validate.step.run_steps under validate.dist_tracker.DistTracker: a warm-up step, then the
steady-state peak over the following steps, phases forward/backward/optimizer.

Shardings (what `sharding=` means here; validate/DISTRIBUTED_MEMORY.md has the bytes):
- 'none':  DistributedDataParallel(bucket_cap_mb=25, gradient_as_bucket_view=False): torch's
           defaults, recorded in each result's extra.
- 'zero1': DDP as above + torch.distributed.optim.ZeroRedundancyOptimizer (optimizer states
           partitioned, parameters_as_bucket_view=False, the default).
- 'zero2': FSDP2 fully_shard(layer, reshard_after_forward=False) per decoder layer and on the
           root: unsharded parameters stay alive from forward to backward, gradients and
           optimizer states are sharded (FSDP2's closest equivalent to ZeRO-2).
- 'zero3': FSDP2 fully_shard(layer, reshard_after_forward=True) per decoder layer and on the
           root (also True on the root, unlike torch's default None, which keeps the root's
           parameters unsharded after forward).

Failures never hang: every collective has `collective_timeout_s`, each configuration has an
overall `timeout_s`, and when a rank fails the others get `grace_s` to fail too before they are
killed. RankFailure names each rank's error.
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from memcalc.errors import MemcalcError
from validate.layers import decoder_layers

SHARDINGS = ("none", "zero1", "zero2", "zero3")
# None = torch's default: 25 MiB buckets, but (torch 2.13, find_unused_parameters=False) all
# parameters in one bucket until the first backward, then rebuilt in gradient-ready order with a
# 1 MiB first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES). Passing 25 explicitly is *not* the same:
# the first bucket then is 25 MiB too (torch/nn/parallel/distributed.py _BucketConfig).
DDP_BUCKET_CAP_MB = None
DDP_GRADIENT_AS_BUCKET_VIEW = False  # torch default
TIMEOUT_S = 180.0  # one configuration, all ranks, start to end
COLLECTIVE_TIMEOUT_S = 60.0  # init_process_group(timeout=...): each gloo collective
GRACE_S = 10.0  # after one rank fails, how long the others get to finish failing


class RankFailure(RuntimeError):
    """One or more ranks failed; `errors` maps rank -> one-line error, `details` the first
    failing rank's traceback, `pids` the rank processes (all ended and reaped when raised)."""

    def __init__(self, what: str, errors: dict[int, str], details: str = "", pids=()):
        self.errors, self.details, self.pids = errors, details, list(pids)
        parts = "; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        super().__init__(f"{what}: {parts}")


@dataclass(frozen=True)
class DistJob:
    """Everything a rank needs (pickled to each process)."""

    spec: object
    training: object
    world_size: int
    sharding: str
    steps: int = 3
    hf_config: dict | None = None
    seed: int = 0
    bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB
    gradient_as_bucket_view: bool = DDP_GRADIENT_AS_BUCKET_VIEW
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S
    events: bool = False
    fail_rank: int | None = None  # tests: this rank raises after init (checks error reporting)
    hang_rank: int | None = None  # tests: this rank sleeps forever (checks the timeout)
    threads: int = 1
    fsdp_root_reshard: str = "same"  # 'same' as the layers, or 'torch-default' (None: False)
    extra: dict = field(default_factory=dict)


# ---- configuration -----------------------------------------------------------------------------
def resolve_parallelism(training, world_size: int | None, sharding: str | None) -> tuple[int, str]:
    """World size and sharding: the arguments, else TrainingConfig's fields (when memcalc has
    them), else 1 and 'none'. A conflict between the two is bad input.

    >>> from memcalc.training import TrainingConfig
    >>> resolve_parallelism(TrainingConfig(micro_batch=1, seq_len=8), 4, "zero3")
    (4, 'zero3')
    >>> resolve_parallelism(TrainingConfig(micro_batch=1, seq_len=8), 2, "zero4")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.errors.MemcalcError: sharding: unknown sharding 'zero4'; fix: use one of ('none', ...)
    """
    resolved = []
    for name, given, default in (("world_size", world_size, 1), ("sharding", sharding, "none")):
        own = getattr(training, name, None)
        if given is not None and own is not None and own != given and own != default:
            raise MemcalcError(name, f"{given!r} conflicts with TrainingConfig.{name}={own!r}",
                               f"give {name} once")
        resolved.append(given if given is not None else (own if own is not None else default))
    ws, sh = resolved
    if sh not in SHARDINGS:
        raise MemcalcError("sharding", f"unknown sharding {sh!r}", f"use one of {SHARDINGS}")
    if not isinstance(ws, int) or ws < 1:
        raise MemcalcError("world_size", f"must be an integer >= 1, got {ws!r}",
                           "pass --world-size 2")
    return ws, sh


def check_distributed(spec, training, world_size: int, sharding: str) -> None:
    """Refuse, as bad input, what this runner cannot run (before any process starts)."""
    tp = getattr(training, "tensor_parallel", 1)
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
        from memcalc.tensor_parallel import check_tensor_parallel

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


# ---- launcher ----------------------------------------------------------------------------------
def measure_distributed(spec, training, world_size: int | None = None, sharding: str | None = None,
                        steps: int = 3, hf_config: dict | None = None, seed: int = 0,
                        timeout_s: float = TIMEOUT_S, events: bool = False,
                        bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB,
                        gradient_as_bucket_view: bool = DDP_GRADIENT_AS_BUCKET_VIEW,
                        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
                        grace_s: float = GRACE_S, **test_hooks) -> list[dict]:
    """Run one configuration on `world_size` gloo ranks; one result dict per rank, rank order.

    Each dict is a validate.measure.Measurement as a dict (peak_bytes: steady-state peak of live
    tensor bytes on that rank) plus 'rank', 'world_size', 'sharding', 'pid' and, with events=True,
    'events': the rank's allocation timeline [phase, op, +bytes, -bytes, live bytes,
    [[shape, dtype, allocation site], ...]], and per-site breakdowns in extra['peak_at'].
    Raises RankFailure when any rank fails or the configuration runs past `timeout_s`.
    """
    from validate.step import check_runnable

    ws, sh = resolve_parallelism(training, world_size, sharding)
    check_runnable(spec, training)
    check_distributed(spec, training, ws, sh)
    if steps < 2:
        raise MemcalcError("steps", f"need >= 2 steps, got {steps}", "pass steps=3")
    threads = max(1, (os.cpu_count() or 1) // ws)
    job = DistJob(spec, training, ws, sh, steps, hf_config, seed, bucket_cap_mb,
                  gradient_as_bucket_view, collective_timeout_s, events, threads=threads,
                  **test_hooks)
    start = time.perf_counter()
    results = launch(job, timeout_s, grace_s)
    wall = round(time.perf_counter() - start, 3)
    for r in results:
        r["launch_wall_s"] = wall
    return results


def launch(job: DistJob, timeout_s: float = TIMEOUT_S, grace_s: float = GRACE_S) -> list[dict]:
    """Start the ranks, wait for them (never past timeout_s), kill what is left, read results.

    Ranks are fresh interpreters (`python -c`), never forks of the caller: the caller may hold
    threads, a dispatch mode or CUDA state, and its __main__ is never re-imported.
    """
    import pickle

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=job.collective_timeout_s))
    with tempfile.TemporaryDirectory(prefix="memcalc-dist-") as tmp:
        # a plain dict: the ranks import validate.distributed by that name, whatever ours is
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
        Path(tmp, "job.pkl").write_bytes(pickle.dumps(fields))
        procs = []
        try:
            for rank in range(job.world_size):
                procs.append(_start_rank(rank, store.port, tmp))
            timed_out, first_failed = _wait(procs, tmp, timeout_s, grace_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(10)
        results = _collect(procs, tmp, job, timed_out, first_failed, timeout_s)
    del store
    return results


def _start_rank(rank: int, port: int, tmp: str):
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parent.parent)  # the folder holding validate/, memcalc/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    code = f"from validate.distributed import rank_entry; rank_entry({rank}, {port}, {tmp!r})"
    log = open(Path(tmp, f"rank{rank}.log"), "wb")
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=root)
    finally:
        log.close()  # the child has its own descriptor


def _wait(procs, tmp: str, timeout_s: float, grace_s: float):
    """Poll until all ranks exit, one fails (+grace), or the deadline; (timed_out, first_failed)."""
    deadline = time.monotonic() + timeout_s
    failed_at, first_failed = None, None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False, first_failed
        for rank, code in enumerate(codes):
            if first_failed is None and (code not in (None, 0)
                                         or Path(tmp, f"rank{rank}.error.json").exists()):
                first_failed, failed_at = rank, time.monotonic()
        now = time.monotonic()
        if failed_at is not None and now - failed_at > grace_s:
            return False, first_failed
        if now > deadline:
            return True, first_failed
        time.sleep(0.05)


def _collect(procs, tmp: str, job: DistJob, timed_out: bool, first_failed, timeout_s) -> list[dict]:
    results, errors, details = [], {}, ""
    for rank, p in enumerate(procs):
        ok, err = Path(tmp, f"rank{rank}.json"), Path(tmp, f"rank{rank}.error.json")
        if ok.exists():
            results.append(json.loads(ok.read_text()))
        elif err.exists():
            info = json.loads(err.read_text())
            errors[rank] = info["error"]
            if rank == first_failed or not details:
                details = info["traceback"]
        elif timed_out and p.returncode in (None, -9):
            errors[rank] = f"killed: no result after {timeout_s:.0f} s (timeout_s)"
        elif first_failed is not None and first_failed != rank and p.returncode in (None, -9):
            errors[rank] = f"killed after rank {first_failed} failed"
        else:
            log = Path(tmp, f"rank{rank}.log")
            tail = log.read_text(errors="replace")[-600:].strip() if log.exists() else ""
            errors[rank] = f"exited with code {p.returncode} and no result: {tail}"
    if errors:
        what = f"world_size={job.world_size} sharding={job.sharding}"
        if timed_out:
            what += f" timed out after {timeout_s:.0f} s"
        raise RankFailure(what, errors, details, [p.pid for p in procs])
    return sorted(results, key=lambda r: r["rank"])


# ---- one rank ----------------------------------------------------------------------------------
def rank_entry(rank: int, port: int, out_dir: str) -> None:
    """Process entry point: init gloo, measure, write rank{r}.json (or rank{r}.error.json)."""
    import pickle

    import torch
    import torch.distributed as dist

    job = DistJob(**pickle.loads(Path(out_dir, "job.pkl").read_bytes()))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(job.threads)
    code = 0
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=job.collective_timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=job.collective_timeout_s))
        if job.fail_rank == rank:
            raise ValueError(f"injected failure on rank {rank}")
        if job.hang_rank == rank:
            time.sleep(10**6)
        result = measure_rank(job, rank)
        _write(Path(out_dir, f"rank{rank}.json"), result)
    except BaseException as err:  # report everything, then exit non-zero
        _write(Path(out_dir, f"rank{rank}.error.json"),
               {"error": f"{type(err).__name__}: {err}"[:1000],
                "traceback": traceback.format_exc()})
        code = 1
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # a broken group cannot always be destroyed; the process exits anyway
            pass
    os._exit(code)  # skip interpreter teardown: a dead peer can make gloo threads block it


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)  # atomic: the parent never reads half a file


def measure_rank(job: DistJob, rank: int) -> dict:
    """Build, wrap and run the steps on this rank under the DistTracker; the result dict."""
    import torch

    from validate.dist_tracker import DistTracker
    from validate.measure import Measurement, _cpu_name, sdpa_backend
    from validate.step import build_trainee, run_steps

    start = time.perf_counter()
    holder: dict = {}
    attribution = {}
    if job.events:  # trace mode: allocation sites and per-site peak breakdowns too
        from validate.dist_attrib import allocation_site, gradient_keys

        attribution = dict(site_fn=allocation_site,
                           grads_fn=lambda: gradient_keys(holder["model"]) if holder else set())
    tracker = DistTracker(events=job.events, **attribution)
    meter = _DistMeter(tracker)
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
            info.update(_after_run(trainee))
        finally:
            gc.enable()
    m = Measurement(status="ok", backend="cpu-gloo", device="cpu", device_name=_cpu_name(),
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


class _DistMeter:
    """Meter over a DistTracker (validate.step's meter protocol); also keeps, per step and
    phase, the peak *with* collective-backend scratch (DistTracker.full_peak)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.steps: list[dict[str, int]] = []
        self.peak_at: list[dict[str, tuple]] = []  # per step, phase -> (peak, op at the peak)
        self._phase = ""

    def reset_peak(self) -> None:
        self.tracker.reset_peak()

    def peak(self) -> int:
        if self.steps:
            own = self.steps[-1]
            own[self._phase] = max(own.get(self._phase, 0), self.tracker.full_peak)
            at = self.peak_at[-1]
            if self.tracker.peak > at.get(self._phase, (-1,))[0]:
                at[self._phase] = (self.tracker.peak, self.tracker.peak_op,
                                   dict(self.tracker.peak_sites))
        return self.tracker.peak

    def mark(self, label: str) -> None:
        if label == "inputs":  # validate.step.train_step marks 'inputs' first in each step
            self.steps.append({})
            self.peak_at.append({})
        self._phase = label
        self.tracker.mark(label)

    def peak_op(self) -> dict:
        """Where the steady-state peak was reached (phase, op, step), and each phase's own
        steady-state peak op; with attribution on, the bytes per allocation site there."""
        phases: dict[str, dict] = {}
        for step, at in enumerate(self.peak_at[1:], start=1):
            for phase, (value, op, sites) in at.items():
                if value > phases.get(phase, {}).get("bytes", -1):
                    phases[phase] = {"bytes": value, "op": op, "step": step}
                    if sites:
                        phases[phase]["breakdown"] = dict(sorted(sites.items(),
                                                                 key=lambda kv: -kv[1]))
        if not phases:
            return {}
        phase = max(phases, key=lambda p: phases[p]["bytes"])
        return {"phase": phase, **phases[phase], "phases": phases}

    def full_peaks(self) -> dict:
        """Steady-state (steps >= 2) and first-step peaks including backend scratch."""
        steady = self.steps[1:]
        return {"peak_bytes_with_scratch": max((max(s.values()) for s in steady), default=None),
                "first_step_peak_bytes_with_scratch": max(self.steps[0].values()) if self.steps
                else None,
                "phases_with_scratch": {p: max(s.get(p, 0) for s in steady) for p in
                                        ("forward", "backward", "optimizer")} if steady else {}}


# ---- wrapping ----------------------------------------------------------------------------------
def _loss_through(module, implementation: str):
    if implementation.startswith("hf"):
        return lambda ids: module(input_ids=ids, labels=ids, use_cache=False).loss
    return lambda ids: module(ids, ids)


def wrap(trainee, job: DistJob) -> dict:
    """Wrap trainee.model for job.sharding and replace its optimizer; returns what was used."""
    from validate.step import make_optimizer

    # build_trainee's optimizer holds the unsharded parameters: drop it before sharding
    trainee.optimizer = None
    model = trainee.model
    tp = getattr(job.training, "tensor_parallel", 1)
    tp_info, dp_mesh = {}, None
    if tp > 1:  # 2-D when world_size > tp: TP inside each row of a (dp, tp) mesh, FSDP across
        from torch.distributed.device_mesh import init_device_mesh

        from validate.tensor_parallel import apply_tensor_parallel

        mesh = init_device_mesh("cpu", (job.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        tp_info = apply_tensor_parallel(model, job.spec, tp, job.training.sequence_parallel,
                                        mesh["tp"])
        if job.world_size == tp:
            trainee.optimizer = make_optimizer(model.parameters(), job.training)
            return tp_info
        dp_mesh = mesh["dp"]
    if job.sharding in ("none", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=job.bucket_cap_mb,
                  gradient_as_bucket_view=job.gradient_as_bucket_view)
        trainee.model = ddp
        trainee.loss_fn = _loss_through(ddp, trainee.implementation)
        config = getattr(ddp, "_bucket_config", None)
        info = {"ddp": {"bucket_cap_mb": job.bucket_cap_mb,
                        "bucket_bytes_cap": ddp.bucket_bytes_cap,
                        "first_bucket_bytes_cap": getattr(config, "first_bucket_bytes_cap", None),
                        "gradient_as_bucket_view": job.gradient_as_bucket_view,
                        "broadcast_buffers": ddp.broadcast_buffers}}
        if job.sharding == "none":
            trainee.optimizer = make_optimizer(ddp.parameters(), job.training)
        else:
            trainee.optimizer, info["zero1"] = _zero_optimizer(ddp, job)
        return info
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = dp_mesh if dp_mesh is not None else init_device_mesh("cpu", (job.world_size,))
    reshard = job.sharding == "zero3"
    root = reshard if job.fsdp_root_reshard == "same" else None  # None: torch picks False
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, **_mp(job))
    fully_shard(model, mesh=mesh, reshard_after_forward=root, **_mp(job))
    trainee.optimizer = make_optimizer(model.parameters(), job.training)
    return {**tp_info, "fsdp2": {"reshard_after_forward": reshard,
                                 "root_reshard_after_forward": root,
                                 "groups": len(decoder_layers(model)) + 1,
                                 "local_param_bytes": _local_param_bytes(model)}}


def _mp(job) -> dict:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) when the TrainingConfig
    asks for it (fsdp_mixed_precision)."""
    if not getattr(job.training, "fsdp_mixed_precision", False):
        return {}
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                              reduce_dtype=torch.float32)}


def _after_run(trainee) -> dict:
    """Facts only known after the steps: DDP's rebuilt buckets (bytes each, in all-reduce order)."""
    data = getattr(trainee.model, "_get_ddp_logging_data", None)
    if data is None:
        return {}
    logged = data()
    return {"ddp_buckets": {"bucket_sizes": logged.get("bucket_sizes"),
                            "rebuilt_bucket_sizes": logged.get("rebuilt_bucket_sizes"),
                            "has_rebuilt_buckets": logged.get("has_rebuilt_buckets")}}


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


def _zero_optimizer(ddp, job: DistJob):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from validate.step import optimizer_kwargs

    cls = {"sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD, "adam": torch.optim.Adam,
           "adamw": torch.optim.AdamW}[job.training.optimizer]
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls,
                                  parameters_as_bucket_view=False,
                                  **optimizer_kwargs(job.training))
    parts = opt._partition_parameters()  # private, read only: which parameters each rank steps
    numels = [sum(p.numel() for g in groups for p in g["params"]) for groups in parts]
    return opt, {"parameters_as_bucket_view": False, "partition_numels": numels,
                 "local_numel": numels[dist.get_rank()]}


__all__ = ["measure_distributed", "RankFailure", "SHARDINGS", "resolve_parallelism",
           "decoder_layers", "DDP_BUCKET_CAP_MB", "DDP_GRADIENT_AS_BUCKET_VIEW"]
