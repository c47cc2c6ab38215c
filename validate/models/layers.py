"""Where a model keeps its decoder layers: the one lookup that checkpoint grouping (validate.models.hf),
FSDP2 wrapping (validate.distributed.wrap), tensor parallelism (validate.distributed.tensor_parallel) and the formulas
(validate.distributed.formulas) share.

- validate.models.reference.ReferenceLM: `model.blocks`
- HF GPT-2: `model.transformer.h`; HF Llama, Mistral, Qwen2, Phi-3, OLMo-2, Granite, SmolLM3:
  `model.model.layers`; HF GPT-NeoX: `model.gpt_neox.layers`
  (`base_model_prefix` names the base model)

>>> from types import SimpleNamespace as NS
>>> decoder_layers(NS(blocks=["b0", "b1"]))
['b0', 'b1']
>>> hf = NS(base_model_prefix="model", model=NS(layers=["l0"]))
>>> decoder_layers(hf)
['l0']
"""
from __future__ import annotations


def decoder_layers(model) -> list:
    """The decoder layers of a reference or HF model, in order."""
    if hasattr(model, "blocks"):  # validate.models.reference.ReferenceLM
        return list(model.blocks)
    base, name = _hf_home(model)
    return list(getattr(base, name))


def replace_decoder_layers(model, layers) -> None:
    """Put `layers` (a torch.nn.ModuleList) where an HF model keeps its decoder layers.

    >>> from types import SimpleNamespace as NS
    >>> hf = NS(base_model_prefix="transformer", transformer=NS(h=["old"]))
    >>> replace_decoder_layers(hf, ["new"]); decoder_layers(hf)
    ['new']
    """
    base, name = _hf_home(model)
    setattr(base, name, layers)


def _hf_home(model) -> tuple[object, str]:
    """(base model, attribute name): HF GPT-2 keeps its layers in `h`, the Llama family in
    `layers`."""
    base = getattr(model, model.base_model_prefix)
    return base, ("h" if hasattr(base, "h") else "layers")


__all__ = ["decoder_layers", "replace_decoder_layers"]
