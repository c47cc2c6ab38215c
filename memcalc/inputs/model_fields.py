"""`ModelFields`: the fields of a model's architecture that the parameter formulas and the MoE
routing read, as a structural type. ModelSpec (memcalc.inputs.specs) has them all; the modules
below it take a ModelFields, so that ModelSpec's conveniences (param_count, routing checks) can
call them without an import circle (scripts/import_cycles.py counts annotation-only imports too).

>>> from memcalc.inputs.specs import ModelSpec
>>> isinstance(ModelSpec.preset("gpt2"), ModelFields)
True
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from memcalc.inputs.moe import MoESpec


@runtime_checkable
class ModelFields(Protocol):
    """What a decoder stack's parameter count, expert routing and default kernel depend on."""

    family: str
    implementation: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    tie_embeddings: bool
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    qk_norm: bool
    moe: MoESpec | None

    @property
    def head_size(self) -> int:
        """Per-head width."""

    @property
    def kv_heads(self) -> int:
        """Key/value heads, resolved."""

    @property
    def ffn_size(self) -> int:
        """MLP inner width, resolved."""
