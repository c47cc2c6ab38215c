"""transformers GraniteForCausalLM (models/granite/modeling_granite.py, transformers 5.24): Llama
with four scalar multipliers, each one more elementwise op whatever its value:
- `inputs_embeds * embedding_multiplier` (GraniteModel.forward; the embedding output is rebound);
- `residual + hidden_states * residual_multiplier` on both residual branches (GraniteDecoderLayer);
- attention_multiplier replaces head_dim**-0.5 as the `scaling` argument: the same ops;
- `logits / logits_scaling` (GraniteForCausalLM.forward; the head's output is rebound).
A multiply or divide by a Python scalar saves nothing; its backward allocates the input's gradient.
"""
from __future__ import annotations

from memcalc.families.hf_llama import HFLlama
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Value
from memcalc.tape.ops import Ops


class HFGranite(HFLlama):
    """GraniteForCausalLM: LlamaForCausalLM's parameters and order, three more scalar ops."""

    def scale_embeddings(self, ops: Ops, x: Value) -> Value:
        """inputs_embeds * embedding_multiplier."""
        return ops.scale(x, "* embedding_multiplier")

    def residual_branch(self, ops: Ops, _spec: ModelSpec, y: Value) -> Value:
        """hidden_states * residual_multiplier."""
        return ops.scale(y, "* residual_multiplier")

    def head_output(self, ops: Ops, _spec: ModelSpec, logits: Value) -> Value:
        """logits / logits_scaling."""
        return ops.scale(logits, "/ logits_scaling")


PROGRAM = HFGranite()
