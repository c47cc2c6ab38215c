"""Primitive argument checks at the project's boundary: integers, fractions, names, output
folders. Each failure is one MemcalcError naming the field the caller gave and the fix."""
from __future__ import annotations

import math
import numbers

from memcalc.core import limits
from memcalc.core.errors import MemcalcError


def shown(value: object, n: int = 60) -> str:
    """A value as an error message quotes it: its repr, cut at n characters.

    >>> shown("x" * 70, 5)
    "'xxxx..."
    """
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def check_int(field: str, value: object, lo: int = 1, hi: int | None = None) -> int:
    """`value` as a Python int in [lo, hi]: an int or numpy integer, never a bool, float or string.

    >>> check_int("top", 3), check_int("top", 0, lo=0)
    (3, 0)
    >>> check_int("micro_batch", True)
    Traceback (most recent call last):
    ...
    memcalc.core.errors.MemcalcError: micro_batch: True is not an integer; fix: pass an integer >= 1
    """
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi:,}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise MemcalcError(field, f"{shown(value)} is not an integer", f"pass an integer {bound}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise MemcalcError(field, f"must be {bound}, got {shown(value)}", f"pass an integer {bound}")
    return value


def check_fraction(field: str, value: object, fix: str) -> float:
    """A finite real number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MemcalcError(field, f"{shown(value)} is not a number", fix)
    value = float(value)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise MemcalcError(field, f"must be in (0, 1], got {value}", fix)
    return value


def check_name(field: str, value: object, example: str) -> str:
    """A non-empty string of reasonable length (preset and GPU names)."""
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise MemcalcError(field, f"{shown(value)} is not a name", f"pass a name, e.g. {example!r}")
    return value


def check_out_dir(field: str, path: str, create: bool) -> None:
    """An output folder that exists or can be made: no file in the way, a sane path."""
    import os

    if not path or len(path) > limits.MAX_PATH_CHARS or "\0" in path:
        raise MemcalcError(field, f"{shown(path)} is not a usable folder path", "pass a folder, e.g. tables")
    if not create:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise MemcalcError(field, f"cannot make the folder {shown(path)} ({err.strerror})",
                           "pass a folder that can be created (no file in the way)") from None
    if not os.access(path, os.W_OK):
        raise MemcalcError(field, f"{shown(path)} is not writable", "pass a writable folder")
