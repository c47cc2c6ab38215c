"""ModelSpec: the architecture of a decoder-only transformer, and named presets.

Families: GPT-2 style (LayerNorm, GELU MLP, learned positions, biases, tied embeddings, dropout),
Llama style (RMSNorm, SwiGLU, rotary, grouped-query attention; Mistral and Qwen2 are Llama style
with other sizes, Qwen2 with q/k/v biases, Qwen3 with per-head q/k norms), and the Gemma
generations (GeGLU, (1+w) RMSNorm in fp32, embeddings scaled by sqrt(h); Gemma-2 adds norms
around both sub-blocks, soft-capping and alternating sliding-window layers; Gemma-3 adds q/k
norms and separate rotary tables for local and global layers).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from memcalc.core.errors import UnknownNameError, closest_names
from memcalc.core.input_model import FrozenModel
from memcalc.inputs.layer_pattern import is_sliding
from memcalc.inputs.moe import MoESpec

if TYPE_CHECKING:
    import os

Family = Literal["gpt2", "llama", "phi3", "gpt_neox", "olmo2", "granite", "gemma", "gemma2", "gemma3",
                 "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"]
# families whose blocks are Llama-shaped (RMSNorm, SwiGLU MLP of intermediate_size, rotary)
LLAMA_LIKE = ("llama", "phi3", "olmo2", "granite")
GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
"""Llama-style families whose MLPs are mixtures of experts (ModelSpec.moe), named as transformers'
model types: Mixtral; Qwen2-MoE (shared expert); Qwen3-MoE (per-head q/k RMSNorm); OLMoE (q/k
RMSNorm over the whole projection); GPT-OSS (attention sinks, alternating sliding-window layers,
biased experts with a clamped SwiGLU: memcalc.families.hf_gpt_oss)."""
# families whose layers alternate local (sliding_window) and global by sliding_window_pattern
PATTERNED = ("gemma2", "gemma3", "gpt_oss")
Implementation = Literal["hf", "reference"]
Activation = Literal["gelu_new", "gelu", "gelu_tanh", "silu"]


class ModelSpec(FrozenModel):
    """A decoder-only transformer's shape.

    >>> ModelSpec.preset("gpt2").param_count
    124439808
    """

    name: str = "custom"
    """A label for reports; presets carry their own name."""
    family: Family
    """'gpt2' (LayerNorm, GELU MLP, learned positions), 'llama' (RMSNorm, SwiGLU, rotary; also
    Mistral, Qwen2, Qwen3, SmolLM3), or a family with its own HF program: 'phi3' (fused
    qkv_proj and gate_up_proj), 'gpt_neox' (Pythia: LayerNorm, GELU, fused query_key_value,
    parallel residual), 'olmo2' (post-norms, q/k norms), 'granite' (Llama with scalar multipliers),
    'gemma' / 'gemma2' / 'gemma3' (memcalc.families.hf_gemma); the mixture-of-experts families
    of MOE_FAMILIES, 'gpt_oss' among them (memcalc.families.hf_gpt_oss)."""
    implementation: Implementation = "hf"
    """Whose code runs the model: 'hf' (Hugging Face transformers) or 'reference' (validate.models.reference).
    Implementations save different tensors for backward, so the activation model follows it."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size V (rows of the embedding and of the output layer)."""
    hidden_size: int = Field(gt=0)
    """Model width h."""
    num_layers: int = Field(gt=0)
    """Number of transformer blocks L."""
    num_heads: int = Field(gt=0)
    """Attention (query) heads a."""
    num_kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads for grouped-query attention; None means num_heads (multi-head)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width; None means hidden_size // num_heads."""
    intermediate_size: int | None = Field(default=None, gt=0)
    """MLP inner width; None means 4h for gpt2 (and is required for the other families)."""
    max_position_embeddings: int = Field(default=1024, gt=0)
    """Rows of the learned position table (gpt2); the longest sequence either family accepts."""
    tie_embeddings: bool = True
    """Output layer shares the input embedding matrix (GPT-2, small Qwen2) or has its own."""
    qkv_bias: bool = True
    """q/k/v projections carry biases (GPT-2, Qwen2: yes; Llama, Mistral: no)."""
    out_bias: bool = True
    """The attention output projection carries a bias (GPT-2: yes; Llama, Qwen2: no)."""
    mlp_bias: bool = True
    """The MLP projections carry biases (GPT-2: yes; Llama family: no)."""
    activation: Activation = "gelu_new"
    """MLP activation: gelu_new (HF GPT-2's tanh GELU written in Python ops), gelu, gelu_tanh
    (one fused op; the gate of Gemma's GeGLU), or silu (SwiGLU, Llama family)."""
    embd_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout after the embeddings (GPT-2's embd_pdrop)."""
    attn_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the attention probabilities (attn_pdrop / attention_dropout)."""
    resid_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on each residual branch (GPT-2's and Phi-3's resid_pdrop, GPT-NeoX's hidden_dropout)."""
    rotary_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """Share of each head's width that rotary embeddings rotate (Phi-3's partial_rotary_factor,
    GPT-NeoX's rotary_pct); phi3 and gpt_neox only, whose apply_rotary_pos_emb slices and cats."""
    parallel_residual: bool = False
    """GPT-NeoX's use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x)) instead of sequential."""
    no_rope_layers: tuple[int, ...] = Field(default=(), strict=False)
    """Layers (0-based) whose attention skips rotary embeddings (SmolLM3's NoPE layers); a JSON
    list is accepted (lax for this field only: a spec read back from a results file)."""
    reorder_and_upcast_attn: bool = False
    """HF GPT-2's upcast attention path (_upcast_and_reordered_attn: baddbmm into an fp32 buffer)."""
    qk_norm: bool = False
    """Per-head RMSNorm of queries and keys before rotary (Qwen3's q_norm/k_norm on the llama
    family; always on for gemma3, off for gemma and gemma2)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Tokens a sliding-window layer's query sees (itself and the window-1 before it); None: every
    layer attends to its whole causal prefix. Which layers slide: `layer_is_sliding`."""
    sliding_window_pattern: int | None = Field(default=None, gt=0)
    """With sliding_window: layer i attends globally when (i+1) is a multiple of this (Gemma-2: 2,
    Gemma-3: 6, GPT-OSS: 2); None: no layer is global by this rule."""
    max_window_layers: int | None = Field(default=None, ge=0)
    """With sliding_window, Qwen2/Qwen3's rule: layers below this index attend globally, the rest
    through the window, and the model builds a full causal mask beside the sliding one. None:
    Mistral's rule (every llama-family layer slides, one mask)."""
    attn_softcap: bool = False
    """Gemma-2's attention logit soft-capping: scores / cap, tanh, * cap before the mask."""
    logit_softcap: bool = False
    """Final logit soft-capping (Gemma-2, optional on Gemma-3): logits / cap, tanh, * cap."""
    moe: MoESpec | None = None
    """The experts of a mixture-of-experts family (memcalc.inputs.moe); None for dense families."""

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelSpec":
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden_size="
                             f"{self.hidden_size}; choose a divisor or set head_dim")
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise ValueError(f"num_kv_heads={self.kv_heads} must divide num_heads={self.num_heads}")
        if (self.family in LLAMA_LIKE or self.family in MOE_FAMILIES) and self.intermediate_size is None:
            raise ValueError(f"intermediate_size is required for the {self.family} family")
        if (self.moe is not None) != (self.family in MOE_FAMILIES):
            raise ValueError(f"moe must be set exactly for the mixture-of-experts families "
                             f"{', '.join(MOE_FAMILIES)} (family is {self.family})")
        if self.moe is not None and any(i >= self.num_layers for i in self.moe.dense_layers):
            raise ValueError(f"moe.dense_layers lists a layer >= num_layers={self.num_layers}")
        if self.moe is not None and self.moe.router_jitter_noise and self.family != "mixtral":
            raise ValueError(f"moe.router_jitter_noise is Mixtral's; transformers' {self.family} has "
                             "no router jitter (set it to 0)")
        if self.family == "gpt2" and (self.num_kv_heads not in (None, self.num_heads)):
            raise ValueError("gpt2 family has no grouped-query attention; drop num_kv_heads")
        if self.family in ("llama", "olmo2", "granite", *GEMMA_FAMILIES, *MOE_FAMILIES) and \
                (self.embd_dropout or self.resid_dropout):
            raise ValueError(f"{self.family} family has only attn_dropout; set embd/resid_dropout to 0")
        if self.family in GEMMA_FAMILIES and self.intermediate_size is None:
            raise ValueError("intermediate_size is required for the gemma families")
        self._check_family_fields()
        self._check_variants()
        return self

    def _check_family_fields(self) -> None:
        """Fields only some families read are refused elsewhere, not ignored."""
        if self.rotary_fraction != 1.0 and self.family not in ("phi3", "gpt_neox"):
            raise ValueError(f"rotary_fraction applies to phi3 and gpt_neox, not {self.family}; set it to 1.0")
        if self.parallel_residual and self.family != "gpt_neox":
            raise ValueError(f"parallel_residual applies to gpt_neox, not {self.family}; set it to false")
        if self.no_rope_layers and self.family != "llama":
            raise ValueError(f"no_rope_layers applies to the llama family, not {self.family}; set it to ()")
        if any(not 0 <= i < self.num_layers for i in self.no_rope_layers):
            raise ValueError(f"no_rope_layers must be layer indices in [0, {self.num_layers})")
        if self.reorder_and_upcast_attn and (self.family, self.implementation) != ("gpt2", "hf"):
            raise ValueError("reorder_and_upcast_attn applies to HF GPT-2 only; set it to false")
        if self.family == "gpt_neox" and self.num_kv_heads not in (None, self.num_heads):
            raise ValueError("gpt_neox has no grouped-query attention; drop num_kv_heads")
        if self.family == "gpt_neox" and self.head_size * self.num_heads != self.hidden_size:
            raise ValueError("gpt_neox needs head_dim = hidden_size / num_heads; drop head_dim")
        if self.family == "gpt_neox" and self.embd_dropout != self.resid_dropout:
            raise ValueError("gpt_neox's hidden_dropout sets embd_dropout and resid_dropout together; "
                             "make them equal")
        if self.family == "gpt_oss":
            _check_gpt_oss(self)
        if self.family == "mixtral" and self.moe is not None and not self.moe.norm_topk_prob:
            # MixtralTopKRouter.forward divides router_top_value by its sum whatever the config
            # (modeling_mixtral.py; Mixtral has no norm_topk_prob key)
            raise ValueError("mixtral's router always renormalises the top-k weights; set "
                             "moe.norm_topk_prob=True")
        if self.family == "gpt_neox" and self.qkv_bias != self.out_bias:
            raise ValueError("gpt_neox's attention_bias sets q/k/v and output biases together; "
                             "make qkv_bias equal out_bias")

    def _check_variants(self) -> None:
        """Fields only some families' code has (the HF classes that run them)."""
        if self.implementation == "reference" and (self.qk_norm or self.sliding_window is not None
                                                   or self.family in GEMMA_FAMILIES):
            raise ValueError("qk_norm, sliding_window and the gemma families are modelled for "
                             "implementation='hf' only; use implementation='hf'")
        if self.family in GEMMA_FAMILIES and self.activation != "gelu_tanh":
            raise ValueError("the gemma families run GeGLU with gelu_pytorch_tanh; set activation='gelu_tanh'")
        if self.qk_norm != (self.family == "gemma3") and self.family != "llama":
            raise ValueError(f"qk_norm is {'always' if self.family == 'gemma3' else 'never'} "
                             f"on in the {self.family} family; set qk_norm={self.family == 'gemma3'}")
        if self.family == "gpt2" and (self.sliding_window is not None or self.logit_softcap):
            raise ValueError("gpt2 family has no sliding window or soft-capping; drop them")
        if self.attn_softcap and self.family != "gemma2":
            raise ValueError("attn_softcap is Gemma-2's (gemma2 family); set it to false")
        if self.logit_softcap and self.family not in ("gemma2", "gemma3"):
            raise ValueError("logit_softcap is Gemma-2/3's; set it to false")
        if (self.family in PATTERNED) != (self.sliding_window is not None) and self.family != "llama":
            raise ValueError("gemma2/gemma3/gpt_oss need sliding_window (their local layers), the other "
                             "families but llama have none; set or drop sliding_window")
        patterned = self.family in PATTERNED
        if (self.sliding_window_pattern is not None) != patterned:
            raise ValueError("sliding_window_pattern is set for gemma2/gemma3/gpt_oss only (their "
                             "local/global alternation); set or drop it")
        if self.max_window_layers is not None and (self.family != "llama" or self.sliding_window is None):
            raise ValueError("max_window_layers is Qwen2/Qwen3's rule with a sliding_window; drop it")

    def layer_is_sliding(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) attends through the sliding window.

        >>> m = ModelSpec.preset("gemma-2-2b")
        >>> [m.layer_is_sliding(i) for i in range(4)]
        [True, False, True, False]
        """
        return is_sliding(layer, self.sliding_window, self.max_window_layers, self.sliding_window_pattern)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Key/value heads, resolved."""
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """Per-head width d, resolved."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        """MLP inner width f, resolved."""
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def param_count(self) -> int:
        """Trainable parameters, as nn.Module.parameters() counts them (tied weights once).

        >>> ModelSpec.preset("llama-2-7b").param_count
        6738415616
        """
        from memcalc.formulas.parameters import parameter_count

        return parameter_count(self)

    # ---- constructors --------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "ModelSpec":
        """A published model by name (see `memcalc.inputs.presets.PRESETS`).

        >>> ModelSpec.preset("mistral-7b").kv_heads
        8
        """
        from memcalc.core.arguments import check_name
        from memcalc.inputs.presets import PRESETS

        key = check_name("model", name, "gpt2").lower()
        if key not in PRESETS:
            raise UnknownNameError("model", f"unknown preset {name!r}",
                                   f"use one of: {closest_names(key, list(PRESETS))}")
        return cls.make(name=key, **PRESETS[key])

    @classmethod
    def from_hf_config(cls, config: dict | str | os.PathLike, implementation: Implementation = "hf") -> "ModelSpec":
        """A spec from a Hugging Face config.json path or its dict; nothing is downloaded.

        >>> ModelSpec.from_hf_config({"model_type": "gpt2", "n_layer": 2}).num_layers
        2
        """
        from memcalc.inputs.hf.config import spec_from_hf

        return spec_from_hf(cls, config, implementation)

    def with_(self, **changes) -> "ModelSpec":
        """A copy with some fields changed, validated again.

        >>> ModelSpec.preset("gpt2").with_(num_layers=4).num_layers
        4
        """
        return type(self).make(**{**self.model_dump(), **changes})


def _check_gpt_oss(spec: ModelSpec) -> None:
    """GptOssForCausalLM's fixed structure: attention_bias sets the q/k/v and o_proj biases
    together; the experts always carry biases (mlp_bias=True stands for them); no shared expert,
    no dense layers; the router's softmax over the top-k logits sums to 1 (norm_topk_prob=True)."""
    moe = spec.moe
    if spec.qkv_bias != spec.out_bias or not spec.mlp_bias:
        raise ValueError("gpt_oss's attention_bias sets q/k/v and o_proj biases together and its "
                         "experts always have biases; set qkv_bias = out_bias and mlp_bias=True")
    if moe is not None and (moe.shared_expert_ffn_size is not None or moe.dense_layers or not moe.norm_topk_prob):
        raise ValueError("gpt_oss has no shared expert and no dense layers, and its router's softmax "
                         "over the top-k normalises them; drop those moe fields")
