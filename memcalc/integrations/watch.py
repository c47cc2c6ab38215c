"""memcalc.watch: memcalc's prediction checked inside a plain PyTorch training loop.

    with memcalc.watch(model, optimizer, training={"micro_batch": 4, "seq_len": 512},
                       json_path="memcheck.json") as comparison:
        for ids in batches:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

The prediction is made on entry from the live model (its config, dtype, peft adapters,
quantization, gradient checkpointing: memcalc.integrations.live), the live optimizer (class,
foreach/fused, weight decay) and `training` (the rest: micro_batch, seq_len, grad_accum,
precision under autocast, max_grad_norm, the call path...). A step ends when optimizer.step()
returns (a post-hook), so step k's peak covers everything from the end of step k-1 (the first:
from entry) to the end of step k: the loop above is the step memcalc models (validate.measure.step:
the batch made inside the step, the model output dropped after .loss, zero_grad(set_to_none)).
The first `steps` steps are measured (CUDA: max_memory_allocated and max_memory_reserved; CPU:
the validator's live-tensor tracker), logged against the prediction with the error, with a
warning above `warn_above`; the comparison is written as JSON to `json_path` on exit.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from memcalc.core.errors import SpecError
from memcalc.integrations.live import model_fields, optimizer_fields, spec_of
from memcalc.integrations.meter import WARN_ABOVE, Comparison, StepMeter, note_overrides, predict, tensors_of


@contextlib.contextmanager
def watch(model: Any, optimizer: Any, training: Any, steps: int = 3, json_path: str | None = None,
          warn_above: float = WARN_ABOVE, model_spec: Any = None) -> Iterator[Comparison]:
    """Predict the step's peak, then compare it with the first `steps` optimizer steps (module
    docstring). `training`: a TrainingConfig or a dict of its fields (micro_batch and seq_len at
    least); the live model and optimizer override what they decide."""
    from memcalc.inputs.training import TrainingConfig

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SpecError("steps", f"{steps!r} is not an integer >= 1", "pass steps=3")
    if isinstance(training, dict):
        training = TrainingConfig.make(**training)
    if not isinstance(training, TrainingConfig):
        raise SpecError("training", f"expected a TrainingConfig or a dict, got {type(training).__name__}",
                        "pass training={'micro_batch': 4, 'seq_len': 512, ...}")
    live = {**model_fields(model), **optimizer_fields(optimizer)}
    note_overrides(training, live)
    training = training.with_(**live)
    comparison = predict(model_spec or spec_of(model), training,
                         "cuda" if training.device == "cuda" else "cpu-tracker", warn_above)
    meter = StepMeter(training.device)
    meter.start(tensors_of(model, optimizer))
    state = {"handle": None}

    def after_step(*_args: Any) -> None:
        comparison.add(meter.end_step())
        if len(comparison.steps) >= steps:
            state["handle"].remove()
            meter.stop()
        else:
            meter.begin_step()

    state["handle"] = optimizer.register_step_post_hook(after_step)
    meter.begin_step()
    try:
        yield comparison
    finally:
        state["handle"].remove()
        meter.stop()
        comparison.write(json_path)
