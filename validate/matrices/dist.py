"""The dist-ci matrix: data-parallel (DDP, ZeRO-1, FSDP2) and tensor-parallel cases at a small
shape, measured on gloo ranks on CPU (validate.distributed.measure). Each case's TrainingConfig carries
its world_size, sharding and tensor_parallel.

    python -m validate run --matrix dist-ci --device cpu --out validate/results/dist-ci.jsonl
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case
from validate.matrices.families_b import dist_families_b
from validate.distributed.job import SHARDINGS

# The shape the brief asks for: h=128, L=3, V=1000, b=2, s=64. Padding rows use sizes that 4 does
# not divide (V=1001, f=346), so FSDP2 pads dim 0 and ranks differ.
DIST_SHAPE = dict(h=128, L=3, V=1000, a=4, kv=2, f=344, b=2, s=64)


def dist_model(kind: str, V: int = 1000, f: int = 344) -> ModelSpec:
    """gpt2-ref, llama-ref, gpt2-hf or llama-hf at the dist-ci shape.

    >>> dist_model("llama-ref").param_count
    800640
    """
    sh = DIST_SHAPE
    impl = "hf" if kind.endswith("-hf") else "reference"
    if kind.startswith("gpt2"):
        return ModelSpec.make(name=f"gpt2-{impl}", family="gpt2", vocab_size=V, hidden_size=sh["h"],
                              num_layers=sh["L"], num_heads=sh["a"], max_position_embeddings=256,
                              implementation=impl)
    return ModelSpec.make(name=f"llama-{impl}", family="llama", vocab_size=V, hidden_size=sh["h"],
                          num_layers=sh["L"], num_heads=sh["a"], num_kv_heads=sh["kv"],
                          intermediate_size=f, max_position_embeddings=256, tie_embeddings=False,
                          qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
                          implementation=impl)


def dist_ci_matrix(device: str = "cpu") -> list[Case]:
    """World sizes 2 and 4 x each sharding x (gpt2-ref, llama-ref, llama-hf), fp32 AdamW, plus
    two padding rows (llama-ref with V=1001, f=346 at W=4, zero2 and zero3), two FSDP2 rows with
    gradient accumulation, three with FSDP2's MixedPrecisionPolicy, then the tensor-parallel rows
    (tensor_parallel_cases), three mixture-of-experts rows (validate.matrices.moe.dist_moe_cases) and
    two with the auxiliary loss (validate.matrices.moe_aux.dist_moe_aux_cases) and one GPT-OSS row
    (validate.matrices.gpt_oss.dist_gpt_oss_cases).

    >>> cases = dist_ci_matrix(); len(cases), cases[0].label
    (67, 'gpt2-ref-W2-none: reference gpt2 L3 h128 V1000 | b2 s64 fp32 adamw | W2 none')
    """
    training = TrainingConfig.make(micro_batch=DIST_SHAPE["b"], seq_len=DIST_SHAPE["s"],
                                   device=device)
    cases = [_case(f"{kind}-W{ws}-{sharding}", dist_model(kind), training, ws, sharding)
             for kind in ("gpt2-ref", "llama-ref", "llama-hf") for ws in (2, 4)
             for sharding in SHARDINGS]
    padded = dist_model("llama-ref", V=1001, f=346)
    cases += [_case(f"llama-ref-pad-W4-{sh}", padded, training, 4, sh) for sh in ("zero2", "zero3")]
    # gradient accumulation under FSDP2: later micro-steps add the reduce-scatter output into the
    # sharded .grad in place
    cases += [_case("llama-ref-pad-W4-zero3-ga2-bf16-amp-per-layer", padded,
                    training.with_(grad_accum=2, precision="bf16-amp", checkpointing="per-layer"),
                    4, "zero3"),
              _case("gpt2-ref-W2-zero2-ga3", dist_model("gpt2-ref"), training.with_(grad_accum=3),
                    2, "zero2")]
    # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    mixed = training.with_(sharding="zero3", fsdp_mixed_precision=True)
    cases += [_case("llama-ref-W2-zero3-mp", dist_model("llama-ref"), mixed, 2, "zero3"),
              _case("gpt2-ref-W4-zero2-mp-per-layer", dist_model("gpt2-ref"),
                    mixed.with_(checkpointing="per-layer"), 4, "zero2"),
              _case("llama-ref-pad-W4-zero3-mp-ga2", padded, mixed.with_(grad_accum=2), 4, "zero3")]
    cases += dist_families_b(device)  # issue 12 part b: Phi-3, GPT-NeoX, OLMo-2, Granite, SmolLM3
    from validate.matrices.moe import dist_moe_cases
    from validate.matrices.moe_aux import dist_moe_aux_cases
    from validate.matrices.gpt_oss import dist_gpt_oss_cases

    return (cases + tensor_parallel_cases(training) + call_path_cases(training)
            + dist_moe_cases(device)  # MoE: validate/matrices/moe.py
            + dist_moe_aux_cases(device)  # MoE auxiliary loss, jitter: validate/matrices/moe_aux.py
            + dist_gpt_oss_cases(device))  # GPT-OSS: validate/matrices/gpt_oss.py


def call_path_cases(training: TrainingConfig) -> list[Case]:
    """HF Llama on DDP and FSDP2 ranks with the Trainer's call path (memcalc.families.call_path):
    the DynamicCache, a padded mask, separate labels and num_items_in_batch.

    >>> [c.name for c in call_path_cases(TrainingConfig(micro_batch=2, seq_len=64, device="cpu"))]
    ['llama-hf-W2-none-callpath', 'llama-hf-W4-zero2-callpath', 'llama-hf-W2-zero3-callpath-bf16-amp']
    """
    path = training.with_(use_cache=True, attention_mask="padded", pad_tokens=5, labels="separate",
                          num_items_in_batch=True)
    model = dist_model("llama-hf")
    return [_case("llama-hf-W2-none-callpath", model, path, 2, "none"),
            _case("llama-hf-W4-zero2-callpath", model, path, 4, "zero2"),
            _case("llama-hf-W2-zero3-callpath-bf16-amp", model, path.with_(precision="bf16-amp"), 2, "zero3")]


# Tensor-parallel rows: (model, degree, TrainingConfig changes). Llama gets 8 query and 4 kv heads
# so that 2 and 4 both divide them; every precision, checkpointing mode, attention kind and
# optimizer implementation appears at least once.
TP_ROWS = (
    ("gpt2-ref", 2, {}),
    ("gpt2-ref", 4, dict(precision="bf16-amp", checkpointing="per-layer", optimizer_impl="foreach")),
    ("gpt2-ref-drop", 2, dict(precision="fp16-amp", attention="eager", optimizer="sgd-momentum")),
    ("gpt2-ref-untied", 4, dict(precision="bf16", checkpointing="selective", optimizer="adam",
                                optimizer_impl="fused")),
    ("llama-ref", 2, {}),
    ("llama-ref", 4, dict(precision="bf16-amp", checkpointing="per-layer")),
    ("llama-ref", 2, dict(precision="fp16-amp", grad_accum=2, optimizer_impl="foreach")),
    ("llama-ref", 4, dict(checkpointing="sqrt", attention="eager")),
    ("llama-hf", 2, {}),
    ("llama-hf", 4, dict(precision="bf16-amp", checkpointing="selective", optimizer_impl="foreach")),
    ("llama-hf", 2, dict(precision="bf16", checkpointing="per-layer", optimizer="sgd-momentum",
                         optimizer_impl="foreach")),
    ("llama-hf", 4, dict(precision="fp16-amp", attention="eager", grad_accum=2)),
    # sequence parallelism (reference models)
    ("gpt2-ref", 2, dict(sequence_parallel=True)),
    ("gpt2-ref-drop", 4, dict(sequence_parallel=True, precision="bf16-amp", attention="eager",
                              checkpointing="per-layer")),
    ("llama-ref", 2, dict(sequence_parallel=True, precision="bf16", checkpointing="selective",
                          optimizer_impl="foreach")),
    ("llama-ref", 4, dict(sequence_parallel=True, precision="fp16-amp", grad_accum=2)),
)


def tp_model(kind: str) -> ModelSpec:
    """The dist-ci shape for tensor parallelism (llama: 8 heads, 4 kv heads; gpt2 variants with
    dropout or untied embeddings).

    >>> tp_model("llama-ref").num_kv_heads, tp_model("gpt2-ref-drop").attn_dropout
    (4, 0.1)
    """
    base = kind.split("-drop")[0].split("-untied")[0].split("-pad")[0]
    spec = dist_model(base, f=346) if kind.endswith("-pad") else dist_model(base)
    if spec.family == "llama":
        spec = spec.with_(num_heads=8, num_kv_heads=4)
    if kind.endswith("-drop"):
        spec = spec.with_(attn_dropout=0.1, resid_dropout=0.1, embd_dropout=0.1)
    if kind.endswith("-untied"):
        spec = spec.with_(tie_embeddings=False)
    return spec


# 2-D rows: (model, tensor_parallel, world_size, sharding, changes): a (dp, tp) mesh, tensor
# parallelism inside each row, FSDP2 across them. The padded Llama (f=346: 173 rows per TP rank,
# odd) makes FSDP pad, so DP ranks differ.
TP2D_ROWS = (
    ("llama-ref-pad", 2, 4, "zero3", {}),
    ("gpt2-ref", 2, 4, "zero2", dict(precision="bf16-amp", checkpointing="per-layer")),
    ("llama-ref", 2, 4, "zero3", dict(sequence_parallel=True, precision="bf16",
                                      optimizer_impl="foreach")),
    ("llama-hf", 2, 4, "zero3", dict(precision="bf16-amp", checkpointing="selective")),
    ("gpt2-ref", 2, 4, "zero2", dict(grad_accum=2)),
    ("llama-hf", 2, 4, "zero3", dict(fsdp_mixed_precision=True, optimizer_impl="foreach")),
)


def tensor_parallel_cases(training: TrainingConfig) -> list[Case]:
    """TP_ROWS as cases (world_size == tensor_parallel, sharding none), then TP2D_ROWS."""
    rows = [(kind, tp, tp, "none", changes) for kind, tp, changes in TP_ROWS] + list(TP2D_ROWS)
    cases = []
    for kind, tp, world, sharding, changes in rows:
        t = training.with_(world_size=world, tensor_parallel=tp, sharding=sharding, **changes)
        suffix = "-".join("mp" if k == "fsdp_mixed_precision" else "SP" if v is True
                          else f"ga{v}" if k == "grad_accum" else str(v) for k, v in changes.items())
        name = f"{kind}-TP{tp}" + (f"-W{world}-{sharding}" if world > tp else "")
        cases.append(Case(name + (f"-{suffix}" if suffix else ""), tp_model(kind), t))
    return cases


def _case(name: str, spec: ModelSpec, training: TrainingConfig, world_size: int,
          sharding: str) -> Case:
    return Case(name, spec, training.with_(world_size=world_size, sharding=sharding))


__all__ = ["dist_ci_matrix", "dist_model", "tp_model", "tensor_parallel_cases", "DIST_SHAPE",
           "TP_ROWS", "TP2D_ROWS"]
