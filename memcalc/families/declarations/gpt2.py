"""GPT-2 (transformers 5.24 modeling_gpt2.py GPT2LMHeadModel; validate.models.reference.ReferenceGPT2)."""
from __future__ import annotations

from memcalc.families.declaration import PACKED_MASKS, FamilyDeclaration, HFType, LoRALayout, Supports
from memcalc.core.errors import SpecError
from memcalc.inputs.hf.values import flag, get

GPT2 = FamilyDeclaration(
    "gpt2", programs={"hf": "hf_gpt2:PROGRAM", "reference": "ref_gpt2:PROGRAM"},
    hf_types=(HFType("gpt2", "GPT2Config", "GPT2LMHeadModel", reader="memcalc.families.declarations.gpt2:fields",
                     modelled=frozenset({"model_type", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner",
                                         "n_positions", "tie_word_embeddings", "activation_function",
                                         "embd_pdrop", "attn_pdrop", "resid_pdrop", "_name_or_path",
                                         "reorder_and_upcast_attn"})),),
    config_keys=dict(vocab_size="vocab_size", hidden_size="n_embd", num_layers="n_layer",
                     num_heads="n_head", intermediate_size="n_inner",
                     max_position_embeddings="n_positions", embd_dropout="embd_pdrop",
                     attn_dropout="attn_pdrop", resid_dropout="resid_pdrop", name="_name_or_path"),
    block_parameters="memcalc.formulas.parameters:gpt2_block", outer_parameters="gpt2",
    supports=Supports(use_cache=True, attention_masks=PACKED_MASKS, trainer_inputs=True,
                      tensor_parallel="reference",
                      tensor_parallel_refusal=("HF GPT-2's Conv1D layers are not split by torch's "
                                               "ColwiseParallel/RowwiseParallel", "use implementation="
                                               "'reference' for GPT-2 with tensor_parallel > 1"),
                      lora=LoRALayout("transformer.h", ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
                                      ("transformer.wte", "transformer.wpe")),
                      dropouts=frozenset({"embd", "attn", "resid"}), upcast_attention=True,
                      grouped_query=False, learned_positions="GPT-2's learned position table",
                      intermediate_required=False),
    activations=("gelu_new", "gelu", "gelu_tanh"), biases=((True, True, True),),
    builder="validate.models.hf:gpt2_config")
DECLARATIONS = (GPT2,)


def fields(cfg: dict, _model_type: str = "gpt2") -> dict:
    """GPT2Config's fields (configuration_gpt2.py)."""
    act = get(cfg, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
        raise SpecError("hf_config.activation_function", f"{act!r} is not modelled",
                        "use gelu_new, gelu or gelu_pytorch_tanh")
    return dict(family="gpt2", vocab_size=get(cfg, "vocab_size", 50257),
                hidden_size=get(cfg, "n_embd", 768), num_layers=get(cfg, "n_layer", 12),
                num_heads=get(cfg, "n_head", 12), intermediate_size=get(cfg, "n_inner"),
                max_position_embeddings=get(cfg, "n_positions", 1024),
                tie_embeddings=flag(cfg, "tie_word_embeddings", True),
                activation="gelu_tanh" if act == "gelu_pytorch_tanh" else act,
                embd_dropout=get(cfg, "embd_pdrop", 0.1), attn_dropout=get(cfg, "attn_pdrop", 0.1),
                resid_dropout=get(cfg, "resid_pdrop", 0.1),
                reorder_and_upcast_attn=flag(cfg, "reorder_and_upcast_attn", False))
