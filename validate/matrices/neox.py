"""ci rows for checkpointed layers under autocast that run SDPA's CPU math kernel (attention
dropout), drawn first by the fresh sweep (scripts/fresh_sweep.py) on HF GPT-NeoX
(memcalc.families.hf_gpt_neox, attention.sdpa_math, tape.simulate StepSimulator._recompute,
loss.hf_causal_lm_loss).

What the checkpointed forward (which saves nothing) and the recompute showed: GPTNeoXLayer passes
its norms' outputs straight into the attention and MLP calls, so they live until those modules
return; the math kernel holds its arguments (autocast's casts of q, k, v), `query`, `attn` and the
attention weights cast back to the input dtype until it returns, and copies neither q nor k^T
when the rotary cat made them contiguous; the recompute's autocast caches the weight casts (bias
casts no op saves among them) until the recompute stops; ForCausalLMLoss keeps the padded labels
until it returns. The same paths run in an HF Llama (h 96, 6 heads, L 4, b 2, s 128, bf16-amp,
per-layer), one of the rows.

    python -m validate run --matrix ci --only '^neox' --device cpu
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.matrices.families_a import SHAPES as SHAPES_A
from validate.matrices.families_a import family_config
from validate.matrices.families_b import SHAPES, family_spec

# the fresh sweep's case: GPT-NeoX, parallel residual, every dropout 0.1, fp16-amp, per-layer
SWEEP = dict(family="gpt_neox", vocab_size=240, hidden_size=64, num_layers=2, num_heads=2,
             intermediate_size=64, activation="gelu", attn_dropout=0.1, embd_dropout=0.1, resid_dropout=0.1,
             parallel_residual=True, rotary_fraction=1.0, tie_embeddings=False)
# (name, model, precision, checkpointing, optimizer, shape index, attention dropout)
ROWS = (
    ("neox-seq-bf16-everyk", "gpt_neox_sequential", "bf16-amp", "every-k", "adamw", 2, 0.1),
    ("neox-bf16-sqrt", "gpt_neox", "bf16-amp", "sqrt", "adam", 2, 0.1),
    ("neox-fp16-selective", "gpt_neox", "fp16-amp", "selective", "sgd", 1, 0.1),
    ("neox-fp32-perlayer", "gpt_neox", "fp32", "per-layer", "adamw", 0, 0.1),
    ("neox-llama-gqa-fp16", "llama", "fp16-amp", "per-layer", "adamw", 0, 0.1),
    ("neox-phi3-bf16", "phi3", "bf16-amp", "per-layer", "sgd-momentum", 2, 0.1),
    ("neox-gpt2-fp16", "gpt2", "fp16-amp", "per-layer", "adamw", 1, 0.1),
)


def _spec(model: str, shape: dict, attn_dropout: float) -> ModelSpec:
    if model == "gpt_neox_sequential":
        return family_spec("gpt_neox", shape, attn_dropout).with_(parallel_residual=False)
    if model == "gpt2":
        p = shape["dropout"]
        return ModelSpec.make(name="gpt2-like", family="gpt2", vocab_size=shape["V"], hidden_size=shape["h"],
                              num_layers=shape["L"], num_heads=shape["a"], max_position_embeddings=256,
                              embd_dropout=p, attn_dropout=attn_dropout, resid_dropout=p)
    return family_spec(model, shape, attn_dropout)


def _training(b: int, s: int, precision: str, ck: str, optimizer: str, device: str) -> TrainingConfig:
    return TrainingConfig.make(micro_batch=b, seq_len=s, precision=precision, optimizer=optimizer,
                               checkpointing=ck, checkpoint_every=2 if ck == "every-k" else None,
                               attention="sdpa", device=device)


def ci_neox_cases(device: str = "cpu") -> list[Case]:
    """The rows, named neox-...: the sweep's case with and without attention dropout, then
    GPT-NeoX variants and the shared paths on other families, an HF Llama (h 96, L 4) and a
    Mistral whose sliding window SDPA materialises (the masked math path).

    >>> cases = ci_neox_cases(); len(cases), cases[0].name, cases[0].spec.parallel_residual
    (11, 'neox-sweep', True)
    """
    sweep = ModelSpec.make(name="gpt_neox-sweep", **SWEEP)
    cases = [Case("neox-sweep", sweep, _training(2, 113, "fp16-amp", "per-layer", "sgd-momentum", device)),
             Case("neox-sweep-nodrop", sweep.with_(attn_dropout=0.0),
                  _training(2, 113, "fp16-amp", "per-layer", "sgd-momentum", device))]
    for name, model, precision, ck, optimizer, k, p in ROWS:
        shape = SHAPES[k]
        cases.append(Case(name, _spec(model, shape, p), _training(shape["b"], shape["s"], precision, ck,
                                                                  optimizer, device)))
    llama = ModelSpec.make(name="llama-readme", family="llama", vocab_size=256, hidden_size=96, num_layers=4,
                           num_heads=6, intermediate_size=256, qkv_bias=False, out_bias=False, mlp_bias=False,
                           activation="silu", tie_embeddings=False, attn_dropout=0.1)
    cases.append(Case("neox-llama-readme", llama, _training(2, 128, "bf16-amp", "per-layer", "adamw", device)))
    shape = SHAPES_A[0]
    cfg = family_config("mistral", shape, "short", 0.1)
    cases.append(Case("neox-mistral-window", ModelSpec.from_hf_config(cfg).with_(name="mistral-short"),
                      _training(shape["b"], shape["s"], "bf16-amp", "per-layer", "adamw", device), cfg))
    return cases
