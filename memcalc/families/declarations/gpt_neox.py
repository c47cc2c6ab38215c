"""GPT-NeoX / Pythia (transformers 5.24 modeling_gpt_neox.py GPTNeoXForCausalLM: LayerNorm, fused
query_key_value, GELU MLP with biases, partial rotary, parallel residual, hidden_dropout)."""
from __future__ import annotations

from types import MappingProxyType

from memcalc.families.declaration import ALL_MASKS, LLAMA_CONFIG_KEYS, FamilyDeclaration, HFType, Supports
from memcalc.core.errors import SpecError
from memcalc.inputs.hf.values import flag, get, partial_rotary_factor

GPT_NEOX = FamilyDeclaration(
    "gpt_neox", programs={"hf": "hf_gpt_neox:PROGRAM"},
    hf_types=(HFType("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
                     reader="memcalc.families.declarations.gpt_neox:fields",
                     modelled=frozenset({"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                         "num_attention_heads", "intermediate_size", "max_position_embeddings",
                                         "tie_word_embeddings", "attention_bias", "hidden_act",
                                         "attention_dropout", "hidden_dropout", "use_parallel_residual",
                                         "rotary_pct", "rope_parameters", "_name_or_path"})),),
    config_keys=MappingProxyType(dict(LLAMA_CONFIG_KEYS, resid_dropout="hidden_dropout",
                                      embd_dropout="hidden_dropout",
                                      rotary_fraction="rope_parameters.partial_rotary_factor")),
    block_parameters="memcalc.formulas.parameters:gpt_neox_block", outer_parameters="layernorm",
    supports=Supports(trainer_inputs=True, attention_masks=ALL_MASKS, use_cache=True,
                      dropouts=frozenset({"embd", "attn", "resid"}), partial_rotary=True,
                      parallel_residual=True, grouped_query=False, intermediate_required=False,
                      tensor_parallel_refusal=("GPT-NeoX's fused attention.query_key_value (per-head "
                                               "[q k v] rows) and attention.dense have no column/row "
                                               "split in memcalc's GPT-NeoX program (not modelled or "
                                               "measured)", "use tensor_parallel=1 (data parallelism "
                                               "and FSDP are modelled)")),
    activations=("gelu", "gelu_new", "gelu_tanh"), biases=((False, False, True), (True, True, True)),
    check="memcalc.families.declarations.gpt_neox:check", builder="validate.models.hf:gpt_neox_config")
DECLARATIONS = (GPT_NEOX,)


def check(spec: object) -> None:
    """GPTNeoXAttention's fixed structure: head_dim = hidden_size / num_heads; hidden_dropout
    sets embedding and residual dropout together, attention_bias the q/k/v and dense biases.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> check(ModelSpec.preset("pythia-160m").with_(num_layers=1))
    """
    if spec.head_size * spec.num_heads != spec.hidden_size:
        raise ValueError("gpt_neox needs head_dim = hidden_size / num_heads; drop head_dim")
    if spec.embd_dropout != spec.resid_dropout:
        raise ValueError("gpt_neox's hidden_dropout sets embd_dropout and resid_dropout together; "
                         "make them equal")
    if spec.qkv_bias != spec.out_bias:
        raise ValueError("gpt_neox's attention_bias sets q/k/v and output biases together; "
                         "make qkv_bias equal out_bias")


def fields(cfg: dict, _model_type: str = "gpt_neox") -> dict:
    """GPTNeoXConfig: LayerNorm, a GELU MLP with biases, attention_bias on query_key_value and
    dense, hidden_dropout on the embeddings and both residual branches, rotary_pct 0.25."""
    act = get(cfg, "hidden_act", "gelu")
    acts = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh"}
    if not isinstance(act, str) or act not in acts:  # a list is unhashable
        raise SpecError("hf_config.hidden_act", f"{act!r} is not modelled", "use gelu, gelu_new or gelu_pytorch_tanh")
    bias = flag(cfg, "attention_bias", True)
    drop = get(cfg, "hidden_dropout", 0.0)
    return dict(family="gpt_neox", vocab_size=get(cfg, "vocab_size", 50432),
                hidden_size=get(cfg, "hidden_size", 6144), num_layers=get(cfg, "num_hidden_layers", 44),
                num_heads=get(cfg, "num_attention_heads", 64),
                intermediate_size=get(cfg, "intermediate_size", 24576),
                max_position_embeddings=get(cfg, "max_position_embeddings", 2048),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False), qkv_bias=bias, out_bias=bias,
                mlp_bias=True, activation=acts[act], attn_dropout=get(cfg, "attention_dropout", 0.0),
                embd_dropout=drop, resid_dropout=drop,
                parallel_residual=flag(cfg, "use_parallel_residual", True),
                rotary_fraction=partial_rotary_factor(cfg, 0.25))
