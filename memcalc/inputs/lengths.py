"""Sequence lengths as a distribution: a list of lengths, a histogram {length: count}, or a
file holding a dataset's tokenized length column (memcalc.queries.lengths answers the peak over
them). Every failure is one SpecError naming the field `seq_lens`.

>>> histogram([512, 1024, 512])
{512: 2, 1024: 1}
>>> histogram("512:3,2048")
{512: 3, 2048: 1}
"""
from __future__ import annotations

import csv
import io
import json
import os

from memcalc.core import limits
from memcalc.core.errors import SpecError
from memcalc.core.files import read_bounded

FIELD = "seq_lens"
FIX = ("give a list of lengths, a histogram {length: count}, 'N,N,...' or 'N:COUNT,...', or a file "
       "(.json list/object, .csv with a 'length' column, or one length a line)")
MAX_LENGTHS_FILE_BYTES = 64 * 2 ** 20
"""A length column of a few million rows (about 8 bytes a row as text)."""
COLUMNS = ("length", "lengths", "seq_len", "num_tokens", "input_length")
"""CSV header names read as the length column when the file has several columns."""


def histogram(source: object) -> dict[int, int]:
    """{length: count} of a list, a histogram dict, 'N,N' / 'N:COUNT' text, or a file path
    (a str naming an existing file, or os.PathLike), sorted by length.

    >>> histogram({2048: 1, 128: 10})
    {128: 10, 2048: 1}
    >>> histogram([0])
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: seq_lens: length 0 is not a positive integer; fix: ...
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and os.path.isfile(source)):
        return _from_file(os.fspath(source))
    if isinstance(source, str):
        return _from_text(source)
    if isinstance(source, dict):
        return _finish({_length(k): _count(v) for k, v in source.items()}, source)
    if isinstance(source, (list, tuple)) or hasattr(source, "tolist"):
        values = source.tolist() if hasattr(source, "tolist") else source
        if not isinstance(values, list):
            values = [values]
        return _finish(_counted(_length(v) for v in values), source)
    raise SpecError(FIELD, f"expected lengths, got {type(source).__name__}", FIX)


def _counted(values: object) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _length(v: object) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= limits.MAX_SHAPE:
        raise SpecError(FIELD, f"length {str(v)[:30]} is not a positive integer", FIX)
    return v


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecError(FIELD, f"count {str(v)[:30]} is not a non-negative integer", FIX)
    return v


def _finish(counts: dict[int, int], source: object) -> dict[int, int]:
    counts = {k: n for k, n in sorted(counts.items()) if n}
    if not counts:
        raise SpecError(FIELD, f"no lengths in {str(source)[:40]!r}", FIX)
    return counts


def _from_text(text: str) -> dict[int, int]:
    """'512,1024' (lengths) or '512:3,1024:1' (length:count); a text that names no file."""
    items = [t.strip() for t in text.replace(";", ",").split(",") if t.strip()]
    if not items or not all(t.replace(":", "").isdigit() and t.count(":") <= 1 for t in items):
        raise SpecError(FIELD, f"{text[:40]!r} is neither lengths nor an existing file", FIX)
    out: dict[int, int] = {}
    for t in items:
        length, _, count = t.partition(":")
        out[_length(length)] = out.get(int(length), 0) + (_count(int(count)) if count else 1)
    return _finish(out, text)


def _from_file(path: str) -> dict[int, int]:
    data = read_bounded(path, FIELD, MAX_LENGTHS_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(FIELD, f"{path[:60]!r} is not UTF-8 text", FIX) from None
    if path.endswith(".json"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise SpecError(FIELD, f"{path[:60]!r} is not valid JSON", FIX) from None
        if isinstance(value, dict):  # JSON keys are strings
            return _finish({_length(k): _count(v) for k, v in value.items()}, path)
        if isinstance(value, list):
            return _finish(_counted(_length(v) for v in value), path)
        raise SpecError(FIELD, f"{path[:60]!r} holds neither a list nor an object", FIX)
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if rows and not rows[0][0].strip().isdigit():  # a header line
        header = [c.strip().lower() for c in rows[0]]
        col = 0 if len(header) == 1 else next((header.index(c) for c in COLUMNS if c in header), None)
        if col is None:
            raise SpecError(FIELD, f"{path[:60]!r} has no column named one of {', '.join(COLUMNS)}", FIX)
        rows = rows[1:]
    else:
        col = 0
    return _finish(_counted(_length(r[col] if col < len(r) else "") for r in rows), path)
