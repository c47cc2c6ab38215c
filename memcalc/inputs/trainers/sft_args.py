"""trl.SFTConfig -> TrainingConfig (trl 1.16, trainer/sft_config.py): SFTConfig's own fields,
each READ, INERT with why, or REFUSED_UNLESS_DEFAULT by name, as memcalc.inputs.trainers.dpo_args
does for DPOConfig. SFTTrainer's call path (memcalc.families.trl_dpo.sft_loss_step): the
collator's input_ids, attention_mask and labels, num_items_in_batch counted by the Trainer,
use_cache=False, TRL's fused LM head.
"""
from __future__ import annotations

from memcalc.core.errors import NotModelledError, SpecError

DEFAULTS = {"model_init_kwargs": None, "router_aux_loss_coef": None, "max_length": 1024,
            "packing": False, "packing_strategy": "bfd", "padding_free": False, "pad_to_multiple_of": "auto",
            "loss_type": "nll", "activation_offloading": False}

READ = {"max_length": "the collator truncates to it (packing: the packed rows' length): seq_len must not exceed it",
        "packing": "with packing_strategy bfd or bfd_split, one padding-free row of per_device_train_batch_size x "
                   "seq_len tokens (attention_mask='packed'; memcalc.families.call_path.packed_inputs)",
        "packing_strategy": "bfd and bfd_split are modelled (padding-free); wrapped is refused",
        "padding_free": "without packing, the micro-batch's per_device_train_batch_size examples of at most "
                        "seq_len tokens as one row (attention_mask='packed', packed_sequences = the examples); "
                        "TRL needs max_length None then",
        "loss_type": "'nll' is modelled; 'dft' (a detached exp of the log-probs) is refused"}

REFUSED_UNLESS_DEFAULT = {
    "model_init_kwargs": "loads the model with these kwargs (dtype, quantization): give the model "
                         "and precision to memcalc instead",
    "router_aux_loss_coef": "the MoE load-balancing loss on the fused head's router logits",
    "pad_to_multiple_of": "pads each batch to a multiple: give the padded seq_len",
    "activation_offloading": "saved tensors moved to the host during forward",
}

_HOST = "host-side data or tokenizer handling; the device sees the same batch"
INERT = {
    "trust_remote_code": _HOST, "chat_template_path": _HOST, "dataset_text_field": _HOST,
    "dataset_kwargs": _HOST, "dataset_num_proc": _HOST, "eos_token": _HOST, "pad_token": _HOST,
    "truncation_mode": _HOST, "shuffle_dataset": _HOST,
    "eval_packing": "evaluation runs outside the training step",
    "completion_only_loss": "-100 labels on the prompt: the labels tensor keeps its size",
    "assistant_only_loss": "-100 labels outside the assistant turns: the labels tensor keeps its size",
}


def own_names() -> set[str]:
    """SFTConfig's fields beyond TrainingArguments'."""
    return set(DEFAULTS) | set(INERT)


def sft_fields(sft: dict, seq_len: int, micro_batch: int, packed_sequences: int | None = None) -> dict:
    """The TrainingConfig fields SFTConfig's own fields set (checked first). With packing (BFD:
    trl data_utils.pack_dataset, then SFTTrainer's padding_free collator) the micro-batch is one
    row of micro_batch x seq_len tokens (seq_len <= max_length: the packed rows' length; every
    row full at seq_len = max_length, the most a step can hold) holding `packed_sequences`
    sequences (cu_seq_lens' size; by default the most it can be, one token each). padding_free
    without packing concatenates the micro-batch's examples (each at most seq_len tokens) the
    same way.

    >>> sft_fields({"completion_only_loss": True}, seq_len=512, micro_batch=4)
    {'trl': 'sft'}
    >>> sft_fields({"packing": True, "max_length": 512}, seq_len=512, micro_batch=4, packed_sequences=9)
    {'trl': 'sft', 'micro_batch': 1, 'seq_len': 2048, 'attention_mask': 'packed', 'packed_sequences': 9}
    >>> sft_fields({"padding_free": True, "max_length": None}, seq_len=512, micro_batch=4)
    {'trl': 'sft', 'micro_batch': 1, 'seq_len': 2048, 'attention_mask': 'packed', 'packed_sequences': 4}
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
    if sft.get("packing", False) is not True and sft.get("padding_free", False) is True:
        if limit is not None:  # SFTTrainer.__init__ raises the same
            raise SpecError("trainer_args.max_length", f"{limit!r} with padding_free and no packing: TRL "
                            "does not enforce it (SFTTrainer refuses the pair)", "set max_length to None")
        if packed_sequences not in (None, micro_batch):
            raise SpecError("packed_sequences", f"{packed_sequences!r}: padding_free without packing "
                            f"concatenates the {micro_batch} examples of the micro-batch", "drop packed_sequences")
        return {"trl": "sft", "micro_batch": 1, "seq_len": micro_batch * seq_len, "attention_mask": "packed",
                "packed_sequences": micro_batch}
    if sft.get("packing", False) is not True:
        if packed_sequences is not None:
            raise SpecError("packed_sequences", "is read only with packing=True", "drop packed_sequences")
        return {"trl": "sft"}
    strategy = sft.get("packing_strategy", DEFAULTS["packing_strategy"])
    if strategy not in ("bfd", "bfd_split"):
        raise NotModelledError("trainer_args.packing_strategy", f"{strategy!r} is not modelled (padded rows "
                               "cut across sequences; measured: bfd, padding-free)", "use packing_strategy 'bfd'")
    tokens = micro_batch * seq_len
    count = tokens if packed_sequences is None else packed_sequences
    if isinstance(count, bool) or not isinstance(count, int) or not micro_batch <= count <= tokens:
        raise SpecError("packed_sequences", f"{count!r}: sequences packed into {micro_batch} rows of "
                        f"{seq_len} tokens", f"pass an integer from {micro_batch} to {tokens}")
    return {"trl": "sft", "micro_batch": 1, "seq_len": tokens, "attention_mask": "packed",
            "packed_sequences": count}
