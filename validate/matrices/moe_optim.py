"""The ci rows of the fine-tuning optimizers on MoE models (named moeoptNN): transformers' Adafactor
factors each 3-D expert weight (E, R, C) over its last two dims (exp_avg_sq_row E*R, exp_avg_sq_col
E*C: transformers/optimization.py Adafactor.step), and bitsandbytes' 8-bit AdamW sizes its states
by numel only (memcalc.tape.finetune_optim). Mixtral, Qwen3-MoE (with the auxiliary loss),
OLMoE and GPT-OSS, both experts paths, every mixed precision; the models of validate.matrices.moe and
validate.matrices.gpt_oss.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.matrices.gpt_oss import GPT_OSS_CONFIG
from validate.matrices.moe import MOE_CONFIGS

ROWS = (
    dict(model="qwen3_moe", optimizer="adafactor", precision="fp16-amp", experts="eager", attention="eager",
         changes={"output_router_logits": True, "norm_topk_prob": False}),
    dict(model="qwen3_moe", optimizer="adafactor", precision="bf16-amp", experts="grouped_mm", attention="sdpa"),
    dict(model="mixtral", optimizer="adafactor", precision="fp32", experts="grouped_mm", attention="sdpa"),
    dict(model="olmoe", optimizer="adafactor", precision="bf16", experts="eager", attention="eager"),
    dict(model="gpt_oss", optimizer="adafactor", precision="bf16-amp", experts="grouped_mm", attention="eager"),
    dict(model="gpt_oss", optimizer="adafactor", precision="fp32", experts="eager", attention="eager"),
    dict(model="mixtral", optimizer="adamw-8bit", precision="bf16-amp", experts="grouped_mm", attention="sdpa"),
)


def ci_moe_optim_cases(device: str = "cpu") -> list[Case]:
    """The MoE rows under Adafactor and AdamW8bit, (2, 40) tokens, no checkpointing.

    >>> cases = ci_moe_optim_cases(); len(cases), sorted({c.training.optimizer for c in cases})
    (7, ['adafactor', 'adamw-8bit'])
    """
    return [_case(f"moeopt{i:02d}", row, device) for i, row in enumerate(ROWS)]


def _case(name: str, row: dict, device: str) -> Case:
    base = GPT_OSS_CONFIG if row["model"] == "gpt_oss" else MOE_CONFIGS[row["model"]]
    cfg = {**base, **row.get("changes", {})}
    training = TrainingConfig.make(
        micro_batch=2, seq_len=40, precision=row["precision"], optimizer=row["optimizer"],
        attention=row["attention"], device=device, experts_implementation=row["experts"])
    spec = ModelSpec.from_hf_config(cfg).with_(name=f"{row['model']}-like")
    return Case(name, spec, training, cfg)
