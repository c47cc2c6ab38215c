"""MemoryCheckCallback: memcalc's prediction checked inside a transformers.Trainer run.

At the start of training the callback predicts the step's peak from the live objects: the model's
config (ModelSpec.from_hf_config), the Trainer's arguments (TrainingConfig.from_trainer_args) and
what the model itself says (pure bf16 weights, peft LoRA adapters via LoRA.from_peft_config,
bitsandbytes quantization: memcalc.integrations.live). After each of the first `steps` optimizer
steps it reads the measured peak (CUDA: max_memory_allocated and max_memory_reserved; CPU: the
validator's live-tensor tracker, started at the end of Trainer.__init__ so that the Trainer's own
tensors are seen), logs predicted against measured with the error (logger "memcalc"), warns above
`warn_above`, and writes the comparison as JSON to `json_path` when given.

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[MemoryCheckCallback(seq_len=2048, json_path="memcheck.json")])

The first step is compared with the first-step peak (optimizer states made lazily), the later
ones with the steady-state peak. transformers is imported here only (never by the engine).
"""
from __future__ import annotations

import logging
from typing import Any

from memcalc.core.errors import MemcalcError, SpecError
from memcalc.integrations.live import model_fields, optimizer_fields, spec_of
from memcalc.integrations.meter import WARN_ABOVE, Comparison, StepMeter, note_overrides, predict, tensors_of

try:
    from transformers import TrainerCallback as _Base
except ImportError:  # the engine runs without transformers; the callback needs it
    _Base = object

LOG = logging.getLogger("memcalc")


class MemoryCheckCallback(_Base):
    """Predicted against measured peak of the first `steps` optimizer steps of a Trainer run.

    `seq_len`: tokens per sequence (default: the length of the training set's first input_ids);
    `attention_mask` / `pad_tokens`: what the data collator passes (see
    TrainingConfig.from_trainer_args); `model_spec`: a ModelSpec instead of the model's config.
    After training, `comparison` holds the result (memcalc.integrations.meter.Comparison).
    """

    def __init__(self, seq_len: int | None = None, steps: int = 3, json_path: str | None = None,
                 warn_above: float = WARN_ABOVE, attention_mask: str = "ones", pad_tokens: int = 0,
                 model_spec: Any = None):
        if _Base is object:
            raise MemcalcError("MemoryCheckCallback", "needs transformers", "pip install transformers")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise SpecError("steps", f"{steps!r} is not an integer >= 1", "pass steps=3")
        self.seq_len, self.steps, self.json_path, self.warn_above = seq_len, steps, json_path, warn_above
        self.attention_mask, self.pad_tokens, self.model_spec = attention_mask, pad_tokens, model_spec
        self.meter: StepMeter | None = None
        self.comparison: Comparison | None = None
        self._done = False

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Start measuring (CPU: the tracker sees what the Trainer makes from here on)."""
        if model is not None and self.meter is None:
            self.meter = StepMeter(_device(args, model))
            self.meter.start(tensors_of(model))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        """Predict the peak for this run. A run memcalc cannot predict (a refusal, named) is logged
        and left alone: the callback never stops the user's training."""
        if self.comparison is not None or self._done:
            return
        try:
            self._predict(args, model, optimizer, train_dataloader)
        except MemcalcError as err:
            LOG.error(f"memcalc: no check for this run: {err}")
            self._finish()

    def _predict(self, args: Any, model: Any, optimizer: Any, train_dataloader: Any) -> None:
        from memcalc.inputs.training import TrainingConfig

        device = _device(args, model)
        seq_len = self.seq_len or _seq_len(train_dataloader)
        training = TrainingConfig.from_trainer_args(args, seq_len=seq_len, device=device,
                                                    attention_mask=self.attention_mask,
                                                    pad_tokens=self.pad_tokens)
        live = _live(model, optimizer)
        note_overrides(training, live)
        training = training.with_(**live)
        spec = self.model_spec or spec_of(model)
        self.comparison = predict(spec, training, "cuda" if device == "cuda" else "cpu-tracker", self.warn_above)
        if self.meter is None:  # added after Trainer.__init__: starts now
            self.meter = StepMeter(device)
            self.meter.start([])
        self.meter.track(tensors_of(model, optimizer))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A step starts: reset the peak."""
        if self.comparison is not None and not self._done:
            self.meter.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A step ended: compare; after `steps` steps stop measuring and write the JSON."""
        if self.comparison is None or self._done:
            return
        self.comparison.add(self.meter.end_step())
        if len(self.comparison.steps) >= self.steps:
            self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training ended before `steps` steps: stop and write what was measured."""
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        if self.meter is not None:
            self.meter.stop()
        if self.comparison is not None:
            self.comparison.write(self.json_path)


def _device(args: Any, model: Any) -> str:
    if getattr(args, "use_cpu", False):
        return "cpu"
    param = next(iter(model.parameters()), None) if model is not None else None
    return "cuda" if param is not None and param.device.type == "cuda" else "cpu"


def _seq_len(loader: Any) -> int:
    """The first training example's length (the data collator may pad: pass seq_len then)."""
    try:
        return len(loader.dataset[0]["input_ids"])
    except (AttributeError, TypeError, KeyError, IndexError):
        raise SpecError("seq_len", "cannot read the sequence length from the training set",
                        "pass MemoryCheckCallback(seq_len=N)") from None


def _live(model: Any, optimizer: Any) -> dict:
    """What the live model and optimizer change in the Trainer's TrainingConfig: pure bf16
    weights, adapters, quantization; a custom optimizer's class and implementation (the weight
    decay stays the Trainer's: it puts it on its parameter groups, not in the defaults)."""
    fields = model_fields(model)
    fields.pop("device")
    if optimizer is not None:  # accelerate's AcceleratedOptimizer wraps the torch one
        opt = optimizer_fields(getattr(optimizer, "optimizer", optimizer))
        fields.update({k: v for k, v in opt.items() if k != "weight_decay"})
    if "lora" in fields or "quantization" in fields:
        # refusals.finetune: the Trainer's own tensors are measured on full training only
        LOG.warning("memcalc: LoRA/quantized model: predicted without the HF Trainer's own tensors "
                    "(held batches, loss scalars), which memcalc models on full training only")
        fields["hf_trainer"] = False
    return fields
