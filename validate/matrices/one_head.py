"""The ci rows with one attention head (named headNN): at num_heads == 1 the reshape and
transpose copies of a (b, heads, s, d) tensor are views (memcalc.families.attention.head_copy),
so bmm saves views of the projections (the whole fused qkv of GPT-2, Phi-3, GPT-NeoX) and
the output's transpose(1, 2).contiguous() copies nothing. Every family's attention paths:
eager, SDPA flash, SDPA math (attention dropout on CPU), SDPA with a padded batch's mask,
checkpointing, one sequence, MoE and GPT-OSS.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.matrices.gpt_oss import GPT_OSS_CONFIG
from validate.matrices.moe import MOE_CONFIGS

ROWS = (
    # (family, implementation, model changes, training fields)
    ("phi3", "hf", dict(resid_dropout=0.1), dict(attention="eager", precision="bf16-amp")),
    ("phi3", "hf", dict(resid_dropout=0.1), dict(attention="sdpa", precision="bf16-amp")),
    ("gpt2", "hf", dict(attn_dropout=0.1), dict(attention="sdpa", precision="fp16-amp")),
    ("gpt2", "hf", {}, dict(attention="eager", precision="fp32", checkpointing="per-layer")),
    ("gpt2", "reference", {}, dict(attention="eager", precision="bf16-amp")),
    ("gpt_neox", "hf", dict(attn_dropout=0.1), dict(attention="sdpa", precision="fp32")),
    ("gpt_neox", "hf", {}, dict(attention="eager", precision="bf16-amp", checkpointing="per-layer")),
    ("llama", "hf", {}, dict(attention="eager", precision="bf16-amp", checkpointing="selective")),
    ("llama", "hf", {}, dict(attention="sdpa", precision="bf16-amp", attention_mask="padded", pad_tokens=5)),
    ("llama", "reference", dict(attn_dropout=0.1), dict(attention="sdpa", precision="fp32", micro_batch=1)),
    ("gemma3", "hf", {}, dict(attention="eager", precision="fp32")),
    ("olmo2", "hf", {}, dict(attention="sdpa", precision="bf16-amp")),
    ("mixtral", "hf", {}, dict(attention="eager", precision="bf16-amp", experts_implementation="eager")),
    ("qwen3_moe", "hf", {}, dict(attention="sdpa", precision="fp32")),
    ("gpt_oss", "hf", {}, dict(attention="eager", precision="bf16-amp")),
)


def ci_one_head_cases(device: str = "cpu") -> list[Case]:
    """The one-head rows: (3, 34) tokens (one sequence of 34 where a row says micro_batch 1).

    >>> cases = ci_one_head_cases(); len(cases), {c.spec.num_heads for c in cases}
    (15, {1})
    """
    return [_case(f"head{i:02d}", *row, device) for i, row in enumerate(ROWS)]


def _spec(family: str, impl: str, changes: dict) -> tuple[ModelSpec, dict | None]:
    """A small one-head spec (and the HF config of the MoE and GPT-OSS models)."""
    if family in MOE_CONFIGS or family == "gpt_oss":
        base = GPT_OSS_CONFIG if family == "gpt_oss" else MOE_CONFIGS[family]
        cfg = {**base, "num_attention_heads": 1, "num_key_value_heads": 1}
        return ModelSpec.from_hf_config(cfg).with_(name=f"{family}-one-head"), cfg
    fields = dict(name=f"{family}-one-head", family=family, implementation=impl, vocab_size=128,
                  hidden_size=32, num_layers=2, num_heads=1, max_position_embeddings=128, tie_embeddings=True)
    if family == "gpt_neox":
        fields.update(activation="gelu", intermediate_size=128, rotary_fraction=0.5)
    elif family != "gpt2":
        fields.update(num_kv_heads=1, activation="gelu_tanh" if family.startswith("gemma") else "silu",
                      qkv_bias=False, out_bias=False, mlp_bias=False, intermediate_size=128)
    if family == "gemma3":
        fields.update(head_dim=32, sliding_window=16, sliding_window_pattern=2, qk_norm=True)
    return ModelSpec.make(**fields, **changes), None


def _case(name: str, family: str, impl: str, changes: dict, fields: dict, device: str) -> Case:
    spec, cfg = _spec(family, impl, changes)
    fields = {"micro_batch": 3, "seq_len": 34, **fields}
    return Case(name, spec, TrainingConfig.make(device=device, **fields), cfg)
