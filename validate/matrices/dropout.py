"""The attention-dropout rows of the ci matrix (named dropoutNN): eager attention with attention
dropout in every llama-family HF program, mostly under autocast, where the forward peak moves to
the end of the last layer (the dropout output, which `hidden_states, _ = self.self_attn(...)`
keeps alive until the layer returns, plus the CPU dropout's saved noise tensor) and so
measures what the layer's locals hold there: a norm's argument until the norm returns
(memcalc.families.layers.NORM_ARGUMENT), the norm outputs freed when `hidden_states` is rebound
(hf_llama.BLOCK_REBINDING), LlamaRMSNorm's `variance` and the base model's `position_ids`
(hf_llama.POSITION_IDS_LOCAL); three more rows (ATTENTION_ROWS) peak inside the
attention function in their forward phase. From a fresh-sweep miss (scripts/fresh_sweep.py: Gemma-3 fp16-amp,
eager, attention dropout 0.1, forward under by 0.67%).
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

_BASE = dict(implementation="hf", vocab_size=16, hidden_size=64, num_layers=1, num_heads=8,
             intermediate_size=128, attn_dropout=0.1, max_position_embeddings=1024, tie_embeddings=False)
_LLAMA = dict(qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu")
_GEMMA = dict(qkv_bias=False, out_bias=False, mlp_bias=False, activation="gelu_tanh")
ROWS = (  # (family and model fields, precision, micro_batch, seq_len)
    (dict(family="gemma3", **{**_GEMMA, "qkv_bias": True, "out_bias": True}, num_kv_heads=1, qk_norm=True,
          logit_softcap=True, sliding_window=32, sliding_window_pattern=3), "fp16-amp", 3, 104),
    (dict(family="gemma3", **_GEMMA, num_kv_heads=2, qk_norm=True, sliding_window=16,
          sliding_window_pattern=2, num_layers=2), "bf16-amp", 2, 48),
    (dict(family="gemma2", **_GEMMA, num_kv_heads=1, attn_softcap=True, logit_softcap=True,
          sliding_window=32, sliding_window_pattern=2), "fp16-amp", 2, 64),
    (dict(family="gemma", **_GEMMA, num_kv_heads=1), "bf16-amp", 2, 64),
    (dict(family="llama", **_LLAMA, num_kv_heads=1), "fp16-amp", 2, 64),
    (dict(family="llama", **_LLAMA, num_kv_heads=2, qk_norm=True), "bf16-amp", 2, 64),  # Qwen3-style
    (dict(family="llama", **_LLAMA, num_kv_heads=2, sliding_window=32), "fp16-amp", 2, 48),  # Mistral
    (dict(family="phi3", **_LLAMA, num_kv_heads=1), "bf16-amp", 2, 64),
    (dict(family="olmo2", **_LLAMA, num_kv_heads=2), "fp16-amp", 2, 64),
    (dict(family="granite", **_LLAMA, num_kv_heads=1), "bf16-amp", 2, 64),
    (dict(family="llama", **_LLAMA, num_kv_heads=1), "fp32", 2, 64),
    (dict(family="gemma3", **_GEMMA, num_kv_heads=1, qk_norm=True, sliding_window=32,
          sliding_window_pattern=3), "fp32", 2, 64),
)
ATTENTION_ROWS = (  # (model fields, training fields): forward-phase moments inside llama_eager
    (dict(family="llama", **_LLAMA, num_kv_heads=1, attn_dropout=0.0),  # one kv head: repeat_kv views
     dict(precision="fp16-amp", micro_batch=2, seq_len=256)),
    (dict(family="gemma2", **_GEMMA, num_kv_heads=1, attn_dropout=0.0, sliding_window=64,
          sliding_window_pattern=2), dict(precision="bf16", micro_batch=2, seq_len=128)),  # softmax's cast
    (dict(family="llama", **_LLAMA, num_kv_heads=8, attn_dropout=0.0, num_layers=2),  # v copied at p @ v
     dict(precision="bf16", micro_batch=2, seq_len=40, checkpointing="every-k", checkpoint_every=1)),
)
"""Rows whose forward phase peaks inside the attention function (checked phase by phase by
tests/test_attention_dropout.py): attention.KV_EXPAND_VIEW, the softmax input held through
softmax's dtype cast, and the (b, heads, s, d) copy of v made by p @ v's reshape, after the
softmax."""


def ci_dropout_cases(device: str = "cpu") -> list[Case]:
    """The attention-dropout rows.

    >>> cases = ci_dropout_cases(); len(cases), {c.training.attention for c in cases}
    (15, {'eager'})
    """
    rows = [(model, dict(precision=precision, micro_batch=b, seq_len=s)) for model, precision, b, s in ROWS]
    return [Case(f"dropout{i:02d}", ModelSpec(**{**_BASE, **model}),
                 TrainingConfig(optimizer="sgd-momentum", optimizer_impl="for-loop", attention="eager",
                                device=device, **training))
            for i, (model, training) in enumerate(rows + list(ATTENTION_ROWS))]
