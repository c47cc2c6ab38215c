"""Every key of a Hugging Face config.json, accounted for: read into the ModelSpec (modelled),
known not to change a training step's memory (with why), or refused with the key and the fix
when its value is not the one memcalc models. A key in none of these is refused too, so a new
transformers release that adds a memory-relevant key is an error, not a silently wrong number
(tests/test_hf_keys.py walks each supported config class's to_dict()).

Sources: transformers 5.24 configuration_*.py and modeling_gpt2.py / modeling_llama.py /
modeling_mistral.py / modeling_qwen2.py / modeling_phi3.py / modeling_gpt_neox.py /
modeling_olmo2.py / modeling_granite.py / modeling_smollm3.py, masking_utils.py.
"""
from __future__ import annotations

from memcalc.errors import NotModelledError

MODELLED = {
    "gpt2": {"model_type", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
             "tie_word_embeddings", "activation_function", "embd_pdrop", "attn_pdrop", "resid_pdrop",
             "_name_or_path", "reorder_and_upcast_attn"},
    "llama": {"model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
              "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "attention_dropout",
              "_name_or_path"},
}
MODELLED["mistral"] = MODELLED["qwen2"] = MODELLED["llama"]
# ---- families of memcalc.hf_config.FAMILY_READERS (transformers 5.24 configuration_*.py)
MODELLED["olmo2"] = MODELLED["llama"]
# rope_parameters: its partial_rotary_factor sets the rotated width (the rest is inert, see INERT)
MODELLED["phi3"] = MODELLED["llama"] | {"resid_pdrop", "partial_rotary_factor", "rope_parameters"}
MODELLED["granite"] = MODELLED["llama"] | {"embedding_multiplier", "residual_multiplier",
                                           "attention_multiplier", "logits_scaling"}
MODELLED["smollm3"] = MODELLED["llama"] | {"no_rope_layers", "no_rope_layer_interval"}
MODELLED["gpt_neox"] = {"model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
                        "hidden_act", "attention_dropout", "hidden_dropout", "use_parallel_residual",
                        "rotary_pct", "rope_parameters", "_name_or_path"}

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
    "max_window_layers": "which layers use the sliding window when use_sliding_window is true (refused)",
    "scale_attn_by_inverse_layer_idx": ("GPT-2: transformers 5.x folds 1/(layer_idx+1) into the scaling "
                                        "constant of the same op (modeling_gpt2.py GPT2Attention.__init__)"),
    "rotary_emb_base": "GPT-NeoX's legacy rope_theta (rotary frequencies)",
    "classifier_dropout": _HEADS,
    "layer_norm_eps": _NUMERIC,
}

# keys inert for one model type only: model_type -> key -> why
TYPE_INERT: dict[str, dict[str, str]] = {
    "phi3": {"embd_pdrop": "not read by modeling_phi3.py in transformers 5.24 (Phi3Model has no "
                           "embedding dropout)",
             "original_max_position_embeddings": "read only by the longrope rotary type to pick "
                                                 "its factors: the cos/sin tables keep their shape",
             "attention_bias": "modeling_phi3.py builds qkv_proj and o_proj with bias=False whatever "
                               "its value"},
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
    "sliding_window": ((None,), "sliding-window attention is not modelled yet (it changes the "
                       "mask and kernel when seq_len exceeds the window)",
                       "set it to null: memcalc then predicts full causal attention, the same "
                       "memory as the window for seq_len <= the window (the mask is then causal)"),
    "use_sliding_window": ((False, None), "sliding-window attention is not modelled yet",
                           "set it to false"),
    "layer_types": ((None, "full_attention"), "sliding-attention layers are not modelled yet",
                    "list only full_attention layers"),
    "pruned_heads": ((None, "empty"), "pruned heads change the projections' widths",
                     "use the unpruned config"),
    "cross_attention_hidden_size": ((None,), "cross-attention is not modelled", "remove it"),
    "quantization_config": ((None,), "quantized base weights are not modelled yet", "remove it"),
    "auto_map": ((None,), "the model runs custom code memcalc has no program for",
                 "use a transformers model type"),
}


def _allowed(key: str, value: object, allowed: tuple) -> bool:
    if key == "layer_types":
        return value is None or (isinstance(value, list) and all(v == "full_attention" for v in value))
    if key == "pruned_heads":
        return value is None or value == {} or value == []
    return any(value is a if a in (None, True, False) else value == a for a in allowed)


def check_config_keys(cfg: dict, family_type: str) -> None:
    """Refuse any key of `cfg` that is not modelled, not known to leave memory unchanged, or has a
    value memcalc does not model.

    >>> check_config_keys({"model_type": "gpt2", "n_layer": 2, "bos_token_id": 1}, "gpt2")
    >>> check_config_keys({"model_type": "gpt2", "output_attentions": True}, "gpt2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.errors.NotModelledError: hf_config.output_attentions: True is not modelled ...
    """
    modelled = MODELLED[family_type]
    for key, value in cfg.items():
        if key in modelled or key in INERT or key in TYPE_INERT.get(family_type, {}):
            continue
        if key == "sliding_window" and family_type == "qwen2":
            continue  # Qwen2 reads it only with use_sliding_window (refused when true)
        if key == "sliding_window" and family_type == "smollm3" and cfg.get("use_sliding_window") in (False, None):
            continue  # SmolLM3 reads it only with use_sliding_window (refused when true)
        if key in REFUSED_UNLESS:
            allowed, why, fix = REFUSED_UNLESS[key]
            if not _allowed(key, value, allowed):
                raise NotModelledError(f"hf_config.{key}", f"{str(value)[:40]} is not modelled ({why})", fix)
            continue
        raise NotModelledError(f"hf_config.{key}", "is a key memcalc does not know (neither modelled "
                               "nor known to leave memory unchanged)",
                               "remove it if it does not change the model's computation, or report it")
