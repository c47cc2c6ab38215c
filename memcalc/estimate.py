"""estimate(): the peak of a training step, per phase, with its breakdown and symbolic form."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from memcalc.poly import Poly
from memcalc.specs import ModelSpec
from memcalc.tape.graph import Graph
from memcalc.tape.ops import Ops
from memcalc.tape.simulate import Moment
from memcalc.tape.step import simulate_step
from memcalc.training import TrainingConfig

GIB = 1024 ** 3
PHASES = ("forward", "backward", "optimizer")
# cuBLAS workspace, allocated through the caching allocator at the first matmul and kept:
# CUBLAS_WORKSPACE_CONFIG default ":4096:8" = 4 MiB x 8 on sm90, 4096 KiB*2+16 KiB*8 ~ 8 MiB on older
# (aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize). Not yet validated on a GPU.
CUBLAS_WORKSPACE_BYTES = 32 * 1024 ** 2


def segment_starts(num_layers: int, training: TrainingConfig) -> set[int]:
    """First layer of each checkpointed segment.

    >>> sorted(segment_starts(9, TrainingConfig(micro_batch=1, seq_len=8, checkpointing="sqrt")))
    [0, 3, 6]
    """
    mode = training.checkpointing
    if mode in ("none", "selective"):
        return set()
    k = {"per-layer": 1, "every-k": training.checkpoint_every or 1,
         "sqrt": sqrt_segment_size(num_layers)}[mode]
    return set(range(0, num_layers, k))


def sqrt_segment_size(num_layers: int) -> int:
    """Layers per segment under 'sqrt' checkpointing: round(sqrt(L)) (Chen et al. 2016, sec. 4).

    >>> sqrt_segment_size(16)
    4
    """
    return max(1, round(math.sqrt(num_layers)))


def optimal_segment_size(model: ModelSpec, training: TrainingConfig) -> int:
    """Layers per checkpointed segment that minimise the steady-state peak for this model and
    step. Chen et al. 2016 (sec. 4.1): with boundary tensors of x bytes and A bytes of saved
    activations per layer, memory ~ (L/k)x + kA is minimal at k = sqrt(L x / A); A is measured
    on the engine (forward peak of 2 layers minus 1), x = b*s*h at the residual dtype, and the
    neighbours of that k are compared exactly. Use it with checkpointing='every-k'.

    >>> k = optimal_segment_size(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=4, seq_len=1024))
    >>> 1 <= k <= 12
    True
    """
    L = model.num_layers
    none = training.with_(checkpointing="none", checkpoint_every=None)
    per_layer = (estimate(model.with_(num_layers=2), none).phases["forward"]
                 - estimate(model.with_(num_layers=1), none).phases["forward"])
    boundary = training.micro_batch * training.seq_len * model.hidden_size * (2 if training.precision == "bf16" else 4)
    guess = max(1, min(L, round(math.sqrt(L * boundary / max(per_layer, 1)))))
    options = sorted({k for k in (guess - 1, guess, guess + 1) if 1 <= k <= L}, reverse=True)
    peaks = {k: estimate(model, training.with_(checkpointing="every-k", checkpoint_every=k)).peak_bytes
             for k in options}
    return min(options, key=lambda k: peaks[k])


def build_graph(model: ModelSpec, training: TrainingConfig) -> tuple[Graph, Ops]:
    """The forward program of the model's implementation."""
    from memcalc.programs import hf_gpt2, hf_llama, ref_gpt2, ref_llama
    from memcalc.tensor_parallel import local_spec

    # FSDP2's MixedPrecisionPolicy: the program runs in bf16 on bf16 parameters (buffers stay fp32)
    mixed = training.fsdp_mixed_precision
    ops = Ops(Graph(), "bf16" if mixed else training.precision, training.device,
              training.tensor_parallel, training.sequence_parallel)
    if mixed:
        ops.buffer_elt = 4
    model = local_spec(model, training.tensor_parallel)
    module = {("hf", "gpt2"): hf_gpt2, ("hf", "llama"): hf_llama,
              ("reference", "gpt2"): ref_gpt2, ("reference", "llama"): ref_llama}[
        (model.implementation, model.family)]
    module.build(ops, model, training, segment_starts(model.num_layers, training))
    return ops.g, ops


class MomentSet:
    """Candidate moments with a fast evaluator: each total is a row of coefficients over the
    monomials b**i * s**j they use, evaluated with plain integer arithmetic (~1 us a moment)."""

    def __init__(self, moments: list[Moment]):
        self.moments = moments
        self.monomials = sorted({mono for m in moments for mono in m.total.terms})
        self.rows = [tuple(m.total.terms.get(mono, 0) for mono in self.monomials) for m in moments]
        self.by_phase = {p: [i for i, m in enumerate(moments) if m.phase == p] for p in PHASES}
        self.fractional = any(not isinstance(c, int) for row in self.rows for c in row)
        self._rounded: dict = {}

    def rounded_totals(self, b: int, s: int, granularity: int) -> list[int]:
        """Totals with every live storage rounded up to `granularity` bytes (the CUDA caching
        allocator hands out multiples of 512 B, c10/cuda/CUDACachingAllocator.cpp round_size).
        Cached per shape: a warm call is a dict lookup.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1),))]).rounded_totals(3, 4, 512)
        [512]
        """
        if granularity <= 1:
            return self.totals(b, s)
        key = (b, s, granularity)
        found = self._rounded.get(key)
        if found is None:
            if len(self._rounded) > 4096:
                self._rounded.clear()
            found = self._rounded[key] = [
                t + sum(n * int(-p.eval(b, s) % granularity) for p, n in m.sizes)
                for t, m in zip(self.totals(b, s), self.moments)]
        return found

    def totals(self, b: int, s: int) -> list[int]:
        """Every moment's bytes at micro_batch b, seq_len s.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {})]).totals(3, 4)
        [24]
        """
        values = [b ** i * s ** j for i, j in self.monomials]
        totals = [sum(c * v for c, v in zip(row, values)) for row in self.rows]
        if self.fractional:  # sequence parallelism: b*s/t tokens, whole when t divides s
            totals = [-(-x // 1) for x in totals]
        return totals


@dataclass
class Candidates:
    """The moments that can set the peak, for the steady state and the first step."""

    steady: list[Moment]
    first: list[Moment]

    def __post_init__(self):
        self.steady_set = MomentSet(self.steady)
        self.first_set = MomentSet(self.first)


_CACHE: dict = {}
_SHAPE_FIELDS = ("micro_batch", "seq_len")


def candidates(model: ModelSpec, training: TrainingConfig) -> Candidates:
    """The simulated candidate moments of (model, training); the shape fields micro_batch and
    seq_len are free symbols, so one simulation serves every shape.

    >>> c = candidates(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> {m.phase for m in c.steady} == {"forward", "backward", "optimizer"}
    True
    """
    key = (model, tuple(v for k, v in training.__dict__.items() if k not in _SHAPE_FIELDS))
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) > 512:
            _CACHE.clear()
        found = _CACHE[key] = _simulate(model, training)
    return found


def _simulate(model: ModelSpec, training: TrainingConfig) -> Candidates:
    constants = {"cublas_workspace": CUBLAS_WORKSPACE_BYTES} if training.device == "cuda" else {}
    distributed = training.data_parallel > 1
    sharded = distributed and training.sharding in ("zero2", "zero3")
    if distributed and not sharded:
        graph, _ = build_graph(model, training)
        constants["ddp_buckets"] = sum(v.size.eval(1, 1) for v in graph.params)

    def run(first_step: bool):
        graph, ops = build_graph(model, training)
        shapes = [(v.size.eval(1, 1) // ops.param_elt, v.rows) for v in graph.params]
        fsdp = None
        if sharded:
            from memcalc.tape.fsdp import Fsdp

            fsdp = Fsdp(graph, training.data_parallel, training.sharding == "zero3", training.device,
                        mixed_precision=training.fsdp_mixed_precision)
            for v in graph.params:
                v.storage.size = Poly()  # counted by Fsdp: padded shards, unsharded copies
        moments = simulate_step(graph, training, ops.param_elt, first_step, constants,
                                not distributed, fsdp)
        master_elt = 4 if training.fsdp_mixed_precision else ops.param_elt  # optimizer's dtype
        return moments, shapes, master_elt

    steady, shapes, elt = run(False)
    first, _, _ = run(True)
    found = Candidates(steady, first)
    found.param_shapes, found.param_elt = shapes, elt
    found.param_bytes = [n * elt for n, _ in shapes]
    return found


@dataclass
class MemoryReport:
    """Predicted memory of one training step.

    >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128))
    >>> r.peak_bytes == max(r.phases.values())
    True
    """

    peak_bytes: int
    first_step_peak_bytes: int
    peak_phase: str
    phases: dict[str, int]
    components: dict[str, int]
    moment: str
    model: ModelSpec = field(repr=False)
    training: TrainingConfig = field(repr=False)
    _candidates: list = field(repr=False, default_factory=list)
    rank_peak_bytes: list = field(default_factory=list)
    """Per-rank steady-state peaks (one entry without data parallelism)."""

    @property
    def expr(self):
        """The steady-state peak as a sympy Max over the candidate moments, in b and s (before
        the CUDA allocator's 512-byte rounding, which `peak_bytes` includes on device cuda)."""
        from memcalc.symbols import b, s
        import sympy

        return sympy.Max(*[m.total.to_sympy(b, s) for m in self._candidates])

    @property
    def peak_gib(self) -> float:
        """The peak in GiB (2**30 bytes)."""
        return self.peak_bytes / GIB

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v / GIB:.3f}" for k, v in self.components.items() if v)
        return (f"MemoryReport(peak={self.peak_gib:.3f} GiB in {self.peak_phase}; {parts} GiB; "
                f"first step {self.first_step_peak_bytes / GIB:.3f} GiB)")


def _check_parallelism(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse what is not modelled yet rather than answer for one process."""
    from memcalc.distributed import SHARDINGS_MODELLED
    from memcalc.errors import NotModelledError
    from memcalc.tensor_parallel import check_tensor_parallel

    check_tensor_parallel(model, training)
    if training.fsdp_mixed_precision and training.data_parallel == 1:
        raise NotModelledError("fsdp_mixed_precision", "FSDP2's MixedPrecisionPolicy on a single "
                               "data-parallel rank is not modelled (measured +1.3%)",
                               "use world_size >= 2 x tensor_parallel")
    tp_and_dp = training.tensor_parallel > 1 and training.data_parallel > 1
    if tp_and_dp and training.sharding in ("none", "zero1"):
        raise NotModelledError("sharding", "data parallelism across tensor-parallel groups is "
                               "modelled with FSDP2 (zero2/zero3) only",
                               "use --sharding zero3 (or zero2), or world_size = tensor_parallel")
    if training.world_size > 1 and training.sharding not in SHARDINGS_MODELLED:
        raise NotModelledError("sharding", f"{training.sharding!r} is not modelled yet",
                               f"use one of {', '.join(SHARDINGS_MODELLED)}")


def estimate(model: ModelSpec, training: TrainingConfig) -> MemoryReport:
    """Predict the peak memory of one training step (per rank when world_size > 1).

    >>> r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=4, seq_len=1024))
    >>> round(r.peak_gib, 1) > 5
    True
    """
    from memcalc.checks import check_step

    check_step(model, training)  # types, memcalc.limits ceilings, what the model can run
    _check_parallelism(model, training)
    cands = candidates(model, training)
    b, s = training.micro_batch, training.seq_len
    if training.data_parallel > 1:
        return _estimate_ranks(model, training, cands, b, s)
    g = allocator_granularity(training)
    steady = cands.steady_set.rounded_totals(b, s, g)
    phases = {p: max((steady[i] for i in idx), default=0) for p, idx in cands.steady_set.by_phase.items()}
    top = max(range(len(steady)), key=steady.__getitem__)
    moment = cands.steady[top]
    components = _components(moment, b, s, steady[top])
    report = MemoryReport(steady[top], max(cands.first_set.rounded_totals(b, s, g)), moment.phase, phases,
                          components, moment.label, model, training, cands.steady)
    report.rank_peak_bytes = [report.peak_bytes] * training.world_size  # TP ranks are alike
    return report


def allocator_granularity(training: TrainingConfig) -> int:
    """Bytes every allocation is rounded up to: 512 for the CUDA caching allocator (kMinBlockSize),
    1 on CPU (validate.tracker counts exact storage bytes)."""
    return 512 if training.device == "cuda" else 1


def _components(moment, b: int, s: int, total: int) -> dict[str, int]:
    """Bytes per category at a moment, with the allocator's rounding as its own component."""
    parts = {k: int(-(-v.eval(b, s) // 1)) for k, v in moment.by_category.items()}
    rounding = total - sum(parts.values())
    if rounding:
        parts["allocator_rounding"] = rounding
    return parts


def _phase_max(moment_set, totals: list[int]) -> dict[str, tuple[int, int]]:
    out = {}
    for phase, idx in moment_set.by_phase.items():
        if idx:
            i = max(idx, key=totals.__getitem__)
            out[phase] = (totals[i], i)
    return out


def _estimate_ranks(model, training, cands, b: int, s: int) -> MemoryReport:
    """Data-parallel ranks: one simulation without the optimizer, then each rank's own
    optimizer states (alive throughout the steady state) and step temporaries."""
    from memcalc.distributed import rank_optimizer_bytes_all

    g = allocator_granularity(training)
    steady = _phase_max(cands.steady_set, cands.steady_set.rounded_totals(b, s, g))
    first = _phase_max(cands.first_set, cands.first_set.rounded_totals(b, s, g))
    reports = []
    for states, temps in rank_optimizer_bytes_all(cands.param_shapes, cands.param_elt, training):
        extra = {"forward": states, "backward": states, "optimizer": states + temps}
        phases = {p: v + extra[p] for p, (v, _) in steady.items()}
        first_peak = max(v + (states + temps if p == "optimizer" else 0) for p, (v, _) in first.items())
        phase = max(phases, key=phases.get)
        moment = cands.steady[steady[phase][1]]
        components = _components(moment, b, s, steady[phase][0])
        components["optimizer"] = components.get("optimizer", 0) + states
        if phase == "optimizer" and temps:
            components["temporaries"] = components.get("temporaries", 0) + temps
        reports.append(MemoryReport(phases[phase], first_peak, phase, phases, components,
                                    moment.label, model, training, cands.steady))
    worst = max(reports, key=lambda r: r.peak_bytes)
    # global rank = dp index * tensor_parallel + tp index (a (dp, tp) mesh, row-major); the
    # ranks of one tensor-parallel group hold the same bytes
    worst.rank_peak_bytes = [r.peak_bytes for r in reports for _ in range(training.tensor_parallel)]
    worst.first_step_peak_bytes = max(r.first_step_peak_bytes for r in reports)
    return worst
