"""Argument checks every public entry point runs before any work: types, ranges, finiteness, the
ceilings of memcalc.limits, and what the model's implementation can run. Each failure is one
MemcalcError naming the field the caller gave and the fix.

>>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
>>> check_step(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=4096))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
memcalc.errors.SpecError: seq_len: 4,096 exceeds max_position_embeddings=1024 (GPT-2's learned ...
"""
from __future__ import annotations

import math
import numbers

from memcalc import limits
from memcalc.errors import MemcalcError, SpecError


def _short(value, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def check_int(field: str, value, lo: int = 1, hi: int | None = None) -> int:
    """`value` as a Python int in [lo, hi]: an int or numpy integer, never a bool, float or string.

    >>> check_int("top", 3), check_int("top", 0, lo=0)
    (3, 0)
    >>> check_int("micro_batch", True)
    Traceback (most recent call last):
    ...
    memcalc.errors.MemcalcError: micro_batch: True is not an integer; fix: pass an integer >= 1
    """
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi:,}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise MemcalcError(field, f"{_short(value)} is not an integer", f"pass an integer {bound}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise MemcalcError(field, f"must be {bound}, got {_short(value)}", f"pass an integer {bound}")
    return value


def check_fraction(field: str, value, fix: str) -> float:
    """A finite real number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MemcalcError(field, f"{_short(value)} is not a number", fix)
    value = float(value)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise MemcalcError(field, f"must be in (0, 1], got {value}", fix)
    return value


def check_model(model) -> None:
    """A ModelSpec within the ceilings of memcalc.limits."""
    from memcalc.specs import ModelSpec

    if not isinstance(model, ModelSpec):
        fix = (f"pass ModelSpec.preset({model!r})" if isinstance(model, str) and len(model) < 60
               else "pass a ModelSpec (ModelSpec.preset(name), ModelSpec.from_hf_config(path))")
        raise SpecError("model", f"expected a ModelSpec, got {type(model).__name__}", fix)
    for field, ceiling in limits.MODEL_CEILINGS.items():
        value = getattr(model, field)
        if value is not None and value > ceiling:
            raise SpecError(field, f"{value:,} is above memcalc's ceiling of {ceiling:,}",
                            f"use {field} <= {ceiling:,} (memcalc.limits: {_why(field)})")


def check_training(training) -> None:
    """A TrainingConfig within the ceilings of memcalc.limits."""
    from memcalc.training import TrainingConfig

    if not isinstance(training, TrainingConfig):
        raise SpecError("training", f"expected a TrainingConfig, got {type(training).__name__}",
                        "pass TrainingConfig(micro_batch=..., seq_len=...)")
    for field, ceiling in limits.TRAINING_CEILINGS.items():
        value = getattr(training, field)
        if value is not None and value > ceiling:
            raise SpecError(field, f"{value:,} is above memcalc's ceiling of {ceiling:,}",
                            f"use {field} <= {ceiling:,} (memcalc.limits: {_why(field)})")
    if training.data_parallel > limits.MAX_DATA_PARALLEL:
        raise SpecError("world_size", f"{training.world_size:,} ranks make {training.data_parallel:,} "
                        f"data-parallel ranks, above memcalc's ceiling of {limits.MAX_DATA_PARALLEL:,}",
                        f"use world_size <= {limits.MAX_DATA_PARALLEL:,} x tensor_parallel "
                        "(memcalc.limits: per-rank accounting visits every rank)")


def _why(field: str) -> str:
    return {"num_layers": "the engine simulates every layer",
            "tensor_parallel": "past any NVLink domain"}.get(field, "past any model in use")


def learned_positions(model) -> bool:
    """Whether the model cannot run sequences longer than max_position_embeddings: GPT-2's learned
    position table (and causal-mask buffer), and the reference models' precomputed tables
    (validate/models.py: causal_mask, Rotary). HF Llama computes rotary angles per call."""
    return model.family == "gpt2" or model.implementation == "reference"


def check_runnable(model, training) -> None:
    """What the implementation can run: seq_len within a fixed position table."""
    if learned_positions(model) and training.seq_len > model.max_position_embeddings:
        p = model.max_position_embeddings
        table = ("GPT-2's learned position table" if model.family == "gpt2"
                 else "the reference model's position tables")
        raise SpecError("seq_len", f"{training.seq_len:,} exceeds max_position_embeddings={p} "
                        f"({table} has {p} rows)",
                        f"use seq_len <= {p}, or raise max_position_embeddings")


def check_step(model, training) -> None:
    """Types, ceilings and runnability of one (model, training) step: the top of estimate()."""
    check_model(model)
    check_training(training)
    check_runnable(model, training)


def check_estimate(model, training) -> None:
    """Exactly what estimate() checks, for callers that evaluate the engine another way."""
    from memcalc.engine import check_supported

    check_step(model, training)
    check_supported(model, training)


def check_name(field: str, value, example: str) -> str:
    """A non-empty string of reasonable length (preset and GPU names)."""
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise MemcalcError(field, f"{_short(value)} is not a name", f"pass a name, e.g. {example!r}")
    return value


def check_search(model, training, field: str) -> None:
    """check_estimate for a capacity search over `field`: the caller's own value of that field
    is replaced, so it is checked at the search's first probe instead."""
    from memcalc.specs import ModelSpec
    from memcalc.training import TrainingConfig

    if not isinstance(model, ModelSpec) or not isinstance(training, TrainingConfig):
        check_step(model, training)  # raises, naming the argument of the wrong type
    t = training.tensor_parallel
    if field == "num_layers":
        model = model.with_(num_layers=1)
    elif field == "world_size":
        training = training.with_(world_size=t * (2 if training.fsdp_mixed_precision else 1))
    else:
        training = training.with_(**{field: t if field == "seq_len" else 1})
    check_estimate(model, training)


def check_plan(model, training, global_batch: int, seq_len: int, precisions, checkpointing) -> None:
    """plan()'s arguments: estimate()'s checks on every variant it will evaluate."""
    from memcalc.planner import CHECKPOINTING, PRECISIONS

    for field, given, known in (("precisions", precisions, PRECISIONS),
                                ("checkpointing", checkpointing, CHECKPOINTING)):
        if not isinstance(given, (list, tuple)) or not all(isinstance(x, str) and x in known for x in given):
            raise MemcalcError(field, f"{_short(given)} is not a list of {', '.join(known)}",
                               f"pass a subset of {list(known)}")
    check_step(model, training)
    for precision in precisions:
        for mode in checkpointing:
            check_estimate(model, training.with_(precision=precision, checkpointing=mode,
                                                 seq_len=seq_len, micro_batch=global_batch))


# ---- estimate_grid ------------------------------------------------------------------------------
def _rectangular(np, name: str, values):
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as err:  # ragged nested lists
        raise MemcalcError(name, f"is not a rectangular array ({str(err).splitlines()[0][:60]})",
                           "pass a numpy array or equal-length nested lists") from None


def _shape_values(np, name: str, arr):
    """An int64 array of integers in [1, MAX_SHAPE], checked in Python ints (uint64 included)."""
    fix = f"pass integers in [1, {limits.MAX_SHAPE:,}], e.g. {name}=np.arange(1, 65)"
    if arr.dtype.kind == "O":
        flat = arr.ravel().tolist()
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise MemcalcError(name, "must be an array of integers", fix)
    elif arr.dtype.kind not in "iu" and arr.size:
        raise MemcalcError(name, f"must be an array of integers, got dtype {arr.dtype}", fix)
    else:
        flat = [int(arr.min()), int(arr.max())] if arr.size else []
    if not arr.size:
        return np.zeros(arr.shape, dtype=np.int64)
    if flat and not (1 <= min(flat) and max(flat) <= limits.MAX_SHAPE):
        raise MemcalcError(name, f"values must be in [1, {limits.MAX_SHAPE:,}], got "
                           f"{_short(min(flat))}..{_short(max(flat))}", fix)
    return arr.astype(np.int64)


_SCALARS = (int, float, str, bool, type(None))


def grid_arrays(np, model, training, arrays: dict):
    """estimate_grid's arrays, checked and broadcast: (other fields, micro_batch, seq_len)."""
    check_step(model, training)
    known = set(type(model).model_fields) | set(type(training).model_fields)
    for name in arrays:
        if name not in known:
            raise MemcalcError(name, "is not a ModelSpec or TrainingConfig field",
                               "pass micro_batch, seq_len, or a field such as num_layers or precision")
    arrs = {name: _rectangular(np, name, values) for name, values in arrays.items()}
    try:
        shape = np.broadcast_shapes(*[a.shape for a in arrs.values()]) if arrs else ()
    except ValueError:
        shapes = ", ".join(f"{n}{a.shape}" for n, a in arrs.items())
        raise MemcalcError(", ".join(arrs), f"shapes do not broadcast: {shapes}",
                           "give arrays numpy can broadcast, e.g. micro_batch=b[:, None], "
                           "seq_len=s[None, :]") from None
    if math.prod(shape) > limits.MAX_GRID_POINTS:
        raise MemcalcError(", ".join(arrs), f"{math.prod(shape):,} points, above memcalc's ceiling of "
                           f"{limits.MAX_GRID_POINTS:,}", "evaluate the grid in slices")
    b = _shape_values(np, "micro_batch", arrs.pop("micro_batch", np.asarray(training.micro_batch)))
    s = _shape_values(np, "seq_len", arrs.pop("seq_len", np.asarray(training.seq_len)))
    for name, arr in arrs.items():
        if arr.dtype.kind not in "biufUS" and not all(isinstance(v, _SCALARS)
                                                       for v in arr.ravel().tolist()):
            raise MemcalcError(name, "must hold plain values (numbers, strings, booleans)",
                               f"pass the {name} values as a numpy array")
    if arrs:
        keys = {tuple(row) for row in zip(*[np.broadcast_to(a, shape).ravel().tolist()
                                            for a in arrs.values()])}
        if len(keys) > limits.MAX_GRID_VARIANTS:
            raise MemcalcError(", ".join(arrs), f"{len(keys):,} distinct combinations, above "
                               f"memcalc's ceiling of {limits.MAX_GRID_VARIANTS} (one simulation each)",
                               "split the call, or vary only micro_batch and seq_len")
    fields = {n: np.broadcast_to(a, shape) for n, a in arrs.items()}
    return fields, np.broadcast_to(b, shape), np.broadcast_to(s, shape)


def check_grid_variant(model, training, b, s) -> None:
    """estimate()'s checks for one variant of a grid, at its largest shape."""
    if getattr(b, "size", 0):
        training = training.with_(micro_batch=int(b.max()), seq_len=int(s.max()))
    check_estimate(model, training)


def check_out_dir(field: str, path: str, create: bool) -> None:
    """An output folder that exists or can be made: no file in the way, a sane path."""
    import os

    if not path or len(path) > limits.MAX_PATH_CHARS or "\0" in path:
        raise MemcalcError(field, f"{_short(path)} is not a usable folder path", "pass a folder, e.g. tables")
    if not create:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise MemcalcError(field, f"cannot make the folder {_short(path)} ({err.strerror})",
                           "pass a folder that can be created (no file in the way)") from None
    if not os.access(path, os.W_OK):
        raise MemcalcError(field, f"{_short(path)} is not writable", "pass a writable folder")
