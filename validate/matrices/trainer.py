"""ci rows through transformers.Trainer (validate.run.trainer_run): the Trainer's defaults
(gradient clipping at 1.0 included) and common options, predicted from
TrainingConfig.from_trainer_args of the same fields."""
from __future__ import annotations

from validate.run.case import Case

def ci_trainer_cases(device: str = "cpu") -> list[Case]:
    """Eight Trainer runs (a few seconds each: the Trainer's own start-up dominates).

    >>> [c.name for c in ci_trainer_cases()]
    ['tr00', 'tr01', 'tr02', 'tr03', 'tr04', 'tr05', 'tr06', 'tr07']
    """
    from memcalc.inputs.training import TrainingConfig
    from validate.matrices.shapes import CI_SHAPES, _model

    if device != "cpu":  # use_cpu runs; on a GPU the Trainer's look-ahead batch stays on the host
        return []

    rows = [  # (model, shape index, TrainingArguments fields, synthetic padding tokens)
        ("gpt2-hf", 0, {}, 0),  # the Trainer's defaults: fused AdamW, fp32
        ("llama-hf", 0, {"bf16": True, "gradient_checkpointing": True}, 0),
        ("qwen2-hf", 4, {"gradient_accumulation_steps": 2, "optim": "adamw_torch",
                         "weight_decay": 0.1}, 6),
        ("gpt2-hf", 3, {"optim": "sgd", "use_cache": True, "gradient_accumulation_steps": 2}, 0),
        ("llama-hf", 2, {"bf16": True, "optim": "adamw_torch_fused", "use_cache": True,
                         "weight_decay": 0.01}, 9),
        ("gpt2-hf", 1, {"optim": "adamw_torch", "max_grad_norm": 0.0}, 0),  # clipping off
        # bitsandbytes: the Trainer keeps nn.Embedding states in 32 bits
        ("llama-hf", 1, {"optim": "adamw_bnb_8bit", "bf16": True}, 0),
        ("gpt2-hf", 0, {"optim": "adafactor", "gradient_accumulation_steps": 2}, 0),
    ]
    cases = []
    for i, (model, shape, fields, pad) in enumerate(rows):
        spec, cfg = _model(model, CI_SHAPES[shape])
        fields = {"per_device_train_batch_size": CI_SHAPES[shape]["b"], **fields,
                  "use_cpu": True}
        training = TrainingConfig.from_trainer_args(fields, seq_len=CI_SHAPES[shape]["s"], device="cpu",
                                                    attention_mask="padded" if pad else "ones",
                                                    pad_tokens=pad)
        cases.append(Case(f"tr{i:02d}", spec, training, cfg, trainer_args=fields))
    return cases
