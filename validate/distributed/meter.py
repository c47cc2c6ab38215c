"""The meter a rank's steps report to (validate.measure.step's meter protocol: reset_peak, peak, mark),
over a validate.distributed.tracker.DistTracker. Besides the peak it keeps, per step and phase, the peak
*with* collective-backend scratch (DistTracker.full_peak) and the op at each phase's peak.

>>> from types import SimpleNamespace as NS
>>> meter = DistMeter(NS(peak=0, full_peak=0, peak_op="", peak_sites={},
...                      reset_peak=lambda: None, mark=lambda label: None))
>>> meter.full_peaks()["peak_bytes_with_scratch"] is None
True
"""
from __future__ import annotations

from validate.measure.step import PHASES


class DistMeter:
    """Meter over a DistTracker; see the module docstring."""

    def __init__(self, tracker) -> None:
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
        if label == "inputs":  # validate.measure.step.train_step marks 'inputs' first in each step
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
                                        PHASES} if steady else {}}


__all__ = ["DistMeter"]
