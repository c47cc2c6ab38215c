"""trl.DPOConfig -> TrainingConfig (trl 1.16, trainer/dpo_config.py, base_config.py): what
DPOTrainer does with each field beyond TrainingArguments' (memcalc.inputs.trainers.trainer_args
reads those), each READ, INERT with why, or REFUSED_UNLESS_DEFAULT by name; a field in none of
them (nor TrainingArguments') is refused, so a new TRL release turns tests red.

What DPOTrainer changes whatever the fields (memcalc.families.trl_dpo): chosen and rejected
rows in one batch (micro_batch = 2 x per_device_train_batch_size), no labels in the batch (made
in _compute_loss from completion_mask), no num_items_in_batch, use_cache=False on every call.
TRL's own TrainingArguments defaults: gradient_checkpointing True, bf16 True unless fp16.
"""
from __future__ import annotations

from typing import Any

from memcalc.core.errors import NotModelledError, SpecError

DEFAULTS: dict[str, Any] = {
    "model_init_kwargs": None, "router_aux_loss_coef": None, "disable_dropout": True,
    "max_length": 1024, "padding_free": False, "pad_to_multiple_of": "auto",
    "precompute_ref_log_probs": False, "loss_type": ["sigmoid"], "ld_alpha": None,
    "f_divergence_type": "reverse_kl", "use_weighting": False, "activation_offloading": False,
    "sync_ref_model": False,
}

READ = {
    "precompute_ref_log_probs": "dpo_reference='precomputed' (no reference forward in the step)",
    "loss_type": "the loss: 'sigmoid' (DPO's) is modelled, the others are refused by name",
    "max_length": "the collator truncates to it: seq_len must not exceed it",
    "disable_dropout": "True (the default) sets every nn.Dropout to p=0: refused as False",
}

REFUSED_UNLESS_DEFAULT = {
    "model_init_kwargs": "loads the model with these kwargs (dtype, quantization): give the model "
                         "and precision to memcalc instead",
    "router_aux_loss_coef": "the MoE load-balancing loss on the fused head's router logits",
    "padding_free": "packs the batch into one row with position_ids (flash attention)",
    "pad_to_multiple_of": "pads each batch to a multiple: give the padded seq_len",
    "ld_alpha": "LD-DPO's shared and tail masks over the completion tokens",
    "f_divergence_type": "forward_kl / js / alpha divergences of the log-ratios",
    "use_weighting": "WPO weights: log_sum_sq_probs from the fused head, a fifth output",
    "activation_offloading": "saved tensors moved to the host during forward",
    "sync_ref_model": "the reference weights mixed with the policy's every ref_model_sync_steps",
}

_SCALAR = "a number the loss multiplies by; no tensor changes size"
_HOST = "host-side data or tokenizer handling; the device sees the same batch"
INERT: dict[str, str] = {
    "beta": _SCALAR, "label_smoothing": "read only by the robust, exo_pair and aot losses (refused)",
    "loss_weights": _SCALAR, "f_alpha_divergence_coef": "read only by alpha_divergence (refused)",
    "discopop_tau": "read only by the discopop loss (refused)",
    "ref_model_mixup_alpha": "read only with sync_ref_model (refused)",
    "ref_model_sync_steps": "read only with sync_ref_model (refused)",
    "trust_remote_code": _HOST, "dataset_num_proc": _HOST, "truncation_mode": _HOST,
    "pad_token": _HOST,
    "precompute_ref_batch_size": ("the precompute pass runs before training, its own no-grad "
                                  "forward; memcalc predicts the training step"),
}
LOSSES = ("sigmoid",)
"""Loss types modelled (dpo_trainer.py _compute_loss: -logsigmoid(beta * delta) on (p,) tensors)."""


def split_fields(fields: dict, own: set[str] | None = None) -> tuple[dict, dict]:
    """(TrainingArguments fields with TRL's defaults filled in, the TRL config's own fields:
    `own` names them, DPOConfig's by default).

    >>> base, dpo = split_fields({"beta": 0.2, "fp16": False})
    >>> base["bf16"], base["gradient_checkpointing"], dpo
    (True, True, {'beta': 0.2})
    """
    own = set(DEFAULTS) | set(INERT) if own is None else own
    dpo = {k: v for k, v in fields.items() if k in own}
    base = {k: v for k, v in fields.items() if k not in own}
    if base.get("gradient_checkpointing") is None and base.get("activation_checkpointing") is None:
        base["gradient_checkpointing"] = True  # trl base_config.py
    if base.get("bf16") is None:
        base["bf16"] = not base.get("fp16")  # TrainingArguments.__post_init__ of TRL's configs
    return base, dpo


def dpo_fields(dpo: dict, seq_len: int) -> dict:
    """The TrainingConfig fields DPOConfig's own fields set (checked first).

    >>> dpo_fields({"precompute_ref_log_probs": True}, seq_len=512)
    {'trl': 'dpo', 'dpo_reference': 'precomputed'}
    >>> dpo_fields({"loss_type": "ipo"}, seq_len=512)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: trainer_args.loss_type: 'ipo' is not modelled ...
    """
    for name, why in REFUSED_UNLESS_DEFAULT.items():
        value = dpo.get(name, DEFAULTS[name])
        if value not in (DEFAULTS[name], None, False, 0, 0.0):
            raise NotModelledError(f"trainer_args.{name}", f"{value!r} is not modelled ({why})",
                                   f"set {name} to {DEFAULTS[name]!r}")
    losses = dpo.get("loss_type", DEFAULTS["loss_type"])
    for loss in [losses] if isinstance(losses, str) else list(losses):
        if loss not in LOSSES:
            raise NotModelledError("trainer_args.loss_type", f"{loss!r} is not modelled (modelled: "
                                   f"{', '.join(LOSSES)})", "use loss_type 'sigmoid'")
    if dpo.get("disable_dropout", True) is not True:
        raise NotModelledError("trainer_args.disable_dropout", "False keeps dropout in the policy "
                               "and reference forwards", "leave disable_dropout true")
    limit = dpo.get("max_length", DEFAULTS["max_length"])
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or seq_len > limit):
        raise SpecError("trainer_args.max_length", f"{limit!r}: the collator truncates every row to "
                        f"it, below seq_len {seq_len}", "pass seq_len <= max_length, or raise max_length")
    pre = dpo.get("precompute_ref_log_probs", False)
    if not isinstance(pre, bool):
        raise SpecError("trainer_args.precompute_ref_log_probs", f"{str(pre)[:40]!r} is not a JSON "
                        "boolean", "write true or false")
    return {"trl": "dpo", "dpo_reference": "precomputed" if pre else "model"}
