"""Mixture-of-experts: the experts of a sparse MLP (MoESpec, a ModelSpec field). How tokens are
routed to them: memcalc.inputs.moe_routing.
"""
from __future__ import annotations

from pydantic import Field, model_validator

from memcalc.core.input_model import FrozenModel


class MoESpec(FrozenModel):
    """The sparse MLP of a mixture-of-experts decoder layer.

    >>> MoESpec(num_experts=8, top_k=2, expert_ffn_size=14336).active_experts
    2
    """

    error_name = "moe"  # a cross-field failure is reported under ModelSpec's field

    num_experts: int = Field(gt=0)
    """Routed experts per MoE layer (E: num_local_experts / num_experts)."""
    top_k: int = Field(gt=0)
    """Experts each token is routed to (num_experts_per_tok)."""
    expert_ffn_size: int = Field(gt=0)
    """Inner width of one expert's SwiGLU (Mixtral: intermediate_size; others: moe_intermediate_size)."""
    norm_topk_prob: bool = True
    """The top-k routing weights are renormalised to sum to 1 (an in-place division)."""
    shared_expert_ffn_size: int | None = Field(default=None, gt=0)
    """Qwen2-MoE: a dense SwiGLU every token passes through, scaled by sigmoid(shared_expert_gate)."""
    dense_layers: tuple[int, ...] = Field(default=(), strict=False)
    """Layers whose MLP is dense (ModelSpec.intermediate_size wide): Qwen-MoE's mlp_only_layers and
    the layers decoder_sparse_step skips. A JSON list is accepted (lax for this field only: a spec
    read back from a results file)."""
    output_router_logits: bool = False
    """transformers' auxiliary load-balancing loss (config output_router_logits): every MoE
    layer's router logits are kept until the loss, which adds router_aux_loss_coef * the
    Switch-Transformer loss over them (memcalc.families.moe_aux)."""
    router_jitter_noise: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """Mixtral only: in training, the block's input is multiplied in place by uniform noise in
    [1 - jitter, 1 + jitter] before the router (memcalc.families.moe_aux.router_jitter); 0: none."""

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}; choose "
                             "top_k <= num_experts (num_experts_per_tok in a HF config)")
        if any(i < 0 for i in self.dense_layers) or len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers must list distinct layer indices >= 0")
        return self

    @property
    def active_experts(self) -> int:
        """Experts a token runs through: top_k routed plus the shared one."""
        return self.top_k + (self.shared_expert_ffn_size is not None)
