"""Pipeline parallelism as torch.distributed.pipelining runs it: the schedule side (torch-free).

What this module holds, each rule read in torch 2.13's torch/distributed/pipelining/schedules.py:
- the schedules and the micro-batch counts each accepts (Schedule1F1B.__init__: m >= stages;
  ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble.__init__: m a multiple of
  max(1, m // pp) rounds; ZBVZeroBubble: exactly 2 stages per rank);
- the order in which each rank runs forward (F), backward (B) or, split by the zero-bubble
  schedules, input-gradient (I) and weight-gradient (W) actions of its stages' micro-batches:
  ScheduleGPipe._step_microbatches, Schedule1F1B._step_microbatches (warm-up, then 1B1F),
  ScheduleLoopedBFS._calculate_single_rank_operations, and _get_1f1b_rank_ops with
  _get_warmup_ops for ScheduleInterleaved1F1B (multiply_factor 2) and
  ScheduleInterleavedZeroBubble (multiply_factor 1, zero bubble);
- from that order, the micro-batches in flight on a rank at its fullest instant: forwards run
  whose backward (or, when split, weight gradient) has not, each keeping its stage's saved
  activations (tests/test_pipeline.py checks the orders against torch's own).
- stage splits: contiguous layers per stage, even (the first stages one more layer when the
  count does not divide) or at explicit boundaries; the embedding on the first stage, the final
  norm, head and loss on the last (torchtitan's pipeline split of its decoder).

The memory of a stage and of each rank's walk through its actions: memcalc.parallel.stages and
memcalc.parallel.pipeline_peaks.

>>> in_flight("1f1b", 4, 8), in_flight("gpipe", 4, 8)
([4, 3, 2, 1], [8, 8, 8, 8])
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from memcalc.core.errors import MemcalcError

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "looped-bfs": "LoopedBFS",
             "interleaved-1f1b": "Interleaved1F1B", "interleaved-zero-bubble": "InterleavedZeroBubble"}
"""memcalc's schedule names -> torch.distributed.pipelining.schedules.get_schedule_class names."""
MULTI = ("looped-bfs", "interleaved-1f1b", "interleaved-zero-bubble")
"""Schedules with several stages per rank (virtual stages)."""

Action = tuple[int, str, int]
"""(stage index, 'F' | 'B' | 'I' | 'W', micro-batch)."""


def check_pipeline(num_layers: int, stages: int, schedule: str, microbatches: int,
                   stages_per_rank: int = 1, boundaries: Sequence[int] | None = None) -> None:
    """Refuse, naming the field and the fix, what torch's schedules or the split cannot take.

    >>> check_pipeline(4, 8, "1f1b", 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: pipeline_parallel: 8 stages for 4 layers; fix: use at most 4 stages ...
    >>> check_pipeline(32, 4, "1f1b", 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: num_microbatches: Schedule1F1B needs ...; fix: use num_microbatches >= 4
    """
    if schedule not in SCHEDULES:
        raise MemcalcError("pipeline_schedule", f"unknown schedule {schedule!r}", f"use one of {list(SCHEDULES)}")
    for name, value in (("pipeline_parallel", stages), ("num_microbatches", microbatches),
                        ("pipeline_stages_per_rank", stages_per_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MemcalcError(name, f"must be an integer >= 1, got {value!r}", f"pass a positive {name}")
    if schedule in MULTI and stages_per_rank < 2:
        raise MemcalcError("pipeline_stages_per_rank", f"{SCHEDULES[schedule]} runs several stages per rank, got "
                           f"{stages_per_rank}", "use pipeline_stages_per_rank >= 2 (or schedule 1f1b)")
    if schedule not in MULTI and stages_per_rank != 1:
        raise MemcalcError("pipeline_stages_per_rank", f"Schedule{SCHEDULES[schedule]} runs one stage per rank, got "
                           f"{stages_per_rank}", "use pipeline_stages_per_rank=1 or interleaved-1f1b")
    total = stages * stages_per_rank
    if total > num_layers:
        raise MemcalcError("pipeline_parallel", f"{total} stages for {num_layers} layers",
                           f"use at most {num_layers} stages (one layer each at least)")
    if schedule == "1f1b" and microbatches < stages:
        raise MemcalcError("num_microbatches", f"Schedule1F1B needs at least as many micro-batches as "
                           f"stages ({stages}), got {microbatches}", f"use num_microbatches >= {stages}")
    if schedule in ("interleaved-1f1b", "interleaved-zero-bubble"):
        rounds = max(1, microbatches // stages)
        if microbatches % rounds:
            raise MemcalcError("num_microbatches", f"{SCHEDULES[schedule]} needs a multiple of its "
                               f"{rounds} rounds (num_microbatches // pipeline_parallel), got {microbatches}",
                               f"use a multiple of {stages}, or fewer than {stages}")
    if boundaries is not None:
        stage_layers(num_layers, total, boundaries)


def stage_layers(num_layers: int, stages: int, boundaries: Sequence[int] | None = None) -> list[range]:
    """The decoder layers of each stage: `boundaries` (the first layer of stages 1..n-1), or an
    even split with the first stages taking one more layer where the count does not divide.

    >>> stage_layers(10, 4)
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    >>> stage_layers(10, 3, [2, 6])
    [range(0, 2), range(2, 6), range(6, 10)]
    """
    if boundaries is None:
        base, extra = divmod(num_layers, stages)
        starts = [i * base + min(i, extra) for i in range(stages)]
    else:
        cuts = list(boundaries)
        if len(cuts) != stages - 1 or any(not isinstance(c, int) or isinstance(c, bool) for c in cuts) \
                or cuts != sorted(set(cuts)) or (cuts and (cuts[0] < 1 or cuts[-1] > num_layers - 1)):
            even = [r.start for r in stage_layers(num_layers, stages)[1:]]
            raise MemcalcError("stage_boundaries", f"{list(boundaries)[:8]} are not {stages - 1} increasing "
                               f"layer indices in [1, {num_layers - 1}]",
                               f"give the first layer of each stage after the first, e.g. {even[:8]}")
        starts = [0] + cuts
    return [range(a, b) for a, b in zip(starts, starts[1:] + [num_layers])]


def rank_actions(schedule: str, stages: int, microbatches: int, rank: int, stages_per_rank: int = 1) -> list[Action]:
    """The compute actions of `rank`, in the order it runs them (module docstring).

    >>> rank_actions("1f1b", 2, 3, 0)
    [(0, 'F', 0), (0, 'F', 1), (0, 'B', 0), (0, 'F', 2), (0, 'B', 1), (0, 'B', 2)]
    """
    m, p, v = microbatches, stages, stages_per_rank
    if schedule == "gpipe":
        return [(rank, "F", i) for i in range(m)] + [(rank, "B", i) for i in range(m)]
    if schedule == "1f1b":
        warm = min(m, p - rank)
        out = [(rank, "F", i) for i in range(warm)]
        for i in range(m):  # 1B1F: a backward, then the next forward while any is left
            out.append((rank, "B", i))
            if warm + i < m:
                out.append((rank, "F", warm + i))
        return out
    if schedule == "looped-bfs":
        local = range(rank, p * v, p)
        return [(s, "F", i) for s in local for i in range(m)] + \
            [(s, "B", i) for s in reversed(local) for i in reversed(range(m))]
    zero_bubble = schedule == "interleaved-zero-bubble"
    per_round = m // max(1, m // p)
    warm = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - rank), m * v)
    total = m * v

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * p + rank

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * p + rank

    return _one_f_one_b(total, warm, forward_stage, backward_stage, rank if zero_bubble else None)


def _one_f_one_b(total: int, warm: int, forward_stage: Callable[[int], int], backward_stage: Callable[[int], int],
                 zero_bubble_after: int | None) -> list[Action]:
    """torch's _get_1f1b_rank_ops without its idle slots: warm-up forwards, then a forward and a
    backward per step, then the cool-down backwards; with zero bubble the backwards compute input
    gradients (I) and each weight gradient (W) follows, from the (rank + 1)-th 1F1B step on."""
    counters: dict[str, dict[int, int]] = {k: defaultdict(int) for k in "FBW"}
    out: list[Action] = []
    backward_steps: list[int] = []
    kind = "B" if zero_bubble_after is None else "I"

    def act(stage: int, what: str) -> None:
        key = "B" if what == "I" else what
        out.append((stage, what, counters[key][stage]))
        counters[key][stage] += 1

    for op in range(total + warm):
        if op < warm:
            act(forward_stage(op), "F")
            continue
        if op < total:
            act(forward_stage(op), "F")
        act(backward_stage(op), kind)
        backward_steps.append(op)
        if zero_bubble_after is not None and op - warm >= zero_bubble_after:
            act(backward_stage(backward_steps[counters_w(counters)]), "W")
    while zero_bubble_after is not None and counters_w(counters) < len(backward_steps):
        act(backward_stage(backward_steps[counters_w(counters)]), "W")
    return out


def counters_w(counters: dict[str, dict[int, int]]) -> int:
    """Weight-gradient actions run so far, over every stage."""
    return sum(counters["W"].values())


def in_flight(schedule: str, stages: int, microbatches: int, stages_per_rank: int = 1) -> list[int]:
    """Per rank, the most micro-batches holding saved activations at once: forwards run whose
    backward (or weight gradient, where split) has not yet run, summed over the rank's stages.

    >>> in_flight("interleaved-1f1b", 2, 4, 2), in_flight("looped-bfs", 2, 4, 2)
    ([5, 3], [8, 8])
    """
    check_pipeline(stages * stages_per_rank, stages, schedule, microbatches, stages_per_rank)
    out = []
    for rank in range(stages):
        live = most = 0
        for _, what, _ in rank_actions(schedule, stages, microbatches, rank, stages_per_rank):
            live += 1 if what == "F" else -1 if what in ("B", "W") else 0
            most = max(most, live)
        out.append(most)
    return out


__all__ = ["SCHEDULES", "MULTI", "check_pipeline", "stage_layers", "rank_actions", "in_flight"]
