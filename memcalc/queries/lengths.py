"""estimate_lengths(): the peak of a run whose batches have different lengths (dynamic padding).

A padding collator (transformers DataCollatorWithPadding, DataCollatorForLanguageModeling with
mlm=False: data/data_collator.py, both through tokenizer.pad) makes each batch as long as its
longest sequence, rounded up to pad_to_multiple_of (tokenization_utils_base.pad,
`((max_length // pad_to_multiple_of) + 1) * pad_to_multiple_of` when not a multiple), and passes
an attention_mask that holds zeros when some sequence of the batch is shorter: the batch then runs
memcalc's 'padded' call path (memcalc.families.call_path.causal_mask), else the 'ones' one. Every
tensor of a step grows with its length, so the run peaks at its longest batch.

Why a function and not a TrainingConfig field: a TrainingConfig is one step's shape, and every
query (capacity, grid, plan, check) solves for or sweeps that shape; a distribution of lengths is
a property of the data the run will see, answered as the worst step of it. The answer is
allocated memory (live tensors), not reserved memory: the caching allocator's behaviour across
changing shapes (blocks of a long batch kept for a shorter one) is modelled separately (issue 23).

Packing: concatenated blocks ('concatenate': TRL's packing_strategy='wrapped', run_clm.py's
group_texts) are fixed-length batches with no padding, answered at the training's seq_len;
per-document masks from position_ids ('position_ids': DataCollatorWithFlattening, TRL's 'bfd' with
padding_free) make transformers build a packed-sequence mask (masking_utils.py
find_packed_sequence_indices, packed_sequence_mask_function), which memcalc does not model: refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.inputs.lengths import histogram
from memcalc.queries.estimate import MemoryReport, estimate

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

PACKINGS = ("none", "concatenate", "position_ids")


@dataclass
class LengthsReport:
    """The peak over a run's batches, and the batch it happens at."""

    peak_bytes: int
    """Peak over the run (the first step's peak included), bytes of live tensors."""
    seq_len: int
    """Padded length of the batch at the peak."""
    micro_batch: int
    """Sequences in that batch."""
    attention_mask: str
    """What that batch's attention_mask holds: 'ones', 'padded', or 'none' (no mask passed)."""
    report: MemoryReport
    """estimate() of that batch's step."""
    step: int | None = None
    """The optimizer step at the peak (0-based), when `batches` gave the run's order."""
    step_peaks: list[int] = field(default_factory=list)
    """Predicted peak of each optimizer step, when `batches` gave the run's order."""

    @property
    def peak_gib(self) -> float:
        """The peak in GiB."""
        return self.peak_bytes / 2 ** 30


def padded_length(longest: int, multiple: int | None) -> int:
    """The length a padding collator gives a batch whose longest sequence is `longest`.

    >>> padded_length(100, None), padded_length(100, 64), padded_length(128, 64)
    (100, 128, 128)
    """
    return longest if not multiple else -(-longest // multiple) * multiple


def estimate_lengths(model: ModelSpec, training: TrainingConfig, lengths: object = None, *,
                     batches: list[list[int]] | None = None, pad_to_multiple_of: int | None = None,
                     packing: str = "none") -> LengthsReport:
    """Peak of a run over sequences of different lengths, batched with dynamic padding.

    `lengths` (a list, a histogram {length: count}, or a file: memcalc.inputs.lengths.histogram)
    answers the worst batch the data allows whatever the order: the longest sequence's padded
    length, with the mask compositions such a batch can have (padding inside it, or none), every
    held batch (grad_accum micro-batches, the HF Trainer's look-ahead) as long. `batches` (lists
    of lengths, in the order the run sees them, grad_accum consecutive ones per optimizer step)
    answers that run exactly: each step at its own length, the first without optimizer state,
    and under hf_trainer on CPU the look-ahead batch at the next step's length (with grad_accum >
    1 each step is counted at its longest micro-batch: an upper bound). The training's seq_len,
    attention_mask and pad_tokens are replaced per batch; attention_mask='none' keeps no mask
    (a loop that passes input_ids only). The answer is allocated memory, not reserved (module
    docstring).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> m, t = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=1, attention_mask="ones")
    >>> r = estimate_lengths(m, t, [100, 300, 1000], pad_to_multiple_of=64)
    >>> r.seq_len, r.attention_mask
    (1024, 'padded')
    >>> r.peak_bytes >= estimate(m, t.with_(seq_len=1024)).peak_bytes
    True
    """
    if packing not in PACKINGS:
        raise SpecError("packing", f"{str(packing)[:30]!r} is not a packing", f"use one of {', '.join(PACKINGS)}")
    if packing == "position_ids":
        raise NotModelledError("packing", "per-document masks from position_ids (transformers' "
                               "packed-sequence mask, masking_utils.find_packed_sequence_indices) "
                               "are not modelled", "pad instead, or pack by concatenation "
                               "(packing='concatenate')")
    if training.attention_mask == "packed":  # its batches are one row already: no lengths to pad
        raise NotModelledError("attention_mask", "'packed' is one padding-free row of seq_len tokens; "
                               "per-batch lengths are not read for it", "estimate() the packed row, "
                               "or give lengths with attention_mask 'ones' or 'none'")
    if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or
                                           not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
        raise SpecError("pad_to_multiple_of", f"{str(pad_to_multiple_of)[:20]} is not a positive integer",
                        "pass e.g. 8 or 64, or None")
    if (lengths is None) == (batches is None):
        raise SpecError("seq_lens", "give exactly one of lengths or batches", "e.g. lengths=[512, 2048]")
    if packing == "concatenate":
        return _single(model, training, training.seq_len, training.micro_batch,
                       "none" if training.attention_mask == "none" else "ones")
    if batches is not None:
        return _in_order(model, training, batches, pad_to_multiple_of)
    return _worst(model, training, histogram(lengths), pad_to_multiple_of)


def _config(training: TrainingConfig, seq_len: int, micro_batch: int, mask: str,
            shortest: int) -> TrainingConfig:
    """The step of one batch: its shape and mask (pad_tokens: its shortest sequence's padding)."""
    return training.with_(seq_len=seq_len, micro_batch=micro_batch, attention_mask=mask,
                          pad_tokens=seq_len - shortest if mask == "padded" else 0)


def _single(model: ModelSpec, training: TrainingConfig, seq_len: int, b: int, mask: str) -> LengthsReport:
    r = estimate(model, _config(training, seq_len, b, mask, seq_len))
    return LengthsReport(max(r.peak_bytes, r.first_step_peak_bytes), seq_len, b, mask, r)


def _worst(model: ModelSpec, training: TrainingConfig, hist: dict[int, int], multiple: int | None) -> LengthsReport:
    """The worst batch of a distribution: its longest sequence padded, each composition it can have."""
    longest, total = max(hist), sum(hist.values())
    b = min(training.micro_batch, total)
    full = padded_length(longest, multiple)
    shorter = [n for n in hist if n < full]  # sequences that would be padded in a batch at `full`
    compositions = []
    if training.attention_mask == "none":
        compositions.append(("none", full))
    else:
        if longest < full or (b >= 2 and shorter):  # padding inside the longest batch
            compositions.append(("padded", longest if longest < full else min(shorter)))
        if longest == full and hist[longest] >= b:  # b sequences of exactly the padded length
            compositions.append(("ones", full))
    found = []
    for mask, shortest in compositions:
        r = estimate(model, _config(training, full, b, mask, shortest))
        found.append(LengthsReport(max(r.peak_bytes, r.first_step_peak_bytes), full, b, mask, r))
    return max(found, key=lambda x: x.peak_bytes)


def _in_order(model: ModelSpec, training: TrainingConfig, batches: list[list[int]],
              multiple: int | None) -> LengthsReport:
    """Each optimizer step of a run in order (see estimate_lengths)."""
    shapes = [_batch_shape(batch, i, training, multiple) for i, batch in enumerate(batches)]
    k = training.grad_accum
    steps = [shapes[i:i + k] for i in range(0, len(shapes), k)]
    out, peaks = [], []
    for n, step in enumerate(steps):
        b, s = max(x[0] for x in step), max(x[1] for x in step)
        mask = _step_mask(training, [x[2] for x in step])
        shortest = min(x[3] for x in step)
        r = estimate(model, _config(training, s, b, mask, min(shortest, s - 1) if mask == "padded" else s))
        peak = (r.first_step_peak_bytes if n == 0 else r.peak_bytes) + _look_ahead_delta(
            training, (b, s), steps[n + 1][0][:2] if n + 1 < len(steps) else None)
        peaks.append(peak)
        out.append(LengthsReport(peak, s, b, mask, r, n))
    top = max(out, key=lambda x: x.peak_bytes)
    top.step_peaks = peaks
    return top


def _batch_shape(batch: object, i: int, training: TrainingConfig, multiple: int | None) -> tuple[int, int, str, int]:
    """(sequences, padded length, mask, shortest) of one batch given as its lengths."""
    if not isinstance(batch, (list, tuple)) or not batch:
        raise SpecError("batches", f"batch {i} is not a non-empty list of lengths", "e.g. batches=[[512, 300], [128]]")
    if len(batch) > training.micro_batch:
        raise SpecError("batches", f"batch {i} has {len(batch)} sequences, above micro_batch="
                        f"{training.micro_batch}", "give at most micro_batch lengths a batch")
    hist = histogram(list(batch))
    full = padded_length(max(hist), multiple)
    padded = training.attention_mask != "none" and min(hist) < full
    mask = "padded" if padded else "none" if training.attention_mask == "none" else "ones"
    return len(batch), full, mask, min(hist)


def _step_mask(training: TrainingConfig, masks: list[str]) -> str:
    if training.attention_mask == "none":
        return "none"
    return "padded" if "padded" in masks else "ones"


def _look_ahead_delta(training: TrainingConfig, current: tuple[int, int], following: tuple[int, int] | None) -> int:
    """Bytes the HF Trainer's look-ahead batch differs by from the current batch's shape, which
    estimate() counts it at (memcalc.families.call_path.held_batches: on CPU, accelerate's
    DataLoaderShard fetches the next batch before yielding the current one; none after the last).
    Its tensors (input_ids, attention_mask, labels as the collator makes them, int64) are alive
    for the whole step, so the difference moves every moment of the step alike.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=2, seq_len=8, device="cpu", hf_trainer=True, attention_mask="ones")
    >>> _look_ahead_delta(t, (2, 8), (2, 16)), _look_ahead_delta(t, (2, 8), None)
    (256, -256)
    """
    if not training.hf_trainer or training.device != "cpu":
        return 0
    per_batch = 1 + (training.attention_mask != "none") + (training.labels == "separate")
    now = current[0] * current[1] * 8
    later = following[0] * following[1] * 8 if following is not None else 0
    return per_batch * (later - now)
