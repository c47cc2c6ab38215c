"""ModelSpec: the architecture of a decoder-only transformer, and named presets.

Families: GPT-2 style (LayerNorm, GELU MLP, learned positions, biases, tied embeddings, dropout),
Llama style (RMSNorm, SwiGLU, rotary, grouped-query attention; Mistral and Qwen2 are Llama style
with other sizes, Qwen2 with q/k/v biases, Qwen3 with per-head q/k norms), and the Gemma
generations (GeGLU, (1+w) RMSNorm in fp32, embeddings scaled by sqrt(h); Gemma-2 adds norms
around both sub-blocks, soft-capping and alternating sliding-window layers; Gemma-3 adds q/k
norms and separate rotary tables for local and global layers).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Literal

from pydantic import Field, model_validator

from memcalc.core.errors import UnknownNameError, closest_names
from memcalc.core.input_model import FrozenModel
from memcalc.families.declaration import Supports, resolve
from memcalc.families.registry import FAMILIES, FAMILY_NAMES, declaration, families_with
from memcalc.inputs.layer_pattern import is_sliding
from memcalc.inputs.moe import MoESpec

if TYPE_CHECKING:
    import os

Family = Literal[FAMILY_NAMES]  # the declared families (memcalc.families.registry)
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
    """A declared family (memcalc.families.registry.FAMILY_NAMES; each declaration in
    memcalc.families.declarations says what it reads, runs and supports): 'gpt2' (LayerNorm, GELU
    MLP, learned positions), 'llama' (RMSNorm, SwiGLU, rotary; also Mistral, Qwen2, Qwen3,
    SmolLM3), and families with their own HF programs (Phi-3, GPT-NeoX, OLMo-2, Granite, the Gemma
    generations, the mixture-of-experts families)."""
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
        check_declared(self)
        return self

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
    def from_hf_config(cls, config: dict | str | os.PathLike, implementation: Implementation = "hf",
                       fallback: Literal["refuse", "trace"] = "refuse") -> "ModelSpec":
        """A spec from a Hugging Face config.json path or its dict; nothing is downloaded. With
        fallback='trace', a model type memcalc has no program for is traced (memcalc.traced.hf;
        needs torch and transformers when estimated); a hand-written program wins where one exists.

        >>> ModelSpec.from_hf_config({"model_type": "gpt2", "n_layer": 2}).num_layers
        2
        >>> ModelSpec.from_hf_config({"model_type": "starcoder2", "vocab_size": 64}, fallback="trace").name
        'starcoder2 (traced)'
        """
        from memcalc.inputs.hf.config import spec_from_hf

        if fallback == "trace":
            from memcalc.core.files import read_json_object
            from memcalc.families.registry import hf_type

            cfg = config if isinstance(config, dict) else read_json_object(config)
            if isinstance(cfg.get("model_type"), str) and hf_type(cfg["model_type"]) is None:
                return resolve("memcalc.traced.hf:from_hf_config")(cfg)
        return spec_from_hf(cls, config, implementation)

    @classmethod
    def from_pretrained(cls, repo_id: str, revision: str | None = None,
                        implementation: Implementation = "hf") -> "ModelSpec":
        """A spec from a Hugging Face Hub id: its config.json (a peft repo: its base model's),
        read through huggingface_hub from the cache or the Hub, never weights
        (memcalc.inputs.hf.hub; HF_HUB_OFFLINE=1 reads the cache only).

        >>> ModelSpec.from_pretrained("not a repo")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memcalc.core.errors.SpecError: model: 'not a repo' is not a hub id 'org/name'; fix: ...
        """
        from memcalc.inputs.hf.hub import pretrained_config

        return cls.from_hf_config(pretrained_config(repo_id, revision)[0], implementation).with_(name=repo_id)

    @classmethod
    def from_module(cls, factory: Callable, inputs: int | Callable, loss: Callable | None = None, *,
                    name: str = "module", num_layers: int = 1, far_seq_len: int | None = None) -> "ModelSpec":
        """A model traced from your own nn.Module (memcalc.traced; needs torch when estimated).

        `factory()` (or `factory(training)`, to apply `training.checkpointing` itself) builds the
        model; it is called under FakeTensorMode, so no weight is ever allocated. `inputs` is the
        vocabulary of the (b, s) int64 token ids the step feeds it, or a function (b, s) -> the batch
        tensor (images of s patches, say); `loss(model, batch)` returns the
        0-d loss (default: `model(ids)`, its `.loss`, or the last item of a tuple). The step is the
        validator's: the batch, forward (autocast for the amp precisions), backward, clipping,
        optimizer.step(), zero_grad(set_to_none=True). Its sizes are fitted as polynomials in b and
        s from a few small shapes and checked at others (memcalc.traced.fit); `num_layers` is a
        label (the depth is the factory's). `far_seq_len`: a sequence length far past the fitting
        shapes where the fit is checked too (a size that steps with s, such as padding to a
        chunk, is then refused instead of fitted as a constant; HF configs are checked at 1040).

        >>> import torch, memcalc
        >>> def lm():
        ...     return torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
        >>> def ce(model, ids):
        ...     return torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        >>> spec = ModelSpec.from_module(lm, inputs=32, loss=ce, name="tiny")
        >>> report = memcalc.estimate(spec, memcalc.TrainingConfig(micro_batch=4, seq_len=64, device="cpu"))
        >>> report.peak_bytes > 0, spec.param_count
        (True, 544)
        """
        # a reference resolved on first use, as the families' declarations are: memcalc.traced
        # depends on the engine and the inputs, never the other way
        return resolve("memcalc.traced.spec:from_module")(factory, inputs, loss, name=name, num_layers=num_layers,
                                                          far_seq_len=far_seq_len)

    def with_(self, **changes) -> "ModelSpec":
        """A copy with some fields changed, validated again.

        >>> ModelSpec.preset("gpt2").with_(num_layers=4).num_layers
        4
        """
        return type(self).make(**{**self.model_dump(), **changes})


def check_declared(spec: ModelSpec) -> None:
    """What the family's declaration (memcalc.families.registry) says its class can build: each
    field only some families read is refused elsewhere, not ignored."""
    decl = declaration(spec.family)
    can, family = decl.supports, spec.family
    if spec.implementation not in decl.programs:
        raise ValueError(f"the {family} family is modelled for implementation "
                         f"{' or '.join(repr(i) for i in decl.programs)} only; use one of them")
    if can.intermediate_required and spec.intermediate_size is None:
        raise ValueError(f"intermediate_size is required for the {family} family")
    if (spec.moe is not None) != can.moe:
        raise ValueError(f"moe must be set exactly for the mixture-of-experts families "
                         f"{', '.join(d.name for d in FAMILIES.values() if d.supports.moe)} (family is {family})")
    if spec.moe is not None and any(i >= spec.num_layers for i in spec.moe.dense_layers):
        raise ValueError(f"moe.dense_layers lists a layer >= num_layers={spec.num_layers}")
    if spec.moe is not None and spec.moe.router_jitter_noise and not can.router_jitter:
        raise ValueError(f"moe.router_jitter_noise is Mixtral's; transformers' {family} has "
                         "no router jitter (set it to 0)")
    if not can.grouped_query and spec.num_kv_heads not in (None, spec.num_heads):
        raise ValueError(f"{family} family has no grouped-query attention; drop num_kv_heads")
    for kind in ("embd", "attn", "resid"):
        if getattr(spec, f"{kind}_dropout") and kind not in can.dropouts:
            raise ValueError(f"{family} family has no {kind}_dropout (it has "
                             f"{', '.join(sorted(can.dropouts))}); set {kind}_dropout to 0")
    _check_fields(spec, can)
    _check_variants(spec, can)
    if decl.check is not None:
        resolve(decl.check)(spec)


def _check_fields(spec: ModelSpec, can: Supports) -> None:
    """Fields only some families read are refused elsewhere, not ignored."""
    family = spec.family
    if spec.rotary_fraction != 1.0 and not can.partial_rotary:
        raise ValueError(f"rotary_fraction applies to {_names('partial_rotary')}, not {family}; set it to 1.0")
    if spec.parallel_residual and not can.parallel_residual:
        raise ValueError(f"parallel_residual applies to {_names('parallel_residual')}, not {family}; "
                         "set it to false")
    if spec.no_rope_layers and not can.no_rope_layers:
        raise ValueError(f"no_rope_layers applies to {_names('no_rope_layers')}, not {family}; set it to ()")
    if any(not 0 <= i < spec.num_layers for i in spec.no_rope_layers):
        raise ValueError(f"no_rope_layers must be layer indices in [0, {spec.num_layers})")
    if spec.reorder_and_upcast_attn and (not can.upcast_attention or spec.implementation != "hf"):
        raise ValueError("reorder_and_upcast_attn applies to HF GPT-2 only; set it to false")


def _check_variants(spec: ModelSpec, can: Supports) -> None:
    """Fields only some families' code has (the HF classes that run them)."""
    family = spec.family
    if spec.implementation == "reference" and (spec.qk_norm or spec.sliding_window is not None):
        raise ValueError("qk_norm and sliding_window are modelled for implementation='hf' only; "
                         "use implementation='hf'")
    if can.qk_norm != "optional" and spec.qk_norm != (can.qk_norm == "always"):
        raise ValueError(f"qk_norm is {can.qk_norm} on in the {family} family; "
                         f"set qk_norm={can.qk_norm == 'always'}")
    if spec.attn_softcap and not can.attn_softcap:
        raise ValueError(f"attn_softcap is {_names('attn_softcap')}'s; set it to false")
    if spec.logit_softcap and not can.logit_softcap:
        raise ValueError(f"logit_softcap is {_names('logit_softcap')}'s; set it to false")
    patterned = can.sliding == "patterned"
    if can.sliding != "optional" and patterned != (spec.sliding_window is not None):
        raise ValueError(f"{_names('sliding', 'patterned')} need sliding_window (their local layers), "
                         f"the other families but {_names('sliding', 'optional')} have none; set or "
                         "drop sliding_window")
    if (spec.sliding_window_pattern is not None) != patterned:
        raise ValueError(f"sliding_window_pattern is set for {_names('sliding', 'patterned')} only "
                         "(their local/global alternation); set or drop it")
    if spec.max_window_layers is not None and (can.sliding != "optional" or spec.sliding_window is None):
        raise ValueError("max_window_layers is Qwen2/Qwen3's rule with a sliding_window; drop it")


def _names(field: str, value: object = True) -> str:
    """The families whose Supports.<field> is `value`, as a phrase."""
    return "/".join(families_with(**{field: value}))
