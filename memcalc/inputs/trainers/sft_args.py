"""trl.SFTConfig -> TrainingConfig (trl 1.16, trainer/sft_config.py): SFTConfig's own fields,
each READ, INERT with why, or REFUSED_UNLESS_DEFAULT by name, as memcalc.inputs.trainers.dpo_args
does for DPOConfig. SFTTrainer's call path (memcalc.families.trl_dpo.sft_loss_step): the
collator's input_ids, attention_mask and labels, num_items_in_batch counted by the Trainer,
use_cache=False, TRL's fused LM head.
"""
from __future__ import annotations

from memcalc.core.errors import NotModelledError, SpecError

DEFAULTS = {"model_init_kwargs": None, "router_aux_loss_coef": None, "max_length": 1024,
            "packing": False, "padding_free": False, "pad_to_multiple_of": "auto",
            "loss_type": "nll", "activation_offloading": False}

READ = {"max_length": "the collator truncates to it: seq_len must not exceed it",
        "loss_type": "'nll' is modelled; 'dft' (a detached exp of the log-probs) is refused"}

REFUSED_UNLESS_DEFAULT = {
    "model_init_kwargs": "loads the model with these kwargs (dtype, quantization): give the model "
                         "and precision to memcalc instead",
    "router_aux_loss_coef": "the MoE load-balancing loss on the fused head's router logits",
    "packing": "packed rows with position_ids: transformers' packed-sequence masks",
    "padding_free": "one row of concatenated sequences with position_ids",
    "pad_to_multiple_of": "pads each batch to a multiple: give the padded seq_len",
    "activation_offloading": "saved tensors moved to the host during forward",
}

_HOST = "host-side data or tokenizer handling; the device sees the same batch"
INERT = {
    "trust_remote_code": _HOST, "chat_template_path": _HOST, "dataset_text_field": _HOST,
    "dataset_kwargs": _HOST, "dataset_num_proc": _HOST, "eos_token": _HOST, "pad_token": _HOST,
    "truncation_mode": _HOST, "shuffle_dataset": _HOST,
    "packing_strategy": "read only with packing (refused)",
    "eval_packing": "evaluation runs outside the training step",
    "completion_only_loss": "-100 labels on the prompt: the labels tensor keeps its size",
    "assistant_only_loss": "-100 labels outside the assistant turns: the labels tensor keeps its size",
}


def own_names() -> set[str]:
    """SFTConfig's fields beyond TrainingArguments'."""
    return set(DEFAULTS) | set(INERT)


def sft_fields(sft: dict, seq_len: int) -> dict:
    """The TrainingConfig fields SFTConfig's own fields set (checked first).

    >>> sft_fields({"completion_only_loss": True}, seq_len=512)
    {'trl': 'sft'}
    >>> sft_fields({"packing": True}, seq_len=512)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: trainer_args.packing: True is not modelled ...
    """
    for name, why in REFUSED_UNLESS_DEFAULT.items():
        value = sft.get(name, DEFAULTS[name])
        if value not in (DEFAULTS[name], None, False, 0, 0.0):
            raise NotModelledError(f"trainer_args.{name}", f"{value!r} is not modelled ({why})",
                                   f"set {name} to {DEFAULTS[name]!r}")
    if sft.get("loss_type", "nll") != "nll":
        raise NotModelledError("trainer_args.loss_type", f"{sft['loss_type']!r} is not modelled "
                               "(modelled: nll)", "use loss_type 'nll'")
    limit = sft.get("max_length", DEFAULTS["max_length"])
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or seq_len > limit):
        raise SpecError("trainer_args.max_length", f"{limit!r}: the collator truncates every row to "
                        f"it, below seq_len {seq_len}", "pass seq_len <= max_length, or raise max_length")
    return {"trl": "sft"}
