"""The GPT-OSS rows of the ci matrix (named gptossNN): a small GptOssForCausalLM (one sliding and
one full layer, window 16 < seq_len, YaRN rotary as published, GQA, 4 experts top-2) across
precisions, checkpointing, both experts paths (grouped_mm, eager) and optimizers, in a pairwise
design (validate.matrices.pairwise.pairwise, seed 0); eager attention only (GPT-OSS has no SDPA path).
Each row is predicted with the routing it measured (validate.models.moe_routing), as the MoE rows are.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import EXPERTS_IMPLEMENTATIONS, TrainingConfig
from validate.run.case import Case

GPT_OSS_CONFIG = {
    "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "vocab_size": 96, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"], "attention_bias": True,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                        "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
    "swiglu_limit": 7.0, "output_router_logits": False, "router_aux_loss_coef": 0.9, "hidden_act": "silu"}
"""Shaped like openai/gpt-oss-20b's config.json (published keys, less quantization_config), scaled down."""
SHAPES = ((2, 40), (1, 72))
AXES = {
    "experts": EXPERTS_IMPLEMENTATIONS,
    "precision": ("fp32", "bf16-amp", "bf16", "fp16-amp"),
    "checkpointing": ("none", "per-layer", "selective", "sqrt"),
    "optimizer": ("adamw", "sgd"),
    "shape": tuple(range(len(SHAPES))),
}


def ci_gpt_oss_cases(device: str = "cpu") -> list[Case]:
    """The GPT-OSS rows, a pairwise design over AXES.

    >>> cases = ci_gpt_oss_cases(); 18 <= len(cases) <= 24 and {c.spec.family for c in cases}
    {'gpt_oss'}
    """
    from validate.matrices.pairwise import pairwise

    cases = [_case(f"gptoss{i:02d}", row, device) for i, row in enumerate(pairwise(AXES, seed=0))]
    return cases + [_case(f"gptoss-aux{i}", row, device, {"output_router_logits": True})
                    for i, row in enumerate(AUX_ROWS)]


AUX_ROWS = (
    dict(experts="grouped_mm", precision="fp32", checkpointing="none", optimizer="adamw", shape=0),
    dict(experts="eager", precision="bf16-amp", checkpointing="per-layer", optimizer="adamw", shape=1),
    dict(experts="grouped_mm", precision="bf16", checkpointing="selective", optimizer="sgd", shape=1),
    dict(experts="eager", precision="fp16-amp", checkpointing="sqrt", optimizer="adamw", shape=0),
)
"""With output_router_logits (the auxiliary load-balancing loss, memcalc.families.moe_aux): both
experts paths, every precision, four checkpointing modes."""


def _case(name: str, row: dict, device: str, changes: dict | None = None) -> Case:
    b, s = SHAPES[row["shape"]]
    training = TrainingConfig.make(
        micro_batch=b, seq_len=s, precision=row["precision"], optimizer=row["optimizer"],
        checkpointing=row["checkpointing"], attention="eager", device=device,
        experts_implementation=row["experts"])
    cfg = {**GPT_OSS_CONFIG, **(changes or {})}
    spec = ModelSpec.from_hf_config(cfg).with_(name="gpt_oss-like")
    return Case(name, spec, training, cfg)


def dist_gpt_oss_cases(device: str = "cpu") -> list[Case]:
    """A data-parallel GPT-OSS row for the dist-ci matrix: FSDP2 per decoder layer (zero3) under
    bf16 autocast with per-layer checkpointing, grouped_mm experts (whose memory does not depend
    on each rank's routing), eager attention.

    >>> [c.name for c in dist_gpt_oss_cases()]
    ['gpt_oss-W2-zero3-bf16-amp-per-layer']
    """
    training = TrainingConfig.make(micro_batch=2, seq_len=40, device=device, world_size=2, sharding="zero3",
                                   precision="bf16-amp", checkpointing="per-layer", attention="eager")
    spec = ModelSpec.from_hf_config(GPT_OSS_CONFIG).with_(name="gpt_oss-like")
    return [Case("gpt_oss-W2-zero3-bf16-amp-per-layer", spec, training, GPT_OSS_CONFIG)]
