"""Measure a user's own nn.Module's training step with real tensors on CPU (the reference a
traced program, memcalc.traced, is held to; issue 25).

The model is built by `factory()` or `factory(training)` inside the live-tensor tracker, and run
by validate.measure.step.run_steps: the same step the validator runs for every other model
(token ids drawn at the step's start, forward under autocast for the amp precisions, backward,
clipping, optimizer.step(), zero_grad).
"""
from __future__ import annotations

import gc
import inspect
import time

import torch

from validate.measure.backends import Measurement, TrackerMeter, cpu_name
from validate.measure.step import Trainee, make_optimizer, run_steps
from validate.measure.tracker import LiveTensorTracker


def measure_module(factory, vocab_size, loss, training, steps: int = 3, seed: int = 0) -> Measurement:
    """Steady and first-step peaks of the module's step, measured. `vocab_size`: the token ids'
    vocabulary, or a function (b, s) -> the batch tensor (memcalc.traced.spec.TracedModel.inputs);
    `loss` None: memcalc.traced.runner.default_loss.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> lm = lambda: torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    >>> ce = lambda m, ids: torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    >>> m = measure_module(lm, 16, ce, TrainingConfig(micro_batch=2, seq_len=4, device="cpu"))
    >>> m.peak_bytes > 2 * 4 * (16 * 8 + 8 * 16 + 16)
    True
    """
    if loss is None:
        from memcalc.traced.runner import default_loss as loss
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    try:
        with LiveTensorTracker() as tracker:
            torch.manual_seed(seed)
            model = factory(training) if len(inspect.signature(factory).parameters) else factory()
            if training.precision == "bf16":
                model.to(torch.bfloat16)
            optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], training)
            trainee = Trainee(model, lambda ids: loss(model, ids), optimizer, None, "module")
            run = run_steps(trainee, training, TrackerMeter(tracker), vocab_size, steps)
    finally:
        gc.enable()
    return Measurement(status="ok", backend="cpu", peak_bytes=run.steady.peak,
                       first_step_peak_bytes=run.first.peak, phases=dict(run.steady.phases),
                       first_step_phases=dict(run.first.phases), implementation="module",
                       device="cpu", device_name=cpu_name(), wall_s=round(time.perf_counter() - start, 3))
