"""Three quick reads of a step's candidates (memcalc.engine.run): its steady-state peak, its
candidate totals in b and s, and its most activation memory (no report built; memcalc.queries.estimate
builds the full one).
"""
from __future__ import annotations

from memcalc.core.poly import ZERO, Poly
from memcalc.engine.run import candidates
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig


def estimate_peak(model: ModelSpec, training: TrainingConfig) -> int:
    """The steady-state peak of a single-process step, from the cached candidates (no report
    built; per-rank peaks need memcalc.estimate).

    >>> t = TrainingConfig(micro_batch=2, seq_len=64, device="cpu")
    >>> gpt2 = ModelSpec.preset("gpt2")
    >>> estimate_peak(gpt2, t) == max(p.eval(2, 64) for p in steady_polys(gpt2, t))
    True
    """
    c = candidates(model, training)
    return max(c.steady_set.rounded_totals(training.micro_batch, training.seq_len))


def steady_polys(model: ModelSpec, training: TrainingConfig) -> list[Poly]:
    """The steady-state candidate totals in b and s (before the allocator's rounding).

    >>> polys = steady_polys(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> all(p.eval(1, 8) > 0 for p in polys)
    True
    """
    return [m.total for m in candidates(model, training).steady]


def activation_peak_bytes(model: ModelSpec, training: TrainingConfig) -> int:
    """The most activation memory alive at any candidate moment of the steady-state step.

    >>> t = TrainingConfig(micro_batch=1, seq_len=128)
    >>> m = ModelSpec.preset("gpt2")
    >>> activation_peak_bytes(m, t.with_(checkpointing="per-layer")) < activation_peak_bytes(m, t)
    True
    """
    b, s = training.micro_batch, training.seq_len
    return max(m.by_category.get("activations", ZERO).eval(b, s)
               for m in candidates(model, training).steady)
