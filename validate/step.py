"""Run training steps exactly as a TrainingConfig says, reporting peaks through a meter.

A meter is anything with `reset_peak()`, `peak() -> int` and `mark(label)` (validate.measure has
one per backend). Step 0 is the warm-up (optimizer state is created lazily there); its peak is the
first-step peak. The steady-state peak is the maximum over the following steps.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from memcalc.errors import MemcalcError

PHASES = ("forward", "backward", "optimizer")
LR = 1e-3  # any value: the learning rate changes no tensor sizes
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


def optimizer_kwargs(training) -> dict:
    """Keyword arguments for the torch.optim class, implementation flags included.

    >>> from memcalc.training import TrainingConfig
    >>> optimizer_kwargs(TrainingConfig(micro_batch=1, seq_len=2, optimizer="sgd-momentum",
    ...                                 optimizer_impl="fused"))
    {'lr': 0.001, 'weight_decay': 0.0, 'momentum': 0.9, 'foreach': False, 'fused': True}
    """
    if training.optimizer == "adafactor":  # its defaults: relative step, so no lr
        return {"weight_decay": training.resolved_weight_decay}
    kwargs = {"lr": LR, "weight_decay": training.resolved_weight_decay}
    if training.optimizer in BNB_OPTIMIZERS:  # one implementation: no foreach/fused flags
        return kwargs
    if training.optimizer.startswith("sgd"):
        kwargs["momentum"] = 0.9 if training.optimizer == "sgd-momentum" else 0.0
    impl = training.resolved_optimizer_impl
    kwargs["foreach"] = impl == "foreach"
    kwargs["fused"] = impl == "fused"
    return kwargs


def make_optimizer(params, training) -> torch.optim.Optimizer:
    """The torch.optim optimizer a TrainingConfig names.

    >>> from memcalc.training import TrainingConfig
    >>> opt = make_optimizer([torch.nn.Parameter(torch.zeros(2))],
    ...                      TrainingConfig(micro_batch=1, seq_len=2, optimizer="adam", device="cpu"))
    >>> type(opt).__name__, opt.defaults["foreach"], opt.defaults["fused"]
    ('Adam', False, False)
    """
    return optimizer_class(training.optimizer)(params, **optimizer_kwargs(training))


BNB_OPTIMIZERS = {"adamw-8bit": "AdamW8bit", "paged-adamw-8bit": "PagedAdamW8bit",
                  "paged-adamw": "PagedAdamW"}  # bitsandbytes.optim class names


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


def check_runnable(spec, training) -> None:
    """Raise MemcalcError for a shape the model cannot run.

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> check_runnable(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=4096))
    Traceback (most recent call last):
    ...
    memcalc.errors.MemcalcError: seq_len: 4096 exceeds max_position_embeddings=1024; fix: ...
    """
    if training.seq_len > spec.max_position_embeddings:
        raise MemcalcError("seq_len", f"{training.seq_len} exceeds max_position_embeddings="
                           f"{spec.max_position_embeddings}",
                           "lower --seq-len or raise --max-position-embeddings")
    if training.checkpointing == "every-k" and training.checkpoint_every > spec.num_layers:
        raise MemcalcError("checkpoint_every", f"{training.checkpoint_every} exceeds num_layers="
                           f"{spec.num_layers}", "choose a segment size <= num_layers")


def build_trainee(spec, training, hf_config: dict | None = None, seed: int = 0) -> Trainee:
    """Model, loss, optimizer and scaler on training.device (call inside the meter's context,
    so that parameters and buffers are counted).

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
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
    optimizer = make_optimizer(model.parameters(), training)
    scaler = torch.amp.GradScaler(training.device) if training.precision == "fp16-amp" else None
    return Trainee(model, loss_fn, optimizer, scaler, description)


def _build_model(spec, training, hf_config):
    if spec.implementation == "hf" or hf_config is not None:
        from validate.hf import build_hf

        model, description = build_hf(spec, training, hf_config)
        return model, description, lambda ids: model(input_ids=ids, labels=ids, use_cache=False).loss
    from validate.models import build_reference

    model = build_reference(spec, training)
    description = f"reference:{type(model).__name__}:{training.attention}"
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
    ids = torch.randint(0, vocab_size, (training.micro_batch, training.seq_len),
                        device=training.device)
    peaks = {"inputs": meter.peak()}
    for _ in range(training.grad_accum):
        # the closures read `ids` and `loss` as cells, so `del loss` frees the loss (ruff's F821
        # does not see the names through the later `del`)
        loss = _phase(meter, "forward", peaks, lambda: _forward(trainee, training, ids))  # noqa: F821
        _phase(meter, "backward", peaks, lambda: _backward(trainee, loss))  # noqa: F821
        del loss
    _phase(meter, "optimizer", peaks, lambda: _optimizer_step(trainee, training))
    del ids
    return StepPeaks(peak=max(peaks.values()), phases={p: peaks[p] for p in PHASES})


def _forward(trainee, training, ids):
    with _autocast(training):
        loss = trainee.loss_fn(ids)
        if training.grad_accum > 1:
            loss = loss / training.grad_accum
    return loss


def _backward(trainee, loss) -> None:
    (trainee.scaler.scale(loss) if trainee.scaler is not None else loss).backward()


def _optimizer_step(trainee, training) -> None:
    if training.max_grad_norm is not None:  # the HF Trainer's order (trainer.py _clip_grad_norm)
        if trainee.scaler is not None:
            trainee.scaler.unscale_(trainee.optimizer)
        torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), training.max_grad_norm)
    if trainee.scaler is not None:
        trainee.scaler.step(trainee.optimizer)
        trainee.scaler.update()
    else:
        trainee.optimizer.step()
    trainee.optimizer.zero_grad(set_to_none=True)


@dataclass
class RunPeaks:
    """First-step and steady-state peaks of a run of steps."""

    first: StepPeaks
    steady: StepPeaks
    steps: list[StepPeaks]


def run_steps(trainee: Trainee, training, meter, vocab_size: int, steps: int = 3) -> RunPeaks:
    """Warm-up step + (steps - 1) steady-state steps; steady peaks are maxima over steps >= 2.

    >>> class Null:
    ...     def reset_peak(self): pass
    ...     def peak(self): return 0
    ...     def mark(self, label): pass
    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=50, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> tc = TrainingConfig(micro_batch=1, seq_len=4, device="cpu")
    >>> run_steps(build_trainee(spec, tc), tc, Null(), 50).steady.peak
    0
    """
    if steps < 2:
        raise MemcalcError("steps", f"need >= 2 steps, got {steps}", "pass steps=3")
    trainee.model.train()
    done = [train_step(trainee, training, meter, vocab_size) for _ in range(steps)]
    steady = done[1:]
    phases = {p: max(s.phases[p] for s in steady) for p in PHASES}
    return RunPeaks(first=done[0], steady=StepPeaks(max(s.peak for s in steady), phases), steps=done)
