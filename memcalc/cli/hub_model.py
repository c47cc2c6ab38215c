"""`--model NAME` on the CLI: a preset, or a Hugging Face Hub id (memcalc.inputs.hf.hub)."""
from __future__ import annotations

import argparse

from memcalc.core.errors import SpecError


def cli_model(args: argparse.Namespace):
    """The ModelSpec of --model (with --revision for a hub id). A peft repo's adapter is left on
    args.hub_lora for the training flags (commands without --lora-* flags refuse it).

    >>> cli_model(argparse.Namespace(model="gpt2", revision=None, implementation=None)).name
    'gpt2'
    """
    from memcalc.inputs.hf.hub import is_hub_id, pretrained_config
    from memcalc.inputs.specs import ModelSpec

    revision = getattr(args, "revision", None)
    if not is_hub_id(args.model):
        if revision is not None:
            raise SpecError("revision", "is for hub ids (org/name)", f"drop --revision for the preset {args.model}")
        return ModelSpec.preset(args.model)
    config, lora = pretrained_config(args.model, revision)
    spec = ModelSpec.from_hf_config(config, implementation=args.implementation or "hf").with_(name=args.model)
    if lora is not None:
        if not hasattr(args, "lora_rank"):
            raise SpecError("model", f"{args.model} is a peft adapter repo; this command reads full "
                            "training", f"use `memcalc estimate --model {args.model}`")
        if args.lora_config is None and args.lora_rank is None:
            args.hub_lora = lora
    return spec
