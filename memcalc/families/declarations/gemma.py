"""The Gemma generations (transformers 5.24 modeling_gemma.py, modeling_gemma2.py,
modeling_gemma3.py Gemma3ForCausalLM: GeGLU, (1+w) RMSNorm, scaled embeddings; Gemma-2 adds
sandwich norms, soft-capping and alternating sliding layers; Gemma-3 q/k norms and a rotary
table per layer kind). Read by memcalc.inputs.hf.gemma."""
from __future__ import annotations

from memcalc.families.declaration import LLAMA_KEYS, ALL_MASKS, FamilyDeclaration, HFType, Supports
from memcalc.core.errors import NotModelledError, SpecError
from memcalc.inputs.hf.values import count, flag, get

# Gemma reads hidden_act, Gemma-2/3 hidden_activation; Hub configs carry both, and
# memcalc.inputs.hf.gemma reads the one the class reads (the other is an attribute no module
# reads). No mlp_bias key.
_KEYS = (LLAMA_KEYS - {"mlp_bias"}) | {"hidden_activation", "use_bidirectional_attention"}
_KEYS2 = _KEYS | {"sliding_window", "layer_types", "attn_logit_softcapping", "final_logit_softcapping"}
_READER = "memcalc.families.declarations.gemma:fields"
_BIASES = ((False, False, False), (True, True, False))
_CHECK = "memcalc.families.declarations.gemma:check"
_BUILDER = "validate.models.hf:gemma_config"
GEMMA = FamilyDeclaration(
    "gemma", programs={"hf": "hf_gemma:PROGRAM"},
    hf_types=(HFType("gemma", "GemmaConfig", "GemmaForCausalLM", reader=_READER, modelled=_KEYS),),
    supports=Supports(trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True, tensor_parallel="all"),
    activations=("gelu_tanh",),
    biases=_BIASES, check=_CHECK, builder=_BUILDER)
GEMMA2 = FamilyDeclaration(
    "gemma2", programs={"hf": "hf_gemma:PROGRAM"},
    hf_types=(HFType("gemma2", "Gemma2Config", "Gemma2ForCausalLM", reader=_READER, modelled=_KEYS2),),
    sandwich_norms=True,
    supports=Supports(sdpa_refusal="transformers' Gemma-2 runs no SDPA path (Gemma2PreTrainedModel."
                                   "_supports_sdpa is False: SDPA cannot soft-cap the scores)",
                      default_attention="eager",  # modeling_gemma2.py: _supports_sdpa = False
                      sliding="patterned", attn_softcap=True, logit_softcap=True,
                      trainer_inputs=True, attention_masks=ALL_MASKS, windowed_call_path=True,
                      use_cache=True, tensor_parallel="all"),
    activations=("gelu_tanh",), biases=_BIASES, check=_CHECK, builder=_BUILDER)
GEMMA3 = FamilyDeclaration(
    "gemma3", programs={"hf": "hf_gemma:PROGRAM"},
    hf_types=(HFType("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", reader=_READER,
                     modelled=_KEYS2 | {"sliding_window_pattern", "_sliding_window_pattern"}),),
    sandwich_norms=True, supports=Supports(sliding="patterned", qk_norm="always", logit_softcap=True,
                                           trainer_inputs=True, attention_masks=ALL_MASKS,
                                           windowed_call_path=True, use_cache=True,
                                           tensor_parallel="all"),
    activations=("gelu_tanh",), biases=_BIASES, check=_CHECK, builder=_BUILDER)
DECLARATIONS = (GEMMA, GEMMA2, GEMMA3)


def check(spec: object) -> None:
    """The Gemma classes run GeGLU with gelu_pytorch_tanh, for implementation hf only.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> check(ModelSpec.preset("gemma-2-2b"))
    """
    if spec.activation != "gelu_tanh":
        raise ValueError("the gemma families run GeGLU with gelu_pytorch_tanh; set activation='gelu_tanh'")


FAMILY = {t.model_type: d.name for d in DECLARATIONS for t in d.hf_types}
# GemmaConfig reads `hidden_act`; Gemma2Config and Gemma3TextConfig `hidden_activation`
ACTIVATION_KEY = {"gemma": "hidden_act", "gemma2": "hidden_activation", "gemma3_text": "hidden_activation"}
# GemmaConfig.__post_init__ turns the legacy "gelu" of the first releases into the tanh GELU
TANH_GELU = {"gemma": ("gelu_pytorch_tanh", "gelu"), "gemma2": ("gelu_pytorch_tanh",),
             "gemma3_text": ("gelu_pytorch_tanh",)}
# Gemma-2 alternates sliding and global layers; Gemma-3 has one global layer in 6 unless the
# config's `sliding_window_pattern` (read by Gemma3TextConfig.__post_init__) says otherwise
DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6}


def fields(cfg: dict, model_type: str) -> dict:
    """ModelSpec fields of a Gemma-generation config.

    >>> f = fields({"model_type": "gemma2", "vocab_size": 10, "hidden_size": 8,
    ...     "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16}, "gemma2")
    >>> f["family"], f["head_dim"], f["sliding_window"], f["attn_softcap"], f["logit_softcap"]
    ('gemma2', 256, 4096, True, True)
    """
    act_key = ACTIVATION_KEY[model_type]
    act = get(cfg, act_key, "gelu_pytorch_tanh")
    if act not in TANH_GELU[model_type]:
        raise SpecError(f"hf_config.{act_key}", f"{act!r} is not modelled", "use gelu_pytorch_tanh")
    if flag(cfg, "use_bidirectional_attention", False):
        raise NotModelledError("hf_config.use_bidirectional_attention", "bidirectional masks are "
                               "not modelled (a causal LM step is)", "set it to false")
    bias = flag(cfg, "attention_bias", False)  # q, k, v and o_proj alike (GemmaAttention)
    fields = dict(family=FAMILY[model_type], vocab_size=get(cfg, "vocab_size", required=True),
                  hidden_size=get(cfg, "hidden_size", required=True),
                  num_layers=get(cfg, "num_hidden_layers", required=True),
                  num_heads=get(cfg, "num_attention_heads", required=True),
                  num_kv_heads=get(cfg, "num_key_value_heads"), head_dim=get(cfg, "head_dim", 256),
                  intermediate_size=get(cfg, "intermediate_size", required=True),
                  max_position_embeddings=get(cfg, "max_position_embeddings", 8192),
                  tie_embeddings=flag(cfg, "tie_word_embeddings", True), qkv_bias=bias,
                  out_bias=bias, mlp_bias=False, activation="gelu_tanh",
                  attn_dropout=get(cfg, "attention_dropout", 0.0),
                  qk_norm=model_type == "gemma3_text")
    if model_type == "gemma":
        return fields
    count(cfg, "hidden_size", required=True), count(cfg, "num_attention_heads", required=True)
    if fields["hidden_size"] % fields["num_heads"]:  # Gemma2Config / Gemma3TextConfig.validate_architecture
        raise SpecError("hf_config.num_attention_heads", f"{fields['num_heads']} does not divide "
                        f"hidden_size={fields['hidden_size']} (transformers refuses this config)",
                        "use a divisor of hidden_size")
    pattern = get(cfg, "sliding_window_pattern", None) or get(cfg, "_sliding_window_pattern", None)
    gemma2 = model_type == "gemma2"
    fields.update(sliding_window=get(cfg, "sliding_window", 4096),
                  sliding_window_pattern=pattern or DEFAULT_PATTERN[model_type],
                  logit_softcap=get(cfg, "final_logit_softcapping", 30.0 if gemma2 else None) is not None,
                  # Gemma3Attention stores attn_logit_softcapping but does not pass it to the
                  # attention function (modeling_gemma3.py, 5.24): no op for it there
                  attn_softcap=gemma2 and get(cfg, "attn_logit_softcapping", 50.0) is not None)
    return fields
