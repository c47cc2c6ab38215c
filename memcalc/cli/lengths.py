"""`memcalc estimate --seq-lens FILE|LIST`: the peak over a run's variable lengths
(memcalc.queries.lengths), printed like `estimate` with the batch it happens at."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--seq-lens, --pad-to-multiple-of, --packing on `estimate`."""
    g = p.add_argument_group("variable lengths")
    g.add_argument("--seq-lens", help="sequence lengths instead of --seq-len: a file (.json list or "
                   "{length: count}, .csv with a 'length' column, one length a line) or "
                   "'N,N,...' / 'N:COUNT,...'; answered at the longest padded batch")
    g.add_argument("--pad-to-multiple-of", type=int, help="the collator's pad_to_multiple_of")
    g.add_argument("--packing", help="none (default: dynamic padding), concatenate (fixed "
                   "--seq-len blocks), or position_ids (refused: not modelled)")


def run(args: argparse.Namespace, model: object, training_from_args: object, print_estimate: object) -> dict:
    """`estimate --seq-lens`: a padding collator passes an attention_mask, so an HF model's mask
    defaults to 'ones' here (per batch 'ones' or 'padded'); --attention-mask none keeps none."""
    from memcalc.core.errors import SpecError

    if args.seq_lens is None:
        flag = "pad_to_multiple_of" if args.pad_to_multiple_of else "packing"
        raise SpecError(flag, "applies to variable lengths only", "give --seq-lens, or drop it")
    if args.formula:
        raise SpecError("formula", "the formula is in b and s, not over a distribution of lengths",
                        "drop --formula, or give --seq-len N")
    fixed = {"attention_mask": "ones"} if args.attention_mask is None and model.implementation == "hf" else {}
    out = payload(args, model, training_from_args(args, **fixed))
    if not args.json:
        print_estimate(out)
        print_note(out)
    return out


def payload(args: argparse.Namespace, model: object, training: object) -> dict:
    """The estimate JSON of the worst batch, plus what the lengths made of it.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> a = argparse.Namespace(seq_lens="100,200", pad_to_multiple_of=64, packing=None)
    >>> out = payload(a, ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=8))
    >>> out["seq_lens"]["padded_length"], out["seq_lens"]["attention_mask"]
    (256, 'none')
    """
    from memcalc.queries.lengths import estimate_lengths

    lr = estimate_lengths(model, training, args.seq_lens, pad_to_multiple_of=args.pad_to_multiple_of,
                          packing=args.packing or "none")
    r = lr.report
    return {"model": model.name, "params": model.param_count, "peak_bytes": r.peak_bytes,
            "peak_gib": r.peak_gib, "peak_phase": r.peak_phase, "moment": r.moment,
            "first_step_peak_bytes": r.first_step_peak_bytes, "phases": r.phases,
            "components": r.components, "rank_peak_bytes": r.rank_peak_bytes,
            "seq_lens": {"run_peak_bytes": lr.peak_bytes, "padded_length": lr.seq_len,
                         "micro_batch": lr.micro_batch, "attention_mask": lr.attention_mask,
                         "memory": "allocated (live tensors); reserved memory across shapes is not "
                                   "modelled here"}}


def print_note(out: dict) -> None:
    """One line saying which batch the answer is for."""
    s = out["seq_lens"]
    print(f"  longest batch: {s['micro_batch']} x {s['padded_length']} tokens, attention_mask "
          f"{s['attention_mask']}; run peak {s['run_peak_bytes'] / 2 ** 30:.3f} GiB (allocated)")
