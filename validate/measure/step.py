"""Run training steps exactly as a TrainingConfig says, reporting peaks through a meter.

A meter is anything with `reset_peak()`, `peak() -> int` and `mark(label)` (validate.measure.backends has
one per backend). Step 0 is the warm-up (optimizer state is created lazily there); its peak is the
first-step peak. The steady-state peak is the maximum over the following steps.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from memcalc.core.errors import MemcalcError
from memcalc.inputs.optimizer_args import BNB_OPTIMIZERS, optimizer_kwargs

PHASES = ("forward", "backward", "optimizer")
LOW_DTYPE = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}


@dataclass
class Trainee:
    """A model with its loss function, optimizer and (fp16-amp) grad scaler."""

    model: torch.nn.Module
    loss_fn: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    scaler: object | None
    implementation: str


@dataclass
class StepPeaks:
    """Peak bytes of one optimizer step, overall and per phase."""

    peak: int
    phases: dict[str, int] = field(default_factory=dict)
    skipped: bool = False
    """fp16-amp: GradScaler found inf/NaN gradients and skipped optimizer.step(), so no
    optimizer state was made or updated (torch/amp/grad_scaler.py step/update: the scale backs off)."""


def make_optimizer(params, training) -> torch.optim.Optimizer:
    """The torch.optim optimizer a TrainingConfig names.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> opt = make_optimizer([torch.nn.Parameter(torch.zeros(2))],
    ...                      TrainingConfig(micro_batch=1, seq_len=2, optimizer="adam", device="cpu"))
    >>> type(opt).__name__, opt.defaults["foreach"], opt.defaults["fused"]
    ('Adam', False, False)
    """
    return optimizer_class(training.optimizer)(params, **optimizer_kwargs(training))




def optimizer_class(name: str) -> type:
    """The optimizer class of a memcalc optimizer name (SGD with or without momentum;
    bitsandbytes and transformers imported only when named).

    >>> optimizer_class("sgd-momentum").__name__, optimizer_class("adamw-8bit").__name__
    ('SGD', 'AdamW8bit')
    """
    if name in BNB_OPTIMIZERS:
        import bitsandbytes.optim

        return getattr(bitsandbytes.optim, BNB_OPTIMIZERS[name])
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor
    return {"sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD,
            "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]


def check_runnable(spec, training, trainer_run: bool = False) -> None:
    """Raise MemcalcError for a shape the model cannot run (`trainer_run`: the case runs through
    transformers.Trainer or a TRL trainer, validate.run.trainer_run, not this loop).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> check_runnable(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=4096))
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: seq_len: 4096 exceeds max_position_embeddings=1024; fix: ...
    >>> check_runnable(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8, hf_trainer=True))
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: hf_trainer: the validator's own training loop does not run ...
    """
    if training.seq_len > spec.max_position_embeddings:
        raise MemcalcError("seq_len", f"{training.seq_len} exceeds max_position_embeddings="
                           f"{spec.max_position_embeddings}",
                           "lower --seq-len or raise --max-position-embeddings")
    if training.pad_tokens >= training.seq_len:
        raise MemcalcError("pad_tokens", f"{training.pad_tokens} leaves no token of a "
                           f"{training.seq_len}-token sequence", "use pad_tokens < seq_len")
    if training.hf_trainer and not trainer_run:  # a Trainer case runs validate.run.trainer_run
        raise MemcalcError("hf_trainer", "the validator's own training loop does not run "
                           "transformers.Trainer, so the Trainer's look-ahead batch and loss scalars "
                           "would be missing from the measured step",
                           "give the case trainer_args (a Trainer run) or set hf_trainer=False")
    if training.checkpointing == "every-k" and training.checkpoint_every > spec.num_layers:
        raise MemcalcError("checkpoint_every", f"{training.checkpoint_every} exceeds num_layers="
                           f"{spec.num_layers}", "choose a segment size <= num_layers")


def build_trainee(spec, training, hf_config: dict | None = None, seed: int = 0) -> Trainee:
    """Model, loss, optimizer and scaler on training.device (call inside the meter's context,
    so that parameters and buffers are counted).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=50, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> build_trainee(spec, TrainingConfig(micro_batch=1, seq_len=4, device="cpu")).implementation
    'reference:ReferenceGPT2:sdpa'
    """
    check_runnable(spec, training)
    torch.manual_seed(seed)
    with torch.device(training.device):
        model, description, loss_fn = _build_model(spec, training, hf_config)
    if training.precision == "bf16":
        model.to(torch.bfloat16)
    params = model.parameters()
    if training.lora is not None or training.freeze:
        from validate.models.finetune import apply_finetuning, trainable_parameters

        params = trainable_parameters(apply_finetuning(model, training))  # adapts `model` in place
    optimizer = make_optimizer(params, training)
    scaler = torch.amp.GradScaler(training.device) if training.precision == "fp16-amp" else None
    return Trainee(model, loss_fn, optimizer, scaler, description)


def _build_model(spec, training, hf_config):
    if spec.implementation == "hf" or hf_config is not None:
        from validate.models.hf import build_hf

        model, description = build_hf(spec, training, hf_config)
        return model, description, lambda ids, **batch: model(**hf_call_kwargs(training, ids, batch)).loss
    from validate.models.reference import build_reference

    model = build_reference(spec, training)
    description = f"reference:{type(model).__name__}:{training.resolved_attention(spec)}"
    return model, description, lambda ids: model(ids, ids)


def _autocast(training):
    dtype = LOW_DTYPE.get(training.precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(training.device, dtype=dtype)


def _phase(meter, name: str, peaks: dict, fn):
    meter.mark(name)
    meter.reset_peak()
    out = fn()
    peaks[name] = max(peaks.get(name, 0), meter.peak())
    return out


def train_step(trainee: Trainee, training, meter, vocab_size: int) -> StepPeaks:
    """One optimizer step (grad_accum micro-steps), peaks read from `meter`."""
    if hasattr(meter, "begin_step"):
        meter.begin_step()
    meter.mark("inputs")
    meter.reset_peak()
    if callable(vocab_size):  # a traced module's own batch (validate.measure.module): (b, s) -> tensor
        ids = vocab_size(training.micro_batch, training.seq_len)
    else:
        ids = torch.randint(0, vocab_size, (training.micro_batch, training.seq_len), device=training.device)
    batch = call_path_batch(training, ids)  # attention_mask, labels, num_items_in_batch
    peaks = {"inputs": meter.peak()}
    for _ in range(training.grad_accum):
        # the closures read `ids` and `loss` as cells, so `del loss` frees the loss (ruff's F821
        # does not see the names through the later `del`)
        loss = _phase(meter, "forward", peaks, lambda: _forward(trainee, training, ids, batch))  # noqa: F821
        _phase(meter, "backward", peaks, lambda: _backward(trainee, loss))  # noqa: F821
        del loss
    skipped = _phase(meter, "optimizer", peaks, lambda: _optimizer_step(trainee, training))
    del ids, batch
    return StepPeaks(peak=max(peaks.values()), phases={p: peaks[p] for p in PHASES}, skipped=skipped)


def _forward(trainee, training, ids, batch):
    with _autocast(training):
        loss = trainee.loss_fn(ids, **batch)
        if training.grad_accum > 1:
            loss = loss / training.grad_accum
    return loss


def _backward(trainee, loss) -> None:
    (trainee.scaler.scale(loss) if trainee.scaler is not None else loss).backward()


def _optimizer_step(trainee, training) -> bool:
    """optimizer.step() (through the GradScaler under fp16-amp) and zero_grad; whether the
    scaler skipped the step (its scale backed off: inf/NaN gradients)."""
    skipped = False
    if training.max_grad_norm is not None:  # the HF Trainer's order (trainer.py _clip_grad_norm)
        if trainee.scaler is not None:
            trainee.scaler.unscale_(trainee.optimizer)
        torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), training.max_grad_norm)
    if trainee.scaler is not None:
        before = trainee.scaler.get_scale()
        trainee.scaler.step(trainee.optimizer)
        trainee.scaler.update()
        skipped = trainee.scaler.get_scale() < before
    else:
        trainee.optimizer.step()
    trainee.optimizer.zero_grad(set_to_none=True)
    return skipped


# ---- the HF call path (TrainingConfig.use_cache, attention_mask, labels, num_items_in_batch) ---
def call_path_batch(training, ids) -> dict:
    """The batch tensors besides input_ids, made before the step as a data collator would: an
    int64 attention_mask (ones, or the last pad_tokens of each sequence 0), a labels copy with
    -100 at the first position and at padding, num_items_in_batch = count of labels != -100.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> tc = TrainingConfig(micro_batch=1, seq_len=4, attention_mask="padded", pad_tokens=1,
    ...                     labels="separate", num_items_in_batch=True)
    >>> b = call_path_batch(tc, torch.arange(4).view(1, 4))
    >>> b["attention_mask"].tolist(), b["labels"].tolist(), int(b["num_items_in_batch"])
    ([[1, 1, 1, 0]], [[-100, 1, 2, -100]], 2)
    """
    batch = {}
    if training.attention_mask != "none":
        mask = torch.ones_like(ids)
        if training.pad_tokens:
            mask[:, training.seq_len - training.pad_tokens:] = 0
        batch["attention_mask"] = mask
    labels = ids
    if training.labels == "separate":
        labels = ids.clone()
        labels[:, 0] = -100
        if "attention_mask" in batch:
            labels[batch["attention_mask"] == 0] = -100
        batch["labels"] = labels
    if training.num_items_in_batch:
        batch["num_items_in_batch"] = (labels != -100).sum()
    return batch


def hf_call_kwargs(training, ids, batch: dict) -> dict:
    """model(**kwargs) for the configured call path: use_cache=False unless use_cache (HF's
    default then applies), labels=input_ids unless a labels tensor is in the batch.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> sorted(hf_call_kwargs(TrainingConfig(micro_batch=1, seq_len=4), "ids", {}))
    ['input_ids', 'labels', 'use_cache']
    """
    kwargs = {"input_ids": ids, "labels": ids, **batch}
    if not training.use_cache:
        kwargs["use_cache"] = False
    return kwargs


@dataclass
class RunPeaks:
    """First-step and steady-state peaks of a run of steps."""

    first: StepPeaks
    steady: StepPeaks
    steps: list[StepPeaks]


def run_steps(trainee: Trainee, training, meter, vocab_size: int, steps: int = 3) -> RunPeaks:
    """Warm-up step + (steps - 1) steady-state steps; steady peaks are maxima over steps >= 2.
    Steps the fp16 GradScaler skipped (inf/NaN gradients: no optimizer state made or updated)
    are not counted: the run goes on until `steps` steps were taken, or fails after
    MAX_SKIPPED skipped ones (that is not the step memcalc predicts).

    >>> class Null:
    ...     def reset_peak(self): pass
    ...     def peak(self): return 0
    ...     def mark(self, label): pass
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=50, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> tc = TrainingConfig(micro_batch=1, seq_len=4, device="cpu")
    >>> run_steps(build_trainee(spec, tc), tc, Null(), 50).steady.peak
    0
    """
    if steps < 2:
        raise MemcalcError("steps", f"need >= 2 steps, got {steps}", "pass steps=3")
    trainee.model.train()
    done, taken = [], []
    while len(taken) < steps:
        done.append(train_step(trainee, training, meter, vocab_size))
        if not done[-1].skipped:
            taken.append(done[-1])
        elif len(done) - len(taken) > MAX_SKIPPED:
            raise MemcalcError("precision", f"fp16-amp: the GradScaler skipped {len(done) - len(taken)} "
                               "optimizer steps (inf/NaN gradients), so no step ran as memcalc predicts it",
                               "validate this model with bf16-amp or fp32")
    steady = taken[1:]
    phases = {p: max(s.phases[p] for s in steady) for p in PHASES}
    return RunPeaks(first=taken[0], steady=StepPeaks(max(s.peak for s in steady), phases), steps=done)


MAX_SKIPPED = 20
"""Skipped fp16 steps run_steps tolerates: the scale halves at each (65536 -> 2**-4)."""
