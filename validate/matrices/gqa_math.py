"""ci rows for SDPA's CPU math kernel (attention dropout) with grouped kv heads (enable_gqa),
drawn first by the random validation sweep: pure bf16 Llama under per-layer and sqrt
checkpointing, a selective Gemma with one kv head under bf16 autocast, a sqrt Gemma under fp16
autocast.

What the live-tensor tracker showed at the checkpointed forward's peak (the dropout of the math
kernel, memcalc.families.attention.sdpa_math): pre_process_group_query_attention_input repeats k
and v before k is scaled, and the repeated `key_expanded` / `value_expanded` live until the
function returns, as do the upcasts `key_acc` and `value_acc` of half inputs; the scaled
transpose of the contiguous repeated k reaches bmm uncopied.

    python -m validate run --matrix ci --only '^gqamath' --device cpu
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

LLAMA = dict(family="llama", vocab_size=185, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
             intermediate_size=128, activation="silu", attn_dropout=0.1, tie_embeddings=False,
             max_position_embeddings=1024)
GEMMA = dict(family="gemma", hidden_size=64, num_kv_heads=1, intermediate_size=128, activation="gelu_tanh",
             attn_dropout=0.1, qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=False)


def _training(b: int, s: int, precision: str, ck: str, optimizer: str, device: str, **extra: object
              ) -> TrainingConfig:
    return TrainingConfig.make(micro_batch=b, seq_len=s, precision=precision, optimizer=optimizer,
                               checkpointing=ck, attention="sdpa", device=device, **extra)


def ci_gqa_math_cases(device: str = "cpu") -> list[Case]:
    """The rows, named gqamath-...: the sweep's pure bf16 Llama (reference with biases, HF
    without) per-layer and sqrt, the selective and sqrt Gemma with one kv head.

    >>> cases = ci_gqa_math_cases(); len(cases), cases[0].name, cases[0].spec.num_kv_heads
    (5, 'gqamath-ref-bf16-perlayer', 2)
    """
    ref = ModelSpec.make(name="llama-ref-gqa", implementation="reference", **LLAMA)
    hf = ModelSpec.make(name="llama-hf-gqa", qkv_bias=False, out_bias=False, mlp_bias=False, **LLAMA)
    bf16 = dict(precision="bf16", optimizer="sgd-momentum", device=device, grad_accum=3)
    gemma1 = ModelSpec.make(name="gemma-mqa", vocab_size=19, num_layers=1, num_heads=8, **GEMMA)
    gemma4 = ModelSpec.make(name="gemma-mqa2", vocab_size=97, num_layers=4, num_heads=2, **GEMMA)
    return [Case("gqamath-ref-bf16-perlayer", ref, _training(3, 78, ck="per-layer", **bf16)),
            Case("gqamath-ref-bf16-sqrt", ref, _training(3, 78, ck="sqrt", **bf16)),
            Case("gqamath-hf-bf16-perlayer", hf, _training(3, 78, ck="per-layer", **bf16)),
            Case("gqamath-gemma-selective", gemma1, _training(8, 19, "bf16-amp", "selective", "adam", device,
                                                                optimizer_impl="for-loop")),
            Case("gqamath-gemma-fp16-sqrt", gemma4, _training(6, 48, "fp16-amp", "sqrt", "adam", device,
                                                                optimizer_impl="foreach", max_grad_norm=1.0,
                                                                grad_accum=2))]
