"""Hugging Face models from a ModelSpec (implementation='hf') or a config dict: random weights,
nothing downloaded, checkpointing applied the way a user of transformers would (per-layer), or by
grouping decoder layers (every-k, sqrt), or around the attention function only (selective).
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from memcalc.core.errors import MemcalcError
from memcalc.families.declaration import resolve
from memcalc.families.registry import FAMILIES, declaration
from validate.models.layers import decoder_layers, replace_decoder_layers
from validate.models.reference import RMS_EPS, ROPE_THETA, segment_size

CLASSES = {t.model_type: t.model_class for d in FAMILIES.values() for t in d.hf_types}
"""model_type -> the transformers ForCausalLM class that builds it (the families' declarations)."""


def gpt2_config(spec) -> dict:
    if not (spec.qkv_bias and spec.out_bias and spec.mlp_bias):
        raise MemcalcError("qkv_bias", "HF GPT-2 always has q/k/v, output and MLP biases",
                           "set qkv_bias/out_bias/mlp_bias true or use implementation=reference")
    if spec.head_size * spec.num_heads != spec.hidden_size:
        raise MemcalcError("head_dim", "HF GPT-2 needs head_dim = hidden_size / num_heads",
                           "drop head_dim or use implementation=reference")
    act = {"gelu_tanh": "gelu_pytorch_tanh"}.get(spec.activation, spec.activation)
    if act == "silu":
        raise MemcalcError("activation", "gpt2 family with silu is not a HF GPT-2 model",
                           "use gelu_new, gelu or gelu_tanh")
    return dict(model_type="gpt2", vocab_size=spec.vocab_size, n_embd=spec.hidden_size,
                n_layer=spec.num_layers, n_head=spec.num_heads, n_inner=spec.intermediate_size,
                n_positions=spec.max_position_embeddings, activation_function=act,
                embd_pdrop=spec.embd_dropout, attn_pdrop=spec.attn_dropout,
                resid_pdrop=spec.resid_dropout, tie_word_embeddings=spec.tie_embeddings,
                reorder_and_upcast_attn=spec.reorder_and_upcast_attn,
                bos_token_id=0, eos_token_id=0)


def _llama_model_type(spec) -> str:
    if spec.qk_norm:  # Qwen3: attention_bias on q, k, v and o_proj alike, no MLP bias
        if spec.qkv_bias != spec.out_bias or spec.mlp_bias:
            raise MemcalcError("qkv_bias", "HF Qwen3 has q/k/v and output biases together (attention_bias) "
                               "and no MLP bias", "set qkv_bias = out_bias and mlp_bias false")
        return "qwen3"
    if spec.max_window_layers is not None:  # Qwen2's sliding rule (Qwen3's with qk_norm)
        # Qwen2Attention builds q/k/v with bias=True whatever the config and o_proj, the MLP without
        # (modeling_qwen2.py): another bias set would measure a model the spec does not describe
        # (fresh1921586647-084: 192 bias parameters and their gradients, 1,536 B, -0.24%)
        if (spec.qkv_bias, spec.out_bias, spec.mlp_bias) != (True, False, False):
            raise MemcalcError("max_window_layers", "HF Qwen2 (the max_window_layers rule) has q/k/v biases "
                               "and no output or MLP bias", "set qkv_bias true, out_bias and mlp_bias false, "
                               "or drop max_window_layers (Mistral's every-layer window, no biases)")
        return "qwen2"
    if spec.sliding_window is not None:
        if spec.qkv_bias or spec.out_bias or spec.mlp_bias:
            raise MemcalcError("sliding_window", "HF Mistral (every layer sliding) has no biases",
                               "drop the biases, or set max_window_layers (Qwen2's rule)")
        return "mistral"
    if spec.mlp_bias and (spec.qkv_bias != spec.out_bias):
        raise MemcalcError("mlp_bias", "no HF llama-family class has this bias combination",
                           "use implementation=reference")
    if spec.qkv_bias and not spec.out_bias:
        return "qwen2"
    if spec.out_bias and not spec.qkv_bias:
        raise MemcalcError("out_bias", "HF Llama has an output bias only together with q/k/v biases",
                           "use implementation=reference")
    return "mistral" if "mistral" in spec.name.lower() else "llama"


def hf_config_dict(spec) -> dict:
    """A transformers config dict (with model_type) that builds the spec's architecture.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> hf_config_dict(ModelSpec.preset("qwen2-0.5b"))["model_type"]
    'qwen2'
    """
    return resolve(declaration(spec.family).builder)(spec)


def llama_config(spec) -> dict:
    """A llama / mistral / qwen2 / qwen3 / smollm3 config dict of a llama-family spec."""
    if spec.no_rope_layers:
        return smollm3_config(spec)
    model_type = _llama_model_type(spec)
    cfg = dict(model_type=model_type, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
               num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
               num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
               intermediate_size=spec.ffn_size, max_position_embeddings=spec.max_position_embeddings,
               tie_word_embeddings=spec.tie_embeddings, hidden_act="silu",
               attention_dropout=spec.attn_dropout, rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA,
               bos_token_id=0, eos_token_id=0, pad_token_id=None)
    if model_type == "llama":
        cfg.update(attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias)
    if model_type == "qwen3":
        cfg.update(attention_bias=spec.qkv_bias)
    if model_type == "mistral":
        cfg.update(sliding_window=spec.sliding_window)
    if model_type in ("qwen2", "qwen3"):
        cfg.update(sliding_window=None, use_sliding_window=False)
        if spec.sliding_window is not None:
            cfg.update(use_sliding_window=True, sliding_window=spec.sliding_window,
                       max_window_layers=spec.max_window_layers)
    return cfg


def gemma_config(spec) -> dict:
    """A gemma / gemma2 / gemma3_text config dict of a gemma-family spec."""
    if spec.qkv_bias != spec.out_bias or spec.mlp_bias:
        raise MemcalcError("qkv_bias", "HF Gemma has q/k/v and output biases together (attention_bias) "
                           "and no MLP bias", "set qkv_bias = out_bias and mlp_bias false")
    model_type = declaration(spec.family).model_types[0]
    cfg = dict(model_type=model_type, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
               num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
               num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
               intermediate_size=spec.ffn_size, max_position_embeddings=spec.max_position_embeddings,
               tie_word_embeddings=spec.tie_embeddings, attention_bias=spec.qkv_bias,
               attention_dropout=spec.attn_dropout, rms_norm_eps=RMS_EPS,
               bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg["hidden_act" if model_type == "gemma" else "hidden_activation"] = "gelu_pytorch_tanh"
    if model_type != "gemma":
        cfg.update(sliding_window=spec.sliding_window, query_pre_attn_scalar=spec.head_size,
                   final_logit_softcapping=30.0 if spec.logit_softcap else None,
                   attn_logit_softcapping=50.0 if spec.attn_softcap else None,
                   layer_types=["sliding_attention" if spec.layer_is_sliding(i) else "full_attention"
                                for i in range(spec.num_layers)])
    return cfg


def moe_config(spec) -> dict:
    """A Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE config dict for a MoE spec (memcalc.inputs.hf.config
    reads it back to the same spec)."""
    moe, family = spec.moe, spec.family
    if (spec.qkv_bias, spec.out_bias, spec.mlp_bias) not in declaration(family).biases:
        raise MemcalcError("qkv_bias", f"HF {family} has no such bias combination",
                           "use the biases of the family's config (attention_bias / qkv_bias)")
    cfg = dict(model_type=family, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
               num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
               num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
               max_position_embeddings=spec.max_position_embeddings,
               tie_word_embeddings=spec.tie_embeddings, hidden_act="silu",
               attention_dropout=spec.attn_dropout, rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA,
               bos_token_id=0, eos_token_id=0, pad_token_id=None, num_experts_per_tok=moe.top_k,
               output_router_logits=moe.output_router_logits)
    if family == "mixtral":
        cfg.update(num_local_experts=moe.num_experts, intermediate_size=moe.expert_ffn_size,
                   sliding_window=None, router_jitter_noise=moe.router_jitter_noise)
        return cfg
    cfg.update(num_experts=moe.num_experts, norm_topk_prob=moe.norm_topk_prob)
    if family == "olmoe":
        cfg.update(intermediate_size=moe.expert_ffn_size, attention_bias=spec.qkv_bias, clip_qkv=None)
        return cfg
    cfg.update(intermediate_size=spec.ffn_size, moe_intermediate_size=moe.expert_ffn_size,
               mlp_only_layers=list(moe.dense_layers), decoder_sparse_step=1, use_sliding_window=False)
    if family == "qwen2_moe":
        cfg.update(shared_expert_intermediate_size=moe.shared_expert_ffn_size, qkv_bias=spec.qkv_bias)
    else:
        cfg.update(attention_bias=spec.qkv_bias)
    return cfg
# ---- families of issue 12, part b: config dicts that build each spec's architecture -------------
def _llama_like_config(spec, model_type: str) -> dict:
    return dict(model_type=model_type, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
                intermediate_size=spec.ffn_size, max_position_embeddings=spec.max_position_embeddings,
                tie_word_embeddings=spec.tie_embeddings, hidden_act="silu",
                attention_dropout=spec.attn_dropout, rms_norm_eps=RMS_EPS,
                rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                bos_token_id=0, eos_token_id=0, pad_token_id=None)


def _require_biases(spec, qkv: bool, out: bool, mlp: bool, family: str) -> None:
    if (spec.qkv_bias, spec.out_bias, spec.mlp_bias) != (qkv, out, mlp):
        raise MemcalcError("qkv_bias", f"HF {family} has qkv_bias={qkv}, out_bias={out}, mlp_bias={mlp}",
                           "set those biases")


def phi3_config(spec) -> dict:
    _require_biases(spec, False, False, False, "Phi-3")
    cfg = _llama_like_config(spec, "phi3")
    cfg["rope_parameters"]["partial_rotary_factor"] = spec.rotary_fraction
    return dict(cfg, resid_pdrop=spec.resid_dropout, embd_pdrop=0.0, sliding_window=None)


def olmo2_config(spec) -> dict:
    _require_biases(spec, spec.qkv_bias, spec.qkv_bias, False, "OLMo-2")
    return dict(_llama_like_config(spec, "olmo2"), attention_bias=spec.qkv_bias)


def granite_config(spec) -> dict:
    _require_biases(spec, spec.qkv_bias, spec.qkv_bias, spec.mlp_bias, "Granite")
    return dict(_llama_like_config(spec, "granite"), attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias,
                embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                logits_scaling=16.0)


def smollm3_config(spec) -> dict:
    _require_biases(spec, spec.qkv_bias, spec.qkv_bias, spec.mlp_bias, "SmolLM3")
    if spec.qk_norm or spec.sliding_window is not None:  # no HF class has NoPE layers with either
        raise MemcalcError("no_rope_layers", "HF SmolLM3 (NoPE layers) is built without q/k norms and "
                           "sliding windows", "drop qk_norm and sliding_window, or no_rope_layers")
    return dict(_llama_like_config(spec, "smollm3"), attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias,
                no_rope_layers=[int(i not in spec.no_rope_layers) for i in range(spec.num_layers)],
                use_sliding_window=False, sliding_window=None)


def gpt_neox_config(spec) -> dict:
    _require_biases(spec, spec.qkv_bias, spec.qkv_bias, True, "GPT-NeoX")
    act = {"gelu_tanh": "gelu_pytorch_tanh"}.get(spec.activation, spec.activation)
    return dict(model_type="gpt_neox", vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                intermediate_size=spec.ffn_size, max_position_embeddings=spec.max_position_embeddings,
                tie_word_embeddings=spec.tie_embeddings, hidden_act=act, attention_bias=spec.qkv_bias,
                attention_dropout=spec.attn_dropout, hidden_dropout=spec.resid_dropout,
                use_parallel_residual=spec.parallel_residual,
                rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                                 "partial_rotary_factor": spec.rotary_fraction},
                bos_token_id=0, eos_token_id=0)


def gpt_oss_config(spec) -> dict:
    """A GptOssConfig dict of a gpt_oss spec (memcalc.inputs.hf.gpt_oss reads it back to the same spec)."""
    _require_biases(spec, spec.qkv_bias, spec.qkv_bias, True, "GPT-OSS")
    return dict(model_type="gpt_oss", vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
                intermediate_size=spec.moe.expert_ffn_size, num_local_experts=spec.moe.num_experts,
                num_experts_per_tok=spec.moe.top_k, max_position_embeddings=spec.max_position_embeddings,
                tie_word_embeddings=spec.tie_embeddings, attention_bias=spec.qkv_bias,
                attention_dropout=spec.attn_dropout, rms_norm_eps=RMS_EPS, sliding_window=spec.sliding_window,
                layer_types=["sliding_attention" if spec.layer_is_sliding(i) else "full_attention"
                             for i in range(spec.num_layers)],
                output_router_logits=spec.moe.output_router_logits, bos_token_id=0, eos_token_id=0,
                pad_token_id=None)


def _make_config(config: dict):
    import transformers

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if model_type not in CLASSES:
        raise MemcalcError("hf_config.model_type", f"{model_type!r} is not supported",
                           f"use one of {', '.join(CLASSES)}")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
                "auto_map", "quantization_config"):
        cfg.pop(key, None)
    return model_type, transformers.AutoConfig.for_model(model_type, **cfg)


def build_hf(spec, training, config: dict | None = None):
    """A randomly initialised HF causal LM in train mode, on the current default device.

    Returns (model, description), e.g. 'hf:GPT2LMHeadModel:sdpa'.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2)
    >>> build_hf(spec, TrainingConfig(micro_batch=1, seq_len=4, attention="eager"))[1]
    'hf:GPT2LMHeadModel:eager'
    >>> build_hf(spec, TrainingConfig(micro_batch=1, seq_len=4))[1]  # the kernel transformers picks
    'hf:GPT2LMHeadModel:default=sdpa'
    """
    import transformers

    transformers.logging.set_verbosity_error()  # config-default chatter, one line per model
    model_type, cfg = _make_config(config if config is not None else hf_config_dict(spec))
    cls = getattr(transformers, CLASSES[model_type])
    attn = training.attention  # None: transformers picks (get_correct_attn_implementation)
    if training.checkpointing == "selective":
        attn = register_selective(training.resolved_attention(spec))
    extra = {}
    if hasattr(cfg, "num_experts_per_tok"):  # MoE: transformers' experts path (integrations/moe.py)
        extra["experts_implementation"] = training.experts_implementation
    model = cls._from_config(cfg, attn_implementation=attn, **extra)
    _apply_checkpointing(model, spec, training)
    from validate.models.moe_routing import install

    install(model)  # MoE models: record each forward's routing (validate.models.moe_routing)
    picked = model.config._attn_implementation  # the kernel the model runs, as transformers resolved it
    return model.train(), f"hf:{cls.__name__}:{picked if training.attention else f'default={picked}'}"


# ---- checkpointing -----------------------------------------------------------------------------
def _apply_checkpointing(model, spec, training) -> None:
    kind = training.checkpointing
    if kind == "per-layer":
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif kind in ("every-k", "sqrt"):
        k = segment_size(spec, training)
        layers = _group_layers(decoder_layers(model), k)
        replace_decoder_layers(model, torch.nn.ModuleList(layers))


class _Group:
    """Shared state of one checkpointed segment: its layers, the calls its wrappers received so
    far in this forward, and the layers' output form."""

    def __init__(self, layers):
        self.layers = layers
        self.calls: list = []
        self.first_hidden = None
        self.tuple_output = False


class SegmentLayer(torch.nn.Module):
    """Wraps one decoder layer. Each wrapper records the arguments the model's loop gives its
    layer (a mask and rotary table of that layer's kind: Gemma-2/3 and Qwen2 mix local and global
    layers) and passes its input through; the segment's last wrapper runs all the segment's
    layers, each with its own arguments, under one non-reentrant checkpoint."""

    def __init__(self, layer, group: _Group, last: bool):
        super().__init__()
        self.layer = layer  # registered here, so parameters and state_dict stay per layer
        self._group, self._last = group, last

    def _run(self, calls, hidden):
        out = hidden
        for layer, (args, kwargs) in zip(self._group.layers, calls):
            out = layer(hidden, *args, **kwargs)
            self._group.tuple_output = isinstance(out, tuple)
            hidden = out[0] if isinstance(out, tuple) else out
        return out

    def forward(self, hidden, *args, **kwargs):
        group = self._group
        if not group.calls:
            group.first_hidden = hidden
        group.calls.append((args, kwargs))
        if not self._last:
            return (hidden,) if group.tuple_output else hidden
        first, calls = group.first_hidden, group.calls  # the recomputation reuses `calls`
        group.first_hidden, group.calls = None, []
        if not (self.training and torch.is_grad_enabled()):
            return self._run(calls, first)
        return checkpoint(self._run, calls, first, use_reentrant=False)


def _group_layers(layers, k: int):
    wrapped = []
    for i in range(0, len(layers), k):
        group = _Group(layers[i:i + k])
        wrapped += [SegmentLayer(layer, group, j == len(group.layers) - 1)
                    for j, layer in enumerate(group.layers)]
    return wrapped


def register_selective(base: str) -> str:
    """Register an attention function that runs `base` (eager or sdpa) inside a non-reentrant
    checkpoint; returns its name for attn_implementation.

    >>> register_selective("sdpa")
    'memcalc_selective_sdpa'
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = f"memcalc_selective_{base}"

    def attention(module, query, key, value, attention_mask, **kwargs):
        fn = _base_attention(module, base)

        def core(q, k, v):
            return fn(module, q, k, v, attention_mask, **kwargs)[0]

        if not (module.training and torch.is_grad_enabled()):
            return core(query, key, value), None
        return checkpoint(core, query, key, value, use_reentrant=False), None

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def _base_attention(module, base: str):
    if base == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    import sys

    # each modeling file defines its own eager_attention_forward; use the module's own
    return sys.modules[type(module).__module__].eager_attention_forward
