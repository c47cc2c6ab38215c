"""ci rows for the fine-tuning optimizers and gradient clipping (memcalc.tape.finetune_optim,
memcalc.tape.optimizer.clip_bytes), appended to the ci matrix.

Each of adamw-8bit, paged-adamw-8bit, paged-adamw and adafactor runs under every precision
(bitsandbytes and Adafactor take bf16 parameters), on the reference and HF models, with
gradient accumulation and checkpointing on some rows; clipping (max_grad_norm) runs on and off
under fp32, fp16-amp (after GradScaler.unscale_), bf16-amp and bf16, with torch and fine-tuning
optimizers. Shapes are small (~1 s a row) but large enough that 8-bit states apply (matrices of
>= 4096 elements) beside small fp32-state tensors (norms, biases).
"""
from __future__ import annotations

from typing import Callable

from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

# (model, precision, grad_accum, checkpointing, max_grad_norm) per optimizer
_ROWS = {
    "adamw-8bit": [("gpt2-ref", "fp32", 1, "none", None), ("llama-hf", "bf16-amp", 2, "per-layer", None),
                   ("gpt2-hf", "fp16-amp", 1, "none", 1.0), ("qwen2-hf", "bf16", 1, "sqrt", None)],
    "paged-adamw-8bit": [("llama-ref", "bf16", 2, "none", 1.0), ("gpt2-hf", "bf16-amp", 1, "per-layer", None)],
    "paged-adamw": [("llama-hf", "fp32", 1, "none", None), ("gpt2-ref", "fp16-amp", 2, "per-layer", None)],
    "adafactor": [("gpt2-hf", "fp32", 2, "none", None), ("llama-ref", "bf16-amp", 1, "none", 1.0),
                  ("qwen2-hf", "fp16-amp", 1, "per-layer", None), ("gpt2-ref", "bf16", 1, "sqrt", 0.5)],
    # clipping with torch optimizers (clip_grad_norm_ takes its foreach path on CPU by default)
    "sgd": [("gpt2-ref", "fp32", 1, "none", 1.0), ("llama-hf", "fp16-amp", 2, "none", 1.0)],
    "adamw": [("llama-ref", "bf16-amp", 1, "none", 1.0), ("gpt2-hf", "bf16", 1, "per-layer", 1.0)],
}
# h=64..128, vocab 500..1000: matrices from 4,096 to 128,000 elements
_SHAPES = (dict(h=64, a=4, kv=2, L=2, V=500, b=2, s=32, f=176, P=128, dropout=0.0, tie=False),
           dict(h=128, a=4, kv=4, L=2, V=1000, b=1, s=64, f=344, P=128, dropout=0.1, tie=True))


def ci_optim_matrix(device: str, build_model: Callable) -> list[Case]:
    """The fine-tuning optimizer and clipping rows, named ci-opt-NN; `build_model(kind, shape)`
    gives (spec, hf_config) (validate.matrices._model, passed in: no import cycle).

    >>> from validate.matrices import _model
    >>> rows = ci_optim_matrix("cpu", _model); len(rows), rows[0].name, rows[0].training.optimizer
    (16, 'ci-opt-00', 'adamw-8bit')
    """
    cases = []
    for optimizer, rows in _ROWS.items():
        for model, precision, accum, ck, clip in rows:
            shape = _SHAPES[len(cases) % len(_SHAPES)]
            spec, cfg = build_model(model, shape)
            training = TrainingConfig.make(
                micro_batch=shape["b"], seq_len=shape["s"], grad_accum=accum, precision=precision,
                optimizer=optimizer, checkpointing=ck, max_grad_norm=clip, device=device)
            cases.append(Case(f"ci-opt-{len(cases):02d}", spec, training, cfg))
    return cases
