"""Every key of a Hugging Face config.json, accounted for: read into the ModelSpec (modelled),
known not to change a training step's memory (with why), or refused with the key and the fix
when its value is not the one memcalc models. A key in none of these is refused too, so a new
transformers release that adds a memory-relevant key is an error, not a silently wrong number
(tests/test_hf_keys.py walks each supported config class's to_dict()).

Each model type's modelled keys, and the keys inert or refused for that type alone, are in its
family's declaration (memcalc.families.declarations, HFType); the keys every type shares are here.

Sources: transformers 5.24 configuration_*.py and modeling_gpt2.py / modeling_llama.py /
modeling_mistral.py / modeling_qwen2.py / modeling_qwen3.py / modeling_gemma*.py / modeling_phi3.py /
modeling_gpt_neox.py / modeling_olmo2.py / modeling_granite.py / modeling_smollm3.py / modeling_gpt_oss.py,
masking_utils.py.
"""
from __future__ import annotations

from memcalc.core.errors import NotModelledError
from memcalc.families.registry import hf_type

_METADATA = "metadata: names and versions, read by no op"
_TOKENS = "token ids: generation and padding only; the step's inputs are TrainingConfig's shape"
_NUMERIC = "a numeric constant inside an op (epsilon, init scale, rotary frequencies): no tensor changes size"
_HEADS = "used by other heads (sequence classification, double heads), not by ForCausalLM"
_GENERATION = "generation settings (legacy config keys): generate() only, not a training step"
_DTYPE = ("the dtype weights are loaded in; the step's dtypes are TrainingConfig.precision's "
          "(parameters cast as the precision regime says)")
_PATH = ("the modelled call path passes use_cache=False and labels, and TrainingConfig.attention "
         "chooses the attention implementation")

INERT: dict[str, str] = {
    **{k: _METADATA for k in ("architectures", "transformers_version", "_commit_hash", "tokenizer_class",
                              "finetuning_task", "prefix", "task_specific_params", "torchscript",
                              "tf_legacy_loss", "use_bfloat16", "_attn_implementation_autoset")},
    **{k: _TOKENS for k in ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                            "decoder_start_token_id")},
    **{k: _NUMERIC for k in ("initializer_range", "layer_norm_epsilon", "rms_norm_eps", "rope_theta")},
    **{k: _HEADS for k in ("id2label", "label2id", "problem_type", "summary_activation",
                           "summary_first_dropout", "summary_proj_to_labels", "summary_type",
                           "summary_use_proj", "num_labels")},
    **{k: _GENERATION for k in ("max_length", "min_length", "do_sample", "early_stopping", "num_beams",
                                "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
                                "typical_p", "repetition_penalty", "length_penalty",
                                "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                                "num_return_sequences", "output_scores", "return_dict_in_generate",
                                "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
                                "exponential_decay_length_penalty", "suppress_tokens",
                                "begin_suppress_tokens")},
    **{k: _DTYPE for k in ("dtype", "torch_dtype")},
    **{k: _PATH for k in ("use_cache", "return_dict", "attn_implementation", "_attn_implementation")},
    "n_ctx": "GPT-2's legacy copy of n_positions; modeling_gpt2.py reads n_positions",
    "chunk_size_feed_forward": "not read by modeling_gpt2.py or modeling_llama.py in transformers 5.x",
    "pretraining_tp": "not read by modeling_llama.py in transformers 5.x (sliced matmuls were removed)",
    "rope_parameters": ("rotary type and scaling: the cos/sin tables are (s, head_dim) for every "
                        "rope_type, the scaling multiplies them in place of the modelled `*scaling`"),
    "rope_scaling": "older name of rope_parameters (same tables)",
    "is_decoder": "a decoder-only causal LM runs the same program with either value",
    "max_window_layers": ("which layers slide when use_sliding_window is true (modelled for qwen2/qwen3, "
                          "MODELLED); no effect without a sliding window"),
    "router_aux_loss_coef": ("a Python float in `coef * aux_loss` (one fp32 scalar whatever its value); "
                             "the auxiliary loss itself follows output_router_logits (modelled for "
                             "mixtral, qwen2_moe, qwen3_moe, olmoe: memcalc.families.moe_aux)"),
    "scale_attn_by_inverse_layer_idx": ("GPT-2: transformers 5.x folds 1/(layer_idx+1) into the scaling "
                                        "constant of the same op (modeling_gpt2.py GPT2Attention.__init__)"),
    "rotary_emb_base": "GPT-NeoX's legacy rope_theta (rotary frequencies)",
    "classifier_dropout": _HEADS,
    "layer_norm_eps": _NUMERIC,
    "query_pre_attn_scalar": ("Gemma-2/3's attention scale is query_pre_attn_scalar**-0.5, a Python "
                              "scalar in the modelled `* scale` op: no tensor changes size"),
    "rope_local_base_freq": "Gemma-3's local rotary base (older name): a number in the local table",
    "cache_implementation": _GENERATION,
    "sliding_window_size": ("an older Gemma-2 name written beside sliding_window; no transformers 5.x "
                            "class reads it (Gemma2Config reads sliding_window)"),
}

# key -> (the values memcalc models, why another value matters, the fix)
REFUSED_UNLESS: dict[str, tuple[tuple, str, str]] = {
    "scale_attn_weights": ((True, None), "leaves out the modelled scaling op of eager attention",
                           "set it to true"),
    "add_cross_attention": ((False, None), "adds cross-attention layers", "set it to false"),
    "is_encoder_decoder": ((False, None), "an encoder-decoder model", "use a decoder-only config"),
    "tie_encoder_decoder": ((False, None), "an encoder-decoder model", "use a decoder-only config"),
    "output_attentions": ((False, None), "keeps every layer's attention weights until the step "
                          "ends", "set it to false"),
    "output_hidden_states": ((False, None), "keeps every layer's hidden states in the outputs",
                             "set it to false"),
    # modelled for mistral, qwen2, qwen3, gemma2, gemma3_text (MODELLED); other types have no
    # sliding-window code path, so a value there would be a config for another model
    "sliding_window": ((None,), "this model type has no sliding-window attention",
                       "set it to null, or use a model type that has it (mistral, qwen2, qwen3, gemma2)"),
    "use_sliding_window": ((False, None), "this model type has no sliding-window attention",
                           "set it to false"),
    "layer_types": ((None, "full_attention"), "this model type has no sliding-attention layers",
                    "list only full_attention layers"),
    "pruned_heads": ((None, "empty"), "pruned heads change the projections' widths",
                     "use the unpruned config"),
    "cross_attention_hidden_size": ((None,), "cross-attention is not modelled", "remove it"),
    "quantization_config": ((None,), "not read from config.json (bitsandbytes 4-bit bases are "
                            "TrainingConfig.quantization)",
                            "remove it and pass --quantization nf4, nf4-double or fp4 with LoRA adapters"),
    # modelled for the MoE types (MODELLED; memcalc.families.moe_aux); any other type has no router
    "output_router_logits": ((False, None), "this model type has no MoE router whose logits an "
                             "auxiliary load-balancing loss could use (modelled for mixtral, "
                             "qwen2_moe, qwen3_moe, olmoe)", "set it to false"),
    "router_jitter_noise": ((0, 0.0, None), "only Mixtral's router multiplies its input by jitter "
                            "noise (modelled for mixtral); this model type has none",
                            "set it to 0.0"),
    "clip_qkv": ((None,), "OLMoE's in-place clamp of q, k and v is not modelled", "set it to null"),
    "auto_map": ((None,), "the model runs custom code memcalc has no program for",
                 "use a transformers model type"),
}


def _allowed(key: str, value: object, allowed: tuple) -> bool:
    if key == "layer_types":
        return value is None or (isinstance(value, list) and all(v == "full_attention" for v in value))
    if key == "pruned_heads":
        return value is None or value == {} or value == []
    if key == "router_jitter_noise":
        return value is None or (type(value) in (int, float) and value == 0)
    return any(value is a if a in (None, True, False) else value == a for a in allowed)


def check_config_keys(cfg: dict, family_type: str) -> None:
    """Refuse any key of `cfg` that is not modelled, not known to leave memory unchanged, or has a
    value memcalc does not model.

    >>> check_config_keys({"model_type": "gpt2", "n_layer": 2, "bos_token_id": 1}, "gpt2")
    >>> check_config_keys({"model_type": "gpt2", "output_attentions": True}, "gpt2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: hf_config.output_attentions: True is not modelled ...
    """
    hf = hf_type(family_type)[1]
    for key, value in cfg.items():
        if key in hf.modelled or key in INERT or key in hf.inert:
            continue
        if key in hf.refused and value is not None:
            why, fix = hf.refused[key]
            raise NotModelledError(f"hf_config.{key}", f"{repr(value)[:40]} is not modelled ({why})", fix)
        if key == "sliding_window" and hf.window_key == "ignored":
            continue  # read only with use_sliding_window (refused when true): Qwen2/Qwen3-MoE
        if key == "sliding_window" and hf.window_key == "gated" and cfg.get("use_sliding_window") in (False, None):
            continue  # read only with use_sliding_window (refused when true): SmolLM3
        if key in REFUSED_UNLESS:
            allowed, why, fix = REFUSED_UNLESS[key]
            if not _allowed(key, value, allowed):
                raise NotModelledError(f"hf_config.{key}", f"{repr(value)[:40]} is not modelled ({why})", fix)
            continue
        raise NotModelledError(f"hf_config.{key}", "is a key memcalc does not know (neither modelled "
                               "nor known to leave memory unchanged)",
                               "remove it if it does not change the model's computation, or report it")
