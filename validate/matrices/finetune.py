"""Fine-tuning rows of the ci matrix: peft LoRA adapters (target sets, ranks, dropout on and
off, every precision and checkpointing mode, GPT-2 Conv1D targets, biases, modules_to_save),
QLoRA (bitsandbytes nf4, nf4-double, fp4 Linear4bit bases) and frozen parameters, on the ci
shapes (validate.matrices.CI_SHAPES). Appended to `ci_matrix`.
"""
from __future__ import annotations

from memcalc.inputs.lora import LoRA
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

QV = ("q_proj", "v_proj")
# small vocabulary and one short sequence: Linear4bit's forward on CPU (gemm_4bit dequantising the
# weight into a temporary, issue 24) sets the forward phase's peak
QLORA_SHAPES = (dict(h=320, a=5, kv=5, L=2, V=500, b=1, s=32, f=1280, P=256, dropout=0.0, tie=False),
                dict(h=256, a=8, kv=2, L=2, V=500, b=1, s=32, f=1024, P=256, dropout=0.0, tie=False))
# (model kind, shape, precision, checkpointing, attention, optimizer, impl, grad_accum, extra)
ROWS = (
    ("llama-hf", 0, "fp32", "none", "sdpa", "adamw", "for-loop", 1, dict(lora=LoRA(rank=8, targets=QV))),
    ("llama-hf", 1, "bf16-amp", "per-layer", "sdpa", "adamw", "foreach", 1,
     dict(lora=LoRA(rank=16, alpha=32, dropout=0.05, targets=QV))),
    ("llama-hf", 2, "bf16", "per-layer", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=4, alpha=8, targets="all-linear"))),
    ("llama-hf", 3, "fp16-amp", "every-k", "eager", "adam", "for-loop", 1,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=["q_proj", "k_proj", "v_proj", "o_proj"]))),
    ("qwen2-hf", 4, "bf16-amp", "sqrt", "sdpa", "adamw", "fused", 1,
     dict(lora=LoRA(rank=8, dropout=0.1, targets="all-linear", bias="all"))),
    ("qwen2-hf", 5, "fp32", "selective", "eager", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=4, targets=["v_proj", "down_proj"]))),
    ("gpt2-hf", 1, "fp32", "none", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=["c_attn"]))),
    ("gpt2-hf", 0, "bf16-amp", "per-layer", "eager", "adamw", "foreach", 1,
     dict(lora=LoRA(rank=8, dropout=0.05, targets=["c_attn", "c_proj", "c_fc"]))),
    ("gpt2-hf", 3, "bf16", "sqrt", "eager", "sgd-momentum", "foreach", 1,
     dict(lora=LoRA(rank=4, targets="all-linear"))),
    ("llama-hf", 1, "fp32", "none", "eager", "sgd-momentum", "for-loop", 2,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=["q_proj", "v_proj", "lm_head"], lora_bias=True,
                    use_rslora=True, layers=[0, 2]))),
    ("llama-hf", 0, "bf16-amp", "per-layer", "sdpa", "adam", "fused", 2,
     dict(lora=LoRA(rank=2, targets=["q_proj"]))),
    ("qwen2-hf", 5, "fp16-amp", "none", "sdpa", "adamw", "foreach", 1,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=["q_proj", "k_proj", "v_proj"], bias="lora_only"))),
    ("llama-hf", 1, "bf16-amp", "per-layer", "sdpa", "adamw", "for-loop", 1,
     dict(freeze=("model.embed_tokens.*",))),
    ("gpt2-hf", 0, "fp32", "none", "sdpa", "adamw", "foreach", 1,
     dict(freeze=("transformer.wte.*", "transformer.wpe.*", "transformer.h.0.*"))),
    ("llama-hf", 1, "bf16", "none", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=8, dropout=0.05, targets=QV, modules_to_save=["lm_head", "embed_tokens"]))),
    ("gpt2-hf", 3, "fp32", "per-layer", "eager", "adam", "foreach", 1,
     dict(lora=LoRA(rank=4, targets=["c_attn"], modules_to_save=["wpe"]))),
    # QLoRA: bitsandbytes Linear4bit base (validate.models.finetune.quantize_linears)
    ("llama-hf", 0, "fp32", "none", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=8, targets=QV), quantization="nf4")),
    ("llama-hf", 1, "bf16", "per-layer", "sdpa", "adamw", "foreach", 1,
     dict(lora=LoRA(rank=16, alpha=32, dropout=0.05, targets=QV), quantization="nf4-double")),
    ("llama-hf", 2, "bf16", "per-layer", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=4, targets="all-linear"), quantization="fp4")),
    ("llama-hf", 3, "fp32", "every-k", "eager", "adam", "fused", 1,
     dict(lora=LoRA(rank=4, targets="all-linear"), quantization="nf4-double")),
    ("llama-hf", 1, "bf16", "sqrt", "eager", "sgd-momentum", "for-loop", 2,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=["q_proj", "k_proj", "v_proj", "o_proj"]), quantization="nf4")),
    ("llama-hf", 0, "fp32", "selective", "sdpa", "adamw", "foreach", 1,
     dict(lora=LoRA(rank=8, dropout=0.1, targets=QV), quantization="fp4")),
    ("llama-hf", 1, "bf16-amp", "per-layer", "sdpa", "adamw", "fused", 1,
     dict(lora=LoRA(rank=4, targets="all-linear"), quantization="nf4-double")),
    ("llama-hf", 3, "fp16-amp", "none", "eager", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=8, dropout=0.05, targets=["q_proj", "v_proj", "down_proj"]), quantization="fp4")),
    # with the fine-tuning optimizers and clipping (validate/matrices/optim.py's optimizers)
    ("llama-hf", 1, "bf16", "none", "sdpa", "adamw-8bit", None, 1,
     dict(lora=LoRA(rank=16, targets="all-linear"), max_grad_norm=1.0)),
    ("llama-hf", 0, "bf16", "per-layer", "sdpa", "paged-adamw-8bit", None, 1,
     dict(lora=LoRA(rank=8, targets=QV), quantization="nf4-double", max_grad_norm=1.0)),
    ("llama-hf", 0, "fp32", "none", "sdpa", "adafactor", None, 1, dict(lora=LoRA(rank=8, targets=QV))),
    # issue 24's QLoRA set-ups: nf4 double quantisation r16 on Llama, nf4 with AdamW8bit on Mistral,
    # both under bf16 autocast
    ("llama-hf", QLORA_SHAPES[0], "bf16-amp", "per-layer", "sdpa", "adamw", "for-loop", 1,
     dict(lora=LoRA(rank=16, alpha=32, dropout=0.05, targets=QV), quantization="nf4-double")),
    ("mistral-hf", QLORA_SHAPES[1], "bf16-amp", "per-layer", "eager", "adamw-8bit", None, 1,
     dict(lora=LoRA(rank=16, alpha=32, targets=QV), quantization="nf4", max_grad_norm=1.0)),
)


def finetune_cases(device: str = "cpu") -> list[Case]:
    """The fine-tuning ci rows ft00, ft01, ...

    >>> cases = finetune_cases(); len(cases), cases[0].label.split("|")[0], cases[28].label.split("|")[0]
    (29, 'ft00: hf llama-like L2 h64 V500 ', 'ft28: hf mistral-like L2 h256 V500 ')
    """
    from validate.matrices.shapes import CI_SHAPES, _model

    cases = []
    for i, (kind, shape_i, precision, ck, attention, optimizer, impl, ga, extra) in enumerate(ROWS):
        shape = CI_SHAPES[shape_i] if isinstance(shape_i, int) else shape_i
        spec, cfg = _mistral(shape) if kind == "mistral-hf" else _model(kind, shape)
        training = TrainingConfig.make(
            micro_batch=shape["b"], seq_len=shape["s"], grad_accum=ga, precision=precision,
            optimizer=optimizer, optimizer_impl=impl, checkpointing=ck,
            checkpoint_every=2 if ck == "every-k" else None, attention=attention, device=device,
            **extra)
        cases.append(Case(f"ft{i:02d}", spec, training, cfg))
    return cases


def _mistral(shape: dict):
    """(spec, hf_config) of a MistralForCausalLM without a sliding window on a shape dict."""
    from memcalc.inputs.specs import ModelSpec

    cfg = dict(model_type="mistral", vocab_size=shape["V"], hidden_size=shape["h"],
               num_hidden_layers=shape["L"], num_attention_heads=shape["a"], num_key_value_heads=shape["kv"],
               intermediate_size=shape["f"], max_position_embeddings=shape["P"], sliding_window=None,
               tie_word_embeddings=shape["tie"], attention_dropout=shape["dropout"])
    return ModelSpec.from_hf_config(cfg).with_(name="mistral-like"), cfg
