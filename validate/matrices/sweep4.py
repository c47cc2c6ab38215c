"""Rows from configurations the random sweeps drew (scripts/fresh_sweep.py --n 50 --seed 6, and
--seed 8), named sweep4NN, each with neighbours that isolate its class:

- One kv head of several, one sequence, eager attention (Phi-3 pure bf16 sqrt, fresh6-042):
  repeat_kv's expand + reshape merges a size-1 kv dimension, a view at any batch size, and at
  b=1 bmm's reshapes merge the size-1 batch dimension too, so nothing copies the expansion but
  an autocast cast; q @ k^T and p @ v save the stride-0 views, which keep the rotated k and the
  fused projection alive (memcalc.families.attention.llama_eager, KV_EXPAND_VIEW).
- GPT-OSS with top_k 1 on the grouped_mm experts path (one head, per-layer, bf16-amp,
  fresh6-029): `weighted_out.view(N, 1, h).sum(dim=1)`'s backward expands the gradient over a
  size-1 dimension and reshapes it as a view: no (S, h) copy
  (memcalc.families.moe.grouped_combine). Mixtral shares the code (its peak, in the experts'
  backward, comes after the copy is freed: the row checks it stays put).
- Eager experts with gradient accumulation whose micro-steps route differently (Qwen2-MoE
  fp16-amp every-k, grad_accum 2, attention dropout, fresh6-037): the validator predicts each
  micro-step with its own routing (validate.run.routed_steps); one routing applied to every
  micro-step would not be the step that ran.
- A checkpointed layer's routing-weights product (Qwen2-MoE fp32 per-layer, grouped experts, top_k 1,
  fresh8-015 of the seed-8 sweep): y and the weights, recomputed and saved by the product only,
  are freed when its backward's apply returns, before the engine's sum_to makes the (S, 1)
  gradient (memcalc.tape.graph.Returns). Its small Mixtral and Qwen3-MoE neighbours' forward
  phases peak at k's rotary: `apply_rotary_pos_emb`'s arguments stay alive in the attention's locals
  until it returns (memcalc.families.layers.apply_rotary_pos_emb, used by
  memcalc.families.hf_moe.attention and memcalc.families.hf_llama.HFLlama.attention).
- A sample of scripts/snapshot_predictions.py on CPU: foreach Adam with weight decay deletes
  its `grads + wd * params` copy before the sqrt's copy (torch/optim/adam.py `del device_grads`),
  so one parameter-sized copy, not two, is alive at once (memcalc.tape.optimizer.transient_bytes;
  pure bf16 and fp32, where the optimizer sets the step's peak).
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

_PHI3 = dict(family="phi3", implementation="hf", vocab_size=16, hidden_size=64, num_layers=2, num_heads=2,
             num_kv_heads=1, intermediate_size=64, qkv_bias=False, out_bias=False, mlp_bias=False,
             activation="silu", attn_dropout=0.1, resid_dropout=0.1, rotary_fraction=0.5,
             max_position_embeddings=1024)
_ONE_SEQ = dict(micro_batch=1, seq_len=84, precision="bf16", optimizer="sgd-momentum", optimizer_impl="fused",
                checkpointing="sqrt", attention="eager", experts_implementation="eager", moe_routing="balanced")
_LLAMA = dict(family="llama", implementation="hf", vocab_size=96, hidden_size=64, num_layers=2, num_heads=4,
              num_kv_heads=1, intermediate_size=128, qkv_bias=False, out_bias=False, mlp_bias=False,
              activation="silu", attn_dropout=0.1, max_position_embeddings=1024)
_GPT_OSS = dict(family="gpt_oss", implementation="hf", vocab_size=223, hidden_size=32, num_layers=2,
                num_heads=1, num_kv_heads=1, intermediate_size=192, tie_embeddings=False, activation="silu",
                sliding_window=32, sliding_window_pattern=1, max_position_embeddings=1024,
                moe=dict(num_experts=6, top_k=1, expert_ffn_size=96))
_GROUPED = dict(micro_batch=2, seq_len=94, grad_accum=3, precision="bf16-amp", optimizer="sgd",
                optimizer_impl="foreach", checkpointing="per-layer", attention="eager",
                experts_implementation="grouped_mm", moe_routing="balanced")
_TOP1 = dict(implementation="hf", vocab_size=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
             intermediate_size=64, qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
             max_position_embeddings=1024, moe=dict(num_experts=4, top_k=1, expert_ffn_size=128))
_QWEN2_MOE = dict(family="qwen2_moe", implementation="hf", vocab_size=45, hidden_size=128, num_layers=4,
                  num_heads=4, num_kv_heads=4, intermediate_size=192, out_bias=False, mlp_bias=False,
                  activation="silu", attn_dropout=0.1, max_position_embeddings=1024,
                  moe=dict(num_experts=4, top_k=1, expert_ffn_size=32, shared_expert_ffn_size=64,
                           output_router_logits=True))
_ACCUM = dict(micro_batch=1, seq_len=11, grad_accum=2, precision="fp16-amp", optimizer="sgd",
              checkpointing="every-k", checkpoint_every=2, attention="sdpa", experts_implementation="eager",
              moe_routing="balanced")
_SAMPLE = dict(family="llama", implementation="hf", vocab_size=700, hidden_size=64, num_layers=5, num_heads=4,
               num_kv_heads=1, intermediate_size=160, max_position_embeddings=512, attn_dropout=0.1,
               qkv_bias=True, out_bias=False, mlp_bias=False, activation="silu")
_QWEN2_MOE_8 = dict(family="qwen2_moe", implementation="hf", vocab_size=120, hidden_size=32, num_layers=4,
                    num_heads=4, num_kv_heads=4, intermediate_size=96, tie_embeddings=False, qkv_bias=True,
                    out_bias=False, mlp_bias=False, activation="silu", max_position_embeddings=1024,
                    moe=dict(num_experts=4, top_k=1, expert_ffn_size=32, shared_expert_ffn_size=32))
_FRESH8 = dict(micro_batch=5, seq_len=113, grad_accum=3, precision="fp32", optimizer="sgd",  # for-loop (CPU default)
               checkpointing="per-layer", attention="sdpa",
               experts_implementation="grouped_mm", moe_routing="worst")
_SMALL8 = dict(_FRESH8, micro_batch=2, seq_len=32, grad_accum=2)
ROWS = (  # (model fields, training fields)
    (_PHI3, _ONE_SEQ),  # the sweep's miss (fresh6-042)
    (_LLAMA, dict(_ONE_SEQ, seq_len=64, precision="bf16-amp", optimizer="sgd")),  # autocast casts the views
    (dict(_LLAMA, attn_dropout=0.0), dict(_ONE_SEQ, seq_len=64, precision="fp32", optimizer="adamw",
                                          optimizer_impl="foreach", checkpointing="per-layer")),
    (dict(_LLAMA, num_layers=1), dict(_ONE_SEQ, seq_len=48, precision="fp16-amp", checkpointing="none")),
    (dict(_TOP1, family="mixtral", num_kv_heads=1), dict(_ONE_SEQ, seq_len=40, checkpointing="none",
                                                         experts_implementation="grouped_mm")),
    (_GPT_OSS, _GROUPED),  # the sweep's miss (fresh6-029)
    (dict(_TOP1, family="mixtral"), dict(_GROUPED, seq_len=64, grad_accum=1, precision="fp32")),  # peak elsewhere
    (dict(_GPT_OSS, num_heads=4, num_kv_heads=2), dict(_GROUPED, seq_len=64, grad_accum=1, precision="bf16")),
    (_QWEN2_MOE, _ACCUM),  # the sweep's miss (fresh6-037)
    (dict(_TOP1, family="qwen3_moe", vocab_size=45, hidden_size=64, attn_dropout=0.1,
          moe=dict(num_experts=4, top_k=1, expert_ffn_size=32)),  # micro-steps routed differently
     dict(_ACCUM, seq_len=6, precision="fp32", checkpointing="per-layer", checkpoint_every=None, attention="eager")),
    (_SAMPLE, dict(_ONE_SEQ, seq_len=100, optimizer="adam", optimizer_impl="foreach", weight_decay=0.1,
                   checkpointing="per-layer")),  # scripts/snapshot_predictions.py's sample 86, on CPU
    (_SAMPLE, dict(_ONE_SEQ, micro_batch=2, seq_len=100, precision="fp32", optimizer="adam",
                   optimizer_impl="foreach", weight_decay=0.1, checkpointing="per-layer")),
    (_QWEN2_MOE_8, _FRESH8),  # the seed-8 sweep's fresh8-015
    (dict(_QWEN2_MOE_8, vocab_size=16), _SMALL8),  # the same peak, small
    (dict(_QWEN2_MOE_8, family="mixtral", vocab_size=16, qkv_bias=False,  # no shared expert; forward phase
          moe=dict(num_experts=4, top_k=1, expert_ffn_size=32)), _SMALL8),  # at k's rotary
    (dict(_QWEN2_MOE_8, family="qwen3_moe", vocab_size=16, qkv_bias=False,  # q/k norms: their outputs held
          moe=dict(num_experts=4, top_k=1, expert_ffn_size=32)), _SMALL8),
    (dict(_QWEN2_MOE_8, family="llama", vocab_size=16, intermediate_size=32, qkv_bias=False, moe=None),
     dict(_SMALL8, grad_accum=1)),  # the Llama trunk's rotary
)


def ci_sweep4_cases(device: str = "cpu") -> list[Case]:
    """The sweep4 rows.

    >>> cases = ci_sweep4_cases(); len(cases), cases[0].spec.family, cases[5].spec.family, cases[12].spec.family
    (17, 'phi3', 'gpt_oss', 'qwen2_moe')
    """
    return [Case(f"sweep4{i:02d}", ModelSpec(**model), TrainingConfig(device=device, **training))
            for i, (model, training) in enumerate(ROWS)]
