"""Mixture-of-experts: the experts of a sparse MLP (MoESpec, a ModelSpec field) and how tokens are
routed to them (TrainingConfig.moe_routing), as the per-layer, per-expert token counts the
programs size their tensors by (memcalc.programs.moe).

Routing matters only where tensors are sized by one expert's tokens: transformers' "eager" experts
loop (modeling_mixtral.py MixtralExperts.forward: one gather, matmul, activation... per hit expert).
Its default "grouped_mm" path (integrations/moe.py grouped_mm_experts_forward) sizes every tensor
by S = tokens * top_k, whatever the routing.
"""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from memcalc.errors import SpecError, from_pydantic
from memcalc.poly import Poly

if TYPE_CHECKING:
    from memcalc.specs import ModelSpec
    from memcalc.training import TrainingConfig


class MoESpec(BaseModel):
    """The sparse MLP of a mixture-of-experts decoder layer.

    >>> MoESpec(num_experts=8, top_k=2, expert_ffn_size=14336).active_experts
    2
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

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
    dense_layers: tuple[int, ...] = ()
    """Layers whose MLP is dense (ModelSpec.intermediate_size wide): Qwen-MoE's mlp_only_layers and
    the layers decoder_sparse_step skips."""

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}; choose "
                             "top_k <= num_experts (num_experts_per_tok in a HF config)")
        if any(i < 0 for i in self.dense_layers) or len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers must list distinct layer indices >= 0")
        return self

    def __init__(self, **fields):
        try:
            super().__init__(**fields)
        except ValidationError as err:
            raise from_pydantic(err, "moe") from None

    @property
    def active_experts(self) -> int:
        """Experts a token runs through: top_k routed plus the shared one."""
        return self.top_k + (self.shared_expert_ffn_size is not None)


def moe_layers(spec: ModelSpec) -> list[int]:
    """The layers with a sparse MLP.

    >>> from memcalc.specs import ModelSpec
    >>> moe_layers(ModelSpec.preset("mixtral-8x7b").with_(num_layers=3))
    [0, 1, 2]
    """
    if spec.moe is None:
        return []
    return [i for i in range(spec.num_layers) if i not in spec.moe.dense_layers]


def token_counts(spec: ModelSpec, routing: object, layer: int) -> list[Poly]:
    """Tokens each expert of a MoE layer receives, as polynomials in b and s (N = b*s tokens,
    S = N*top_k token-expert pairs):
    - "balanced": S/E each;
    - "worst": `worst_counts`;
    - explicit counts per MoE layer and expert (constants: they fix b*s).

    >>> from memcalc.specs import ModelSpec
    >>> spec = ModelSpec.preset("mixtral-8x7b").with_(num_layers=1)
    >>> token_counts(spec, "worst", 0)[-2], token_counts(spec, "balanced", 0)[0]
    (Poly(1*b*s), Poly(1/4*b*s))
    >>> token_counts(spec, ((10, 0, 0, 0, 0, 0, 0, 6),), 0)[:2]
    [Poly(10), Poly(0)]
    """
    E, k = spec.moe.num_experts, spec.moe.top_k
    if routing == "balanced":
        return [Poly({(1, 1): Fraction(k, E) if k % E else k // E})] * E
    if routing == "worst":
        return worst_counts(E, k)
    return [Poly.const(n) for n in routing[moe_layers(spec).index(layer)]]


def _frac(num: int, den: int) -> int | Fraction:
    return num // den if num % den == 0 else Fraction(num, den)


def worst_counts(E: int, k: int) -> list[Poly]:
    """The routing the eager loop peaks highest on. Its backward runs the experts in reverse
    order; from the second expert it runs on, each expert's full-size expert-weight gradient
    (select_backward) is summed into the first one's (two more weight-sized buffers), while the
    saved tensors of every expert before it are still alive. So: expert E-2 receives all N tokens
    (the largest transients an expert can have: top-k experts are distinct, so at most N), expert
    E-1 one token (hit, so that E-2 is not the first), the rest share what remains.

    >>> worst_counts(4, 2)
    [Poly(-1/2 + 1/2*b*s), Poly(-1/2 + 1/2*b*s), Poly(1*b*s), Poly(1)]
    >>> worst_counts(2, 1), worst_counts(2, 2)
    ([Poly(-1 + 1*b*s), Poly(1)], [Poly(1*b*s), Poly(1*b*s)])
    """
    N = Poly.bs(1)
    if k == E:
        return [N] * E
    if k == 1:
        return [Poly()] * (E - 2) + [N - Poly.const(1), Poly.const(1)]
    rest = Poly({(1, 1): _frac(k - 1, E - 2), (0, 0): _frac(-1, E - 2)})
    return [rest] * (E - 2) + [N, Poly.const(1)]


def check_routing(model: ModelSpec, training: TrainingConfig) -> None:
    """Explicit routing counts must fit the model and the shape: one row per MoE layer, one count
    per expert, each at most b*s (an expert receives a token once), each row summing to
    b*s*top_k.

    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> spec = ModelSpec.preset("mixtral-8x7b").with_(num_layers=1)
    >>> check_routing(spec, TrainingConfig(micro_batch=1, seq_len=4, moe_routing=((4, 4, 0, 0, 0, 0, 0, 0),)))
    >>> check_routing(spec, TrainingConfig(micro_batch=1, seq_len=4, moe_routing=((4, 3, 0, 0, 0, 0, 0, 0),)))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.errors.SpecError: moe_routing: layer 0's counts sum to 7, not b*s*top_k = 1*4*2 = 8; fix: ...
    """
    routing = training.moe_routing
    if isinstance(routing, str):
        return
    if model.moe is None:
        raise SpecError("moe_routing", "explicit routing counts given for a dense model",
                        "use moe_routing='worst' (the default) or a mixture-of-experts model")
    layers, E, k = moe_layers(model), model.moe.num_experts, model.moe.top_k
    N = training.micro_batch * training.seq_len
    if len(routing) != len(layers) or any(len(row) != E for row in routing):
        raise SpecError("moe_routing", f"expected {len(layers)} rows (one per MoE layer) of {E} "
                        "counts (one per expert)", "give one row per MoE layer, one count per expert")
    for i, row in zip(layers, routing):
        if sum(row) != N * k:
            raise SpecError("moe_routing", f"layer {i}'s counts sum to {sum(row)}, not b*s*top_k = "
                            f"{training.micro_batch}*{training.seq_len}*{k} = {N * k}",
                            "give each MoE layer's token counts per expert, summing to "
                            "micro_batch*seq_len*top_k")
        if max(row) > N:
            raise SpecError("moe_routing", f"layer {i} gives an expert {max(row)} tokens, more "
                            f"than the {N} tokens of the micro-batch (top-k experts are distinct)",
                            "give each expert at most micro_batch*seq_len tokens")
