"""The measured side of a check inside a run, and its report.

CUDA: torch.cuda.reset_peak_memory_stats at each step's start, max_memory_allocated (what memcalc
predicts: the caching allocator's allocated peak) and max_memory_reserved (the segments it holds)
at its end. CPU: the live-tensor tracker of validate.measure.tracker (the validator's own CPU
backend), entered when the check starts; the model's parameters and buffers and the optimizer's
existing states, made before, are added with track_tensor. Tensors made before the check and
not among those (a dataset already in memory, say) are not counted, as the validator does not
count its host-side data.
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from memcalc.core.units import MIB

LOG = logging.getLogger("memcalc")
WARN_ABOVE = 0.01
"""Relative error above which the comparison warns (1%)."""


class StepMeter:
    """Peak memory of each step, on CUDA or (CPU) through the live-tensor tracker."""

    def __init__(self, device: str):
        self.device = device
        self.tracker = None

    def start(self, tensors: list) -> None:
        """Begin measuring; `tensors` made before (parameters, buffers, states) count on CPU."""
        if self.device == "cuda":
            return
        from validate.measure.tracker import LiveTensorTracker

        self.tracker = LiveTensorTracker()
        self.tracker.__enter__()
        for t in tensors:
            self.tracker.track_tensor(t)

    def track(self, tensors: list) -> None:
        """Count tensors made before the tracker started (CPU; a no-op for counted ones)."""
        if self.tracker is not None:
            for t in tensors:
                self.tracker.track_tensor(t)

    def begin_step(self) -> None:
        """The step starts: its peak is measured from here."""
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        elif self.tracker is not None:
            self.tracker.reset_peak()

    def end_step(self) -> dict:
        """The step's peaks: allocated (and reserved on CUDA), bytes."""
        if self.device == "cuda":
            import torch

            return {"measured_bytes": torch.cuda.max_memory_allocated(),
                    "reserved_bytes": torch.cuda.max_memory_reserved()}
        return {"measured_bytes": self.tracker.peak if self.tracker is not None else 0}

    def stop(self) -> None:
        """Stop measuring (leaves the tracker's dispatch mode)."""
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            self.tracker = None


def tensors_of(model: Any, optimizer: Any = None) -> list:
    """The parameters, buffers and existing optimizer states of a run."""
    import torch

    out = list(model.parameters()) + list(model.buffers())
    for state in getattr(optimizer, "state", {}).values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


@dataclass
class Comparison:
    """Predicted against measured, step by step."""

    model: str
    training: dict
    predicted_peak_bytes: int
    predicted_first_step_peak_bytes: int
    backend: str
    steps: list[dict] = field(default_factory=list)
    warn_above: float = WARN_ABOVE

    def add(self, measured: dict) -> dict:
        """Record one step's measurement; log it, warn above `warn_above`.

        >>> c = Comparison("m", {}, 1000, 900, "cpu"); c.add({"measured_bytes": 900})["error"]
        0.0
        """
        step = len(self.steps) + 1
        predicted = self.predicted_first_step_peak_bytes if step == 1 else self.predicted_peak_bytes
        error = (predicted - measured["measured_bytes"]) / measured["measured_bytes"] \
            if measured["measured_bytes"] else float("inf")
        row = {"step": step, "predicted_bytes": predicted, **measured, "error": error}
        self.steps.append(row)
        reserved = f", reserved {measured['reserved_bytes'] / MIB:.2f} MiB" if "reserved_bytes" in measured else ""
        line = (f"memcalc: step {step}: predicted {predicted / MIB:.2f} MiB, measured "
                f"{measured['measured_bytes'] / MIB:.2f} MiB{reserved} ({self.backend}), error {error:+.4%}")
        LOG.info(line)
        if abs(error) > self.warn_above:
            warnings.warn(f"{line}: above {self.warn_above:.0%}; the run differs from what memcalc "
                          f"was told ({self.model}, {self.training})", RuntimeWarning, stacklevel=2)
        return row

    def steady_state(self) -> dict | None:
        """The validator's steady-state comparison: the largest measured peak of steps >= 2
        against the predicted peak (None before step 2). A step that ends an epoch holds no
        look-ahead batch in the HF Trainer, so it can be below the others by one batch."""
        later = self.steps[1:]
        if not later:
            return None
        measured = max(s["measured_bytes"] for s in later)
        return {"predicted_bytes": self.predicted_peak_bytes, "measured_bytes": measured,
                "error": (self.predicted_peak_bytes - measured) / measured if measured else float("inf")}

    def as_dict(self) -> dict:
        """JSON-ready."""
        return {"steady_state": self.steady_state(), "model": self.model, "training": self.training,
                "backend": self.backend,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "predicted_first_step_peak_bytes": self.predicted_first_step_peak_bytes,
                "steps": self.steps, "worst_error": max((abs(s["error"]) for s in self.steps), default=None)}

    def write(self, path: str | os.PathLike | None) -> None:
        """Write the comparison as JSON to `path` (nothing when None).

        >>> Comparison("m", {}, 1, 1, "cpu").write(None)
        """
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.as_dict(), f, indent=2, sort_keys=True)


def note_overrides(training: Any, live: dict) -> None:
    """Log each field the live objects set to another value than the caller's (nothing silent).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> note_overrides(TrainingConfig(micro_batch=1, seq_len=8, optimizer="sgd"), {"optimizer": "adamw"})
    """
    given = training.model_fields_set
    for name, value in live.items():
        if name in given and getattr(training, name) != value:
            LOG.warning(f"memcalc: {name}={getattr(training, name)!r} given, but the live model or optimizer "
                        f"says {value!r}: predicting with {value!r}")


def predict(model_spec: Any, training: Any, backend: str, warn_above: float = WARN_ABOVE) -> Comparison:
    """The prediction for the run, as an empty Comparison.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> c = predict(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=64, device="cpu"), "cpu-tracker")
    >>> c.predicted_peak_bytes > c.predicted_first_step_peak_bytes > 0, c.steps
    (True, [])
    """
    from memcalc.queries.estimate import estimate

    r = estimate(model_spec, training)
    LOG.info(f"memcalc: predicted peak {r.peak_bytes / MIB:.2f} MiB (first step "
             f"{r.first_step_peak_bytes / MIB:.2f} MiB) for {model_spec.name} with {training}")
    return Comparison(model_spec.name, training.model_dump(mode="json"), r.peak_bytes,
                      r.first_step_peak_bytes, backend, warn_above=warn_above)
