"""What the fine-tuning fields of TrainingConfig (lora, freeze, quantization) may be combined
with, each refusal naming the field and the fix (memcalc.refusals.step calls `check_finetuning`).
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.families.registry import FAMILIES, declaration
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

if TYPE_CHECKING:
    from memcalc.families.declaration import LoRALayout
    from memcalc.inputs.lora import LoRA



def lora_layout(model: ModelSpec) -> LoRALayout | None:
    """peft's view of the model (its declaration's Supports.lora; None: LoRA is not modelled).

    >>> lora_layout(ModelSpec.preset("gpt2")).layers
    'transformer.h'
    """
    return declaration(model.family).supports.lora


def _lora_families() -> str:
    return " and ".join(d.name for d in FAMILIES.values() if d.supports.lora is not None)


def linear_modules(model: ModelSpec) -> list[str]:
    """Dotted names of the model's linear modules (HF names, as peft sees them), lm_head last.

    >>> linear_modules(ModelSpec.preset("gpt2").with_(num_layers=1))[::2]
    ['transformer.h.0.attn.c_attn', 'transformer.h.0.mlp.c_fc', 'lm_head']
    """
    layout = lora_layout(model)
    return [f"{layout.layers}.{i}.{name}" for i in range(model.num_layers)
            for name in layout.linears] + ["lm_head"]


def check_finetuning(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse fine-tuning set-ups memcalc does not model, or that name what the model lacks.

    >>> from memcalc.inputs.lora import LoRA
    >>> check_finetuning(ModelSpec.preset("llama-2-7b"), TrainingConfig(micro_batch=1, seq_len=8,
    ...     lora=LoRA(targets=["query"])))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: lora.targets: 'query' matches no linear module of llama-2-7b; fix: ...
    """
    lora, tuned = training.lora, training.lora is not None or bool(training.freeze)
    if training.quantization != "none" and lora is None:
        raise NotModelledError("quantization", "a quantised base model with nothing to train",
                               "add LoRA adapters (--lora-rank ...), or use quantization none")
    if training.quantization != "none":
        check_quantization(model, training)
    if tuned and (lora_layout(model) is None or model.sliding_window is not None):
        field = "lora" if lora is not None else "freeze"
        raise NotModelledError(field, "frozen parameters and LoRA are modelled and measured for the "
                               f"{_lora_families()} families without sliding windows, not for this "
                               f"{model.family} model", f"use a model of the {_lora_families()} "
                               "families without a sliding window, or train every parameter")
    if tuned and training.hf_trainer and training.trl == "none":  # DPO with LoRA: measured (trl dpo02)
        raise NotModelledError("hf_trainer", "the HF Trainer's parameter groups and held batches are "
                               "measured without frozen parameters or LoRA", "drop hf_trainer, or train "
                               "every parameter")
    if tuned and training.world_size > 1:
        check_finetuning_ranks(training)
    if lora is None:
        return
    if model.implementation != "hf":
        raise NotModelledError("lora", "LoRA is modelled on the Hugging Face implementations "
                               "(peft's module names)", "use implementation hf")
    if lora_layout(model) is None:
        raise NotModelledError("lora", f"LoRA is modelled and measured for the {_lora_families()} "
                               f"families, not {model.family}", f"use a model of the {_lora_families()} families")
    if lora.layers is not None and max(lora.layers) >= model.num_layers:
        raise SpecError("lora.layers", f"layer {max(lora.layers)} does not exist "
                        f"(num_layers={model.num_layers})", f"use layers below {model.num_layers}")
    check_modules_to_save(model, lora)
    if lora.targets == "all-linear":
        return
    modules = linear_modules(model)
    for target in lora.targets:
        if any(e == target or e.endswith("." + target) for e in lora_layout(model).embeddings):
            raise NotModelledError("lora.targets", f"{target!r} is an embedding: peft's "
                                   "lora.Embedding is not modelled", "target linear modules")
        hits = [m for m in modules if m == target or m.endswith("." + target)]
        if not hits:
            names = sorted({m.rsplit(".", 1)[-1] for m in modules})
            raise SpecError("lora.targets", f"{target!r} matches no linear module of {model.name}",
                            f"use some of {', '.join(names)} or 'all-linear'")
        if hits == ["lm_head"] and model.tie_embeddings:
            raise NotModelledError("lora.targets", "LoRA on an lm_head tied to the embedding is "
                                   "not modelled", "drop lm_head from the targets")


def check_finetuning_ranks(training: TrainingConfig) -> None:
    """Frozen parameters and LoRA across ranks: modelled and measured (dist-ci) under DDP
    (sharding none: the Reducer buckets the trainable gradients only) and FSDP2 (zero2/zero3:
    frozen parameters sharded and all-gathered, only the trainable ones reduce-scattered), with
    tensor_parallel 1, a full-precision base and no MixedPrecisionPolicy.

    >>> from memcalc.inputs.lora import LoRA
    >>> check_finetuning_ranks(TrainingConfig(micro_batch=1, seq_len=8, world_size=2, sharding="zero1",
    ...     lora=LoRA()))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: sharding: ZeroRedundancyOptimizer partitions frozen ...
    """
    field = "lora" if training.lora is not None else "freeze"
    if training.quantization != "none":
        raise NotModelledError("quantization", "QLoRA across ranks (FSDP-QLoRA's bnb_4bit_quant_storage "
                               "Params4bit sharded by fully_shard) is not measured: bitsandbytes' "
                               "Linear4bit on CPU quantises at .to(device) and FSDP2's DTensor shards of "
                               "packed uint8/bf16 storage are not validated here", "use world_size 1")
    if training.sharding == "zero1":
        raise NotModelledError("sharding", "ZeroRedundancyOptimizer partitions frozen parameters "
                               "too (a rank may own only frozen ones); not measured with "
                               f"{field}", "use sharding none (DDP) or zero2/zero3 (FSDP2)")
    if training.tensor_parallel > 1:
        raise NotModelledError(field, "frozen parameters and LoRA under tensor parallelism "
                               "(peft's lora_A/lora_B beside DTensor weights) are not modelled",
                               "use tensor_parallel 1")
    if training.fsdp_mixed_precision:
        raise NotModelledError(field, "frozen parameters and LoRA under FSDP2's "
                               "MixedPrecisionPolicy are not measured", "drop fsdp_mixed_precision")
    if training.lora is not None and training.sharding in ("zero2", "zero3") and training.precision == "bf16":
        raise NotModelledError("precision", "LoRA under FSDP2 at precision bf16 puts fp32 adapters "
                               "and bf16 base weights in one parameter group (fully_shard wants one "
                               "dtype per group)", "use precision fp32 or bf16-amp")


def check_freeze(model_params: list[str], patterns: tuple[str, ...]) -> None:
    """Each freeze pattern must match some parameter name.

    >>> check_freeze(["lm_head.weight"], ("*embed*",))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: freeze: '*embed*' matches no parameter; fix: ...
    """
    for p in patterns:
        if not any(fnmatchcase(name, p) for name in model_params):
            raise SpecError("freeze", f"{p!r} matches no parameter",
                            f"use fnmatch patterns over torch names, e.g. {model_params[0]}")


def check_modules_to_save(model: ModelSpec, lora: "LoRA") -> None:
    """modules_to_save: not a tied embedding or head (peft's tied-module handling is not
    modelled), not also a LoRA target.

    >>> from memcalc.inputs.lora import LoRA
    >>> check_modules_to_save(ModelSpec.preset("gpt2"), LoRA(modules_to_save=["lm_head"]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: lora.modules_to_save: 'lm_head' is tied to the embedding ...
    """
    tied = ("lm_head",) + lora_layout(model).embeddings[:1]
    for m in lora.modules_to_save:
        if model.tie_embeddings and any(t == m or t.endswith("." + m) for t in tied):
            raise NotModelledError("lora.modules_to_save", f"{m!r} is tied to the embedding (or is it): "
                                   "peft's tied modules_to_save is not modelled", "untie, or drop it")
        if lora.targets != "all-linear" and m in lora.targets or lora.targets == "all-linear" and m == "lm_head":
            raise SpecError("lora.modules_to_save", f"{m!r} is also a LoRA target", "pick one of the two")


def check_saved_modules(labels: list[str], lora: "LoRA | None") -> None:
    """Each modules_to_save entry must wrap some module of the model (after the graph is built)."""
    if lora is None:
        return
    for m in lora.modules_to_save:
        if not any(".modules_to_save." in label and lora.saves_module(label.split(".modules_to_save.")[0])
                   and label.split(".modules_to_save.")[0].endswith(m) for label in labels):
            raise SpecError("lora.modules_to_save", f"{m!r} matches no module with parameters",
                            "name modules such as lm_head or embed_tokens")


def check_quantization(model: ModelSpec, training: TrainingConfig) -> None:
    """QLoRA is modelled for bitsandbytes 4-bit (nf4, nf4-double, fp4) Linear4bit layers of
    HF llama-family models without linear biases (weights loaded in bf16 under precision bf16,
    else fp32; compute dtype bf16, fp16 under fp16-amp, fp32 under fp32).

    >>> from memcalc.inputs.lora import LoRA
    >>> check_quantization(ModelSpec.preset("llama-2-7b"), TrainingConfig(micro_batch=1, seq_len=8,
    ...     quantization="int8", lora=LoRA()))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: quantization: 'int8' (load_in_8bit) is not modelled: ...
    """
    q = training.quantization
    if q == "int8":
        raise NotModelledError("quantization", "'int8' (load_in_8bit) is not modelled: its "
                               "MatMul8bitLt path differs from Linear4bit", "use nf4, nf4-double or fp4")
    if not declaration(model.family).supports.quantization or model.implementation != "hf":
        names = " and ".join(d.name for d in FAMILIES.values() if d.supports.quantization)
        raise NotModelledError("quantization", f"{q!r} is modelled for HF {names}-family models "
                               "(GPT-2's Conv1D layers are converted differently)", f"use a {names}-family model")
    if model.qkv_bias or model.out_bias or model.mlp_bias:
        raise NotModelledError("quantization", "Linear4bit layers with biases are not modelled "
                               "(bnb casts the bias in place)", "use a model without linear biases")
    odd = [n for n in (model.hidden_size, model.num_heads * model.head_size, model.ffn_size) if n % 2]
    if training.device == "cpu" and odd:
        # bitsandbytes/backends/cpu/ops.py dequantize_4bit: `shape[-1] % 2 != 0` falls back to
        # the torch.compile'd backends/default/ops.py _dequantize_4bit_compute (int32 codes, fp32
        # values); measured -15.9% on a Llama with intermediate_size 1279
        raise NotModelledError("quantization", f"Linear4bit layers with an odd in_features ({odd[0]}) "
                               "dequantise on CPU through bitsandbytes' compiled fallback, not modelled",
                               "use even hidden_size, num_heads * head_dim and intermediate_size")
