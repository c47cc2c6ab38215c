"""A slice of a matrix for CI: every topic keeps rows in proportion to its size (at least one), drawn
by a seed, so that a CI run measures each topic again without measuring every row.

Why a slice is enough: every recorded row of the CI matrices is re-predicted by the current engine
and held to its bound in the quick lane (tests/test_recorded_rows.py), so an engine change that moves
any row fails there. What only a new measurement catches is the measured side drifting (a torch or
transformers build, the validator's tracker): a slice that changes with the seed (CI passes the
commit) measures a different part of every topic on each run, and the full matrix runs with no
--sample.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def topic_quotas(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Rows to take from each topic: proportional to its size, at least 1, at most all of it.

    >>> topic_quotas({"a": 90, "b": 9, "c": 1}, 10)
    {'a': 9, 'b': 1, 'c': 1}
    >>> topic_quotas({"a": 3}, 10)
    {'a': 3}
    """
    total = sum(sizes.values())
    return {t: min(k, max(1, round(n * k / total))) for t, k in sizes.items()}


def sample_rows(rows: Sequence[T], topic_of: object, n: int, seed: str) -> list[T]:
    """About `n` of `rows` (see topic_quotas), in their order; the same seed draws the same rows.

    >>> rows = [("a", i) for i in range(90)] + [("b", i) for i in range(10)]
    >>> picked = sample_rows(rows, lambda r: r[0], 10, "abc")
    >>> len(picked), sorted({t for t, _ in picked}), picked == sample_rows(rows, lambda r: r[0], 10, "abc")
    (10, ['a', 'b'], True)
    """
    by_topic: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_topic.setdefault(topic_of(row), []).append(i)
    quotas = topic_quotas({t: len(ix) for t, ix in by_topic.items()}, n)
    keep: set[int] = set()
    for topic, indices in by_topic.items():
        digest = hashlib.sha256(f"{seed}/{topic}".encode()).digest()
        keep.update(random.Random(digest).sample(indices, quotas[topic]))
    return [row for i, row in enumerate(rows) if i in keep]
