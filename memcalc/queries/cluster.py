"""The layout planner of a cluster: which data x tensor x pipeline x sharding x checkpointing x
micro-batch layouts fit every rank of N GPUs, ranked by a stated step-time model
(memcalc.queries.step_time).

    >>> import memcalc
    >>> plans = plan_cluster(memcalc.ModelSpec.preset("gpt2"), memcalc.TrainingConfig(micro_batch=1,
    ...     seq_len=1024, precision="bf16-amp"), gpus="8xA100-80GB", global_batch=64)
    >>> best = plans[0]
    >>> best.data_parallel * best.tensor_parallel * best.pipeline_parallel
    8
    >>> max(best.rank_peak_bytes) <= memcalc.GPUS["A100-80GB"].usable_bytes
    True

Memory is the engine's per-rank peak (memcalc.estimate's rank_peak_bytes) on the `basis` given:
'allocated' (live tensor bytes plus the caching allocator's rounding, what memcalc predicts today).
Only the layouts memcalc models and has measured on gloo ranks are searched: DDP, ZeRO-1, FSDP2
zero2/zero3, tensor parallelism inside a node and FSDP2 across tensor-parallel groups
(docs/distributed.md), and, on the allocated basis, pipeline layouts where the model's stages are
modelled (memcalc.queries.cluster_pipeline: the reference GPT-2 and Llama on pipeline ranks alone).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from memcalc.core.errors import MemcalcError
from memcalc.inputs.gpus import GPU, gpu as lookup_gpu
from memcalc.queries.planner import CHECKPOINTING, DEFAULT_UTILISATION
from memcalc.queries.step_time import (Links, StepTime, dp_comm_bytes, layer_and_head_flops,
                                       tp_comm_bytes)

if TYPE_CHECKING:
    from memcalc.engine.candidates import Candidates
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

MAX_CLUSTER_GPUS = 16384
"""GPUs in a cluster string: 2048 data-parallel ranks (memcalc.core.limits) x 8 per node."""
BASES = ("allocated", "reserved", "device")
_CLUSTER = re.compile(r"([1-9][0-9]{0,5})x([A-Za-z0-9][A-Za-z0-9._-]*)")
_CLUSTER_FIX = "write COUNTxGPU, e.g. '64xH100-80GB' (see `memcalc gpus`)"


@dataclass(frozen=True)
class Cluster:
    """N GPUs of one catalogue model."""

    count: int
    gpu: GPU


def parse_cluster(text: str) -> Cluster:
    """'64xH100-80GB' -> 64 H100-80GB; anything else is refused naming the fix.

    >>> c = parse_cluster("64xH100-80GB"); c.count, c.gpu.name
    (64, 'H100-80GB')
    >>> parse_cluster("64 x H100")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: gpus: '64 x H100' is not COUNTxGPU; fix: write COUNTxGPU, ...
    """
    if not isinstance(text, str):
        raise MemcalcError("gpus", f"{str(text)[:40]!r} is not a string", _CLUSTER_FIX)
    match = _CLUSTER.fullmatch(text)
    if match is None:
        raise MemcalcError("gpus", f"{text[:40]!r} is not COUNTxGPU", _CLUSTER_FIX)
    count = int(match.group(1))
    if count > MAX_CLUSTER_GPUS:
        raise MemcalcError("gpus", f"{count} GPUs is above the planner's ceiling of {MAX_CLUSTER_GPUS}",
                           f"plan for at most {MAX_CLUSTER_GPUS} GPUs")
    try:
        card = lookup_gpu(match.group(2))
    except MemcalcError as err:
        raise MemcalcError("gpus", err.problem, err.fix) from None
    return Cluster(count, card)


@dataclass(frozen=True)
class Layout:
    """One layout of the step on the cluster, its memory and its time."""

    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    sharding: str
    precision: str
    checkpointing: str
    micro_batch: int
    grad_accum: int
    rank_peak_bytes: list[int]
    """Steady-state peak of every global rank (rank = dp index x t + tp index), bytes."""
    budget_bytes: int
    step: StepTime
    flops_per_gpu: int = field(default=0)
    basis_peak_bytes: int | None = None
    """The step's peak on the reserved or device basis (memcalc.queries.basis.peak_on: the caching
    allocator replayed under the card's limit), None on the allocated basis."""
    pipeline_schedule: str | None = None
    """With pipeline_parallel > 1: the schedule (memcalc.queries.cluster_pipeline); micro_batch is
    then the sequences of one of its micro-batches."""
    num_microbatches: int | None = None
    """With pipeline_parallel > 1: the micro-batches the schedule splits the global batch into."""

    @property
    def peak_bytes(self) -> int:
        """The largest rank's peak on the layout's basis (allocated: the largest rank_peak_bytes)."""
        return max(self.rank_peak_bytes) if self.basis_peak_bytes is None else self.basis_peak_bytes

    @property
    def headroom_bytes(self) -> int:
        """Budget minus the largest rank's peak."""
        return self.budget_bytes - self.peak_bytes

    def as_dict(self) -> dict:
        """Plain fields, for --json."""
        out = {k: getattr(self, k) for k in ("data_parallel", "tensor_parallel", "pipeline_parallel",
                                             "sharding", "precision", "checkpointing", "micro_batch",
                                             "grad_accum", "rank_peak_bytes", "budget_bytes",
                                             "peak_bytes", "headroom_bytes", "flops_per_gpu",
                                             "pipeline_schedule", "num_microbatches")}
        return {**out, "step": self.step.as_dict(), "step_seconds": self.step.total_s}


def plan_cluster(model: ModelSpec, training: TrainingConfig, gpus: str, global_batch: int,
                 basis: str = "device", utilisation: float = DEFAULT_UTILISATION,
                 links: Links = Links(), precisions: Sequence[str] | None = None,
                 checkpointing: Sequence[str] = CHECKPOINTING, budget: int | str | None = None,
                 top: int | None = None) -> list[Layout]:
    """Every layout of `training` on `gpus` (COUNTxGPU) whose every rank fits, fastest first
    (the first `top` of them when given: on the reserved and device bases each is confirmed by
    replaying the caching allocator, in ranked order, until `top` fit).

    basis: 'device' (default: reserved memory plus the CUDA context within the card's whole
    memory), 'reserved' (max_memory_reserved) or 'allocated' (max_memory_allocated within the
    usable bytes). The search runs on allocated peaks (a necessary condition: reserved >= allocated,
    and the device basis adds the context the usable bytes leave out), then each candidate is
    replayed on the basis asked (memcalc.queries.basis.peak_on).

    training's shape fields give seq_len (micro_batch is searched); its precision is kept unless
    `precisions` lists several; its other fields (optimizer, attention, ...) are kept.
    utilisation is the model FLOPs utilisation (MFU) the compute term assumes. `budget` (bytes, a
    size such as '24GiB') replaces the GPU's usable memory per rank (memcalc.inputs.gpus.parse_budget).
    """
    from memcalc.queries.planner import _check
    from memcalc.inputs.training import PRECISIONS

    from memcalc.inputs.gpus import parse_budget

    cluster = parse_cluster(gpus)
    limit = cluster.gpu.usable_bytes if budget is None else parse_budget(budget)
    _check(global_batch, training.seq_len, utilisation)
    _check_basis(basis)
    _check_training(training)
    chosen = tuple(precisions) if precisions is not None else (training.precision,)
    for name, given, known in (("precisions", chosen, PRECISIONS),
                               ("checkpointing", tuple(checkpointing), CHECKPOINTING)):
        if not given or any(x not in known for x in given):
            raise MemcalcError(name, f"{list(given)} is not a list of {', '.join(known)}",
                               f"pass a subset of {list(known)}")
    meshes = [(tp, sh) for tp, sh in _meshes(model, training, cluster.count, links)
              if global_batch % (cluster.count // tp) == 0]  # each data-parallel rank: as many sequences
    if not meshes:
        degrees = sorted({cluster.count // tp for tp, _ in _meshes(model, training, cluster.count, links)})
        raise MemcalcError("global_batch", f"{global_batch} sequences do not split evenly over any data-parallel "
                           f"degree of {cluster.count} GPUs ({', '.join(map(str, degrees))})",
                           f"use a multiple of {degrees[0]}")
    layouts = []
    for tp, shardings in meshes:
        dp = cluster.count // tp
        for precision in chosen:
            peak_tflops = cluster.gpu.tflops(precision)
            if peak_tflops is None:
                continue  # e.g. bf16 on V100
            for sharding in shardings:
                if _states_alone_exceed(model, training, tp, dp, sharding, precision, limit):
                    continue
                for mode in checkpointing:
                    t = training.with_(world_size=cluster.count, tensor_parallel=tp, sharding=sharding,
                                       precision=precision, checkpointing=mode, checkpoint_every=None,
                                       micro_batch=1, grad_accum=1)
                    layouts += _fitting(model, t, cluster, limit, global_batch // dp,
                                        peak_tflops * 1e12 * utilisation, links, global_batch)
    if basis == "allocated" or training.device == "cpu":  # no allocator replay of a pipeline rank
        from memcalc.queries.cluster_pipeline import pipeline_layouts

        layouts += [Layout(1, 1, x.training.pipeline_parallel, "none", x.training.precision,
                           x.training.checkpointing, x.sequences, 1, x.rank_peak_bytes, limit, x.step,
                           x.flops_per_gpu, pipeline_schedule=x.training.pipeline_schedule,
                           num_microbatches=x.training.num_microbatches)
                    for x in pipeline_layouts(model, training, cluster.count, cluster.gpu, limit, global_batch,
                                              chosen, utilisation, tuple(checkpointing))]
    layouts.sort(key=lambda x: (x.step.total_s, -x.micro_batch, -x.headroom_bytes))
    if basis == "allocated" or training.device == "cpu":
        return layouts[:top] if top is not None else layouts
    return _confirmed_on_basis(model, training, cluster, layouts, basis, budget, top)


def _confirmed_on_basis(model: ModelSpec, training: TrainingConfig, cluster: Cluster, layouts: list[Layout],
                        basis: str, budget: int | str | None, top: int | None) -> list[Layout]:
    """The layouts (in their order) that fit on the reserved or device basis, each with that peak."""
    from dataclasses import replace

    from memcalc.queries.basis import peak_on

    where = cluster.gpu.name if budget is None else budget
    out: list[Layout] = []
    for x in layouts:
        t = training.with_(world_size=cluster.count, tensor_parallel=x.tensor_parallel, sharding=x.sharding,
                           precision=x.precision, checkpointing=x.checkpointing, checkpoint_every=None,
                           micro_batch=x.micro_batch, grad_accum=x.grad_accum)
        ok, peak, nbytes = peak_on(model, t, where, basis, decide_only=True)
        if ok:
            out.append(replace(x, basis_peak_bytes=peak, budget_bytes=nbytes))
            if top is not None and len(out) == top:
                break
    return out


def _states_alone_exceed(model: ModelSpec, training: TrainingConfig, tp: int, dp: int, sharding: str,
                         precision: str, budget: int) -> bool:
    """A lower bound of every rank's optimizer.step() exceeds the GPU, so no checkpointing or
    micro-batch can fit (planner._states_alone_exceed, per rank): DDP and ZeRO-1 hold the whole
    weights and gradients of a tensor-parallel rank, FSDP2 at least 1/dp of its weights,
    gradients and optimizer states (its padding only adds). Not a shortcut when some parameters are
    frozen (LoRA, freeze patterns: no gradient or state).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> from memcalc.inputs.gpus import GPUS
    >>> m, t = ModelSpec.preset("llama-2-70b"), TrainingConfig(micro_batch=1, seq_len=8)
    >>> [_states_alone_exceed(m, t, 1, 64, sh, "bf16-amp", GPUS["H100-80GB"].usable_bytes) for sh in ("zero1", "zero3")]
    [True, False]
    """
    from memcalc.engine.regime import param_element_size
    from memcalc.formulas.model_states import model_state_bytes
    from memcalc.parallel.tensor import local_spec

    if training.lora is not None or training.freeze:
        return False
    params = local_spec(model, tp).param_count
    if sharding in ("none", "zero1"):
        bound = 2 * params * param_element_size(precision)
    else:
        bound = model_state_bytes(params // dp, precision, training.optimizer, training.device)
    return bound > budget


def _check_basis(basis: str) -> None:
    if basis not in BASES:
        raise MemcalcError("basis", f"unknown basis {str(basis)[:40]!r}", f"use one of {BASES}")


def _check_training(training: TrainingConfig) -> None:
    """The fields the planner sets itself must be left at their defaults."""
    for name, default in (("world_size", 1), ("tensor_parallel", 1), ("sharding", "none"),
                          ("sequence_parallel", False), ("pipeline_parallel", 1)):
        if getattr(training, name) != default:
            raise MemcalcError(name, f"the planner searches {name} itself, got {getattr(training, name)!r}",
                               f"leave {name} at its default ({default!r})")


def _meshes(model: ModelSpec, training: TrainingConfig, count: int, links: Links) -> list[tuple[int, tuple[str, ...]]]:
    """(tensor_parallel, shardings) the engine models on `count` GPUs: t divides the count, stays
    in a node and splits the heads and MLP (memcalc.parallel.tensor); DDP and ZeRO-1 only without
    tensor parallelism (FSDP2 across tensor-parallel groups, docs/distributed.md)."""
    from memcalc.parallel.tensor import check_tensor_parallel

    out = []
    for tp in range(1, min(count, links.gpus_per_node) + 1):
        if count % tp:
            continue
        if tp > 1:
            try:
                check_tensor_parallel(model, training.with_(world_size=count, tensor_parallel=tp))
            except MemcalcError:
                continue
        dp = count // tp
        if dp == 1:
            out.append((tp, ("none",)))
        elif tp == 1:
            out.append((tp, ("none", "zero1", "zero2", "zero3")))
        else:
            out.append((tp, ("zero2", "zero3")))
    return out


def _fitting(model: ModelSpec, t: TrainingConfig, cluster: Cluster, budget: int, local_batch: int,
             flops_per_s: float, links: Links, global_batch: int) -> list[Layout]:
    """The micro-batches dividing `local_batch` whose every rank fits, each with its step time."""
    from memcalc.engine.run import candidates
    from memcalc.parallel.tensor import local_spec

    micros = [m for m in range(1, local_batch + 1) if local_batch % m == 0]
    try:
        accum_c = candidates(model, t.with_(grad_accum=2))
    except MemcalcError:
        return []  # a layout the engine refuses (named by memcalc.estimate) is not searched
    states = _rank_states(accum_c)
    peaks = {}
    for m in micros[:-1] if local_batch > 1 else []:
        peaks[m] = _rank_peaks(accum_c, states, m, t.seq_len)
        if min(peaks[m]) > budget:
            break  # the peak grows with the micro-batch: larger ones do not fit either
    if local_batch == micros[-1] and all(max(p) <= budget for p in peaks.values()):
        # no accumulation: lacks at most the fp32 .grad of the rank's parameters (planner._peaks)
        lower = max(_rank_peaks(accum_c, states, local_batch, t.seq_len)) \
            - 4 * local_spec(model, t.tensor_parallel).param_count
        if lower <= budget:
            one = candidates(model, t)
            peaks[local_batch] = _rank_peaks(one, _rank_states(one), local_batch, t.seq_len)
    dp = cluster.count // t.tensor_parallel
    out = []
    for m, ranks in peaks.items():
        if max(ranks) <= budget:
            step, flops = step_time(model, t, dp, local_batch // m, global_batch, flops_per_s, links)
            out.append(Layout(dp, t.tensor_parallel, 1, t.sharding, t.precision, t.checkpointing, m,
                              local_batch // m, ranks, budget, step, flops))
    return out


def _rank_states(cands: Candidates) -> list[tuple[int, int]]:
    """Per data-parallel rank: (optimizer state bytes, step temporaries) (memcalc.parallel.data)."""
    from memcalc.parallel.data import rank_optimizer_bytes_all

    return rank_optimizer_bytes_all(cands.param_shapes, cands.param_elt, cands.regime)


def _rank_peaks(cands: Candidates, states: list[tuple[int, int]], b: int, s: int) -> list[int]:
    """Every global rank's steady-state peak, as memcalc.queries.estimate._estimate_ranks adds each
    rank's optimizer to the shared simulation (tests/test_cluster.py checks they agree)."""
    totals = cands.steady_set.rounded_totals(b, s)
    phase_max = {p: max((totals[i] for i in idx), default=0) for p, idx in cands.steady_set.by_phase.items()}
    if cands.regime.data_parallel == 1:
        return [max(phase_max.values())] * cands.regime.tensor_parallel
    memo: dict[tuple[int, int], int] = {}
    out = []
    for st in states:
        if st not in memo:
            memo[st] = max(v + st[0] + (st[1] if p == "optimizer" else 0) for p, v in phase_max.items())
        out += [memo[st]] * cands.regime.tensor_parallel
    return out


def step_time(model: ModelSpec, t: TrainingConfig, dp: int, grad_accum: int, global_batch: int,
              flops_per_s: float, links: Links) -> tuple[StepTime, int]:
    """The step time of a layout and the FLOPs of one GPU (memcalc.queries.step_time).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=1024, world_size=2, sharding="zero3", precision="bf16")
    >>> st, flops = step_time(ModelSpec.preset("gpt2"), t, 2, 4, 8, 1e15, Links())
    >>> st.bubble_s, st.tp_comm_s, st.dp_comm_s > 0
    (0.0, 0.0, True)
    """
    from memcalc.engine.regime import param_element_size
    from memcalc.parallel.tensor import local_spec

    tp, seq = t.tensor_parallel, t.seq_len
    tokens = global_batch * seq // dp  # one data-parallel replica's tokens per step
    layers, head = layer_and_head_flops(model, tokens, seq, t.checkpointing)
    flops = layers // tp + head  # the LM head is replicated on the tensor-parallel ranks
    act_elt = 4 if t.precision == "fp32" else 2
    tp_bytes = tp_comm_bytes(model, tokens, tp, t.checkpointing, act_elt)
    elt = param_element_size(t.precision)
    gather, reduce = (2, 4) if t.fsdp_mixed_precision else (elt, elt)
    dp_bytes = dp_comm_bytes(local_spec(model, tp).param_count, dp, t.sharding, grad_accum, gather, reduce)
    gbps = 1e9
    return StepTime(compute_s=flops / flops_per_s, bubble_s=0.0,
                    tp_comm_s=tp_bytes / (links.link_gbps(tp) * gbps),
                    dp_comm_s=dp_bytes / (links.link_gbps(dp * tp) * gbps)), flops


__all__ = ["Cluster", "Layout", "parse_cluster", "plan_cluster", "step_time", "BASES"]
