"""One configuration to validate: a model spec, a TrainingConfig and, optionally, the HF config
dict it came from. The TrainingConfig says everything, parallelism included (world_size,
sharding, tensor_parallel): a case with more than one rank, or with a sharding, is measured on
gloo ranks (validate.distributed.measure), any other in this process (validate.measure.backends).

No torch here: matrices and the CLI build cases before anything is measured.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig


def config_key(spec: ModelSpec, training: TrainingConfig, hf_config: dict | None = None,
               traced: dict | None = None) -> str:
    """Canonical JSON of a configuration: sorted keys, no spaces.

    >>> k = config_key(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> k.startswith('{"hf_config":null,"model":{"activation":"gelu_new"')
    True
    """
    return json.dumps(_key_fields(spec, training, hf_config, traced), sort_keys=True,
                      separators=(",", ":"))


def _key_fields(spec: ModelSpec, training: TrainingConfig, hf_config: dict | None,
                traced: dict | None = None) -> dict:
    """The configuration a key names. The attention kernel is the one the step runs (None, the
    kernel transformers picks, is keyed as that kernel), so a row that names the default and one
    that leaves it to transformers are the same configuration. A traced model (memcalc.traced) is
    keyed by what it is traced from (`traced`: the row's field), not by its process-local
    registration key."""
    fields = _training_fields(training)
    model = spec.model_dump(mode="json")
    if traced is not None:
        model.pop("trace_key", None)
        fields["attention"] = None  # the module's own attention: not TrainingConfig's to pick
        return {"model": model, "training": fields, "hf_config": hf_config, "traced": traced}
    if fields.get("attention") is None:
        fields["attention"] = training.resolved_attention(spec)
    return {"model": model, "training": fields, "hf_config": hf_config}


def _training_fields(training: TrainingConfig) -> dict:
    """training.model_dump(), less the call-path, pipeline and allocator fields at their defaults
    (so that keys recorded before those fields existed still match)."""
    from memcalc.families.call_path import CALL_PATH_DEFAULTS
    from memcalc.inputs.training import PIPELINE_DEFAULTS

    fields = training.model_dump(mode="json")
    later = {"allocator": "", "trl": "none", "dpo_reference": "model", "grpo_completion_len": 0,
             "grpo_reference": False, "grpo_old_logps": False, "disable_dropout": False,
             "trl_phase": "step"}  # fields added after rows were recorded
    for name, default in {**CALL_PATH_DEFAULTS, **PIPELINE_DEFAULTS, **later}.items():
        if fields.get(name) == default:
            del fields[name]
    return fields


def call_path_label(training: TrainingConfig) -> str:
    """The non-default call-path fields, for labels ('' when none).

    >>> call_path_label(TrainingConfig(micro_batch=1, seq_len=8, use_cache=True))
    ' | use_cache=True'
    """
    from memcalc.families.call_path import CALL_PATH_DEFAULTS

    changed = [f"{n}={getattr(training, n)}" for n, d in CALL_PATH_DEFAULTS.items()
               if getattr(training, n) != d]
    return (" | " + " ".join(changed)) if changed else ""


@dataclass(frozen=True)
class Case:
    """One configuration to validate.

    >>> tc = TrainingConfig(micro_batch=1, seq_len=8)
    >>> Case("x", ModelSpec.preset("gpt2"), tc).distributed
    False
    >>> Case("x", ModelSpec.preset("gpt2"), tc.with_(world_size=2)).distributed
    True
    """

    name: str
    spec: ModelSpec
    training: TrainingConfig
    hf_config: dict | None = None
    trainer_args: dict | None = None
    """TrainingArguments fields: the case runs through transformers.Trainer
    (validate.run.trainer_run); `training` is then TrainingConfig.from_trainer_args of them."""
    trl: dict | None = None
    """A TRL trainer's run (validate.run.trl_run): {"kind": "dpo", "prompt_len": N}; the
    trainer_args are then its config's fields (a DPOConfig's)."""
    traced: dict | None = None
    """A traced model's source (validate.matrices.load.traced_spec): {"hf": true} for an HF config
    traced with ModelSpec.from_hf_config(fallback='trace'), or {"factory", "loss", "inputs"}
    ('pkg.mod:name' references, inputs a vocabulary or a reference) for ModelSpec.from_module;
    the case is measured by validate.measure.module with the same factory and real tensors."""
    topic: str | None = None
    """The matrix topic the row comes from (validate/matrices/rows/TOPIC.json), which names its
    tolerance (validate.matrices.tolerances); not part of the key."""

    @property
    def distributed(self) -> bool:
        """Whether the case runs on gloo ranks: more than one rank, or a sharding."""
        return self.training.world_size > 1 or self.training.sharding != "none"

    @property
    def world_size(self) -> int:
        """Ranks (processes) the case runs on."""
        return self.training.world_size

    @property
    def sharding(self) -> str:
        """Data-parallel sharding: none, zero1, zero2 or zero3."""
        return self.training.sharding

    @property
    def key(self) -> str:
        """Canonical JSON of the configuration (what resume matches on). A distributed case's key
        also holds its parallelism under 'parallel' (as recorded since the first dist-ci run).

        >>> tc = TrainingConfig(micro_batch=1, seq_len=8, world_size=2, sharding="zero3")
        >>> Case("x", ModelSpec.preset("gpt2"), tc).key.count('"world_size":2')
        2
        """
        fields = _key_fields(self.spec, self.training, self.hf_config, self.traced)
        if self.trainer_args is not None:
            fields["trainer_args"] = self.trainer_args
        if self.trl is not None:
            fields["trl"] = self.trl
        if self.distributed:
            fields["parallel"] = {"world_size": self.world_size, "sharding": self.sharding}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @property
    def label(self) -> str:
        """A short human label for tables.

        >>> tc = TrainingConfig(micro_batch=1, seq_len=8)
        >>> Case("x", ModelSpec.preset("gpt2").with_(num_layers=2), tc).label
        'x: hf gpt2 L2 h768 V50257 | b1 s8 fp32 adamw/foreach ckpt=none default-sdpa ga1'
        >>> Case("y", ModelSpec.preset("qwen2-0.5b").with_(num_layers=2), tc).label.split("|")[0]
        'y: hf qwen2-0.5b L2 h896 V151936 '
        >>> Case("z", ModelSpec.preset("gpt2").with_(num_layers=2),
        ...      tc.with_(world_size=4, tensor_parallel=2, sharding="zero3")).label
        'z: hf gpt2 L2 h768 V50257 | b1 s8 fp32 adamw | W4 zero3 TP2'
        """
        s, t = self.spec, self.training
        if self.distributed:
            return (f"{self.name}: {s.implementation} {s.family} L{s.num_layers} "
                    f"h{s.hidden_size} V{s.vocab_size} | b{t.micro_batch} s{t.seq_len} "
                    f"{t.precision} {t.optimizer} | W{t.world_size} {t.sharding}"
                    + (f" TP{t.tensor_parallel}" if t.tensor_parallel > 1 else "")
                    + ("+SP" if t.sequence_parallel else ""))
        ck = t.checkpointing + (f"/{t.checkpoint_every}" if t.checkpoint_every else "")
        return (f"{self.name}: {s.implementation} {s.name} L{s.num_layers} h{s.hidden_size} "
                f"V{s.vocab_size} | b{t.micro_batch} s{t.seq_len} {t.precision} "
                f"{t.optimizer}/{t.resolved_optimizer_impl} ckpt={ck} "
                f"{self._attention_label} "
                f"ga{t.grad_accum}" + (f" clip={t.max_grad_norm:g}" if t.max_grad_norm else "")
                + call_path_label(t) + _finetuning_label(t)
                + (f" experts={t.experts_implementation}" if s.moe else "")
                + (f" | Trainer {json.dumps(self.trainer_args, sort_keys=True)}"
                   if self.trainer_args is not None else ""))

    @property
    def _attention_label(self) -> str:
        """The attention kernel of the label: a traced model's is its own."""
        t = self.training
        if self.traced is not None:
            return "traced"
        return t.attention or "default-" + t.resolved_attention(self.spec)


def _finetuning_label(t: TrainingConfig) -> str:
    """' | lora r8 a16 d0.05 q_proj,v_proj' and ' | freeze ...' (empty for full training).

    >>> from memcalc.inputs.lora import LoRA
    >>> _finetuning_label(TrainingConfig(micro_batch=1, seq_len=8, lora=LoRA(rank=8, targets="all-linear")))
    ' | lora r8 a8 d0.0 all-linear'
    """
    out = ""
    if t.lora is not None:
        lo = t.lora
        targets = lo.targets if isinstance(lo.targets, str) else ",".join(lo.targets)
        out += f" | lora r{lo.rank} a{lo.alpha:g} d{lo.dropout} {targets}"
        out += "".join(f" {k}" for k, on in (("rslora", lo.use_rslora), ("lora_bias", lo.lora_bias)) if on)
        out += (f" bias={lo.bias}" if lo.bias != "none" else "") + (f" layers={list(lo.layers)}" if lo.layers else "")
        out += f" save={','.join(lo.modules_to_save)}" if lo.modules_to_save else ""
    if t.quantization != "none":
        out += f" {t.quantization}"
    if t.freeze:
        out += " | freeze " + ",".join(t.freeze)
    return out


__all__ = ["Case", "config_key"]
