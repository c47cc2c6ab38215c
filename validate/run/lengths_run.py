"""A padded HF Trainer run over batches of different lengths, measured step by step, and memcalc's
prediction of it (memcalc.estimate_lengths with the run's batches in order).

The run: transformers.Trainer (use_cpu, the TrainingArguments given, train_sampling_strategy
'sequential' (the dataset's order) or 'random' (the Trainer's default), the batches' lengths
recorded as the collator receives them) over examples of the given token
lengths, collated by DataCollatorForLanguageModeling(mlm=False, pad_to_multiple_of): the causal-LM
form of DataCollatorWithPadding (the same tokenizer.pad call pads input_ids and attention_mask to
the batch's longest, rounded up to the multiple; it adds labels, input_ids with -100 at padding,
which a causal LM needs and DataCollatorWithPadding alone does not give). Each optimizer step's
peak is read by validate.run.trainer_run's step meter under the live-tensor tracker.

>>> batches_of([5, 9, 3, 7, 2], micro_batch=2)
[[5, 9], [3, 7], [2]]
"""
from __future__ import annotations

from validate.run.trainer_run import hf_trainer, run_tracked_trainer


def batches_of(lengths: list[int], micro_batch: int) -> list[list[int]]:
    """The lengths of each batch a sequential sampler makes (the last may be short)."""
    return [lengths[i:i + micro_batch] for i in range(0, len(lengths), micro_batch)]


def tiny_tokenizer(vocab_size: int):
    """A PreTrainedTokenizerFast over a word-level vocabulary of `vocab_size` ids, id 0 the pad
    token (built in memory: no download). Only its pad() is used."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"t{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def measure_padded_trainer(spec, training, trainer_args: dict, lengths: list[int],
                           pad_to_multiple_of: int | None = None, hf_config: dict | None = None,
                           seed: int = 0, sampling: str = "sequential") -> tuple[list[dict], list[list[int]]]:
    """Run one epoch over examples of `lengths` tokens (random ids, never the pad id), in the
    dataset's order ('sequential') or the Trainer's default RandomSampler ('random'); return each
    optimizer step's measured peaks {'peak', 'forward+backward', 'optimizer', 'shape'} and the
    lengths of each batch as the collator received them (the order the run saw)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    g = torch.Generator().manual_seed(seed)
    data = [{"input_ids": torch.randint(1, spec.vocab_size, (n,), generator=g).tolist()} for n in lengths]
    tokenizer = tiny_tokenizer(spec.vocab_size)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False,
                                                            pad_to_multiple_of=pad_to_multiple_of)
    shapes: list[tuple[int, ...]] = []
    seen: list[list[int]] = []

    def collate(features):
        seen.append([len(f["input_ids"]) for f in features])
        batch = collator(features)
        shapes.append(tuple(batch["input_ids"].shape))
        return batch

    steps = -(-len(lengths) // (training.micro_batch * training.grad_accum))
    meter, _, _, _ = run_tracked_trainer(spec, training, hf_config,
                                         {**trainer_args, "max_steps": steps,
                                          "train_sampling_strategy": sampling}, seed,
                                         make=hf_trainer(data, collate))
    steps_out = [{**s, "shape": shapes[i * training.grad_accum] if i * training.grad_accum < len(shapes) else None}
                 for i, s in enumerate(meter.steps)]
    return steps_out, seen
