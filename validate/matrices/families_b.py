"""ci rows (named cifb...) for Phi-3 (partial rotary, residual dropout),
GPT-NeoX (parallel and sequential residual, partial rotary, dropouts), OLMo-2, Granite and
SmolLM3 (NoPE layers), each crossed pairwise with precisions, checkpointing modes, eager/SDPA,
optimizers and their kernels (memcalc.families.hf_phi3, hf_gpt_neox, hf_olmo2, hf_granite,
hf_llama).

Attention dropout is drawn only without checkpointing: checkpointed layers running SDPA's math
kernel (which CPU runs under attention dropout) are measured by validate/matrices/neox.py's rows
instead. OLMo-2 rows
run bf16-amp where the design draws fp16-amp: at GradScaler's initial scale (65536) the randomly
initialised OLMo-2's scaled gradients overflow fp16 in every measured step, the scaler skips
optimizer.step(), and the measurement then holds no optimizer states (checked: no state after 3
steps), which is not the steady state memcalc predicts.
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.matrices.pairwise import TRAINING_AXES, pairwise, pairwise_case

# small shapes (~1 s a row under the tracker), each family's variant chosen by the shape
SHAPES = (
    dict(h=64, a=4, kv=2, d=16, L=2, V=500, b=4, s=64, f=176, dropout=0.0, tie=False, rotary=0.5, parallel=True),
    dict(h=128, a=4, kv=4, d=32, L=3, V=1500, b=2, s=96, f=344, dropout=0.1, tie=True, rotary=1.0, parallel=False),
    dict(h=96, a=6, kv=3, d=16, L=4, V=1000, b=3, s=48, f=256, dropout=0.1, tie=False, rotary=0.25, parallel=True),
)
AXES = {
    "model": ("phi3", "gpt_neox", "olmo2", "granite", "smollm3"),
    **TRAINING_AXES,
    "shape": tuple(range(len(SHAPES))),
}


def family_spec(model: str, shape: dict, attn_dropout: float) -> ModelSpec:
    """A small spec of one family on a shape.

    >>> family_spec("gpt_neox", SHAPES[0], 0.0).parallel_residual
    True
    """
    common = dict(name=f"{model}-like", vocab_size=shape["V"], hidden_size=shape["h"], num_layers=shape["L"],
                  num_heads=shape["a"], intermediate_size=shape["f"], max_position_embeddings=256,
                  tie_embeddings=shape["tie"], attn_dropout=attn_dropout)
    p = shape["dropout"]
    if model == "gpt_neox":
        return ModelSpec.make(family="gpt_neox", activation="gelu", rotary_fraction=shape["rotary"],
                              parallel_residual=shape["parallel"], embd_dropout=p, resid_dropout=p, **common)
    llama = dict(num_kv_heads=shape["kv"], head_dim=shape["d"], qkv_bias=False, out_bias=False, mlp_bias=False,
                 activation="silu", **common)
    if model == "phi3":
        return ModelSpec.make(family="phi3", rotary_fraction=shape["rotary"], resid_dropout=p, **llama)
    if model == "smollm3":
        return ModelSpec.make(family="llama", no_rope_layers=tuple(range(shape["L"] - 1, -1, -2)), **llama)
    return ModelSpec.make(family=model, **llama)


def ci_families_b(device: str, seed: int = 0) -> list[Case]:
    """One pairwise design over the part-b families (rows named cifb00...; validate.matrices.pairwise's
    design and row builder, as the ci matrix's), then the GPT-2 upcast rows.

    >>> cases = ci_families_b("cpu"); 20 <= len(cases) <= 40
    True
    """
    cases = []
    for i, r in enumerate(pairwise(AXES, seed=seed)):
        shape = SHAPES[r["shape"]]
        spec = family_spec(r["model"], shape, shape["dropout"] if r["checkpointing"] == "none" else 0.0)
        if (r["model"], r["precision"]) == ("olmo2", "fp16-amp"):  # see the module docstring
            r = {**r, "precision": "bf16-amp"}
        cases.append(pairwise_case(f"cifb{i:02d}-{r['model']}", r, shape, device, spec))
    return cases + ci_gpt2_upcast(device)


# GPT-2 with reorder_and_upcast_attn (GPT2Attention._upcast_and_reordered_attn, eager only; under
# SDPA the flag is not read): each precision and checkpointing mode once, plus one SDPA row
UPCAST_ROWS = (
    ("fp32", "none", "adamw", "foreach", "eager", 0),
    ("bf16-amp", "selective", "adam", "fused", "eager", 1),
    ("fp16-amp", "per-layer", "sgd-momentum", "for-loop", "eager", 2),
    ("bf16", "sqrt", "adamw", "for-loop", "eager", 1),
    ("bf16-amp", "every-k", "sgd", "foreach", "eager", 0),
    ("bf16-amp", "none", "adamw", "fused", "sdpa", 2),
)


def ci_gpt2_upcast(device: str = "cpu") -> list[Case]:
    """HF GPT-2 rows with reorder_and_upcast_attn (named cifb-upcastNN).

    >>> [c.spec.reorder_and_upcast_attn for c in ci_gpt2_upcast()][:2]
    [True, True]
    """
    cases = []
    for i, (precision, ck, optimizer, impl, attention, k) in enumerate(UPCAST_ROWS):
        shape = SHAPES[k]
        p = 0.1 if ck == "none" or attention == "eager" else 0.0
        spec = ModelSpec.make(name="gpt2-upcast", family="gpt2", vocab_size=shape["V"], hidden_size=shape["h"],
                              num_layers=shape["L"], num_heads=shape["a"], max_position_embeddings=256,
                              embd_dropout=p, attn_dropout=p, resid_dropout=p, reorder_and_upcast_attn=True)
        training = TrainingConfig.make(
            micro_batch=shape["b"], seq_len=shape["s"], grad_accum=1 + i % 2, precision=precision,
            optimizer=optimizer, optimizer_impl=impl, checkpointing=ck,
            checkpoint_every=2 if ck == "every-k" else None, attention=attention, device=device)
        cases.append(Case(f"cifb-upcast{i:02d}", spec, training))
    return cases


# data parallelism over the part-b programs (gloo ranks; appended to dist-ci): each sharding once
DIST_ROWS = (("phi3", 2, "zero3", "fp32"), ("gpt_neox", 2, "none", "bf16-amp"), ("olmo2", 2, "zero2", "bf16"),
             ("granite", 2, "zero1", "fp32"), ("smollm3", 2, "zero3", "bf16-amp"))


def dist_families_b(device: str = "cpu") -> list[Case]:
    """DDP / ZeRO-1 / FSDP2 rows of the part-b families (named famb-<model>-W2-<sharding>).

    >>> [c.distributed for c in dist_families_b()] == [True] * len(DIST_ROWS)
    True
    """
    shape = SHAPES[0]
    cases = []
    for model, world, sharding, precision in DIST_ROWS:
        training = TrainingConfig.make(micro_batch=2, seq_len=64, precision=precision, attention="sdpa",
                                       world_size=world, sharding=sharding, device=device)
        cases.append(Case(f"famb-{model}-W{world}-{sharding}", family_spec(model, shape, 0.0), training))
    return cases
