"""The mixture-of-experts rows of the ci matrix: each transformers MoE type memcalc models
(Mixtral, Qwen3-MoE, Qwen2-MoE with its shared expert and a dense layer, OLMoE) across precisions,
checkpointing, optimizers, both experts paths (grouped_mm, eager) and attention kernels, in a
pairwise design (validate.matrices.pairwise, seed 0). Fixed seeds: validate.measure.step builds
each model with torch.manual_seed(0), so each row routes the same tokens every run.

Each row is predicted with the routing it measured (validate.models.moe_routing); the row's
extra['moe'] also holds the predictions under 'worst' and 'balanced' routing.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import CHECKPOINTINGS, EXPERTS_IMPLEMENTATIONS, PRECISIONS, TrainingConfig
from validate.run.case import Case

_COMMON = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}

MOE_CONFIGS: dict[str, dict] = {
    "mixtral": dict(_COMMON, model_type="mixtral", architectures=["MixtralForCausalLM"],
                    num_hidden_layers=2, num_key_value_heads=2, intermediate_size=96,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                    router_jitter_noise=0.0, output_router_logits=False),
    "qwen3_moe": dict(_COMMON, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                      num_hidden_layers=2, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                      moe_intermediate_size=96, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False),
    "qwen2_moe": dict(_COMMON, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"],
                      num_hidden_layers=3, num_key_value_heads=4, intermediate_size=128,
                      moe_intermediate_size=64, shared_expert_intermediate_size=96, num_experts=6,
                      num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[1], use_sliding_window=False),
    "olmoe": dict(_COMMON, model_type="olmoe", architectures=["OlmoeForCausalLM"], num_hidden_layers=2,
                  num_key_value_heads=4, intermediate_size=64, num_experts=8, num_experts_per_tok=3,
                  norm_topk_prob=False, clip_qkv=None),
}
SHAPES = ((2, 40), (4, 24), (1, 96))
"""(micro_batch, seq_len): 80-96 tokens; with a 96-token vocabulary the experts' tensors
(S = tokens * top_k rows) set the peak rather than the logits."""
AXES = {
    "model": tuple(MOE_CONFIGS),
    "experts": EXPERTS_IMPLEMENTATIONS,
    "precision": PRECISIONS,
    "checkpointing": CHECKPOINTINGS,
    "optimizer": ("sgd", "sgd-momentum", "adam", "adamw"),  # torch.optim (the fine-tuning ones: ci_optim)
    "impl": ("foreach", "fused", "for-loop"),
    "attention": ("eager", "sdpa"),
    "shape": tuple(range(len(SHAPES))),
}


def ci_moe_cases(device: str = "cpu") -> list[Case]:
    """The MoE rows (named moeNN), a pairwise design over AXES (the eager experts loop runs
    slowly under the tracker: one design, not two).

    >>> cases = ci_moe_cases(); 20 < len(cases) < 40 and {c.spec.family for c in cases} == set(MOE_CONFIGS)
    True
    """
    from validate.matrices.pairwise import pairwise

    rows = pairwise(AXES, seed=0)
    return [_case(f"moe{i:02d}", row, device) for i, row in enumerate(rows)]


def _case(name: str, row: dict, device: str) -> Case:
    cfg = MOE_CONFIGS[row["model"]]
    b, s = SHAPES[row["shape"]]
    ck = row["checkpointing"]
    training = TrainingConfig.make(
        micro_batch=b, seq_len=s, precision=row["precision"], optimizer=row["optimizer"],
        optimizer_impl=row["impl"], checkpointing=ck, checkpoint_every=1 if ck == "every-k" else None,
        attention=row["attention"], device=device, experts_implementation=row["experts"])
    spec = ModelSpec.from_hf_config(cfg).with_(name=f"{row['model']}-like")
    return Case(name, spec, training, cfg)


def dist_moe_cases(device: str = "cpu") -> list[Case]:
    """Data-parallel rows of MoE models for the dist-ci matrix (FSDP2 per decoder layer, DDP):
    grouped_mm experts, whose memory does not depend on each rank's routing.

    >>> [c.name for c in dist_moe_cases()]
    ['mixtral-W2-zero3-bf16-amp', 'qwen3_moe-W4-zero2', 'qwen2_moe-W2-none-per-layer']
    """
    rows = (("mixtral", 2, "zero3", dict(precision="bf16-amp"), "-bf16-amp"),
            ("qwen3_moe", 4, "zero2", {}, ""),
            ("qwen2_moe", 2, "none", dict(checkpointing="per-layer"), "-per-layer"))
    cases = []
    for kind, world, sharding, changes, suffix in rows:
        cfg = MOE_CONFIGS[kind]
        training = TrainingConfig.make(micro_batch=2, seq_len=40, device=device, world_size=world,
                                       sharding=sharding, **changes)
        spec = ModelSpec.from_hf_config(cfg).with_(name=f"{kind}-like")
        cases.append(Case(f"{kind}-W{world}-{sharding}{suffix}", spec, training, cfg))
    return cases
