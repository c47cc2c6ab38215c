"""What the live objects of a run say about the step: a model (an HF PreTrainedModel, possibly
wrapped by peft) and a torch optimizer, read into ModelSpec and TrainingConfig fields.

Read: the model's config (ModelSpec.from_hf_config of config.to_dict()), its parameters' dtype
(bfloat16: pure bf16) and device, peft's LoRA adapters (LoRA.from_peft_config of the active
adapter's config), bitsandbytes quantization (config.quantization_config), gradient
checkpointing (is_gradient_checkpointing); the optimizer's class and its defaults (foreach, fused,
momentum, weight_decay). Anything else the step depends on comes from the caller's TrainingConfig.
"""
from __future__ import annotations

from typing import Any

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.inputs.lora import LoRA
from memcalc.inputs.specs import ModelSpec

# optimizer class name -> TrainingConfig.optimizer (torch.optim, bitsandbytes.optim, transformers)
OPTIMIZER_CLASSES = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "AdamW8bit": "adamw-8bit",
                     "PagedAdamW8bit": "paged-adamw-8bit", "PagedAdamW": "paged-adamw",
                     "PagedAdamW32bit": "paged-adamw", "Adafactor": "adafactor"}


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def spec_of(model: Any) -> ModelSpec:
    """The ModelSpec of a live HF model, from its config.

    >>> class Config:
    ...     def to_dict(self): return {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2}
    >>> class Model: config = Config()
    >>> spec_of(Model()).num_layers
    2
    """
    config = getattr(base_model(model), "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        raise SpecError("model", f"{type(model).__name__} has no Hugging Face config",
                        "pass a transformers model (PreTrainedModel), or give ModelSpec yourself")
    fields = {k: v for k, v in config.to_dict().items() if k != "quantization_config"}
    return ModelSpec.from_hf_config(fields)


def lora_of(model: Any) -> LoRA | None:
    """peft's active LoRA adapter as memcalc.LoRA (None without peft)."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    active = getattr(model, "active_adapter", "default")
    config = configs[active if isinstance(active, str) else active[0]]
    data = config.to_dict() if callable(getattr(config, "to_dict", None)) else dict(vars(config))
    data = {k: sorted(v) if isinstance(v, (set, frozenset)) else getattr(v, "value", v) for k, v in data.items()}
    return LoRA.from_peft_config(data)


def quantization_of(model: Any) -> str:
    """bitsandbytes quantization of the base weights from config.quantization_config.

    >>> class C: quantization_config = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
    ...                                 "bnb_4bit_use_double_quant": True}
    >>> class M: config = C()
    >>> quantization_of(M())
    'nf4-double'
    """
    q = getattr(getattr(base_model(model), "config", None), "quantization_config", None)
    if q is None:
        return "none"
    q = q if isinstance(q, dict) else q.to_dict()
    if q.get("load_in_8bit"):
        return "int8"
    if not q.get("load_in_4bit"):
        raise NotModelledError("quantization_config", f"{q.get('quant_method', q)!r} is not bitsandbytes "
                               "4-bit or 8-bit", "use bitsandbytes quantization, or none")
    kind = q.get("bnb_4bit_quant_type", "fp4")
    return "nf4-double" if kind == "nf4" and q.get("bnb_4bit_use_double_quant") else kind


def model_fields(model: Any) -> dict:
    """TrainingConfig fields the live model decides: device, pure bf16, adapters, quantization,
    checkpointing."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    fields: dict = {"device": params[0].device.type if params else "cpu"}
    bf16 = sum(p.numel() for p in params if str(p.dtype) == "torch.bfloat16")
    if bf16 * 2 > sum(p.numel() for p in params):  # loaded in bfloat16 (peft's adapters stay fp32)
        fields["precision"] = "bf16"
    lora = lora_of(model)
    if lora is not None:
        fields["lora"] = lora
    quantization = quantization_of(model)
    if quantization != "none":
        fields["quantization"] = quantization
    base = base_model(model)
    flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"  # transformers 5 renamed it (the old name warns)
    if getattr(base, flag, False):
        fields["checkpointing"] = "per-layer"
    return fields


def optimizer_fields(optimizer: Any) -> dict:
    """TrainingConfig fields of a live optimizer (its class and constructor defaults).

    >>> import types
    >>> opt = type("AdamW", (), {"defaults": {"fused": True, "foreach": None, "weight_decay": 0.01}})()
    >>> optimizer_fields(opt)
    {'optimizer': 'adamw', 'optimizer_impl': 'fused', 'weight_decay': 0.01}
    """
    name = type(optimizer).__name__
    if name not in OPTIMIZER_CLASSES:
        raise NotModelledError("optimizer", f"{name} is not a modelled optimizer",
                               f"use one of {sorted(OPTIMIZER_CLASSES)}")
    kind, d = OPTIMIZER_CLASSES[name], getattr(optimizer, "defaults", {})
    if kind == "sgd" and d.get("momentum"):
        kind = "sgd-momentum"
    out: dict = {"optimizer": kind}
    if kind in ("adamw", "adam", "sgd", "sgd-momentum"):
        out["optimizer_impl"] = ("fused" if d.get("fused") else "foreach" if d.get("foreach")
                                 else "for-loop" if d.get("foreach") is False else None)
    if isinstance(d.get("weight_decay"), (int, float)):
        out["weight_decay"] = float(d["weight_decay"])
    return out
