"""estimate_grid(): steady-state peaks over arrays of shapes, evaluated with numpy.

The engine simulates each (model, training without b and s) once into candidate moments whose
totals are polynomials in b and s; the peak is their max. On CUDA every moment's total gets the
allocator's rounding of its live storages, exactly, in int64, with the moments that cannot win in
a region of shapes left out there (memcalc.queries.grid_cells); past int64, Python ints. On CPU (no
rounding) the polynomials' upper envelope or a dense product (eval_polys).
Needs numpy (extra 'grid').
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from memcalc.engine.candidates import Candidates
from memcalc.engine.run import candidates, single_sequence
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.queries.grid_cells import CellEvaluator
from memcalc.core.poly import Poly

if TYPE_CHECKING:
    from types import ModuleType

    import numpy

    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

SHAPE_FIELDS = ("micro_batch", "seq_len")
_EXACT_FLOAT = 2 ** 53  # float64 holds every integer below this exactly
_CHUNK = 1 << 16  # points per matrix product (bounds the temporary to ~CHUNK x candidates)


_CELLS: WeakKeyDictionary = WeakKeyDictionary()  # Candidates -> CellEvaluator


def _candidates(model: ModelSpec, training: TrainingConfig) -> tuple[Candidates, int]:
    if training.sequence_parallel:
        raise NotModelledError("sequence_parallel", "estimate_grid works on whole-token sizes; "
                               "sequence-parallel sizes are b*s/t", "call estimate() per point")
    if training.data_parallel > 1:
        raise NotModelledError("world_size", "estimate_grid evaluates single-process steps",
                               "call estimate() per point for data-parallel ranks")
    found = candidates(model, training)
    return found, found.regime.granularity


def eval_candidates(model: ModelSpec, training: TrainingConfig, b: numpy.ndarray, s: numpy.ndarray):
    """Peaks at every (b, s): the polynomial envelope on CPU, with the allocator's rounding
    (exact, per live storage) on CUDA."""
    from memcalc.refusals.grid import check_grid_variant

    np = _numpy()
    check_grid_variant(model, training, b, s)  # exactly estimate()'s checks
    if b.size and (model.sliding_window is not None or single_sequence(training.with_(micro_batch=1), model)):
        # the program differs on each side of the window (engine.window_reached) and at one
        # sequence (engine.single_sequence)
        return _split_at_shape(np, model, training, b, s)
    return _eval_class(np, model, training, b, s)


def _eval_class(np: ModuleType, model: ModelSpec, training: TrainingConfig, b: numpy.ndarray,
                s: numpy.ndarray):
    """Peaks at points that share training's shape conditions (one simulation)."""
    cands, g = _candidates(model, training)
    if model.moe is not None and cands.steady_set.fractional and b.size:
        # MoE routings sized in fractions of b*s (memcalc.inputs.moe): exact, as estimate() rounds them
        flat = [max(cands.steady_set.rounded_totals(int(x), int(y))) for x, y in zip(b.ravel(), s.ravel())]
        return np.array(flat, dtype=np.int64).reshape(b.shape)
    return _eval_side(np, cands, g, b, s)


def _eval_side(np: ModuleType, cands: Candidates, g: int, b: numpy.ndarray, s: numpy.ndarray):
    """Peaks at every (b, s) from one simulation's candidates: on CUDA, exact in int64 with the
    moments that can win pruned per cell (memcalc.queries.grid_cells), else in Python ints."""
    if g <= 1 or not b.size:
        return eval_polys([m.total for m in cands.steady], b, s)
    cells = _CELLS.get(cands)
    if cells is None:
        cells = _CELLS[cands] = CellEvaluator(np, cands.steady_set, g)
    if g & (g - 1) == 0 and cells.fits_int64(int(b.max()), int(s.max())):
        return cells.peaks(b.ravel(), s.ravel()).reshape(b.shape)
    bound = max(_upper_bound(m.total, (1, int(b.max()), 1, int(s.max()))) for m in cands.steady)
    flat = [max(cands.steady_set.rounded_totals(int(x), int(y))) for x, y in zip(b.ravel(), s.ravel())]
    return np.array(flat, dtype=np.int64 if bound + 512 * 10**6 < 2 ** 62 else object).reshape(b.shape)


def _split_at_shape(np: ModuleType, model: ModelSpec, training: TrainingConfig, b: numpy.ndarray,
                    s: numpy.ndarray):
    """eval_candidates on each class of points that share the shape conditions (below or at
    the sliding window; one sequence or more), each with a training config of a point of that
    class (the simulation it reuses)."""
    reached = s >= model.sliding_window if model.sliding_window is not None else np.zeros(s.shape, bool)
    single = b == 1
    parts = []
    for side in (reached & single, reached & ~single, ~reached & single, ~reached & ~single):
        if side.any():
            probe = training.with_(seq_len=int(s[side].flat[0]), micro_batch=int(b[side].flat[0]))
            parts.append((side, _eval_class(np, model, probe, b[side], s[side])))
    out = np.empty(b.shape, dtype=object if any(p.dtype == object for _, p in parts) else np.int64)
    for side, found in parts:
        out[side] = found
    return out


def _numpy():
    try:
        import numpy
    except ImportError:
        raise MemcalcError("numpy", "estimate_grid needs numpy, which is not installed",
                           "pip install 'memcalc[grid]'") from None
    return numpy


def _upper_bound(p: Poly, box: tuple[int, int, int, int]) -> int:
    """An upper bound of p over b in [b0, b1], s in [s0, s1] (all >= 1): positive terms at the
    top corner, negative terms at the bottom one."""
    b0, b1, s0, s1 = box
    return sum(c * (b1 ** i * s1 ** j if c > 0 else b0 ** i * s0 ** j) for (i, j), c in p.terms.items())


def prune(polys: list[Poly], box: tuple[int, int, int, int]) -> list[Poly]:
    """Drop candidates that never exceed another one on the box (sound: the max is unchanged).

    Only the candidates that are largest at a corner of the box serve as dominators, so the
    pruning costs O(candidates x corners) rather than O(candidates**2).

    >>> prune([Poly.bs(2), Poly.bs(1), Poly.const(3)], (1, 4, 1, 4))
    [Poly(2*b*s), Poly(3)]
    """
    b0, b1, s0, s1 = box
    corners = [(b0, s0), (b0, s1), (b1, s0), (b1, s1)]
    champions = {id(max(polys, key=lambda p: p.eval(x, y))): None for x, y in corners}
    tops = [p for p in polys if id(p) in champions]
    return [p for p in polys if id(p) in champions
            or not any(_upper_bound(p - q, box) <= 0 for q in tops)]


def eval_polys(polys: list[Poly], b: numpy.ndarray, s: numpy.ndarray):
    """max over polys at every (b, s) pair of two equal-shape int64 arrays; exact int64 result.

    When every candidate is linear in b and s takes few distinct values, each distinct s gets the
    upper envelope of the lines p_k(b) = A_k(s) + B_k(s) * b (exact integer breakpoints), and the
    points are looked up in it; otherwise a dense (points x candidates) product is taken.
    """
    np = _numpy()
    if not b.size:
        return np.zeros(b.shape, dtype=np.int64)
    polys = prune(polys, (int(b.min()), int(b.max()), int(s.min()), int(s.max())))
    bound = max(_upper_bound(p, (1, int(b.max()), 1, int(s.max()))) for p in polys)
    if bound >= 2 ** 62:  # beyond int64: exact Python ints, slowly
        flat = [max(p.eval(int(x), int(y)) for p in polys) for x, y in zip(b.ravel(), s.ravel())]
        return np.array(flat, dtype=object).reshape(b.shape)
    s_values, s_index = np.unique(s.ravel(), return_inverse=True)
    linear_in_b = all(i <= 1 for p in polys for i, _ in p.terms)
    if linear_in_b and len(polys) > 8 and s_values.size * 64 <= b.size:
        return _eval_envelopes(np, polys, b.ravel(), s_values, s_index).reshape(b.shape)
    if bound >= _EXACT_FLOAT:
        flat = [max(p.eval(int(x), int(y)) for p in polys) for x, y in zip(b.ravel(), s.ravel())]
        return np.array(flat, dtype=np.int64).reshape(b.shape)
    return _eval_dense(np, polys, b.ravel(), s.ravel()).reshape(b.shape)


def _eval_dense(np: ModuleType, polys: list[Poly], b: numpy.ndarray, s: numpy.ndarray):
    monos = sorted({m for p in polys for m in p.terms})
    coeffs = np.array([[p.terms.get(m, 0) for p in polys] for m in monos], dtype=np.float64)
    out = np.empty(b.shape, dtype=np.int64)
    for start in range(0, b.size, _CHUNK):
        bb = b[start:start + _CHUNK].astype(np.float64)
        ss = s[start:start + _CHUNK].astype(np.float64)
        mat = np.stack([bb ** i * ss ** j for i, j in monos], 1)
        out[start:start + _CHUNK] = (mat @ coeffs).max(axis=1).astype(np.int64)
    return out


def _line_coeffs(np: ModuleType, polys: list[Poly], s_values: numpy.ndarray):
    """A[k, u], B[k, u]: candidate k at s = s_values[u] is A + B * b (int64; callers bound it)."""
    a = np.zeros((len(polys), s_values.size), dtype=np.int64)
    c = np.zeros((len(polys), s_values.size), dtype=np.int64)
    for k, p in enumerate(polys):
        for (i, j), coef in p.terms.items():
            (a if i == 0 else c)[k] += coef * s_values ** j
    return a, c


def _survivors(np: ModuleType, a: numpy.ndarray, c: numpy.ndarray, lo: int, hi: int):
    """mask[k, u]: line k is not below one of the two lines on top at b = lo and b = hi (a line
    below another at both ends of [lo, hi] is below it on the whole interval)."""
    at_lo, at_hi = a + c * lo, a + c * hi
    keep = np.ones(a.shape, dtype=bool)
    cols, rows = np.arange(a.shape[1]), np.arange(a.shape[0])[:, None]
    for top in (at_lo.argmax(axis=0), at_hi.argmax(axis=0)):
        below = (at_lo <= at_lo[top, cols]) & (at_hi <= at_hi[top, cols])
        keep &= ~below | (rows == top)
    return keep


def upper_envelope(lines: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Indices of the lines (intercept, slope) that form max_k(A_k + B_k x) for integer x >= 1, in
    order, and the integer x at which each next one takes over (exact integer arithmetic).

    >>> upper_envelope([(10, 0), (-20, 5), (4, 2), (0, 1)])  # 10, then 4 + 2x from 3, then 5x - 20
    ([0, 2, 1], [3, 8])
    """
    order = sorted(range(len(lines)), key=lambda k: (lines[k][1], lines[k][0]))
    hull: list[int] = []
    for k in order:
        a3, b3 = lines[k]
        if hull and lines[hull[-1]][1] == b3:
            hull.pop()  # same slope: the later one (larger intercept) wins
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = lines[hull[-2]], lines[hull[-1]]
            if (a1 - a3) * (b2 - b1) <= (a1 - a2) * (b3 - b1):
                hull.pop()  # the middle line is never strictly on top
            else:
                break
        hull.append(k)
    takeover = []
    for k, nxt in zip(hull, hull[1:]):
        (a1, b1), (a2, b2) = lines[k], lines[nxt]
        takeover.append(-((a2 - a1) // (b2 - b1)))  # ceil((a1 - a2) / (b2 - b1))
    return hull, takeover


def _eval_envelopes(np: ModuleType, polys: list[Poly], b: numpy.ndarray, s_values: numpy.ndarray,
                    s_index: numpy.ndarray):
    a, c = _line_coeffs(np, polys, s_values)
    keep = _survivors(np, a, c, int(b.min()), int(b.max()))
    out = np.empty(b.shape, dtype=np.int64)
    order = np.argsort(s_index, kind="stable")
    bounds = np.searchsorted(s_index[order], np.arange(s_values.size + 1))
    for u in range(s_values.size):
        rows = order[bounds[u]:bounds[u + 1]]
        if not rows.size:
            continue
        ks = np.flatnonzero(keep[:, u])
        lines = list(zip(a[ks, u].tolist(), c[ks, u].tolist()))
        hull, takeover = upper_envelope(lines)
        pick = np.searchsorted(np.array(takeover, dtype=np.int64), b[rows], side="right")
        hull_a = np.array([lines[k][0] for k in hull], dtype=np.int64)
        hull_b = np.array([lines[k][1] for k in hull], dtype=np.int64)
        out[rows] = hull_a[pick] + hull_b[pick] * b[rows]
    return out


def estimate_grid(model: ModelSpec, training: TrainingConfig, **arrays):
    """Steady-state peak bytes for every point of broadcast arrays of shapes (and other fields).

    `micro_batch` and `seq_len` are evaluated on the cached polynomials; any other TrainingConfig
    or ModelSpec field given as an array is looped over its distinct values.

    >>> import numpy as np
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> grid = estimate_grid(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8),
    ...                      micro_batch=np.arange(1, 5)[:, None], seq_len=np.array([128, 256]))
    >>> grid.shape
    (4, 2)
    """
    from memcalc.refusals.grid import grid_arrays

    np = _numpy()
    fields, b, s = grid_arrays(np, model, training, arrays)  # types, ranges, broadcasting
    b, s = np.asarray(b, order="C"), np.asarray(s, order="C")  # broadcast views made contiguous
    if not fields:
        return eval_candidates(model, training, b, s)
    return _grid_over_fields(np, model, training, fields, b, s)


def _grid_over_fields(np: ModuleType, model: ModelSpec, training: TrainingConfig, fields: dict,
                      b: numpy.ndarray, s: numpy.ndarray):
    model_fields = set(type(model).model_fields)
    train_fields = set(type(training).model_fields)
    for name in fields:
        if name not in model_fields | train_fields:
            raise MemcalcError(name, "is not a ModelSpec or TrainingConfig field",
                               "pass micro_batch, seq_len, or a field such as num_layers or precision")
    names = list(fields)
    keys = np.stack([np.asarray(fields[n]).astype(object).ravel() for n in names], 1)
    out = np.empty(b.size, dtype=np.int64)
    for combo in {tuple(row) for row in keys.tolist()}:
        mask = np.all(keys == np.array(combo, dtype=object), axis=1)
        changes = {n: (v.item() if hasattr(v, "item") else v) for n, v in zip(names, combo)}
        m = model.with_(**{k: v for k, v in changes.items() if k in model_fields})
        t = training.with_(**{k: v for k, v in changes.items() if k in train_fields and k not in model_fields})
        found = eval_candidates(m, t, b.ravel()[mask], s.ravel()[mask])
        if found.dtype == object:  # beyond int64: exact Python ints
            out = out.astype(object)
        out[mask] = found
    return out.reshape(b.shape)
