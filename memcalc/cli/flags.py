"""Command-line flags generated from the fields of the input models (ModelSpec, TrainingConfig): a
field `x_y` is the flag `--x-y`, its type, choices (a Literal's values) and repetition (a tuple's
items) read from the annotation, its help the first sentence of the field's docstring, so the
command and the Python API accept and refuse the same values (pydantic validates both).

Help text is read from the source only when help is printed (FieldHelp, HelpFormatter): parsing
the docstrings costs milliseconds that a cold `memcalc estimate` does not spend.
"""
from __future__ import annotations

import argparse
import sys
import types
import typing

_SCALARS = (int, float, str)


def parse_bool(text: str) -> bool:
    """A true|false flag value.

    >>> parse_bool("yes"), parse_bool("False")
    (True, False)
    """
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def field_kwargs(annotation: object, bools: str = "switch") -> dict | None:
    """argparse keywords for a field annotation: a Literal's values as choices (of the Literal
    part of a union with a non-scalar, as moe_routing's counts), int / float / str, a tuple of
    them repeated (action append), a bool as a switch (store_true; `bools`="value": true|false);
    None for what a flag cannot give (a nested model).

    >>> from typing import Literal
    >>> field_kwargs(Literal["a", "b"] | None), field_kwargs(tuple[str, ...]), field_kwargs(bool)
    ({'choices': ['a', 'b']}, {'type': <class 'str'>, 'action': 'append'}, {'action': 'store_true'})
    """
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        literals = [a for a in args if typing.get_origin(a) is typing.Literal]
        rest = [a for a in args if a is not type(None)]
        if literals:
            annotation = literals[0]
        elif len(rest) == 1:
            annotation = rest[0]
        else:
            return None
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if annotation is bool:
        return {"action": "store_true"} if bools == "switch" else {"type": parse_bool, "metavar": "true|false"}
    if annotation in _SCALARS:
        return {"type": annotation}
    item = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple and len(item) == 2 and item[1] is Ellipsis and item[0] in _SCALARS:
        return {"type": item[0], "action": "append"}
    return None


def flag_fields(model: type, skip: tuple[str, ...] = ()) -> list[str]:
    """The fields of `model` a flag can give (field_kwargs not None), in declaration order.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> flag_fields(TrainingConfig)[:3], "lora" in flag_fields(TrainingConfig)
    (['micro_batch', 'seq_len', 'grad_accum'], False)
    """
    return [name for name, info in model.model_fields.items()
            if name not in skip and field_kwargs(info.annotation) is not None]


class FieldHelp(str):
    """A flag's help: the first sentence of a model field's docstring, read when help is printed
    (HelpFormatter); as a plain string, `Model.field` and the note."""

    def __new__(cls, model: type, name: str, note: str = "") -> "FieldHelp":
        out = super().__new__(cls, f"{model.__name__}.{name}" + (f" ({note})" if note else ""))
        out.model, out.name, out.note = model, name, note
        return out

    def text(self) -> str:
        """The docstring's first sentence, with the note (escaped for argparse's % formatting)."""
        doc = field_doc(self.model, self.name) or f"{self.model.__name__}.{self.name}"
        return (doc + (f" ({self.note})" if self.note else "")).replace("%", "%%")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with FieldHelp read from the field's docstring."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        found = action.help
        return found.text() if isinstance(found, FieldHelp) else found


_DOCS: dict[type, dict[str, str]] = {}


def field_doc(model: type, name: str) -> str:
    """The first sentence of the docstring under a field of `model` (a string statement after
    its annotated assignment in the class body), or ''.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> field_doc(TrainingConfig, "seq_len")
    'Tokens per sequence (s).'
    """
    docs = _DOCS.get(model)
    if docs is None:
        import ast  # (only when help is printed)

        docs = _DOCS[model] = {}
        source = open(sys.modules[model.__module__].__file__, encoding="utf-8").read()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.name == model.__name__:
                body = node.body
                for stmt, after in zip(body, body[1:]):
                    if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                            and isinstance(after.value.value, str)):
                        docs[stmt.target.id] = _first_sentence(after.value.value)
    return docs.get(name, "")


def _first_sentence(doc: str) -> str:
    """The text up to the first '. ' (or all of it), on one line.

    >>> _first_sentence("Tokens per\\n    sequence. More here.")
    'Tokens per sequence.'
    """
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def add_fields(group: argparse._ArgumentGroup, model: type, names: list[str], bools: str = "switch",
               defaults: dict | None = None, notes: dict | None = None) -> list[str]:
    """A flag for each field in `names` of `model` (default None: the field's own default applies,
    unless `defaults` gives the command's); the names, for field_values."""
    defaults, notes = defaults or {}, notes or {}
    for name in names:
        kwargs = field_kwargs(model.model_fields[name].annotation, bools)
        group.add_argument("--" + name.replace("_", "-"), dest=name, default=defaults.get(name),
                           help=FieldHelp(model, name, notes.get(name, "")), **kwargs)
    return names


def field_values(args: argparse.Namespace, names: list[str]) -> dict:
    """The fields among `names` that the flags give (not None), a repeated flag's as a tuple.

    >>> field_values(argparse.Namespace(a=1, b=None, c=["x"]), ["a", "b", "c"])
    {'a': 1, 'c': ('x',)}
    """
    out = {}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out
