"""Pairwise (all-pairs) covering designs: every value of every axis appears and every pair of
values of any two axes appears in some row, far fewer rows than the full product. The designs
that chose the rows of several topics (validate/matrices/rows/: training-options, families,
families-from-config, moe, moe-aux-loss, gpt-oss, gpu-quick, gpu-full; each file's `about` names
its axes and seed) are written out as rows; this is the tool for designing new ones, and
tests/test_validate_compare.py checks that the written rows still cover every pair. No torch here.
"""
from __future__ import annotations

import itertools
import random

from memcalc.inputs.training import CHECKPOINTINGS, OPTIMIZER_IMPLS, PRECISIONS, TORCH_OPTIMIZERS

TRAINING_AXES = {
    "precision": PRECISIONS,
    "checkpointing": CHECKPOINTINGS,
    "optimizer": TORCH_OPTIMIZERS,
    "impl": OPTIMIZER_IMPLS,
    "attention": ("eager", "sdpa"),
    "grad_accum": (1, 2),
}
"""The training axes of the pairwise designs, in the order the designs draw them (a design's
rows depend on its axes' order: `pairwise` walks them as listed)."""


def pairwise(axes: dict[str, tuple], seed: int = 0, candidates: int = 40) -> list[dict]:
    """Rows covering every pair of values of every two axes (greedy AETG-style, deterministic).

    >>> rows = pairwise({"a": (1, 2), "b": (1, 2), "c": (1, 2)})
    >>> len(rows) <= 6 and {(r["a"], r["b"]) for r in rows} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    True
    """
    names = list(axes)
    uncovered = {((i, a), (j, b)) for i, j in itertools.combinations(range(len(names)), 2)
                 for a in range(len(axes[names[i]])) for b in range(len(axes[names[j]]))}
    rng = random.Random(seed)
    rows = []
    while uncovered:
        best = max((_candidate(axes, names, uncovered, rng) for _ in range(candidates)),
                   key=lambda row: _gain(row, uncovered))
        uncovered -= _pairs(best)
        rows.append({n: axes[n][v] for n, v in zip(names, best)})
    return rows


def _pairs(row) -> set:
    return {((i, row[i]), (j, row[j])) for i, j in itertools.combinations(range(len(row)), 2)}


def _gain(row, uncovered) -> int:
    return len(_pairs(row) & uncovered)


def _candidate(axes, names, uncovered, rng) -> tuple:
    (i, a), (j, b) = rng.choice(sorted(uncovered))
    row: dict[int, int] = {i: a, j: b}
    for k in rng.sample(range(len(names)), len(names)):
        if k in row:
            continue
        options = list(range(len(axes[names[k]])))
        rng.shuffle(options)
        row[k] = max(options, key=lambda v: sum(((min(k, m), v if k < m else w),
                                                 (max(k, m), w if k < m else v)) in uncovered
                                                for m, w in row.items()))
    return tuple(row[k] for k in range(len(names)))
