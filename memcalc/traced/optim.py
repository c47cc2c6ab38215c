"""The torch.optim optimizer a TrainingConfig names, for a traced step (torch imported inside).

The same classes and keyword arguments as the validator's (both from
memcalc.inputs.optimizer_args): SGD (momentum 0.9 for sgd-momentum), Adam, AdamW, with foreach / fused / the
for-loop as TrainingConfig.resolved_optimizer_impl says; the others are refused by name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcalc.core.errors import NotModelledError
from memcalc.inputs.optimizer_args import optimizer_kwargs as torch_free_kwargs

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig

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
    return torch_free_kwargs(training)


def make_optimizer(params: list, training: TrainingConfig) -> Any:
    """The optimizer over `params`."""
    import torch

    kwargs = optimizer_kwargs(training)
    cls = {"sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD, "adam": torch.optim.Adam,
           "adamw": torch.optim.AdamW}[training.optimizer]
    return cls(params, **kwargs)
