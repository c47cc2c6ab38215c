"""Bounded reading of config files: regular files only (no FIFOs, devices or directories left
unresolved), at most memcalc.core.limits.MAX_CONFIG_BYTES, JSON objects only, every failure one
MemcalcError naming the field.

>>> read_json_object(b"config.json")
Traceback (most recent call last):
...
memcalc.core.errors.SpecError: hf_config: b'config.json' is not a path; fix: pass the path of a config.json as a str
"""
from __future__ import annotations

import json
import os
import stat

from memcalc.core import limits
from memcalc.core.errors import SpecError

_FIX = "give the path of a Hugging Face config.json"
_FIXES = {"trainer_args": "give the JSON TrainingArguments.to_json_string() writes",
          "deepspeed": "give the DeepSpeed config JSON", "axolotl": "give an axolotl config.yml",
          "adapter_config": "pass peft's adapter_config.json (or its folder)",
          "accelerate_config": "give the YAML `accelerate config` writes",
          "torchtitan_config": "give a torchtitan job config TOML"}


def _fix(field: str) -> str:
    return _FIXES.get(field, _FIX)


def config_path(path: str, field: str = "hf_config") -> str:
    """A path given as str or os.PathLike, of sane length, without NUL bytes; a folder means
    its config.json."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise SpecError(field, f"{path[:60]!r} is not a path" if isinstance(path, bytes) else
                        f"expected a path or a dict, got {type(path).__name__}",
                        "pass the path of a config.json as a str" if isinstance(path, bytes) else _FIX)
    if not path or len(path) > limits.MAX_PATH_CHARS or "\0" in path:
        problem = ("is empty" if not path else "contains a NUL byte" if "\0" in path
                   else f"is {len(path):,} characters long (limit {limits.MAX_PATH_CHARS})")
        raise SpecError(field, f"the path {problem}", _FIX)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    return path


def read_bounded(path: str, field: str = "hf_config", max_bytes: int = limits.MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (O_NONBLOCK: a FIFO never blocks)."""
    shown = repr(path if len(path) <= 80 else path[:80] + "...")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        problem = ("no such file" if isinstance(err, FileNotFoundError) else
                   f"cannot open ({err.strerror if isinstance(err, OSError) else err})")
        raise SpecError(field, f"{problem}: {shown}", _fix(field)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(field, f"{shown} is not a regular file", _fix(field))
        if info.st_size > max_bytes:
            raise SpecError(field, f"{shown} is {info.st_size:,} bytes, above the "
                            f"{max_bytes:,}-byte limit", "give a config.json (a few KiB)")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise SpecError(field, f"{shown} is above the {max_bytes:,}-byte limit",
                            "give a config.json (a few KiB)")
        return data
    except OSError as err:
        raise SpecError(field, f"cannot read {shown} ({err.strerror})", _fix(field)) from None
    finally:
        os.close(fd)


def parse_json_object(data: bytes | str, where: str, field: str = "hf_config") -> dict:
    """A JSON object from text; deep nesting, huge integers and non-objects are SpecErrors."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text)
    except UnicodeDecodeError:
        raise SpecError(field, f"{where} is not UTF-8 text", _fix(field)) from None
    except RecursionError:
        raise SpecError(field, f"{where} nests JSON too deeply", _fix(field)) from None
    except ValueError as err:  # JSONDecodeError, or an integer past Python's digit limit
        raise SpecError(field, f"{where} is not valid JSON ({str(err).splitlines()[0][:80]})",
                        _fix(field)) from None
    if not isinstance(value, dict):
        raise SpecError(field, f"{where} holds a JSON {_json_type(value)}, not an object", _fix(field))
    return value


def _json_type(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def read_json_object(path: str, field: str = "hf_config") -> dict:
    """The JSON object in a config file (bounded read, see the module docstring)."""
    path = config_path(path, field)
    shown = repr(path if len(path) <= 80 else path[:80] + "...")
    return parse_json_object(read_bounded(path, field), shown, field)
