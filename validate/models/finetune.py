"""Fine-tuning set-ups as users run them: peft LoRA adapters on the built model (and frozen
parameters by TrainingConfig.freeze patterns). Imported lazily; needs peft (the `validate`
extra pins peft 0.21).
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from memcalc.core.errors import MemcalcError


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
    if training.quantization != "none":
        quantize_linears(model, training)
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


# bnb_4bit_compute_dtype per precision (memcalc.engine.regime: bnb_compute_elt)
COMPUTE_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "bf16-amp": "bfloat16", "fp16-amp": "float16"}


def quantize_linears(model, training) -> None:
    """QLoRA as transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type,
    bnb_4bit_use_double_quant, bnb_4bit_compute_dtype) loads a model, then
    peft.prepare_model_for_kbit_training: every nn.Linear but lm_head becomes a bitsandbytes
    Linear4bit quantised from its weight in the model's dtype, and the other parameters are cast
    to fp32 (checkpointing is applied by validate.models.hf, non-reentrant, so prepare's own is off)."""
    import bitsandbytes as bnb
    import torch
    from peft import prepare_model_for_kbit_training

    quant_type = "fp4" if training.quantization == "fp4" else "nf4"
    double = training.quantization == "nf4-double"
    compute = getattr(torch, COMPUTE_DTYPE[training.precision])
    forget_quantize_tables()
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear) or f"{name}.{child_name}".endswith("lm_head") \
                    or child_name == "lm_head":
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=compute, quant_type=quant_type, compress_statistics=double,
                                  device="meta")
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type=quant_type,
                                         compress_statistics=double)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(module, child_name, q.to("cpu"))
    fresh_quantize_tables(double)
    model.is_loaded_in_4bit = True
    prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def forget_quantize_tables() -> None:
    """Empty the tables bitsandbytes' CPU quantize_4bit caches for the process at its first call
    (backends/utils.py _code_4bit_cache, backends/default/ops.py _get_4bit_quantize_bounds'
    functools cache), so that each case makes and holds them as a new process would
    (memcalc.tape.ops.QUANTIZE_TABLES)."""
    from bitsandbytes.backends import utils
    from bitsandbytes.backends.default import ops

    utils._code_4bit_cache.clear()
    ops._get_4bit_quantize_bounds.cache_clear()


def fresh_quantize_tables(double: bool) -> None:
    """The process-global dynamic map made at the first double quantisation: a fresh copy per
    case, as a new process would make (memcalc.tape.ops.DYNAMIC_MAP)."""
    if double:
        import bitsandbytes.functional as bnbf

        bnbf.name2qmap["dynamic"] = bnbf.name2qmap["dynamic"].clone()
