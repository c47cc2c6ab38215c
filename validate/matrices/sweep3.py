"""Rows from three configurations the fresh sweep drew (scripts/fresh_sweep.py, attention dropout
0.1 on CPU), named sweep3NN, each with the neighbours that isolate its class:

- SDPA's CPU math kernel with grouped-query attention (enable_gqa; kv heads < heads, the
  `sdpa` path with no mask): the kernel's repeat_interleave'd key and value are C++ locals held
  to its return, and k^T * sqrt(scale) is taken after the repeat, a temporary of the first
  matmul (memcalc.families.attention.sdpa_math). Granite fp16-amp selective b=1.
- Qwen2-MoE: the window-0 sliding mask Qwen2MoeModel always builds
  (memcalc.families.call_path.zero_window_mask), the (N, h) product of the shared expert's
  sigmoid gate, and the router's outputs held to the block's return (memcalc.families.moe).
  Eager every-k bf16-amp: the forward phase.
- Eager experts: the routing-weights product's backward holds grad * y at full size before
  sum_to reduces it to the weights' (n, 1) gradient (memcalc.families.moe.eager_experts).
  Qwen3-MoE fp32 every-k.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

_PLAIN = dict(implementation="hf", qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
              attn_dropout=0.1, max_position_embeddings=1024)
_GRANITE = dict(_PLAIN, family="granite", vocab_size=73, hidden_size=32, num_layers=1, num_heads=2,
                num_kv_heads=1, intermediate_size=64, mlp_bias=True, tie_embeddings=True)
_MATH = dict(micro_batch=1, seq_len=73, precision="fp16-amp", optimizer="sgd", optimizer_impl="foreach",
             checkpointing="selective", attention="sdpa")
_QWEN2_MOE = dict(_PLAIN, family="qwen2_moe", vocab_size=192, hidden_size=32, num_layers=4, num_heads=4,
                  num_kv_heads=1, intermediate_size=192, tie_embeddings=False,
                  moe=dict(num_experts=1, top_k=1, expert_ffn_size=64, shared_expert_ffn_size=64))
_QWEN3_MOE = dict(_PLAIN, family="qwen3_moe", vocab_size=179, hidden_size=32, num_layers=1, num_heads=1,
                  num_kv_heads=1, intermediate_size=64,
                  moe=dict(num_experts=1, top_k=1, expert_ffn_size=32, norm_topk_prob=False))
_EXPERTS_FP32 = dict(micro_batch=7, seq_len=103, precision="fp32", optimizer="paged-adamw-8bit",
                     max_grad_norm=1.0, checkpointing="every-k", checkpoint_every=1, attention="eager",
                     experts_implementation="eager", moe_routing="worst", grad_accum=3)
ROWS = (  # (model fields, training fields)
    (_GRANITE, _MATH),  # the sweep's miss: b=1, selective, SDPA math under autocast
    (dict(_GRANITE, family="llama", num_heads=4, num_kv_heads=2, mlp_bias=False),
     dict(_MATH, micro_batch=2, precision="bf16-amp", checkpointing="per-layer")),  # two kv heads, b=2
    (dict(_GRANITE, family="mixtral", num_heads=4, mlp_bias=False, moe=dict(num_experts=2, top_k=1,
                                                                           expert_ffn_size=32)),
     dict(_MATH, micro_batch=2, experts_implementation="eager")),
    (_QWEN2_MOE, dict(micro_batch=3, seq_len=101, precision="bf16-amp", optimizer="sgd-momentum",
                      checkpointing="every-k", checkpoint_every=3, attention="eager",
                      experts_implementation="eager", moe_routing="balanced", grad_accum=2)),  # the sweep's case
    (dict(_QWEN2_MOE, num_layers=1), dict(micro_batch=3, seq_len=101, precision="bf16-amp",
                                          optimizer="sgd-momentum", attention="eager",
                                          experts_implementation="eager")),  # no checkpointing
    (dict(_QWEN2_MOE, num_layers=1), dict(micro_batch=3, seq_len=101, precision="fp32", optimizer="sgd",
                                          checkpointing="every-k", checkpoint_every=1, attention="sdpa",
                                          experts_implementation="eager")),  # the (s, s) bool mask
    (_QWEN3_MOE, _EXPERTS_FP32),  # the sweep's miss
    (dict(_QWEN3_MOE, family="olmoe", attn_dropout=0.0),
     dict(_EXPERTS_FP32, optimizer="sgd", max_grad_norm=None, grad_accum=1, checkpointing="per-layer",
          checkpoint_every=None)),
)


def ci_sweep3_cases(device: str = "cpu") -> list[Case]:
    """The sweep3 rows.

    >>> cases = ci_sweep3_cases(); len(cases), cases[0].spec.family, cases[-1].spec.family
    (8, 'granite', 'olmoe')
    """
    return [Case(f"sweep3{i:02d}", ModelSpec(**model), TrainingConfig(device=device, **training))
            for i, (model, training) in enumerate(ROWS)]
