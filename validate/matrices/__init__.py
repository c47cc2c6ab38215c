"""Named validation matrices: lists of Cases (model spec, training config, optional HF config).
`get_matrix` serves every matrix: ci, gpu-quick, gpu-full and the distributed dist-ci
(validate/matrices/dist.py).

`ci` (CPU) and `gpu-full` are covering designs: every value of every axis appears and every pair of
values of any two axes appears in some row (validate.matrices.pairwise: greedy pairwise construction,
deterministic), far fewer rows than the full product. `gpu-quick` is a hand-picked list sized
for ~5 minutes on one H200, with 7B-class layer shapes at realistic sequence lengths and few
layers.
"""
from __future__ import annotations

from memcalc.core.errors import UnknownNameError, closest_names
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import PRECISIONS, TrainingConfig
from validate.run.case import Case
from validate.matrices.finetune import finetune_cases
from validate.matrices.moe import ci_moe_cases
from validate.matrices.gpt_oss import ci_gpt_oss_cases
from validate.matrices.moe_aux import ci_moe_aux_cases
from validate.matrices.moe_optim import ci_moe_optim_cases
from validate.matrices.one_head import ci_one_head_cases
from validate.matrices.neox import ci_neox_cases
from validate.matrices.families_b import ci_families_b
from validate.matrices.call_path import ci_callpath_cases
from validate.matrices.call_path_families import ci_call_path_family_cases
from validate.matrices.trainer import ci_trainer_cases
from validate.matrices.optim import ci_optim_matrix
from validate.matrices.dropout import ci_dropout_cases
from validate.matrices.gqa_math import ci_gqa_math_cases
from validate.matrices.sweep3 import ci_sweep3_cases
from validate.matrices.sweep4 import ci_sweep4_cases
from validate.matrices.shapes import CI_SHAPES, _case, _model, qwen2_config  # noqa: F401 (re-exported)
from validate.matrices.dist import dist_ci_matrix
from validate.matrices.pairwise import TRAINING_AXES, pairwise, pairwise_case  # noqa: F401 (pairwise, pairwise_case re-exported)


# ---- ci ----------------------------------------------------------------------------------------
CI_AXES = {
    "model": ("gpt2-ref", "llama-ref", "gpt2-hf", "llama-hf", "qwen2-hf"),
    **TRAINING_AXES,
    "shape": tuple(range(len(CI_SHAPES))),
}


def ci_matrix(device: str = "cpu") -> list[Case]:
    """The CPU matrix: pairwise over model x precision x checkpointing x optimizer x impl x
    attention x grad_accum x shape.

    Two independent pairwise designs (seeds 0 and 1), so every pair is covered twice.

    Then the families read from config.json (validate.matrices.families_a: Qwen3, sliding windows,
    Gemma, Gemma-2, Gemma-3; validate.matrices.families_b: Phi-3, GPT-NeoX, OLMo-2, Granite, SmolLM3) and
    the fine-tuning optimizers (validate.matrices.optim), the call paths and the Trainer
    (validate.matrices.call_path, ci_trainer), LoRA/QLoRA (validate.matrices.finetune) and MoE (validate.matrices.moe).

    >>> cases = ci_matrix(); 300 < len(cases) < 500
    True
    """
    from validate.matrices.families_a import families_cases

    rows = pairwise(CI_AXES, seed=0) + pairwise(CI_AXES, seed=1)
    cases = [_case(f"ci{i:02d}", r, CI_SHAPES[r["shape"]], device) for i, r in enumerate(rows)]
    cases += ci_families_b(device)  # issue 12 part b: Phi-3, GPT-NeoX, OLMo-2, Granite, SmolLM3
    cases += families_cases(device)  # issue 12 part a: Qwen3, sliding windows, Gemma 1/2/3
    cases += ci_moe_cases(device)  # mixture-of-experts rows (validate/matrices/moe.py)
    cases += ci_moe_aux_cases(device)  # MoE auxiliary loss, router jitter (validate/matrices/moe_aux.py)
    cases += ci_gpt_oss_cases(device)  # GPT-OSS rows (validate/matrices/gpt_oss.py)
    cases += ci_moe_optim_cases(device)  # Adafactor, AdamW8bit on MoE experts (validate/matrices/moe_optim.py)
    cases += ci_one_head_cases(device)  # num_heads == 1: views, not copies (validate/matrices/one_head.py)
    cases += ci_neox_cases(device)  # checkpointing + autocast + SDPA math, GPT-NeoX (validate/matrices/neox.py)
    cases += ci_dropout_cases(device)  # eager attention dropout, llama families (validate/matrices/dropout.py)
    cases += ci_gqa_math_cases(device)  # SDPA math with enable_gqa (validate/matrices/gqa_math.py)
    cases += ci_sweep3_cases(device)  # SDPA math GQA, Qwen2-MoE, eager experts (validate/matrices/sweep3.py)
    cases += ci_sweep4_cases(device)  # one kv head at b=1, top_k 1 grouped experts (validate/matrices/sweep4.py)
    return (cases + ci_optim_matrix(device, _model)  # fine-tuning optimizers, clipping (validate/matrices/optim.py)
            + ci_callpath_cases(device)  # the HF call paths (validate/matrices/call_path.py)
            + ci_trainer_cases(device)  # through transformers.Trainer (validate/matrices/trainer.py)
            + finetune_cases(device)  # LoRA, QLoRA, frozen parameters (validate/matrices/finetune.py)
            + ci_call_path_family_cases(device))  # the Trainer's call path, every family (call_path_families.py)


# ---- gpu ---------------------------------------------------------------------------------------
def _preset(name: str, **changes) -> ModelSpec:
    return ModelSpec.preset(name).with_(**changes)


def _tc(**fields) -> TrainingConfig:
    return TrainingConfig.make(device="cuda", **fields)


def gpu_quick_matrix(device: str = "cuda") -> list[Case]:
    """About 5 minutes on one H200: hand-picked cases (GPT-2 small/medium whole, 7B-class layers
    of Llama-2, Mistral, Llama-3 with its 128K vocabulary at 2K-8K tokens, Qwen2-0.5B whole, a
    few-hundred-MB and a tens-of-GB extreme) plus two pairwise designs over models x
    implementation x precision x checkpointing x optimizer x kernel x attention x accumulation.

    >>> len(gpu_quick_matrix()) >= 48
    True
    """
    full = dict(embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)
    rows = [
        ("gpt2-bf16amp", _preset("gpt2"), _tc(micro_batch=8, seq_len=1024, precision="bf16-amp", optimizer_impl="fused")),
        ("gpt2-fp32-eager-ckpt", _preset("gpt2"), _tc(micro_batch=8, seq_len=1024, attention="eager", checkpointing="per-layer")),
        ("gpt2-ref-fp16amp", _preset("gpt2", implementation="reference", **full), _tc(micro_batch=8, seq_len=1024, precision="fp16-amp", optimizer="adam")),
        ("gpt2m-sgdm-ga2", _preset("gpt2-medium"), _tc(micro_batch=4, seq_len=1024, optimizer="sgd-momentum", optimizer_impl="for-loop", grad_accum=2)),
        ("llama2-7b-L2-bf16amp", _preset("llama-2-7b", num_layers=2), _tc(micro_batch=1, seq_len=4096, precision="bf16-amp", optimizer_impl="fused")),
        ("llama2-7b-L2-ref-bf16", _preset("llama-2-7b", num_layers=2, implementation="reference"), _tc(micro_batch=2, seq_len=2048, precision="bf16", attention="eager", checkpointing="per-layer")),
        ("mistral-7b-L4-sqrt", _preset("mistral-7b", num_layers=4, max_position_embeddings=8192), _tc(micro_batch=1, seq_len=8192, precision="bf16-amp", checkpointing="sqrt")),
        ("llama3-8b-L2-selective", _preset("llama-3-8b", num_layers=2), _tc(micro_batch=1, seq_len=4096, precision="bf16-amp", attention="eager", checkpointing="selective")),
        ("llama3-8b-L2-ref-sdpa", _preset("llama-3-8b", num_layers=2, implementation="reference"), _tc(micro_batch=2, seq_len=4096, precision="bf16-amp", optimizer="adam")),
        ("qwen2-0.5b-perlayer", _preset("qwen2-0.5b"), _tc(micro_batch=4, seq_len=1024, precision="bf16-amp", checkpointing="per-layer")),
        ("qwen2-0.5b-ref-fp32", _preset("qwen2-0.5b", implementation="reference", num_layers=6), _tc(micro_batch=2, seq_len=1024, optimizer_impl="for-loop", checkpointing="every-k", checkpoint_every=3)),
    ]
    rows += [  # the extremes: a few hundred MB, and tens of GB without checkpointing
        ("gpt2-L2-few-hundred-MB", _preset("gpt2", num_layers=2, **full), _tc(micro_batch=1, seq_len=256, precision="bf16", optimizer="sgd", optimizer_impl="foreach")),
        ("llama2-7b-L4-eager-16k-tokens", _preset("llama-2-7b", num_layers=4), _tc(micro_batch=2, seq_len=4096, precision="bf16-amp", attention="eager")),
    ]
    cases = [Case(n, s, t.with_(device=device)) for n, s, t in rows]
    for i, r in enumerate(pairwise(GPU_QUICK_AXES, seed=2) + pairwise(GPU_QUICK_AXES, seed=3)):
        spec = GPU_QUICK_MODELS[r["model"]](r["implementation"])
        b, s_ = GPU_QUICK_SHAPES[r["shape"]]
        t = _tc(micro_batch=b, seq_len=min(s_, spec.max_position_embeddings),
                grad_accum=r["grad_accum"], precision=r["precision"],
                optimizer=r["optimizer"], optimizer_impl=r["impl"], checkpointing=r["checkpointing"],
                attention=r["attention"])
        cases.append(Case(f"q{i:02d}-{r['model']}", spec, t.with_(device=device)))
    return cases


# pairwise part of gpu-quick: small and 7B-class-layer models, the CUDA defaults and fused kernels
GPU_QUICK_MODELS = {
    "gpt2": lambda impl: _preset("gpt2", implementation=impl),
    "gpt2-medium-L12": lambda impl: _preset("gpt2-medium", num_layers=12, implementation=impl),
    "llama-2-7b-L2": lambda impl: _preset("llama-2-7b", num_layers=2, implementation=impl),
    "qwen2-0.5b-L8": lambda impl: _preset("qwen2-0.5b", num_layers=8, implementation=impl,
                                          max_position_embeddings=8192),
}
GPU_QUICK_SHAPES = ((1, 512), (4, 1024), (1, 4096))
GPU_QUICK_AXES = {
    "model": tuple(GPU_QUICK_MODELS),
    "implementation": ("hf", "reference"),
    "precision": PRECISIONS,
    "checkpointing": ("none", "per-layer", "sqrt"),
    "optimizer": ("adamw", "sgd-momentum"),
    "impl": ("foreach", "fused"),
    "attention": ("eager", "sdpa"),
    "grad_accum": (1, 2),
    "shape": tuple(range(len(GPU_QUICK_SHAPES))),
}


GPU_MODELS = {
    "gpt2": lambda impl: _preset("gpt2", implementation=impl),
    "gpt2-medium": lambda impl: _preset("gpt2-medium", implementation=impl),
    "llama-2-7b-L4": lambda impl: _preset("llama-2-7b", num_layers=4, implementation=impl),
    "mistral-7b-L4": lambda impl: _preset("mistral-7b", num_layers=4, implementation=impl,
                                          max_position_embeddings=8192),
    "qwen2-1.5b-L8": lambda impl: _preset("qwen2-1.5b", num_layers=8, implementation=impl,
                                          max_position_embeddings=8192),
}
GPU_SHAPES = ((1, 4096), (4, 1024), (2, 2048))
GPU_AXES = {
    "model": tuple(GPU_MODELS),
    "implementation": ("hf", "reference"),
    **TRAINING_AXES,
    "shape": tuple(range(len(GPU_SHAPES))),
}


def gpu_full_matrix(device: str = "cuda") -> list[Case]:
    """Pairwise design over 5 real architectures (7B-class with 4 layers) plus two whole 7B runs:
    the lecture's fp32+Adam case (expected to OOM on 141 GB: 112 GB of model states plus
    activations) and a bf16-amp one with per-layer checkpointing."""
    cases = []
    for i, r in enumerate(pairwise(GPU_AXES, seed=1)):
        spec = GPU_MODELS[r["model"]](r["implementation"])
        b, s = GPU_SHAPES[r["shape"]]
        ck = r["checkpointing"]
        t = _tc(micro_batch=b, seq_len=min(s, spec.max_position_embeddings),
                grad_accum=r["grad_accum"], precision=r["precision"], optimizer=r["optimizer"],
                optimizer_impl=r["impl"], checkpointing=ck,
                checkpoint_every=2 if ck == "every-k" else None, attention=r["attention"])
        cases.append(Case(f"gpu{i:02d}-{r['model']}", spec, t.with_(device=device)))
    seven = _preset("llama-2-7b")
    cases.append(Case("llama2-7b-fp32-adam", seven, _tc(micro_batch=1, seq_len=4096, optimizer="adam").with_(device=device)))
    cases.append(Case("llama2-7b-bf16amp-ckpt", seven, _tc(micro_batch=1, seq_len=4096, precision="bf16-amp", optimizer_impl="fused", checkpointing="per-layer").with_(device=device)))
    return cases


# name -> (builder, the device it runs on unless --device says otherwise)
MATRICES = {"ci": (ci_matrix, "cpu"), "gpu-quick": (gpu_quick_matrix, "cuda"),
            "gpu-full": (gpu_full_matrix, "cuda"), "dist-ci": (dist_ci_matrix, "cpu")}


def get_matrix(name: str, device: str | None = None) -> list[Case]:
    """A named matrix; `device` overrides the matrix's own.

    >>> len(get_matrix("gpu-quick")) > 5, get_matrix("dist-ci")[0].distributed
    (True, True)
    """
    if name not in MATRICES:
        raise UnknownNameError("matrix", f"unknown matrix {name!r}",
                               f"use one of: {closest_names(name, list(MATRICES))}")
    build, default = MATRICES[name]
    return build(device or default)
