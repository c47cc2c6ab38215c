"""The disk cache of traced programs (issue 25): a fitted step is stored as JSON, keyed by what
determines it, so that the second answer reads a file instead of tracing (no torch imported).

Key: the model's source (the factory's and the loss's module source and qualified names, or an HF
config's JSON), the vocabulary, the training regime (every TrainingConfig field but the shape),
the shape condition (b = 1 or not), the fitting shapes, the tracer's own source, and the installed
torch and transformers versions (importlib.metadata: no import). A model whose source cannot be read (a lambda typed at
a prompt) is not cached on disk. The folder is $MEMCALC_TRACE_CACHE, else ~/.cache/memcalc/traced.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from memcalc.core.poly import Poly
from memcalc.traced.fit import B_FIT, CHECK, S_FIT
from memcalc.traced.program import FittedStep


def cache_dir() -> Path:
    """Where traced programs are kept.

    >>> os.environ["MEMCALC_TRACE_CACHE"] = "/tmp/x"; str(cache_dir()); del os.environ["MEMCALC_TRACE_CACHE"]
    '/tmp/x'
    """
    found = os.environ.get("MEMCALC_TRACE_CACHE")
    return Path(found) if found else Path.home() / ".cache" / "memcalc" / "traced"


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def source_of(obj: Callable | None) -> str | None:
    """What determines a factory's or a loss's ops: an HF config's JSON, or its module's source and
    its qualified name; None where the source cannot be read.

    >>> source_of(None)
    ''
    >>> source_of(source_of).splitlines()[0]
    'memcalc.traced.disk:source_of'
    """
    import inspect

    if obj is None:
        return ""
    cfg = getattr(obj, "cfg", None)
    if isinstance(cfg, dict):  # memcalc.traced.hf's factory: the config determines the model
        return json.dumps(cfg, sort_keys=True, default=str)
    module = inspect.getmodule(obj)
    try:
        text = inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        return None
    if text is None or getattr(obj, "__name__", "") == "<lambda>" and module.__name__ == "__main__":
        return None
    return f"{module.__name__}:{getattr(obj, '__qualname__', type(obj).__qualname__)}\n{text}"


def _tracer_source() -> str:
    """A digest of the tracer's own code (a change to how steps are traced invalidates the cache)."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("runner.py", "record.py", "fit.py", "hf_patches.py", "optim.py", "program.py", "hf.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def key_of(model: Any, regime: tuple, single: bool) -> str | None:
    """The cache key of a traced model's fit under a regime (None: not cacheable)."""
    parts = [source_of(model.factory), source_of(model.loss)]
    if any(p is None for p in parts):
        return None
    blob = json.dumps([parts, model.vocab_size, repr(regime), single, B_FIT, S_FIT, CHECK,
                       _version("torch"), _version("transformers"), _tracer_source()], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load(key: str | None) -> tuple[FittedStep, list] | None:
    """The stored fit, or None."""
    if key is None:
        return None
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    sizes = {int(k): Poly({(i, j): c for i, j, c in v}) for k, v in data["sizes"].items()}
    cats = {int(k): v for k, v in data["categories"].items()}
    return FittedStep([tuple(e) for e in data["events"]], sizes, cats), [tuple(p) for p in data["params"]]


def store(key: str | None, step: FittedStep, params: list) -> None:
    """Keep a fit (a failure to write leaves the cache as it was)."""
    if key is None:
        return
    data = {"events": step.events, "categories": step.categories, "params": params,
            "sizes": {k: [[i, j, c] for (i, j), c in p.terms.items()] for k, p in step.sizes.items()}}
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(folder / f"{key}.json")
    except OSError:
        pass
