"""The prediction of a measured mixture-of-experts step from the routing each of its micro-steps
measured (validate.models.moe_routing records one routing per forward pass). No torch: scripts/
check_recorded.py predicts recorded rows with it.

memcalc simulates a step's micro-steps under one routing (TrainingConfig.moe_routing): micro-step 0,
with no gradients yet, and micro-step 1, with every gradient held (later ones alike; memcalc.tape.
step.simulate_step). With gradient accumulation the micro-steps of one real step route differently
(attention dropout, different data), and the eager experts' memory follows the routing: each hit
expert's weight-slice gradient is a full-size zero-filled tensor (select_backward) summed out of
place. One micro-step's routing applied to the whole step then predicts a step that did not run
(measured, Qwen2-MoE eager experts fp16-amp every-k, grad_accum 2, fresh sweep seed 6: a first
micro-step routing three experts in the last layer, applied to the second micro-step that routed
one, puts the backward phase 1.58% over; with the same routing in both micro-steps, forced by
seeding the dropout alike, memcalc is within 152 B of five measured steps). So each micro-step is
predicted with its own routing: the first as a step of one micro-step (the same simulation of
micro-step 0), the later ones as memcalc's second micro-step, which holds everything the first does
and the gradients (at any one routing its phases bound the first's).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PHASES = ("forward", "backward", "optimizer")


@dataclass
class StepPrediction:
    """What the validator's row reads of a prediction (validate.run.compare.result_row)."""

    peak_bytes: int
    phases: dict[str, int]
    first_step_peak_bytes: int
    components: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    moment: str = ""


def routing(counts) -> tuple[tuple[int, ...], ...]:
    """One forward pass's counts as TrainingConfig.moe_routing takes them.

    >>> routing([[1, 2], (3, 0)])
    ((1, 2), (3, 0))
    """
    return tuple(tuple(layer) for layer in counts)


def steps_of(passes: list, grad_accum: int) -> list[list]:
    """Consecutive forward passes grouped by optimizer step (grad_accum passes each).

    >>> steps_of(["a", "b", "c", "d"], 2)
    [['a', 'b'], ['c', 'd']]
    """
    return [passes[i:i + grad_accum] for i in range(0, len(passes), grad_accum)]


def predict_step(estimate: Callable, spec, training, passes: list) -> StepPrediction:
    """One optimizer step whose micro-steps routed `passes` (one count list per micro-step), with
    `estimate` (memcalc.estimate): one estimate when they all routed alike (or without
    accumulation), else the first micro-step as a one-micro-step step and each later one as
    memcalc's second micro-step, phase by phase the largest. The HF Trainer path keeps one
    estimate per routing (its held batches depend on grad_accum: memcalc.families.call_path).

    >>> from memcalc import estimate
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="mixtral", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
    ...                       intermediate_size=32, moe=dict(num_experts=2, top_k=1, expert_ffn_size=8))
    >>> t = TrainingConfig(micro_batch=1, seq_len=4, grad_accum=2, experts_implementation="eager", device="cpu")
    >>> alike = predict_step(estimate, spec, t, [[(4, 0)], [(4, 0)]])
    >>> alike.peak_bytes == estimate(spec, t.with_(moe_routing=((4, 0),))).peak_bytes
    True
    >>> mixed = predict_step(estimate, spec, t, [[(2, 2)], [(4, 0)]])
    >>> mixed.peak_bytes <= max(estimate(spec, t.with_(moe_routing=r)).peak_bytes for r in (((2, 2),), ((4, 0),)))
    True
    """
    routings = [routing(p) for p in passes]
    later = [estimate(spec, training.with_(moe_routing=r)) for r in dict.fromkeys(routings[1:] or routings)]
    first = None
    if len(set(routings)) > 1 and not training.hf_trainer:
        first = _one_micro_step(estimate, spec, training.with_(moe_routing=routings[0]))
    if first is None:
        reports = later + ([] if len(set(routings)) == 1 else
                           [estimate(spec, training.with_(moe_routing=routings[0]))])
        best = max(reports, key=lambda r: r.peak_bytes)
        return _of(best, dict(best.phases), best.first_step_peak_bytes)
    phases = {p: max(r.phases[p] for r in later + ([first] if p != "optimizer" else [])) for p in PHASES}
    top = max(phases, key=phases.get)
    source = max(later + ([first] if top != "optimizer" else []), key=lambda r: r.phases[top])
    return _of(source, phases, max(r.first_step_peak_bytes for r in later), top)


def _one_micro_step(estimate: Callable, spec, training):
    """The estimate of the same step with one micro-step, or None where that step is refused
    (then each routing is applied to every micro-step, and the largest is a bound)."""
    from memcalc.core.errors import MemcalcError

    try:
        return estimate(spec, training.with_(grad_accum=1))
    except (MemcalcError, ValueError):
        return None


def _of(report, phases: dict[str, int], first_step: int, phase: str | None = None) -> StepPrediction:
    peak = max(phases.values())
    return StepPrediction(peak, phases, first_step, dict(report.components),
                          phase or report.peak_phase, report.moment)


def predict_steps(estimate: Callable, spec, training, passes: list) -> list[StepPrediction]:
    """predict_step for each optimizer step of the steady passes (grad_accum passes each)."""
    return [predict_step(estimate, spec, training, step) for step in steps_of(passes, training.grad_accum)]
