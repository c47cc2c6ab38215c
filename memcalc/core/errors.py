"""The project's one family of errors: each message names the field and says how to fix it."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class MemcalcError(ValueError):
    """Base error: bad input to memcalc. The CLI prints `str(err)` on one line and exits 2.

    >>> str(MemcalcError("micro_batch", "must be >= 1, got 0", "pass a positive integer"))
    'micro_batch: must be >= 1, got 0; fix: pass a positive integer'
    """

    def __init__(self, field: str, problem: str, fix: str = ""):
        field = str(field) or "''"  # a user's empty (or non-str) name, still shown as a name
        self.field, self.problem, self.fix = field, problem, fix
        message = f"{field}: {problem}" + (f"; fix: {fix}" if fix else "")
        super().__init__(message)


class SpecError(MemcalcError):
    """A ModelSpec, TrainingConfig or config file is invalid."""


class UnknownNameError(MemcalcError):
    """A preset, GPU or option name is not known; the message lists the closest names."""


class NotModelledError(MemcalcError):
    """A valid configuration whose memory the engine does not model (yet)."""


def closest_names(name: str, known: list[str], n: int = 3) -> str:
    """The known names closest to `name`, for 'did you mean' hints.

    >>> closest_names("llama-2-7", ["llama-2-7b", "gpt2"])
    'llama-2-7b'
    """
    import difflib

    close = difflib.get_close_matches(str(name), known, n=n, cutoff=0.3)  # a dict's key may be any type
    return ", ".join(close or sorted(known)[:n])


def from_pydantic(err: ValidationError, model_name: str) -> SpecError:
    """Turn a pydantic ValidationError into one SpecError naming the first bad field."""
    import re

    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    field = loc[0] if loc else model_name  # ('num_kv_heads', 'int'): a union's branch
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, MemcalcError):  # a nested model's own error (LoRA, MoESpec): keep its parts
        name = inner.field if not loc or inner.field.split(".")[0] == field else f"{field}.{inner.field}"
        return SpecError(name, inner.problem, inner.fix)
    msg = first.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if not loc:  # a cross-field check: name the first field its message mentions
        names = _fields(model_name)
        field = next((w for w in re.findall(r"[a-z_]+", msg) if w in names), model_name)
    return SpecError(field, msg, first.get("ctx", {}).get("fix", "") if isinstance(first.get("ctx"), dict) else "")


def _fields(model_name: str) -> set[str]:
    import importlib

    module = {"ModelSpec": "memcalc.inputs.specs", "TrainingConfig": "memcalc.inputs.training"}.get(model_name)
    return set(getattr(importlib.import_module(module), model_name).model_fields) if module else set()
