"""What the pipeline stage model (memcalc.parallel.stages, pipeline_peaks) does not cover, refused by
name before any stage is walked (here, not in pipeline_peaks, so that the step's refusals
(memcalc.refusals.step) need not import the stage model, which imports the engine)."""
from __future__ import annotations

from memcalc.core.errors import NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig


def check_pipeline_supported(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse by name what the stage model does not cover (modelled: the reference GPT-2 and
    Llama, untied, on pipeline ranks alone, full backward schedules; the checkpointing modes:
    memcalc.parallel.stages)."""
    hf_llama = model.implementation == "hf" and model.family == "llama"
    if not (model.implementation == "reference" or hf_llama) or model.tie_embeddings:
        raise NotModelledError("pipeline_parallel", "pipeline stages are modelled and measured for the untied "
                               "reference GPT-2 and Llama and the untied HF Llama family (Llama, Mistral, Qwen2, "
                               "Qwen3) only (a tied head spans the first and last stages; the other HF programs' "
                               "stage splits are not measured)",
                               "use an untied reference or HF Llama-family model, or pipeline_parallel=1")
    if hf_llama and model.no_rope_layers:
        raise NotModelledError("no_rope_layers", "pipeline stages of HF models with NoPE layers (SmolLM3) are not "
                               "measured", "use a model without no_rope_layers, or pipeline_parallel=1")
    if training.world_size != training.pipeline_parallel:
        raise NotModelledError("pipeline_parallel", "pipeline parallelism combined with data or tensor "
                               "parallelism (FSDP2, DDP or TP inside a stage) is not modelled",
                               f"use world_size = pipeline_parallel = {training.pipeline_parallel}")
    if training.pipeline_schedule == "interleaved-zero-bubble":
        raise NotModelledError("pipeline_schedule", "InterleavedZeroBubble's split input/weight backward "
                               "(stage_backward_input keeps the graph for the weight pass) is not modelled",
                               "use gpipe, 1f1b, looped-bfs or interleaved-1f1b")
    if training.precision not in ("fp32", "bf16"):
        raise NotModelledError("precision", f"{training.precision} inside pipeline stages (autocast around each "
                               "stage's forward) is not measured", "use precision fp32 or bf16")
    for name in ("lora", "max_grad_norm"):
        if getattr(training, name) is not None:
            raise NotModelledError(name, f"{name} with pipeline_parallel > 1 is not modelled", f"drop {name}")
    if training.freeze or training.grad_accum != 1 or training.quantization != "none":
        raise NotModelledError("pipeline_parallel", "freezing, quantization or grad_accum > 1 with pipeline "
                               "stages is not modelled (num_microbatches is the schedule's accumulation)",
                               "use freeze=[], quantization='none', grad_accum=1")
