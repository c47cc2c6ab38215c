"""A trl.GRPOTrainer step's phases (memcalc.families.trl_grpo): each phase's peak and the one that
decides: generation (generate's prefill and its last decode step, with a DynamicCache), scoring
(the no-grad old-policy and reference log-prob passes after generation, with the last step's
buffered inputs) and step (the training forward, backward and optimizer step). Each is measured on
its own by the validator (validate.run.trl_run.measure_grpo).
"""
from __future__ import annotations

from dataclasses import dataclass

from memcalc.core.errors import SpecError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig


@dataclass(frozen=True)
class GRPOPhases:
    """Allocated peaks (bytes) of a GRPO step's modelled phases."""

    generation: int | None
    """generate: the larger of the prefill's peak and the last decode step's (`decode_decides`);
    None where the generation phase is refused (`generation_refused` says why)."""
    decode_decides: bool
    """The last decode step (its cache at prompt + completion - 1 tokens) sets the generation
    phase's peak, not the prefill."""
    generation_refused: str = ""
    scoring: int = 0
    """The no-grad passes of _generate_and_score_completions (with neither an old policy nor a
    reference: the buffered inputs and the new prompt and completion tensors only)."""
    step: int = 0
    """The training step: forward, backward and optimizer step on prompt + completion."""

    @property
    def deciding(self) -> str:
        """The phase with the largest peak (the later one on a tie)."""
        peaks = {"generation": self.generation or 0, "scoring": self.scoring, "step": self.step}
        return max(reversed(peaks), key=peaks.get)

    @property
    def peak_bytes(self) -> int:
        """The step's peak: the largest phase's."""
        return max(self.generation or 0, self.scoring, self.step)


def grpo_phases(model: ModelSpec, training: TrainingConfig) -> GRPOPhases:
    """Each modelled phase's peak of a trl='grpo' step.

    >>> t = TrainingConfig.from_trainer_args({"per_device_train_batch_size": 4, "num_generations": 2,
    ...     "max_completion_length": 16, "use_cpu": True, "beta": 0.04}, seq_len=48, trainer="grpo")
    >>> p = grpo_phases(ModelSpec.preset("gpt2").with_(num_layers=2), t)
    >>> p.deciding, p.step > p.scoring > 0, p.generation > 0
    ('step', True, True)
    """
    from memcalc import estimate

    if training.trl != "grpo":
        raise SpecError("trl", f"{training.trl!r}: grpo_phases reads a GRPO step", "pass trl='grpo'")
    from memcalc.core.errors import NotModelledError
    from memcalc.engine.run import candidates

    prompt = training.seq_len - training.grpo_completion_len
    gen_config = training.with_(trl_phase="generation", seq_len=prompt)
    # the no-grad programs' peak is their forward phase (memcalc.families.trl_grpo: no backward)
    scoring = estimate(model, training.with_(trl_phase="scoring")).phases["forward"]
    step = estimate(model, training.with_(trl_phase="step")).peak_bytes
    try:
        forward = [m for m in candidates(model, gen_config).steady if m.phase == "forward"]
    except NotModelledError as err:
        return GRPOPhases(generation=None, decode_decides=False, generation_refused=str(err),
                          scoring=scoring, step=step)
    top = max(forward, key=lambda m: m.total.eval(training.micro_batch, prompt))
    return GRPOPhases(generation=estimate(model, gen_config).phases["forward"],
                      decode_decides=top.label.startswith("cat: the last layer's"),
                      scoring=scoring, step=step)
