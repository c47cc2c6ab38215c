"""The HF Trainer as a validated client: a transformers.Trainer (use_cpu, synthetic batches, the
TrainingArguments given) runs `steps` optimizer steps under the live-tensor tracker; a
TrainerCallback resets the peak at on_step_begin and reads it at on_pre_optimizer_step and
on_step_end, so a step is measured the way validate.measure.step measures its own runner (after the
Trainer fetched the step's batches: get_batch_samples prefetches all gradient_accumulation_steps
micro-batches and counts num_items_in_batch before on_step_begin).

memcalc's prediction for it is TrainingConfig.from_trainer_args(the same fields).
"""
from __future__ import annotations

import gc
import tempfile
from typing import Callable

import torch

from validate.measure.backends import Measurement, cpu_name
from validate.measure.tracker import LiveTensorTracker

# fields the validator sets whatever the user gives: a CPU run of `steps` steps, no I/O
FORCED = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "logging_strategy": "no",
          "disable_tqdm": True, "dataloader_pin_memory": False, "eval_strategy": "no"}


def synthetic_dataset(training, vocab_size: int, examples: int, seed: int = 0) -> list[dict]:
    """Examples as a tokenizer + collator would give them: input_ids, attention_mask (the last
    pad_tokens 0 when padded) and labels (-100 at padding)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(examples):
        ids = torch.randint(0, vocab_size, (training.seq_len,), generator=g)
        mask = torch.ones_like(ids)
        if training.pad_tokens:
            mask[training.seq_len - training.pad_tokens:] = 0
        labels = ids.clone()
        labels[mask == 0] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def measure_trainer(spec, training, trainer_args: dict, hf_config: dict | None = None,
                    steps: int = 3, seed: int = 0) -> Measurement:
    """Run the Trainer for `steps` optimizer steps; steady-state peak over steps >= 2."""
    data = synthetic_dataset(training, spec.vocab_size, steps * training.micro_batch * training.grad_accum, seed)
    meter, model, description, tracker = run_tracked_trainer(spec, training, hf_config,
                                                              {**trainer_args, "max_steps": steps}, seed,
                                                              make=hf_trainer(data))
    return steady_measurement(meter, model, tracker, f"trainer:{description}")


def steady_measurement(meter, model, tracker, implementation: str) -> Measurement:
    """A Measurement of a tracked Trainer run: the steady-state peak and phases over steps >= 2,
    the first step's apart."""
    result = Measurement(status="ok", backend="cpu", device="cpu", device_name=cpu_name(),
                         implementation=implementation)
    result.peak_bytes = max(s["peak"] for s in meter.steps[1:])
    result.first_step_peak_bytes = meter.steps[0]["peak"]
    result.phases = {p: max(s[p] for s in meter.steps[1:]) for p in ("forward+backward", "optimizer")}
    result.first_step_phases = {p: meter.steps[0][p] for p in ("forward+backward", "optimizer")}
    result.param_dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    result.extra["untracked_tensors"] = tracker.untracked
    return result


def hf_trainer(dataset, data_collator=None) -> Callable:
    """run_tracked_trainer's `make` for a plain transformers.Trainer over `dataset`."""
    def make(model, args, meter):
        import transformers

        return transformers.Trainer(model=model, args=args, train_dataset=dataset,
                                    data_collator=data_collator, callbacks=[meter])
    return make


def run_tracked_trainer(spec, training, hf_config: dict | None, trainer_args: dict, seed: int = 0, *,
                        make: Callable, args_class=None, model_training=None,
                        args_in_tracker: bool = False):
    """Build the arguments (`args_class`, transformers.TrainingArguments by default, from
    `trainer_args` plus FORCED), then inside the live-tensor tracker the model
    (validate.models.hf.build_hf of `model_training`, by default `training` without
    checkpointing: the trainer turns it on) and the trainer (`make(model, args, meter)`: the
    Trainer class, its dataset, collator and callbacks differ by client), and train it with the
    step meter; garbage collection is off while it runs (a collection mid-step frees tensors at
    a time the step does not choose). Return (meter, model, description, tracker), `model` the
    trainer's own (a peft wrapper when it made one).

    The model is built inside the tracker, so its parameters are tracked from their allocation.
    Libraries imported for the first time inside it count their module-level tensors (peft's
    loha layer: two 8 B; bitsandbytes' backends.utils: two 64 B), which a training process
    holds from import, not from the step: sft00 was recorded so (+144 B), before this path
    imported them first.
    With `args_in_tracker` (TRL's configs, as their rows were recorded) the arguments are built
    inside it too.
    """
    import transformers

    from validate.models.hf import build_hf

    transformers.logging.set_verbosity_error()
    args_class = args_class or transformers.TrainingArguments
    model_training = model_training or training.with_(checkpointing="none")
    with tempfile.TemporaryDirectory() as out_dir:
        fields = {**trainer_args, **FORCED, "output_dir": out_dir, "seed": seed}
        args = None if args_in_tracker else args_class(**fields)
        meter = _StepMeter()
        gc.collect()
        gc.disable()
        try:
            with LiveTensorTracker() as tracker:
                meter.tracker = tracker
                torch.manual_seed(seed)
                model, description = build_hf(spec, model_training, hf_config)
                trainer = make(model, args or args_class(**fields), meter)
                model = trainer.model
                trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no log lines
                trainer.train()
        finally:
            gc.enable()
    return meter, model, description, tracker


class _StepMeter:
    """A TrainerCallback (duck-typed: the Trainer calls the hooks it finds) recording each
    optimizer step's peak, before the optimizer step and over the whole step."""

    def __init__(self):
        self.tracker = None
        self.steps: list[dict] = []
        self._current: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None  # the hooks not used here
        raise AttributeError(name)

    def on_step_begin(self, *args, **kwargs):
        self.tracker.mark("step")
        self.tracker.reset_peak()

    def on_pre_optimizer_step(self, *args, **kwargs):
        self._current["forward+backward"] = self.tracker.peak
        self.tracker.mark("optimizer")
        self.tracker.reset_peak()

    def on_step_end(self, *args, **kwargs):
        fb = self._current.pop("forward+backward")
        self.steps.append({"forward+backward": fb, "optimizer": self.tracker.peak,
                           "peak": max(fb, self.tracker.peak)})
