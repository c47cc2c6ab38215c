"""The disk cache of traced programs (issue 25): a traced step's candidate moments are stored as JSON, keyed by what
determines it, so that the second answer reads a file instead of tracing (no torch imported).

Key: the model's source (the factory's and the loss's module source and qualified names, or an HF
config's JSON), the vocabulary, the training regime (every TrainingConfig field but the shape),
the shape condition (b = 1 or not), the fitting shapes, the tracer's own source, and the installed
torch and transformers versions (their dist-info folders: no import). A model whose source cannot
be read (a lambda typed at a prompt) is not cached on disk. The folder is $MEMCALC_TRACE_CACHE,
else ~/.cache/memcalc/traced.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from memcalc.core.poly import Poly
from memcalc.traced.fit import B_FIT, CHECK, S_FIT
from memcalc.tape.moment import Moment


def cache_dir() -> Path:
    """Where traced programs are kept.

    >>> os.environ["MEMCALC_TRACE_CACHE"] = "/tmp/x"; str(cache_dir()); del os.environ["MEMCALC_TRACE_CACHE"]
    '/tmp/x'
    """
    found = os.environ.get("MEMCALC_TRACE_CACHE")
    return Path(found) if found else Path.home() / ".cache" / "memcalc" / "traced"


def _version(name: str) -> str | None:
    """An installed distribution's version from its dist-info folder's name, found beside the
    package without importing it (importlib.metadata.version scans every distribution: about
    57 ms each, measured, against a glob of one folder).

    >>> _version("no_such_package_here") is None
    True
    """
    from importlib.util import find_spec

    found = find_spec(name)
    if found is None or not found.submodule_search_locations:
        return None
    site = Path(list(found.submodule_search_locations)[0]).parent
    infos = sorted(site.glob(f"{name}-*.dist-info"))
    return infos[0].name[len(name) + 1:-len(".dist-info")] if infos else None


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
    if callable(getattr(obj, "resolve", None)):  # memcalc.traced.spec.ModuleRef: what it names
        obj = obj.resolve()
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
    for name in ("runner.py", "record.py", "fake_kernels.py", "fit.py", "hf_patches.py", "optim.py", "program.py",
                 "hf.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def key_of(model: Any, regime: tuple, single: bool) -> str | None:
    """The cache key of a traced model's fit under a regime (None: not cacheable)."""
    parts = [source_of(model.factory), source_of(model.loss),
             model.inputs if isinstance(model.inputs, int) else source_of(model.inputs)]
    if any(p is None for p in parts):
        return None
    blob = json.dumps([parts, repr(regime), single, B_FIT, S_FIT, CHECK, model.far_seq_len,
                       _version("torch"), _version("transformers"), _tracer_source()], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _poly(terms: list) -> Poly:
    return Poly({(i, j): c for i, j, c in terms})


def _terms(p: Poly) -> list:
    return [[i, j, c] for (i, j), c in p.terms.items()]


def load(key: str | None) -> tuple[list[Moment], list[Moment], list, list | None] | None:
    """The stored (steady moments, first-step moments, parameters, sequence limit), or None."""
    if key is None:
        return None
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    moments = [[Moment(ph, label, _poly(total), {c: _poly(t) for c, t in cats.items()})
                for ph, label, total, cats in data[part]] for part in ("steady", "first")]
    return moments[0], moments[1], [tuple(p) for p in data["params"]], data.get("seq_limit")


def store(key: str | None, steady: list[Moment], first: list[Moment], params: list,
          seq_limit: list | None = None) -> None:
    """Keep a traced program's moments (a failure to write leaves the cache as it was)."""
    if key is None:
        return
    data = {part: [[m.phase, m.label, _terms(m.total), {c: _terms(t) for c, t in m.by_category.items()}]
                   for m in moments] for part, moments in (("steady", steady), ("first", first))}
    data["params"], data["seq_limit"] = params, seq_limit
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(folder / f"{key}.json")
    except OSError:
        pass
