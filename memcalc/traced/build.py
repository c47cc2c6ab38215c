"""Trace, fit and cache a TracedSpec's candidates per training regime (issue 25).

For a regime (every TrainingConfig field but the shape), the step is traced under FakeTensorMode
(memcalc.traced.runner) at the shapes memcalc.traced.fit names, fitted, checked at shapes not used
to fit, and walked into candidate moments (memcalc.traced.program); one fit serves every shape
with b >= 2, another b = 1. torch is imported by the runner only when a trace is made.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from memcalc.core.errors import NotModelledError
from memcalc.engine.candidates import Candidates
from memcalc.engine.regime import Regime
from memcalc.traced.fit import (B_FIT, CHECK, MONOS_1, MONOS_B, S_FIT, check_aligned, check_fit, fit_sizes,
                                sizes, structure)
from memcalc.traced.program import FittedStep, moments

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig
    from memcalc.inputs.specs import ModelSpec as TracedSpec  # a memcalc.traced.spec.TracedSpec

_CACHE: dict = {}
TRACED_FIELDS = frozenset({"micro_batch", "seq_len", "precision", "checkpointing", "checkpoint_every",
                           "optimizer", "optimizer_impl", "weight_decay", "grad_accum", "max_grad_norm",
                           "device"})
"""The TrainingConfig fields a traced step applies (memcalc.traced.runner); any other field set
away from its default is refused by name."""


def check_traceable(spec: TracedSpec, training: TrainingConfig) -> None:
    """Refuse, by field, what the traced step does not run.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> from memcalc.traced.spec import TracedSpec
    >>> check_traceable(TracedSpec(trace_key="k", vocab_size=8), TrainingConfig(micro_batch=1, seq_len=8,
    ...                 device="cpu", world_size=2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: world_size: a traced model runs ...
    """
    from memcalc.inputs.training import TrainingConfig

    if training.device != "cpu":
        raise NotModelledError("device", "a traced model is traced with CPU kernels only (CUDA's "
                               "kernel choices are not traced yet)", "use --device cpu")
    if training.precision == "fp16-amp":
        raise NotModelledError("precision", "fp16-amp's GradScaler reads its inf check with .item(), "
                               "which FakeTensorMode cannot run", "use bf16-amp, bf16 or fp32")
    default = TrainingConfig(micro_batch=1, seq_len=1, device="cpu")
    for name in TrainingConfig.model_fields:
        if name not in TRACED_FIELDS and getattr(training, name) != getattr(default, name):
            raise NotModelledError(name, f"a traced model runs one process's plain step; {name}="
                                   f"{getattr(training, name)!r} is not traced yet",
                                   f"leave {name} at its default for a traced model")
    if training.checkpointing != "none" and not _takes_training(spec.traced.factory):
        raise NotModelledError("checkpointing", "the factory takes no TrainingConfig, so the model "
                               "cannot apply checkpointing", "write factory(training) and checkpoint "
                               "as training.checkpointing says")


def _takes_training(factory: Callable) -> bool:
    import inspect

    try:
        return len(inspect.signature(factory).parameters) >= 1
    except (TypeError, ValueError):
        return False


def traced_candidates(spec: TracedSpec, training: TrainingConfig) -> Candidates:
    """The candidates of `spec` under `training`, traced once per regime and shape condition."""
    from memcalc.engine.run import regime_key

    check_traceable(spec, training)
    single = training.micro_batch == 1
    key = (spec.trace_key, regime_key(training), single)
    found = _CACHE.get(key)
    if found is None:
        from memcalc.traced import disk

        disk_key = disk.key_of(spec.traced, key[1], single)
        cached = disk.load(disk_key)
        if cached is None:
            step, params = fitted_step(spec, training, single)
            steady, first = moments(step)
            limit = getattr(spec.traced.factory, "seq_limit", None)
            disk.store(disk_key, steady, first, params, limit)
        else:
            steady, first, params, limit = cached
        elt = params[0][2] if params else 4
        found = _CACHE[key] = Candidates(Regime.of(training), steady, first,
                                         [(n, rows) for n, rows, _ in params], elt)
        found.depth, found.seq_limit = None, limit
    check_seq_limit(found.seq_limit, training.seq_len)
    return found


def check_seq_limit(limit: list | None, seq_len: int) -> None:
    """Refuse a sequence longer than a length where the model's step changes and the trace never
    went (memcalc.traced.hf `seq_limit`: a sliding window, an attention chunk, a scan's chunk).

    >>> check_seq_limit(["sliding_window", 4096], 4096)
    >>> check_seq_limit(["sliding_window", 4096], 4097)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: seq_len: past sliding_window=4096 ...
    """
    if limit is not None and seq_len > limit[1]:
        raise NotModelledError("seq_len", f"past {limit[0]}={limit[1]} the model's step changes (a window's "
                               "or a chunk's mask and ops), and the trace (s <= 1040) never went there",
                               f"use seq_len <= {limit[1]}, or a hand-written program (memcalc.families)")


def fitted_step(spec: TracedSpec, training: TrainingConfig, single: bool) -> tuple[FittedStep, list]:
    """Trace at the fitting shapes and the checks, line the streams up, fit and check the sizes."""
    from memcalc.traced.runner import trace_step

    model = spec.traced
    shapes = [(1, s) for s in S_FIT] if single else [(b, s) for b in B_FIT for s in S_FIT]
    checks = [(1, 40)] if single else list(CHECK)
    if model.far_seq_len is not None:  # a size that steps with s (memcalc.traced.spec.TracedModel)
        checks.append((checks[0][0], model.far_seq_len))
    traces = [trace_step(model.factory, training, b, s, model.inputs, model.loss) for b, s in shapes + checks]
    check_aligned([t.events for t in traces], shapes + checks)
    per = [sizes(t.events) for t in traces]
    fit = fit_sizes(per[:len(shapes)], shapes, MONOS_1 if single else MONOS_B)
    for actual, shape in zip(per[len(shapes):], checks):
        check_fit(fit, actual, shape)
    return FittedStep(structure(traces[0].events), fit, traces[0].categories), traces[0].params


def param_count(spec: TracedSpec) -> int:
    """Trainable parameters of the traced model (those its fp32 AdamW step traced)."""
    from memcalc.inputs.training import TrainingConfig

    shapes = traced_candidates(spec, TrainingConfig(micro_batch=2, seq_len=16, device="cpu")).param_shapes
    return sum(n for n, _ in shapes)
