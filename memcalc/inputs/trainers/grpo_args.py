"""trl.GRPOConfig -> TrainingConfig (trl 1.16, trainer/grpo_config.py, grpo_trainer.py): GRPOConfig's
own fields, each READ, INERT with why, or REFUSED_UNLESS_DEFAULT by name, as
memcalc.inputs.trainers.dpo_args does for DPOConfig; a field in none of them (nor
TrainingArguments') is refused, so a new TRL release turns tests red.

GRPOTrainer's step (memcalc.families.trl_grpo): generation with transformers' generate (the
prompts of the step, repeated num_generations times, up to max_completion_length new tokens,
under no_grad with a DynamicCache), the reference's per-token log-probabilities (beta != 0) and
the old policy's (num_iterations > 1) under no_grad, then the training step on prompt +
completion. per_device_train_batch_size counts completions (rows); seq_len is prompt +
max_completion_length.
"""
from __future__ import annotations

from typing import Any

from memcalc.core.errors import NotModelledError, SpecError

DEFAULTS: dict[str, Any] = {
    "model_init_kwargs": None, "router_aux_loss_coef": None, "disable_dropout": False,
    "cast_lm_head_to_fp32": False, "num_generations": 8, "max_completion_length": 512,
    "pad_to_multiple_of": "auto", "generation_batch_size": None, "steps_per_generation": None,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "generation_kwargs": None,
    "repetition_penalty": 1.0, "cache_implementation": None, "use_vllm": False, "beta": 0.0,
    "num_iterations": 1, "delta": None, "importance_sampling_level": "token", "loss_type": "dapo",
    "mask_truncated_completions": False, "sync_ref_model": False, "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0, "use_adaptive_entropy": False, "off_policy_mask_threshold": None,
    "use_bias_correction_kl": True, "use_transformers_continuous_batching": False,
    "use_transformers_paged": False,
}

READ = {
    "beta": "0 (TRL's default): no reference model; otherwise a no-grad reference pass before the "
            "step (a frozen copy, or with peft the adapters disabled) and its (b, C) log-probs",
    "num_iterations": "above 1: the old policy's no-grad log-prob pass and its (b, C) fp32 result",
    "max_completion_length": "C, the completion tokens: generate's new tokens and the scored tail",
    "num_generations": "completions per prompt: must divide per_device_train_batch_size; the rows "
                       "are the completions, so at a fixed batch it changes no size",
    "loss_type": "dapo (the default), grpo, bnpo and dr_grpo: the same (b, C) tensors",
    "use_bias_correction_kl": "with beta: per_token_kl * coef_1, one more (b, C) tensor saved",
    "disable_dropout": "True sets every nn.Dropout to p=0 (the policy and the reference); False "
                       "(the default) keeps the model's dropout",
}

REFUSED_UNLESS_DEFAULT = {
    "use_vllm": "vLLM generation (server or colocated) is out of scope: generate with transformers",
    "use_transformers_continuous_batching": "generate_batch's paged cache",
    "use_transformers_paged": "generate_batch's paged cache",
    "model_init_kwargs": "loads the model with these kwargs (dtype, quantization): give the model "
                         "and precision to memcalc instead",
    "router_aux_loss_coef": "the MoE load-balancing loss",
    "cast_lm_head_to_fp32": "an fp32 copy of the LM head and its fp32 logits",
    "pad_to_multiple_of": "pads prompts and completions to a multiple: give the padded lengths",
    "generation_batch_size": "a generation batch of several steps' completions at once",
    "steps_per_generation": "a generation batch of several steps' completions at once",
    "temperature": "TemperatureLogitsWarper in generate and a scaled fused LM head",
    "top_p": "TopPLogitsWarper's sort and cumsum over the vocabulary",
    "top_k": "TopKLogitsWarper over the vocabulary",
    "min_p": "MinPLogitsWarper over the vocabulary",
    "repetition_penalty": "RepetitionPenaltyLogitsProcessor's gather and scatter",
    "generation_kwargs": "generation options beyond the config's",
    "cache_implementation": "a static or quantized KV cache instead of the DynamicCache",
    "delta": "two-sided clipping: one more clamp of (b, C)",
    "importance_sampling_level": "sequence-level ratios: (b, 1) tensors",
    "mask_truncated_completions": "zeros in the attention mask: a padded batch",
    "sync_ref_model": "the reference weights mixed with the policy's every ref_model_sync_steps",
    "top_entropy_quantile": "a quantile over the gathered entropies",
    "entropy_coef": "an entropy bonus: gradients through the fused head's entropy",
    "use_adaptive_entropy": "an entropy bonus: gradients through the fused head's entropy",
    "off_policy_mask_threshold": "the off-policy sequence mask",
}

_HOST = "host-side data, tokenizer or logging; the device sees the same tensors"
_VLLM = "read only with use_vllm (refused)"
_SCALAR = "a number the loss multiplies or clips by; no tensor changes size"
_REWARD = ("reward arithmetic on (b,)-sized tensors after the no-grad passes: a few bytes a row, "
           "not modelled (docs/trl.md: the scoring phase without a pass, ~50 B a row short)")
INERT: dict[str, str] = {
    "trust_remote_code": _HOST, "shuffle_dataset": _HOST, "chat_template_kwargs": _HOST,
    "log_completions": _HOST, "log_multimodal": _HOST, "num_completions_to_print": _HOST,
    "log_unique_prompts": _HOST, "log_completions_hub_repo": _HOST,
    "num_generations_eval": "evaluation runs outside the training step",
    "ds3_gather_for_generation": "DeepSpeed ZeRO-3 only (refused: one process)",
    "epsilon": _SCALAR, "epsilon_high": _SCALAR,
    "sapo_temperature_neg": "read only by loss_type 'sapo' (refused)",
    "sapo_temperature_pos": "read only by loss_type 'sapo' (refused)",
    "vespo_k_pos": "read only by loss_type 'vespo' (refused)",
    "vespo_lambda_pos": "read only by loss_type 'vespo' (refused)",
    "vespo_k_neg": "read only by loss_type 'vespo' (refused)",
    "vespo_lambda_neg": "read only by loss_type 'vespo' (refused)",
    "reward_weights": _REWARD, "multi_objective_aggregation": _REWARD, "scale_rewards": _REWARD,
    "ref_model_mixup_alpha": "read only with sync_ref_model (refused)",
    "ref_model_sync_steps": "read only with sync_ref_model (refused)",
    "entropy_coef_min": "read only with use_adaptive_entropy (refused)",
    "entropy_coef_max": "read only with use_adaptive_entropy (refused)",
    "entropy_coef_delta": "read only with use_adaptive_entropy (refused)",
    "entropy_target": "read only with use_adaptive_entropy (refused)",
    "max_tool_calling_iterations": "read only with tools passed to the trainer (not a config field)",
    "transformers_continuous_batching_config": "read only with use_transformers_continuous_batching (refused)",
    "vllm_mode": _VLLM, "vllm_model_impl": _VLLM, "vllm_enable_sleep_mode": _VLLM,
    "vllm_structured_outputs_regex": _VLLM, "vllm_server_base_url": _VLLM, "vllm_server_host": _VLLM,
    "vllm_server_port": _VLLM, "vllm_server_timeout": _VLLM, "vllm_group_port": _VLLM,
    "vllm_gpu_memory_utilization": _VLLM, "vllm_max_model_length": _VLLM,
    "vllm_tensor_parallel_size": _VLLM, "vllm_importance_sampling_correction": _VLLM,
    "vllm_importance_sampling_mode": _VLLM, "vllm_importance_sampling_clip_max": _VLLM,
    "vllm_importance_sampling_clip_min": _VLLM, "vllm_importance_sampling_cap": _VLLM,
}
LOSSES = ("dapo", "grpo", "bnpo", "dr_grpo")
"""Loss types modelled (grpo_trainer.py _compute_loss: the clipped ratio on (b, C) tensors)."""


def own_names() -> set[str]:
    """GRPOConfig's fields beyond TrainingArguments'."""
    return set(DEFAULTS) | set(INERT)


def _is_default(name: str, value: Any) -> bool:
    default = DEFAULTS[name]
    if name == "top_k":
        return value in (0, None)
    if name == "pad_to_multiple_of":
        return value in ("auto", None)
    return value == default or (default is None and value in (None, {}, []))


def grpo_fields(grpo: dict, seq_len: int, micro_batch: int) -> dict:
    """The TrainingConfig fields GRPOConfig's own fields set (checked first).

    >>> grpo_fields({"max_completion_length": 64, "beta": 0.04}, seq_len=96, micro_batch=8)
    {'trl': 'grpo', 'grpo_completion_len': 64, 'grpo_reference': True, 'grpo_old_logps': False}
    >>> grpo_fields({"use_vllm": True}, seq_len=600, micro_batch=8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: trainer_args.use_vllm: True is not modelled (vLLM ...
    """
    # GRPOConfig.__post_init__ fills these in: one step's batch, one step per generation
    same = {"generation_batch_size": (None, micro_batch), "steps_per_generation": (None, 1)}
    for name, why in REFUSED_UNLESS_DEFAULT.items():
        value = grpo.get(name, DEFAULTS[name])
        if value not in same.get(name, ()) and not _is_default(name, value):
            raise NotModelledError(f"trainer_args.{name}", f"{value!r} is not modelled ({why})",
                                   f"set {name} to {DEFAULTS[name]!r}")
    loss = grpo.get("loss_type", DEFAULTS["loss_type"])
    if loss not in LOSSES:
        raise NotModelledError("trainer_args.loss_type", f"{loss!r} is not modelled (modelled: "
                               f"{', '.join(LOSSES)})", "use loss_type 'dapo'")
    c = grpo.get("max_completion_length", DEFAULTS["max_completion_length"])
    if isinstance(c, bool) or not isinstance(c, int) or not 0 < c < seq_len:
        raise SpecError("trainer_args.max_completion_length", f"{c!r}: seq_len {seq_len} is prompt + "
                        "completion, so max_completion_length must be an integer in [1, seq_len)",
                        "pass seq_len = prompt tokens + max_completion_length")
    g = grpo.get("num_generations", DEFAULTS["num_generations"])
    if isinstance(g, bool) or not isinstance(g, int) or g < 2 or micro_batch % g:
        raise SpecError("trainer_args.num_generations", f"{g!r} must be an integer >= 2 dividing "
                        f"per_device_train_batch_size {micro_batch} (the completions of whole prompts)",
                        "pick a divisor of the batch")
    iters = grpo.get("num_iterations", 1)
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise SpecError("trainer_args.num_iterations", f"{iters!r} is not a positive integer", "write 1")
    beta = grpo.get("beta", 0.0)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise SpecError("trainer_args.beta", f"{beta!r} is not a number", "write 0.0 or a KL weight")
    return {"trl": "grpo", "grpo_completion_len": c, "grpo_reference": beta != 0,
            "grpo_old_logps": iters > 1}
