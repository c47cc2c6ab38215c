"""The keyword arguments of the optimizer class a TrainingConfig names, torch-free: one place for
the validator's real step (validate/measure/step.py) and the traced step (memcalc/traced/optim.py),
so that what is measured and what is traced are built the same way.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig

LR = 1e-3  # any value: the learning rate changes no tensor sizes
BNB_OPTIMIZERS = {"adamw-8bit": "AdamW8bit", "paged-adamw-8bit": "PagedAdamW8bit",
                  "paged-adamw": "PagedAdamW"}
"""memcalc's name -> bitsandbytes.optim class name (one implementation each: no foreach/fused flags)."""


def optimizer_kwargs(training: TrainingConfig) -> dict:
    """Keyword arguments for the optimizer class, implementation flags included: SGD (momentum 0.9
    for sgd-momentum), Adam and AdamW with foreach / fused / the for-loop as
    TrainingConfig.resolved_optimizer_impl says; bitsandbytes' classes take lr and weight decay;
    transformers' Adafactor its defaults (relative step, so no lr).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> optimizer_kwargs(TrainingConfig(micro_batch=1, seq_len=2, optimizer="sgd-momentum",
    ...                                 optimizer_impl="fused"))
    {'lr': 0.001, 'weight_decay': 0.0, 'momentum': 0.9, 'foreach': False, 'fused': True}
    >>> optimizer_kwargs(TrainingConfig(micro_batch=1, seq_len=2, optimizer="adamw", optimizer_impl="foreach"))
    {'lr': 0.001, 'weight_decay': 0.01, 'foreach': True, 'fused': False}
    """
    if training.optimizer == "adafactor":
        return {"weight_decay": training.resolved_weight_decay}
    kwargs = {"lr": LR, "weight_decay": training.resolved_weight_decay}
    if training.optimizer in BNB_OPTIMIZERS:
        return kwargs
    if training.optimizer.startswith("sgd"):
        kwargs["momentum"] = 0.9 if training.optimizer == "sgd-momentum" else 0.0
    impl = training.resolved_optimizer_impl
    kwargs["foreach"] = impl == "foreach"
    kwargs["fused"] = impl == "fused"
    return kwargs
