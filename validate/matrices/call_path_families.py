"""ci rows (named cpf...) for the HF Trainer's call path on every hand-written family besides
GPT-2 and Llama (issue 24 item 1; memcalc.families.call_path, each family's
Supports.trainer_inputs and attention_masks): an all-ones attention_mask, a labels tensor of
its own and num_items_in_batch, on SDPA (where the class has it) and eager, with and without
per-layer checkpointing, and two runs through transformers.Trainer with its default
TrainingArguments (Phi-3 and Gemma-2, whose kernel is then transformers' default: eager).

Measured before the refusals were lifted (validate tracker, torch 2.13 CPU, transformers 5.24,
b=3 s=40 on tests/test_programs.py's SPECS): every family's step with mask='ones', separate
labels and num_items_in_batch is the estimate's, 4 B short (the loss's seed,
validate.matrices tolerances), as on the default call path.
"""
from __future__ import annotations

from memcalc.families.registry import declaration
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

_LLAMA_LIKE = dict(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   intermediate_size=96, max_position_embeddings=128, activation="silu", mlp_bias=False,
                   tie_embeddings=False)
_GEMMA = dict(_LLAMA_LIKE, num_layers=3, head_dim=16, activation="gelu_tanh", qkv_bias=True, out_bias=True)
_MOE = dict(_LLAMA_LIKE, qkv_bias=False, out_bias=False)
SPECS = {
    "phi3": dict(_LLAMA_LIKE, qkv_bias=False, out_bias=False, rotary_fraction=0.5),
    "olmo2": dict(_LLAMA_LIKE, qkv_bias=True, out_bias=True),
    "granite": dict(_LLAMA_LIKE, qkv_bias=True, out_bias=True, mlp_bias=True),
    "gemma": _GEMMA,
    "gemma2": dict(_GEMMA, sliding_window=16, sliding_window_pattern=2, attn_softcap=True, logit_softcap=True),
    "gemma3": dict(_GEMMA, qk_norm=True, sliding_window=16, sliding_window_pattern=3),
    "mixtral": dict(_MOE, moe=dict(num_experts=4, top_k=2, expert_ffn_size=40)),
    "olmoe": dict(_MOE, moe=dict(num_experts=4, top_k=2, expert_ffn_size=24, norm_topk_prob=False)),
    "qwen2_moe": dict(_MOE, num_layers=3, qkv_bias=True, moe=dict(num_experts=3, top_k=1, expert_ffn_size=24,
                      norm_topk_prob=False, shared_expert_ffn_size=56, dense_layers=(1,))),
    "gpt_neox": dict(_LLAMA_LIKE, num_kv_heads=None, activation="gelu", rotary_fraction=0.25,
                     parallel_residual=True, qkv_bias=True, out_bias=True, mlp_bias=True),
    "stablelm": dict(_LLAMA_LIKE, qkv_bias=True, out_bias=False, rotary_fraction=0.5, parallel_residual=True),
    "qwen3_moe": dict(_MOE, qkv_bias=True, out_bias=True, moe=dict(num_experts=5, top_k=3, expert_ffn_size=24,
                      dense_layers=(0,))),
    "gpt_oss": dict(_MOE, qkv_bias=True, out_bias=True, mlp_bias=True, head_dim=16, sliding_window=16,
                    sliding_window_pattern=2, moe=dict(num_experts=4, top_k=2, expert_ffn_size=24)),
}
"""A small spec of each family whose Trainer call path is lifted (family -> ModelSpec fields)."""
TRAINER_PATH = dict(attention_mask="ones", labels="separate", num_items_in_batch=True)


def family_spec(family: str) -> ModelSpec:
    """The small spec of a family.

    >>> family_spec("gemma2").sliding_window
    16
    """
    return ModelSpec.make(family=family, name=f"{family}-like", **SPECS[family])


def ci_call_path_family_cases(device: str = "cpu") -> list[Case]:
    """The Trainer's call path per family and kernel, two transformers.Trainer runs, then the
    use_cache rows (cache_cases).

    >>> cases = ci_call_path_family_cases(); len(cases), cases[0].name, cases[-1].training.use_cache
    (56, 'cpf00', True)
    """
    rows = []
    for family in SPECS:
        kernels = ["eager"] if declaration(family).supports.sdpa_refusal else ["sdpa", "eager"]
        for i, attention in enumerate(kernels):
            for checkpointing in ("none", "per-layer"):
                precision = "bf16-amp" if (i + (checkpointing == "none")) % 2 else "fp32"
                rows.append((family, TrainingConfig(micro_batch=3, seq_len=40, device=device, attention=attention,
                                                    precision=precision, checkpointing=checkpointing,
                                                    **TRAINER_PATH)))
    cases = [Case(f"cpf{i:02d}", family_spec(f), t) for i, (f, t) in enumerate(rows)]
    if device != "cpu":  # use_cpu runs; on a GPU the Trainer's look-ahead batch stays on the host
        return cases
    for family in ("phi3", "gemma2"):  # TrainingArguments' defaults; the kernel transformers picks
        fields = {"per_device_train_batch_size": 2, "use_cpu": True}
        t = TrainingConfig.from_trainer_args(fields, seq_len=40, device="cpu")
        cases.append(Case(f"cpf{len(cases):02d}", family_spec(family), t, trainer_args=fields))
    return cases + cache_cases(device, len(cases))


CACHE_ROWS = (("olmo2", "eager"), ("gemma3", "sdpa"), ("gemma", "eager"), ("granite", "eager"), ("gemma3", "eager"),
              ("gemma2", "eager"))
"""use_cache=True where the cache's copies set the peak (a 16-token vocabulary, 4 layers: the
end of the forward, not the loss's backward, is the peak; the estimate's cache effect there is
15-95 KB)."""


def cache_cases(device: str, first: int) -> list[Case]:
    """use_cache=True rows (a plain loop's model(input_ids=ids, labels=ids)), numbered from `first`.

    >>> [c.training.use_cache for c in cache_cases("cpu", 0)]
    [True, True, True, True, True, True]
    """
    return [Case(f"cpf{first + i:02d}", family_spec(f).with_(vocab_size=16, num_layers=4),
                 TrainingConfig(micro_batch=2, seq_len=64, device=device, attention=a, use_cache=True))
            for i, (f, a) in enumerate(CACHE_ROWS)]
