"""Pre-flight check: does a training step fit a GPU, and if not, the smallest change that makes
it fit (each with its predicted peak, each checked with estimate()).

Changes are tried from the least to the most intrusive: a smaller micro-batch with more
gradient accumulation (same sequences per optimizer step), per-layer activation checkpointing
(alone, then with the largest micro-batch that fits), bf16 autocast, 8-bit AdamW
(bitsandbytes), SGD instead of AdamW. TODO(merge with branch lora): LoRA.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcalc.queries.capacity import max_micro_batch
from memcalc.core.errors import MemcalcError
from memcalc.queries.estimate import estimate  # noqa: F401 (the doctests use it)
from memcalc.queries.basis import peak_on

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

# TrainingConfig field -> how a TrainingArguments user says it
TRAINER_NAMES = {"micro_batch": "per_device_train_batch_size",
                 "grad_accum": "gradient_accumulation_steps",
                 "checkpointing": "gradient_checkpointing", "precision": "bf16", "optimizer": "optim"}


@dataclass(frozen=True)
class Change:
    """One change to the step, with its predicted peak."""

    fields: dict
    """TrainingConfig fields changed, e.g. {'micro_batch': 2, 'grad_accum': 4}."""
    peak_bytes: int
    why: str

    def trainer_args(self) -> dict:
        """The same change in TrainingArguments fields.

        >>> Change({"checkpointing": "per-layer", "micro_batch": 2}, 0, "").trainer_args()
        {'gradient_checkpointing': True, 'per_device_train_batch_size': 2}
        """
        out = {}
        for name, value in self.fields.items():
            if name == "optimizer_impl":  # the Trainer's optim name says it
                continue
            if name == "checkpointing":
                value = value == "per-layer"
            elif name == "precision":
                value = value in ("bf16-amp", "bf16")
            elif name == "optimizer":  # the Trainer's optim names (memcalc.inputs.trainers.trainer_args.OPTIMS)
                value = {"adamw-8bit": "adamw_bnb_8bit", "sgd": "sgd"}.get(value, value)
            out[TRAINER_NAMES.get(name, name)] = value
        return out


@dataclass(frozen=True)
class Verdict:
    """What `check` found."""

    fits: bool
    peak_bytes: int
    budget_bytes: int
    changes: list[Change] = field(default_factory=list)
    """When it does not fit: the changes that make it fit, least intrusive first."""

    @property
    def headroom_bytes(self) -> int:
        """Budget minus peak (negative when it does not fit)."""
        return self.budget_bytes - self.peak_bytes


def check(model: ModelSpec, training: TrainingConfig, budget: int | float | str, basis: str = "device") -> Verdict:
    """Whether one step fits `budget` (bytes, '24GiB', or a catalogue GPU) on `basis`
    (memcalc.queries.basis: device by default, reserved, or allocated); every peak is on that basis.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> v = check(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=32, seq_len=1024), "RTX-4090")
    >>> v.fits, v.changes[0].fields
    (False, {'micro_batch': 8, 'grad_accum': 4})
    >>> estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=8, seq_len=1024,
    ...          grad_accum=4)).device_bytes <= v.budget_bytes
    True
    """
    ok, peak, budget_bytes = peak_on(model, training, budget, basis)
    if ok:
        return Verdict(True, peak, budget_bytes)
    return Verdict(False, peak, budget_bytes, _changes(model, training, (budget, basis)))


def _changes(model: ModelSpec, training: TrainingConfig, budget: tuple) -> list[Change]:
    found: list[Change] = []
    batch = _smaller_batch(model, training, budget, {})
    if batch:
        found.append(batch)
    if training.checkpointing == "none":
        ckpt = _try(model, training, budget, {"checkpointing": "per-layer"},
                    "per-layer activation checkpointing")
        found += [ckpt] if ckpt else _nonempty(_smaller_batch(model, training, budget,
                                                              {"checkpointing": "per-layer"}))
    if training.precision == "fp32":
        found += _nonempty(_try(model, training, budget, {"precision": "bf16-amp"}, "bf16 autocast"))
    if training.optimizer in ("adam", "adamw"):
        found += _nonempty(_try(model, training, budget, {"optimizer": "adamw-8bit", "optimizer_impl": None},
                                "bitsandbytes 8-bit AdamW states"))
        found += _nonempty(_try(model, training, budget, {"optimizer": "sgd", "optimizer_impl": None},
                                "SGD: no optimizer states (changes the training)"))
    return found


def _nonempty(change: Change | None) -> list[Change]:
    return [change] if change else []


def _try(model: ModelSpec, training: TrainingConfig, budget: tuple, fields: dict, why: str) -> Change | None:
    """The change when the step fits with it; `budget` is (the budget, its basis)."""
    try:
        ok, peak, _ = peak_on(model, training.with_(**fields), *budget)
    except MemcalcError:  # the change is not modelled for this step: not a suggestion
        return None
    return Change(fields, peak, why) if ok else None


def _smaller_batch(model: ModelSpec, training: TrainingConfig, budget: tuple, extra: dict) -> Change | None:
    """The largest micro-batch that fits (with `extra`) and divides the sequences of one
    optimizer step, gradient accumulation raised to keep that number."""
    try:
        cap = max_micro_batch(model, training.with_(**extra), *budget)
    except MemcalcError:
        return None
    total = training.micro_batch * training.grad_accum
    b = max((d for d in range(1, min(cap.value, training.micro_batch) + 1) if total % d == 0), default=0)
    if b == 0 or (b == training.micro_batch and not extra):
        return None
    accum = total // b
    fields = {**extra, "micro_batch": b, "grad_accum": accum}
    peak = peak_on(model, training.with_(**fields), *budget)[1]
    why = (f"micro-batch {b} x {accum} accumulation steps" + (" with " + ", ".join(
        f"{k}={v}" for k, v in extra.items()) if extra else ""))
    return Change(fields, peak, why)
