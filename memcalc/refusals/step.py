"""Whether a (model, training) step may be estimated: types, the ceilings of memcalc.core.limits,
what the model's implementation can run, and what the engine models. Each failure is one
MemcalcError naming the field the caller gave and the fix.

>>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import FINE_TUNE_OPTIMIZERS, TrainingConfig
>>> check_step(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=4096))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
memcalc.core.errors.SpecError: seq_len: 4,096 exceeds max_position_embeddings=1024 (GPT-2's learned ...
"""
from __future__ import annotations

from memcalc.core import limits
from memcalc.core.errors import NotModelledError, SpecError
from memcalc.refusals.finetune import check_finetuning
from memcalc.parallel.tensor import check_tensor_parallel
from memcalc.families.call_path import check_call_path
from memcalc.families.registry import declaration
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import FINE_TUNE_OPTIMIZERS, TrainingConfig


def check_model(model: ModelSpec) -> None:
    """A ModelSpec within the ceilings of memcalc.core.limits."""
    if not isinstance(model, ModelSpec):
        fix = (f"pass ModelSpec.preset({model!r})" if isinstance(model, str) and len(model) < 60
               else "pass a ModelSpec (ModelSpec.preset(name), ModelSpec.from_hf_config(path))")
        raise SpecError("model", f"expected a ModelSpec, got {type(model).__name__}", fix)
    for field, ceiling in limits.MODEL_CEILINGS.items():
        value = getattr(model, field)
        if value is not None and value > ceiling:
            raise SpecError(field, f"{value:,} is above memcalc's ceiling of {ceiling:,}",
                            f"use {field} <= {ceiling:,} (memcalc.core.limits: {_why(field)})")


def check_training(training: TrainingConfig) -> None:
    """A TrainingConfig within the ceilings of memcalc.core.limits."""
    if not isinstance(training, TrainingConfig):
        raise SpecError("training", f"expected a TrainingConfig, got {type(training).__name__}",
                        "pass TrainingConfig(micro_batch=..., seq_len=...)")
    for field, ceiling in limits.TRAINING_CEILINGS.items():
        value = getattr(training, field)
        if value is not None and value > ceiling:
            raise SpecError(field, f"{value:,} is above memcalc's ceiling of {ceiling:,}",
                            f"use {field} <= {ceiling:,} (memcalc.core.limits: {_why(field)})")
    if training.data_parallel > limits.MAX_DATA_PARALLEL:
        raise SpecError("world_size", f"{training.world_size:,} ranks make {training.data_parallel:,} "
                        f"data-parallel ranks, above memcalc's ceiling of {limits.MAX_DATA_PARALLEL:,}",
                        f"use world_size <= {limits.MAX_DATA_PARALLEL:,} x tensor_parallel "
                        "(memcalc.core.limits: per-rank accounting visits every rank)")


def check_rank_layers(model: ModelSpec, training: TrainingConfig) -> None:
    """data-parallel ranks x layers within memcalc.core.limits.MAX_RANK_LAYERS."""
    if training.data_parallel > 1 and training.data_parallel * model.num_layers > limits.MAX_RANK_LAYERS:
        raise SpecError("num_layers", f"{model.num_layers:,} layers over {training.data_parallel:,} "
                        f"data-parallel ranks is above memcalc's ceiling of {limits.MAX_RANK_LAYERS:,} "
                        "rank-layers", f"use num_layers x data-parallel ranks <= {limits.MAX_RANK_LAYERS:,} "
                        "(memcalc.core.limits: per-rank accounting visits every rank's parameters)")


def _why(field: str) -> str:
    return {"num_layers": "the engine simulates every layer",
            "tensor_parallel": "past any NVLink domain"}.get(field, "past any model in use")


def learned_positions(model: ModelSpec) -> bool:
    """Whether the model cannot run sequences longer than max_position_embeddings: GPT-2's learned
    position table (and causal-mask buffer), and the reference models' precomputed tables
    (validate/models/reference.py: causal_mask, Rotary). HF Llama computes rotary angles per call."""
    return declaration(model.family).supports.learned_positions is not None or model.implementation == "reference"


def check_runnable(model: ModelSpec, training: TrainingConfig) -> None:
    """What the implementation can run: seq_len within a fixed position table; explicit MoE
    routing counts that fit the model and the shape (memcalc.inputs.moe_routing.check_routing);
    no MoE option set on a dense model (check_moe_options)."""
    from memcalc.inputs.moe_routing import check_routing

    check_routing(model, training)
    check_moe_options(model, given=moe_options_set(training))
    if learned_positions(model) and training.seq_len > model.max_position_embeddings:
        p = model.max_position_embeddings
        table = declaration(model.family).supports.learned_positions or "the reference model's position tables"
        raise SpecError("seq_len", f"{training.seq_len:,} exceeds max_position_embeddings={p} "
                        f"({table} has {p} rows)",
                        f"use seq_len <= {p}, or raise max_position_embeddings")


def check_step(model: ModelSpec, training: TrainingConfig) -> None:
    """Types, ceilings and runnability of one (model, training) step: the top of estimate()."""
    check_model(model)
    check_training(training)
    check_pipeline_step(model, training)
    check_rank_layers(model, training)
    check_runnable(model, training)


def check_pipeline_step(model: ModelSpec, training: TrainingConfig) -> None:
    """pipeline_parallel > 1: what torch's schedules or the split cannot take is bad input
    (memcalc.parallel.pipeline.check_pipeline); what the stage model does not cover is refused by
    name (memcalc.refusals.pipeline.check_pipeline_supported: here an HF program).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=8, seq_len=64, world_size=4, pipeline_parallel=4, num_microbatches=8)
    >>> check_pipeline_step(ModelSpec.preset("gpt2"), t)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: pipeline_parallel: pipeline stages are modelled and measured for ...
    """
    if training.pipeline_parallel == 1:
        return
    from memcalc.parallel.pipeline import check_pipeline

    check_pipeline(model.num_layers, training.pipeline_parallel, training.pipeline_schedule,
                   training.num_microbatches, training.pipeline_stages_per_rank, training.stage_boundaries)
    if training.micro_batch % training.num_microbatches:
        raise SpecError("num_microbatches", f"{training.num_microbatches} micro-batches do not split "
                        f"micro_batch={training.micro_batch} evenly", "use a divisor of micro_batch")
    from memcalc.refusals.pipeline import check_pipeline_supported

    check_pipeline_supported(model, training)


MOE_OPTIONS = ("experts_implementation", "moe_routing")
"""The TrainingConfig fields that describe a mixture-of-experts layer's experts."""


def moe_options_set(training: TrainingConfig) -> list[str]:
    """The MOE_OPTIONS a TrainingConfig sets to other than their defaults (what estimate() can
    tell was set on purpose: with_ sets every field, so a default value cannot be told apart).

    >>> moe_options_set(TrainingConfig(micro_batch=1, seq_len=8, moe_routing="balanced"))
    ['moe_routing']
    """
    fields = TrainingConfig.model_fields
    return [n for n in MOE_OPTIONS if getattr(training, n) != fields[n].default]


def check_moe_options(model: ModelSpec, given: tuple | list = ()) -> None:
    """MOE_OPTIONS named in `given` for a model without mixture-of-experts layers: refused by
    name, since they would change nothing (measured: validate/results/cpu-ci-sweep4.jsonl ran dense
    models with experts_implementation='eager', the same peaks). The command passes the flags
    given (memcalc.cli.args), estimate() the fields set to other than their defaults
    (moe_options_set, check_runnable), so both refuse alike.

    >>> check_moe_options(ModelSpec.preset("gpt2"), given=["moe_routing"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: moe_routing: gpt2 has no mixture-of-experts layers; fix: ...
    """
    if model.moe is None:
        for name in MOE_OPTIONS:
            if name in given:
                raise SpecError(name, f"{model.name} has no mixture-of-experts layers",
                                f"leave {name} unset (it applies to mixture-of-experts models only)")


def check_shape(model: ModelSpec, training: TrainingConfig) -> None:
    """The checks that depend on micro_batch and seq_len alone, for a (model, training) whose
    other fields were checked (estimate() on a cached simulation)."""
    for field in ("micro_batch", "seq_len"):
        if getattr(training, field) > limits.MAX_SHAPE:
            check_training(training)  # raises, naming the field
    if getattr(model, "traced_candidates", None) is None:  # a traced model ran its own shapes
        check_runnable(model, training)


def check_estimate(model: ModelSpec, training: TrainingConfig) -> None:
    """Exactly what estimate() checks, for callers that evaluate the engine another way."""
    check_step(model, training)
    check_supported(model, training)


def check_supported(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse, naming the field, what is not modelled rather than answer for something else.

    >>> check_supported(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8,
    ...     precision="fp32", world_size=1, sharding="zero3", fsdp_mixed_precision=True))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: fsdp_mixed_precision: FSDP2's MixedPrecisionPolicy on a single ...
    """
    check_tensor_parallel(model, training)
    check_attention(model, training)
    check_call_path(model, training)
    check_finetuning(model, training)
    if training.trl != "none":
        from memcalc.families.trl_dpo import check_dpo

        check_dpo(model, training)
    if training.world_size > 1 and training.optimizer in FINE_TUNE_OPTIMIZERS:
        raise NotModelledError("optimizer", f"optimizer='{training.optimizer}' is modelled on one "
                               "process (its states under DDP/ZeRO/FSDP are not validated)",
                               "use world_size=1, or a torch.optim optimizer (adamw, adam, sgd)")
    if training.max_grad_norm is not None and training.tensor_parallel > 1:
        # DDP and ZeRO-1 clip whole, all-reduced plain gradients (the single-process
        # clip_grad_norm_); FSDP2's are Shard(0) DTensors whose local norms are all-reduced into
        # the total (memcalc.tape.step._clip); both measured in dist-ci (finetune-ranks)
        raise NotModelledError("max_grad_norm", "gradient clipping under tensor parallelism (a "
                               "mix of Replicate and Shard DTensor gradients) is not modelled",
                               "use tensor_parallel=1, or max_grad_norm=None")
    if training.fsdp_mixed_precision and training.data_parallel == 1:
        raise NotModelledError("fsdp_mixed_precision", "FSDP2's MixedPrecisionPolicy on a single "
                               "data-parallel rank is not modelled (measured +1.3%)",
                               "use world_size >= 2 x tensor_parallel")
    if training.tensor_parallel > 1 and training.data_parallel > 1 and training.sharding in ("none", "zero1"):
        raise NotModelledError("sharding", "data parallelism across tensor-parallel groups is "
                               "modelled with FSDP2 (zero2/zero3) only",
                               "use --sharding zero3 (or zero2), or world_size = tensor_parallel")


def check_attention(model: ModelSpec, training: TrainingConfig) -> None:
    """What the model's transformers class can run: its declaration's sdpa_refusal (Gemma-2 and
    GPT-OSS have no SDPA path; with attention=None the step runs their default, eager).

    >>> check_attention(ModelSpec.preset("gemma-2-2b"), TrainingConfig(micro_batch=1, seq_len=8))  # eager
    >>> check_attention(ModelSpec.preset("gemma-2-2b"), TrainingConfig(micro_batch=1, seq_len=8,
    ...                 attention="sdpa"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: attention: transformers' Gemma-2 runs no SDPA path ...
    """
    can = declaration(model.family).supports
    if training.precision not in can.precisions:
        raise NotModelledError("precision", f"{training.precision} is not modelled for {model.family}",
                               f"use one of {', '.join(can.precisions)}")
    why = can.sdpa_refusal
    if why is not None and training.resolved_attention(model) == "sdpa":
        raise NotModelledError("attention", why, "use attention='eager'")


def check_search(model: ModelSpec, training: TrainingConfig, field: str) -> None:
    """check_estimate for a capacity search over `field`: the caller's own value of that field
    is replaced, so it is checked at the search's first probe instead."""
    from memcalc.inputs.specs import ModelSpec
    if not isinstance(model, ModelSpec) or not isinstance(training, TrainingConfig):
        check_step(model, training)  # raises, naming the argument of the wrong type
    if not isinstance(training.moe_routing, str):
        raise NotModelledError("moe_routing", "explicit routing counts fix micro_batch*seq_len, "
                               "which a capacity search varies",
                               "use moe_routing='worst' (the default) or 'balanced'")
    t = training.tensor_parallel
    if field == "num_layers":
        model = model.with_(num_layers=1)
    elif field == "world_size":
        training = training.with_(world_size=t * (2 if training.fsdp_mixed_precision else 1))
    else:
        training = training.with_(**{field: t if field == "seq_len" else 1})
    check_estimate(model, training)
