"""The torch.optim optimizer a TrainingConfig names, for a traced step (torch imported inside).

The same classes and keyword arguments as the validator's (validate/measure/step.py
optimizer_kwargs): SGD (momentum 0.9 for sgd-momentum), Adam, AdamW, with foreach / fused / the
for-loop as TrainingConfig.resolved_optimizer_impl says; the others are refused by name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcalc.core.errors import NotModelledError

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig

LR = 1e-3  # any value: the learning rate changes no tensor sizes
TRACED_OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")


def optimizer_kwargs(training: TrainingConfig) -> dict:
    """Keyword arguments of the torch.optim class.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> optimizer_kwargs(TrainingConfig(micro_batch=1, seq_len=2, optimizer="adamw", optimizer_impl="foreach"))
    {'lr': 0.001, 'weight_decay': 0.01, 'foreach': True, 'fused': False}
    """
    if training.optimizer not in TRACED_OPTIMIZERS:
        raise NotModelledError("optimizer", f"{training.optimizer!r} is not traced yet",
                               f"use one of {', '.join(TRACED_OPTIMIZERS)} for a traced model")
    kwargs = {"lr": LR, "weight_decay": training.resolved_weight_decay}
    if training.optimizer.startswith("sgd"):
        kwargs["momentum"] = 0.9 if training.optimizer == "sgd-momentum" else 0.0
    impl = training.resolved_optimizer_impl
    kwargs["foreach"] = impl == "foreach"
    kwargs["fused"] = impl == "fused"
    return kwargs


def make_optimizer(params: list, training: TrainingConfig) -> Any:
    """The optimizer over `params`."""
    import torch

    kwargs = optimizer_kwargs(training)
    cls = {"sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD, "adam": torch.optim.Adam,
           "adamw": torch.optim.AdamW}[training.optimizer]
    return cls(params, **kwargs)
