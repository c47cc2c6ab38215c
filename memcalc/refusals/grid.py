"""estimate_grid's arrays: rectangular, broadcastable, integer shapes within the ceilings, and
estimate()'s checks for every variant. Each failure is one MemcalcError naming the field."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from memcalc.core import limits
from memcalc.core.arguments import shown
from memcalc.core.errors import MemcalcError
from memcalc.refusals.step import check_estimate, check_step

if TYPE_CHECKING:
    from types import ModuleType

    import numpy

    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

_SCALARS = (int, float, str, bool, type(None))


def _rectangular(np: ModuleType, name: str, values: object):
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as err:  # ragged nested lists
        raise MemcalcError(name, f"is not a rectangular array ({str(err).splitlines()[0][:60]})",
                           "pass a numpy array or equal-length nested lists") from None


def _shape_values(np: ModuleType, name: str, arr: numpy.ndarray):
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
                           f"{shown(min(flat))}..{shown(max(flat))}", fix)
    return arr.astype(np.int64)


def grid_arrays(np: ModuleType, model: ModelSpec, training: TrainingConfig, arrays: dict):
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


def check_grid_variant(model: ModelSpec, training: TrainingConfig, b: numpy.ndarray, s: numpy.ndarray) -> None:
    """estimate()'s checks for one variant of a grid, at its largest shape."""
    if getattr(b, "size", 0):
        training = training.with_(micro_batch=int(b.max()), seq_len=int(s.max()))
    check_estimate(model, training)
