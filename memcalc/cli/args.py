"""The model and training arguments every `memcalc` command shares: the parser with the project's
one-line errors, a flag per ModelSpec / TrainingConfig field (memcalc.cli.flags), the LoRA flags,
and the ModelSpec and TrainingConfig they give.
"""
from __future__ import annotations

import argparse
import re
import sys

from memcalc.cli.flags import HelpFormatter, add_fields, field_values, flag_fields

_MODEL_SKIP = ("name", "family")  # a preset or an HF config gives these
_SHAPES = ("micro_batch", "seq_len", "grad_accum")
_CLI_DEFAULTS = {"micro_batch": 1, "seq_len": 1024}  # (TrainingConfig has no default for these)
_NOTES = {"micro_batch": "default 1", "seq_len": "default 1024", "tensor_parallel": "--world-size defaults to it",
          "freeze": "repeatable"}


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in the project's one-line form (exit 2) and help read from the
    fields' docstrings (memcalc.cli.flags)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**{"formatter_class": HelpFormatter, **kwargs})

    def error(self, message: str):
        match = (re.match(r"argument (?:--)?([\w-]+)(?:/[^:]*)?: (.*)", message)
                 or re.match(r"unrecognized arguments: --([\w-]+)()", message))
        field, problem = (match.group(1).replace("-", "_"), match.group(2)
                          or "this command has no such option") if match else (
            "arguments", message)
        fail(field, problem, f"see `{self.prog} --help`")


def fail(field: str, problem: str, fix: str):
    print(f"memcalc: error: {field}: {problem}; fix: {fix}", file=sys.stderr)
    raise SystemExit(2)


def model_args(p: argparse.ArgumentParser) -> None:
    """--model / --hf-config, and a flag per ModelSpec field to override (memcalc.cli.flags)."""
    from memcalc.inputs.specs import ModelSpec

    g = p.add_argument_group("model")
    g.add_argument("--model", help="preset name (e.g. gpt2, llama-3-8b) or Hugging Face Hub id (org/name)")
    g.add_argument("--revision", help="with a hub id: branch, tag or commit (default main)")
    g.add_argument("--hf-config", help="path to a Hugging Face config.json")
    g.add_argument("--module", help="pkg.mod:factory building your own nn.Module, traced "
                                    "(memcalc.traced; imports and runs that code; needs torch and --vocab-size)")
    g.add_argument("--module-loss", help="with --module: pkg.mod:loss, loss(model, ids) -> 0-d loss "
                                         "(default: model(ids), its .loss or a tuple's last item)")
    add_fields(g, ModelSpec, flag_fields(ModelSpec, skip=_MODEL_SKIP), bools="value")


def training_args(p: argparse.ArgumentParser, shapes: bool = True) -> None:
    """A flag per TrainingConfig field (memcalc.cli.flags; without `shapes`, not micro_batch, seq_len
    and grad_accum), and the LoRA flags."""
    from memcalc.inputs.training import TrainingConfig

    g = p.add_argument_group("training")
    skip = ("lora",) if shapes else ("lora",) + _SHAPES
    add_fields(g, TrainingConfig, flag_fields(TrainingConfig, skip=skip), defaults=_CLI_DEFAULTS, notes=_NOTES)
    add_lora_args(p)


def add_lora_args(p: argparse.ArgumentParser) -> None:
    """--lora-* (peft LoRA adapters) and --lora-config."""
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--lora-rank", type=int, help="LoRA adapters of this rank r on a frozen model")
    g.add_argument("--lora-alpha", type=float, help="lora_alpha (default 8; scaling alpha/r)")
    g.add_argument("--lora-dropout", type=float, help="lora_dropout (default 0: no input copy)")
    g.add_argument("--lora-targets", help="comma-separated module names (default q_proj,v_proj) "
                                          "or all-linear")
    g.add_argument("--lora-config", help="peft adapter_config.json (or its folder)")


def lora_from_args(args: argparse.Namespace):
    """The LoRA of --lora-config and the --lora-* flags (None without any of them).

    >>> a = argparse.Namespace(lora_rank=16, lora_alpha=32.0, lora_dropout=None,
    ...                        lora_targets="q_proj,v_proj", lora_config=None)
    >>> lora_from_args(a).scaling
    2.0
    """
    from memcalc.inputs.lora import LoRA

    flags = {"rank": args.lora_rank, "alpha": args.lora_alpha, "dropout": args.lora_dropout,
             "targets": _targets(args.lora_targets) if args.lora_targets else None}
    given = {k: v for k, v in flags.items() if v is not None}
    if args.lora_config is None:
        return LoRA(**given) if given else None
    base = LoRA.from_peft_config(args.lora_config)
    return LoRA(**{**base.model_dump(), **given}) if given else base


def _targets(text: str):
    return "all-linear" if text == "all-linear" else [t.strip() for t in text.split(",") if t.strip()]


def json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def model_from_args(args: argparse.Namespace):
    """The ModelSpec named by --model / --hf-config plus overrides."""
    from memcalc.inputs.specs import ModelSpec
    from memcalc.refusals.step import MOE_OPTIONS, check_moe_options

    given = [a for a in (args.model, args.hf_config, getattr(args, "module", None)) if a is not None]
    if len(given) != 1:
        fail("model", "give exactly one of --model PRESET, --hf-config PATH or --module PKG.MOD:FACTORY",
              "e.g. --model gpt2")
    if getattr(args, "module", None) is not None:
        return _from_module(args)
    from memcalc.cli.hub_model import cli_model

    model = cli_model(args) if args.model is not None else _from_hf(args.hf_config, args)
    changes = field_values(args, flag_fields(ModelSpec, skip=_MODEL_SKIP + ("implementation",)))
    if args.implementation and args.model:
        changes["implementation"] = args.implementation
    model = model.with_(**changes) if changes else model
    check_moe_options(model, given=[n for n in MOE_OPTIONS if getattr(args, n, None) is not None])
    return model


def _from_module(args: argparse.Namespace):
    """A traced spec from --module pkg.mod:factory (and --module-loss, --vocab-size)."""
    from memcalc.inputs.specs import ModelSpec

    if args.vocab_size is None:
        fail("vocab_size", "--module needs the token ids' vocabulary", "add --vocab-size N")
    factory = _user_object("module", args.module)
    loss = _user_object("module_loss", args.module_loss) if args.module_loss else None
    return ModelSpec.from_module(factory, inputs=args.vocab_size, loss=loss, name=args.module)


def _user_object(field: str, ref: str):
    """The object `pkg.mod:name` names (its module imported: the user's own code, found from the
    working directory as `python -m` finds it)."""
    import os
    from importlib import import_module

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module, _, name = ref.partition(":")
    if not module or not name.isidentifier():
        fail(field, f"{ref!r} is not pkg.mod:name", "e.g. --module mymodels.gpt:factory")
    try:
        return getattr(import_module(module), name)
    except (ImportError, AttributeError) as err:
        fail(field, f"cannot load {ref!r}: {err}", "check the module is importable from here")


def _from_hf(path: str, args: argparse.Namespace):
    from memcalc.core.files import read_json_object
    from memcalc.inputs.specs import ModelSpec

    config = read_json_object(path)  # a regular file of at most 1 MiB holding a JSON object
    return ModelSpec.from_hf_config(config, implementation=args.implementation or "hf")


def training_from_args(args: argparse.Namespace, **fixed):
    """The TrainingConfig of the training flags (plus `fixed` fields)."""
    from memcalc.inputs.training import TrainingConfig

    fields = field_values(args, flag_fields(TrainingConfig, skip=("lora",)))
    lora = lora_from_args(args) if hasattr(args, "lora_rank") else None
    lora = lora if lora is not None else getattr(args, "hub_lora", None)  # a peft repo's adapter
    if lora is not None:
        fields["lora"] = lora
    if "tensor_parallel" in fields and "world_size" not in fields:
        fields["world_size"] = fields["tensor_parallel"]
    return TrainingConfig.make(**{"micro_batch": 1, "seq_len": 1, **fields, **fixed})
