"""LoRA adapters as peft 0.21 runs them (peft/tuners/lora/layer.py, LoraConfig in config.py).

A targeted linear `W` (frozen) becomes `lora.Linear`:

    result = base_layer(x)                       # the frozen W: saves W only (no weight grad)
    x = x.to(lora_A.weight.dtype)                # _cast_input_dtype: a copy when dtypes differ
    result = result + lora_B(lora_A(dropout(x))) * scaling
    result = result.to(torch_result_dtype)

with lora_A = nn.Linear(in, r, bias=False), lora_B = nn.Linear(r, out, bias=lora_bias),
dropout nn.Dropout(p) for p > 0 else nn.Identity (update_layer), scaling alpha / r (alpha /
sqrt(r) under use_rslora). Adapters are fp32 under every precision: get_peft_model's
autocast_adapter_dtype=True upcasts bf16/fp16 adapters (tuners_utils.cast_adapter_dtype).

>>> LoRA(rank=16, alpha=32, dropout=0.05, targets=["q_proj", "v_proj"]).scaling
2.0
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memcalc.core import limits
from memcalc.core.errors import NotModelledError, SpecError, from_pydantic

ALL_LINEAR = "all-linear"
# peft's target matching (tuners_utils.check_target_module_exists): a string is a full-match
# regex over the module name; a list matches a module whose name equals an entry or ends in
# "." + entry. "all-linear" targets every nn.Linear / Conv1D except the output layer.

_INERT_WHY = {
    "task_type": "selects the PeftModel wrapper class (CAUSAL_LM forwards to the same model)",
    "peft_type": "LORA: this module's subject",
    "auto_mapping": "metadata for AutoPeftModel",
    "peft_version": "metadata",
    "base_model_name_or_path": "metadata: the base model is memcalc's ModelSpec",
    "revision": "metadata",
    "inference_mode": "True only when loading for inference; a training step trains the adapters",
    "init_lora_weights": "initial values (gaussian, pissa, olora, loftq...), not tensor shapes",
    "loftq_config": "LoftQ initialisation: values only",
    "megatron_core": "module path string used only with megatron_config",
    "fan_in_fan_out": "GPT-2 Conv1D weight layout: the same matmuls, transposed",
    "use_rslora": "scaling alpha/sqrt(r) instead of alpha/r: a Python float",
    "qalora_group_size": "used only with use_qalora",
    "ensure_weight_tying": "tied modules_to_save only; modules_to_save is refused unless empty",
    "runtime_config": "ephemeral_gpu_offload for loading; no training-step tensor",
    "lora_alpha": "modelled as alpha (a Python float scaling)",
}
_MODELLED_KEYS = {"r", "lora_alpha", "lora_dropout", "target_modules", "bias", "layers_to_transform",
                  "use_rslora", "lora_bias", "modules_to_save"}
# keys whose value must be empty/False/None: each names a peft feature memcalc does not model
_REFUSED_UNLESS_EMPTY = {
    "use_dora": "DoRA's magnitude vector and weight-norm ops are not modelled",
    "exclude_modules": "exclusion patterns are not modelled; list the targets instead",
    "layers_pattern": "only with layers_to_transform over the standard layer path; not modelled",
    "rank_pattern": "per-module ranks are not modelled",
    "alpha_pattern": "per-module alphas are not modelled",
    "megatron_config": "Megatron parallel LoRA layers are not modelled",
    "trainable_token_indices": "trainable token rows are not modelled",
    "eva_config": "EVA initialisation runs a data pass; not modelled",
    "corda_config": "CorDA initialisation runs a data pass; not modelled",
    "lora_ga_config": "LoRA-GA initialisation runs gradient passes; not modelled",
    "velora_config": "VeLoRA compresses saved activations; not modelled",
    "alora_invocation_tokens": "activated LoRA changes the forward; not modelled",
    "use_qalora": "QA-LoRA pooling is not modelled",
    "monteclora_config": "MonteCLoRA sampling is not modelled",
    "layer_replication": "replicated layers are not modelled",
    "target_parameters": "LoRA on nn.Parameter targets (MoE experts) is not modelled",
    "use_bdlora": "block-diagonal LoRA is not modelled",
    "arrow_config": "Arrow routing is not modelled",
    "kasa_config": "KaSA is not modelled",
}


class LoRA(BaseModel):
    """LoRA adapters on the named linears (peft.LoraConfig); the base model is frozen.

    >>> LoRA(rank=8, alpha=16, targets="all-linear").targets
    'all-linear'
    >>> LoRA(rank=0)
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: lora.rank: Input should be greater than 0; fix: see memcalc.LoRA's fields
    """

    # strict: a JSON true is no rank 1, a "16" no rank (peft's LoraConfig would refuse both)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    rank: int = Field(default=8, gt=0, le=limits.MAX_WIDTH)
    """r: the adapters' inner dimension (lora_A: in -> r, lora_B: r -> out)."""
    alpha: float = Field(default=8, gt=0)
    """lora_alpha: scaling = alpha / rank (a Python float, no tensor)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """lora_dropout: nn.Dropout(p) on the adapter input, nn.Identity when 0 (no copy)."""
    targets: tuple[str, ...] | Literal["all-linear"] = ("q_proj", "v_proj")
    """target_modules: module names (or name suffixes) of the linears to adapt, or 'all-linear'
    (every linear except lm_head)."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which base biases train: none; all (every parameter named *bias*); lora_only (the
    targeted linears' biases)."""
    lora_bias: bool = False
    """lora_B has a bias (out_features, trainable)."""
    use_rslora: bool = False
    """Rank-stabilised scaling alpha / sqrt(rank): a float, no memory."""
    layers: tuple[int, ...] | None = None
    """layers_to_transform: only these decoder layers get adapters (None: all)."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained in full beside the adapters (e.g. lm_head, embed_tokens): peft's
    ModulesToSaveWrapper keeps the frozen original and a trainable copy in the base dtype."""

    def __init__(self, **fields):
        try:
            super().__init__(**fields)
        except ValidationError as err:
            e = from_pydantic(err, type(self).__name__)
            raise SpecError(f"lora.{e.field}", e.problem, e.fix or "see memcalc.LoRA's fields") from None
        if self.layers is not None and self.targets == ALL_LINEAR:  # peft LoraConfig.__post_init__
            raise SpecError("lora.layers", "layers_to_transform cannot be used with target_modules "
                            "'all-linear' (peft: not when target_modules is a str)",
                            "list the module names in targets, e.g. q_proj, v_proj")

    @field_validator("targets", mode="before")
    @classmethod
    def _targets(cls, v: object) -> object:
        if isinstance(v, str) and v != ALL_LINEAR:
            return (v,)
        if isinstance(v, (list, tuple, set, frozenset)):  # peft keeps a set: order is not meaning
            if not all(isinstance(t, str) for t in v):
                return tuple(v)  # validation names the entry that is not a name (a list is unhashable)
            return tuple(sorted(set(v)))
        return v

    @field_validator("layers", mode="before")
    @classmethod
    def _layers(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v  # a JSON list

    @field_validator("modules_to_save", mode="before")
    @classmethod
    def _modules(cls, v: object) -> object:
        if v is None:
            return ()
        return (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (list, set)) else v

    def saves_module(self, module: str) -> bool:
        """Whether `module` is wrapped by ModulesToSaveWrapper (peft matches a name suffix).

        >>> LoRA(modules_to_save=["lm_head"]).saves_module("lm_head")
        True
        """
        return any(module == m or module.endswith("." + m) for m in self.modules_to_save)

    @field_validator("layers")
    @classmethod
    def _layers_valid(cls, v: object) -> object:
        if v is not None and (not v or min(v) < 0):  # peft: no layer index matches, no adapter
            raise ValueError("layers must list decoder layer indices >= 0 (empty, peft adapts no layer)")
        return v

    @field_validator("targets")
    @classmethod
    def _targets_nonempty(cls, v: object) -> object:
        if isinstance(v, tuple) and not v:
            raise ValueError("targets is empty; name the linears to adapt, e.g. q_proj, v_proj")
        return v

    @property
    def scaling(self) -> float:
        """The multiplier peft applies to lora_B's output (LoraLayer.update_layer)."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def targets_module(self, module: str, layer: int | None) -> bool:
        """Whether peft wraps the linear `module` (its dotted name) in decoder layer `layer`.

        >>> LoRA(targets=["q_proj"]).targets_module("model.layers.0.self_attn.q_proj", 0)
        True
        >>> LoRA(targets="all-linear").targets_module("lm_head", None)
        False
        >>> LoRA(targets=["q_proj", "lm_head"], layers=[1]).targets_module("lm_head", None)
        True
        """
        if self.targets != ALL_LINEAR and module in self.targets:
            return True  # a full name is matched before the layer filter (check_target_module_exists)
        if self.layers is not None and (layer is None or layer not in self.layers):
            return False
        if self.targets == ALL_LINEAR:
            return module != "lm_head"
        return any(module.endswith("." + t) for t in self.targets)

    def peft_kwargs(self) -> dict:
        """Keyword arguments for peft.LoraConfig (the validator builds the same adapters).

        >>> LoRA(rank=4, targets=["q_proj"]).peft_kwargs()["r"]
        4
        """
        return dict(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                    target_modules=self.targets if self.targets == ALL_LINEAR else list(self.targets),
                    bias=self.bias, lora_bias=self.lora_bias, use_rslora=self.use_rslora,
                    layers_to_transform=list(self.layers) if self.layers is not None else None,
                    modules_to_save=list(self.modules_to_save) or None)

    @classmethod
    def from_peft_config(cls, source: dict | str | Path) -> "LoRA":
        """A LoRA from peft's adapter_config.json (a dict, or a path to the file or its folder).
        Every key is modelled, inert (memcalc.inputs.lora._INERT_WHY says why) or refused by name.

        >>> LoRA.from_peft_config({"peft_type": "LORA", "r": 16, "lora_alpha": 32,
        ...                        "target_modules": ["v_proj", "q_proj"]}).targets
        ('q_proj', 'v_proj')
        >>> LoRA.from_peft_config({"r": 8, "use_dora": True})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memcalc.core.errors.NotModelledError: adapter_config.use_dora: True: DoRA's magnitude ...
        """
        data = _load(source)
        for key, value in data.items():
            if key in _MODELLED_KEYS or key in _INERT_WHY:
                continue
            if key in _REFUSED_UNLESS_EMPTY:
                if value in (None, False, {}, [], ""):
                    continue
                raise NotModelledError(f"adapter_config.{key}", f"{value!r}: {_REFUSED_UNLESS_EMPTY[key]}",
                                       f"set {key} {'false' if isinstance(value, bool) else 'empty'}"
                                       + (" (plain LoRA)" if key == "use_dora" else ""))
            raise NotModelledError(f"adapter_config.{key}", "unknown adapter_config key",
                                   "remove it, or check the peft version (memcalc reads peft 0.21)")
        if str(data.get("peft_type", "LORA")).upper().removeprefix("PEFTTYPE.") != "LORA":
            raise NotModelledError("adapter_config.peft_type", f"{data['peft_type']!r} is not LoRA",
                                   "use a LoRA adapter config")
        if data.get("target_modules") is None:
            raise SpecError("adapter_config.target_modules", "missing (peft would infer it per model)",
                            "list the target modules, e.g. [\"q_proj\", \"v_proj\"]")
        targets = data["target_modules"]
        if isinstance(targets, str) and targets != ALL_LINEAR:  # peft: re.fullmatch on each full name
            raise NotModelledError("adapter_config.target_modules", f"the string {targets[:60]!r} is a regex "
                                   "peft matches against each full module name (not a name suffix); not modelled",
                                   "list the module names instead, e.g. [\"q_proj\", \"v_proj\"]")
        layers = data.get("layers_to_transform")
        return cls(rank=data.get("r", 8), alpha=data.get("lora_alpha", 8),
                   dropout=data.get("lora_dropout", 0.0), targets=targets,
                   bias=data.get("bias", "none"), lora_bias=_flag(data, "lora_bias"),
                   use_rslora=_flag(data, "use_rslora"),
                   layers=[layers] if isinstance(layers, int) else layers,
                   modules_to_save=data.get("modules_to_save"))


def _flag(data: dict, key: str) -> bool:
    """A JSON boolean (null or absent: False); a string "false" would be truthy."""
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise SpecError(f"adapter_config.{key}", f"{str(value)[:40]!r} is not a JSON boolean",
                        f"write {key}: true or false, without quotes")
    return bool(value)


def _load(source: dict | str | Path) -> dict:
    """The dict, or the JSON object of the file (or folder's adapter_config.json): a bounded read
    of a regular file (memcalc.core.files: a FIFO or /dev/zero never blocks or fills memory)."""
    from memcalc.core.files import parse_json_object, read_bounded

    if isinstance(source, dict):
        return dict(source)
    if not isinstance(source, (str, os.PathLike)) or not str(source) or "\0" in str(source):
        raise SpecError("adapter_config", f"expected a dict or a path, got {str(source)[:40]!r}",
                        "pass peft's adapter_config.json (or its folder)")
    path = Path(source)
    if path.is_dir():
        path = path / "adapter_config.json"
    return parse_json_object(read_bounded(str(path), "adapter_config"), repr(str(path)), "adapter_config")


__all__ = ["LoRA", "ALL_LINEAR"]
