"""The pipeline layouts of the cluster planner (memcalc.queries.cluster): where the model's stages
are modelled (memcalc.refusals.pipeline.check_pipeline_supported: the untied reference
GPT-2 and Llama, pipeline ranks alone, fp32 or pure bf16), p = N ranks each
run a stage of every micro-batch under GPipe, 1F1B or Interleaved1F1B (2 stages per rank), the
global batch split into m micro-batches of every size that divides it, with each of the planner's
checkpointing modes a stage models (none, per-layer, selective).

Memory is each rank's steady-state peak (memcalc.estimate, allocated basis: the caching
allocator's replay of a pipeline rank is not modelled, so plan_cluster searches these on the
allocated basis only). Time (memcalc.queries.step_time): the busiest rank's compute (its share of
the layers, the LM head on the last), times 1 + the schedule's bubble; the stage-to-stage sends
(b*s*h per micro-batch each way) are not in the time model.

    >>> import memcalc
    >>> spec = memcalc.ModelSpec.make(family="gpt2", vocab_size=96, hidden_size=32, num_layers=4, num_heads=2,
    ...                               implementation="reference", tie_embeddings=False)
    >>> t = memcalc.TrainingConfig(micro_batch=1, seq_len=16, precision="fp32")
    >>> plans = memcalc.plan_cluster(spec, t, gpus="2xA100-80GB", global_batch=8, basis="allocated")
    >>> sorted({(x.pipeline_parallel, x.pipeline_schedule) for x in plans if x.pipeline_parallel > 1})
    [(2, '1f1b'), (2, 'gpipe'), (2, 'interleaved-1f1b')]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.core.errors import MemcalcError
from memcalc.queries.step_time import StepTime

if TYPE_CHECKING:
    from memcalc.inputs.gpus import GPU
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2))
"""(schedule, stages per rank) searched."""
STAGE_CHECKPOINTING = ("none", "per-layer", "selective")
"""The checkpointing modes a stage models (memcalc.parallel.stages)."""


@dataclass(frozen=True)
class PipelineFit:
    """A pipeline layout that fits (memcalc.queries.cluster makes its Layout)."""

    training: TrainingConfig
    """The step: world_size = pipeline_parallel, the schedule, micro_batch = the global batch."""
    sequences: int
    """Sequences per micro-batch."""
    rank_peak_bytes: list[int]
    step: StepTime
    flops_per_gpu: int


def pipeline_layouts(model: ModelSpec, training: TrainingConfig, count: int, card: GPU, budget: int,
                     global_batch: int, precisions: tuple[str, ...], utilisation: float,
                     checkpointing: tuple[str, ...] = ("none",)) -> list[PipelineFit]:
    """Every pipeline layout of `count` ranks of `card` whose every rank fits `budget` (module
    docstring); none where the model's stages are not modelled."""
    from memcalc.refusals.pipeline import check_pipeline_supported
    from memcalc.queries.estimate import estimate

    p = count
    out = []
    for precision in precisions:
        peak_tflops = card.tflops(precision)
        if peak_tflops is None or p < 2 or _receive_floor(model, training, global_batch, precision) > budget:
            continue
        for (schedule, v), mode in ((x, c) for x in SCHEDULES for c in checkpointing if c in STAGE_CHECKPOINTING):
            for b in (k for k in range(1, global_batch + 1) if global_batch % k == 0):
                m = global_batch // b
                t = training.with_(world_size=p, pipeline_parallel=p, pipeline_schedule=schedule,
                                   num_microbatches=m, pipeline_stages_per_rank=v, precision=precision,
                                   micro_batch=global_batch, grad_accum=1, checkpointing=mode,
                                   checkpoint_every=None)
                try:
                    check_pipeline_supported(model, t)
                    ranks = estimate(model, t).rank_peak_bytes
                except MemcalcError:
                    continue  # a layout the engine refuses (named by memcalc.estimate) is not searched
                if max(ranks) <= budget:
                    out.append(_fit(model, t, ranks, b, peak_tflops * 1e12 * utilisation))
    return out


def _receive_floor(model: ModelSpec, training: TrainingConfig, global_batch: int, precision: str) -> int:
    """What a later stage's rank holds whatever the split, schedule or micro-batch size: one
    receive buffer per micro-batch, kept across steps (PipelineStage._prepare_forward_infra), the
    m micro-batches together the whole batch's hidden states (global_batch * s * h, in bf16 under
    pure bf16, else fp32). A precision whose floor exceeds the budget is not searched.

    >>> import memcalc
    >>> spec = memcalc.ModelSpec.preset("llama-3-70b")
    >>> _receive_floor(spec, memcalc.TrainingConfig(micro_batch=1, seq_len=8192), 1024, "bf16") // 2**30
    128
    """
    return global_batch * training.seq_len * model.hidden_size * (2 if precision == "bf16" else 4)


def _fit(model: ModelSpec, t: TrainingConfig, ranks: list[int], b: int, flops_per_s: float) -> PipelineFit:
    """A pipeline step's time: the busiest rank's compute and the schedule's bubble (no tensor- or
    data-parallel collectives; the stage-to-stage sends are not in the time model)."""
    from memcalc.parallel.pipeline import stage_layers
    from memcalc.queries.step_time import bubble_fraction, layer_and_head_flops

    p, v, m = t.pipeline_parallel, t.pipeline_stages_per_rank, t.num_microbatches
    layers, head = layer_and_head_flops(model, t.micro_batch * t.seq_len, t.seq_len, t.checkpointing)
    parts = stage_layers(model.num_layers, p * v, t.stage_boundaries)
    per_rank = [sum(len(parts[s]) for s in range(r, p * v, p)) for r in range(p)]
    busiest = max(layers * n // model.num_layers + (head if r == p - 1 else 0) for r, n in enumerate(per_rank))
    compute = busiest / flops_per_s
    step = StepTime(compute_s=compute, bubble_s=compute * bubble_fraction(t.pipeline_schedule, p, m, v),
                    tp_comm_s=0.0, dp_comm_s=0.0)
    return PipelineFit(t, b, ranks, step, busiest)


__all__ = ["PipelineFit", "pipeline_layouts", "SCHEDULES", "STAGE_CHECKPOINTING"]
