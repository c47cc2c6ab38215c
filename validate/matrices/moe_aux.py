"""The ci rows of the MoE auxiliary load-balancing loss (config output_router_logits: true;
memcalc.families.moe_aux): the four MoE types of validate.matrices.moe across precisions, checkpointing,
both experts paths, attention kernels and optimizers in a pairwise design (seed 0), plus Mixtral's
router jitter (router_jitter_noise > 0) under each checkpointing mode. Each row is predicted with
the routing it measured (validate.models.moe_routing), as the moe rows are.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import EXPERTS_IMPLEMENTATIONS, TrainingConfig
from validate.run.case import Case
from validate.matrices.moe import MOE_CONFIGS

SHAPES = ((2, 24), (1, 40))
"""(micro_batch, seq_len): 40-48 tokens, small enough for about a second a row."""
AXES = {
    "model": tuple(MOE_CONFIGS),
    "precision": ("fp32", "bf16-amp", "bf16"),
    "checkpointing": ("none", "per-layer", "selective"),
    "experts": EXPERTS_IMPLEMENTATIONS,
    "attention": ("sdpa", "eager"),
    "optimizer": ("sgd", "adamw"),
    "shape": tuple(range(len(SHAPES))),
}
JITTER_ROWS = ({"precision": "fp32", "checkpointing": "none", "experts": "grouped_mm"},
               {"precision": "bf16-amp", "checkpointing": "per-layer", "experts": "eager"},
               {"precision": "bf16", "checkpointing": "selective", "experts": "grouped_mm"})
"""Mixtral with router_jitter_noise 0.01 (the noise tensor saved by the in-place multiply)."""


def ci_moe_aux_cases(device: str = "cpu") -> list[Case]:
    """The rows moeaux00... (pairwise over AXES) and moeaux-jitterN.

    >>> cases = ci_moe_aux_cases(); all(c.spec.moe.output_router_logits for c in cases)
    True
    >>> {c.spec.family for c in cases} == set(MOE_CONFIGS), sum(c.spec.moe.router_jitter_noise > 0 for c in cases)
    (True, 3)
    """
    from validate.matrices.pairwise import pairwise

    cases = [_case(f"moeaux{i:02d}", row, device) for i, row in enumerate(pairwise(AXES, seed=0))]
    for i, changes in enumerate(JITTER_ROWS):
        row = {"model": "mixtral", "attention": "sdpa", "optimizer": "adamw", "shape": i % 2, **changes}
        cases.append(_case(f"moeaux-jitter{i}", row, device, {"router_jitter_noise": 0.01}))
    return cases


def _case(name: str, row: dict, device: str, changes: dict | None = None) -> Case:
    cfg = {**MOE_CONFIGS[row["model"]], "output_router_logits": True, **(changes or {})}
    b, s = SHAPES[row["shape"]]
    training = TrainingConfig.make(
        micro_batch=b, seq_len=s, precision=row["precision"], optimizer=row["optimizer"],
        checkpointing=row["checkpointing"], attention=row["attention"], device=device,
        experts_implementation=row["experts"])
    spec = ModelSpec.from_hf_config(cfg).with_(name=f"{row['model']}-like")
    return Case(name, spec, training, cfg)


def dist_moe_aux_cases(device: str = "cpu") -> list[Case]:
    """Data-parallel rows with the auxiliary loss (dist-ci matrix): Qwen3-MoE under FSDP2 zero3
    with bf16 autocast, Mixtral with jitter under DDP with per-layer checkpointing (grouped_mm
    experts: each rank's routing changes nothing).

    >>> [c.name for c in dist_moe_aux_cases()]
    ['qwen3_moe-aux-W2-zero3-bf16-amp', 'mixtral-aux-jitter-W2-none-per-layer']
    """
    rows = (("qwen3_moe", "zero3", {}, dict(precision="bf16-amp"), "qwen3_moe-aux-W2-zero3-bf16-amp"),
            ("mixtral", "none", {"router_jitter_noise": 0.01}, dict(checkpointing="per-layer"),
             "mixtral-aux-jitter-W2-none-per-layer"))
    cases = []
    for kind, sharding, cfg_changes, changes, name in rows:
        cfg = {**MOE_CONFIGS[kind], "output_router_logits": True, **cfg_changes}
        training = TrainingConfig.make(micro_batch=2, seq_len=40, device=device, world_size=2,
                                       sharding=sharding, **changes)
        spec = ModelSpec.from_hf_config(cfg).with_(name=f"{kind}-like")
        cases.append(Case(name, spec, training, cfg))
    return cases
