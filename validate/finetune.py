"""Fine-tuning set-ups as users run them: peft LoRA adapters on the built model (and frozen
parameters by TrainingConfig.freeze patterns). Imported lazily; needs peft (the `validate`
extra pins peft 0.21).
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from memcalc.errors import MemcalcError


def apply_finetuning(model, training):
    """Freeze by pattern, then wrap in peft LoRA adapters (get_peft_model, as a user does after
    loading and enabling gradient checkpointing). Returns the model to train."""
    for name, param in model.named_parameters():
        if any(fnmatchcase(name, p) for p in training.freeze):
            param.requires_grad_(False)
    if training.lora is None:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:  # pragma: no cover - the validate extra installs it
        raise MemcalcError("lora", "the validator needs peft", 'pip install -e ".[validate]"') from None
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    kwargs = training.lora.peft_kwargs()
    if getattr(model.config, "model_type", None) == "gpt2":
        kwargs["fan_in_fan_out"] = True  # Conv1D weights are (in, out); peft warns and sets it
    peft_model = get_peft_model(model, LoraConfig(**kwargs))
    for name, param in model.named_parameters():  # freeze patterns win over bias='all'
        if name.replace(".base_layer", "") in frozen:
            param.requires_grad_(False)
    return peft_model


def trainable_parameters(model) -> list:
    """The parameters the optimizer gets (a Trainer passes only those requiring grad)."""
    return [p for p in model.parameters() if p.requires_grad]
