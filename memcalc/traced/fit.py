"""From traced runs at a few shapes to a program in b and s (issue 25; no torch).

Runs at several (b, s) must make the same storages in the same order and free them at the same
ops (the event streams of memcalc.traced.record, storage sizes aside); each storage's bytes are
then fitted as an exact integer polynomial sum(c_ij * b**i * s**j), i <= 1, j <= 2, from a grid of
shapes (b in B_FIT, s in S_FIT: the tensor-product Vandermonde system has one solution) and
checked at shapes not used to fit (CHECK). A stream that differs between shapes, a coefficient
that is not an integer or a size the check misses is refused by name, never approximated.
"""
from __future__ import annotations

from fractions import Fraction

from memcalc.core.errors import NotModelledError
from memcalc.core.poly import Poly

B_FIT = (2, 3)
S_FIT = (16, 24, 32)
CHECK = ((4, 40),)
"""Shapes for b >= 2. One sequence (b = 1) is fitted on its own, in s alone, from (1, s) for s in
S_FIT and checked at (1, 40): a size-1 dimension makes views where b >= 2 makes copies
(memcalc.engine.run.single_sequence), so the two need not be one program."""
MONOS_B = tuple((i, j) for i in (0, 1) for j in (0, 1, 2))
MONOS_1 = tuple((0, j) for j in (0, 1, 2))


def structure(events: list[tuple]) -> list[tuple]:
    """The events without the storages' sizes (what must agree between shapes), each run of
    frees between two instants in storage order: storages freed together (a frame's locals, a
    node's saved tensors) are freed in an order that varies from run to run, and no instant sees
    between them.

    >>> structure([("a", 0, 64), ("a", 1, 8), ("i", "aten::mul"), ("f", 1), ("f", 0)])
    [('a', 0), ('a', 1), ('i', 'aten::mul'), ('f', 0), ('f', 1)]
    """
    out: list[tuple] = []
    frees: list[int] = []
    for e in events:
        if e[0] == "f":
            frees.append(e[1])
            continue
        if frees:
            out += [("f", sid) for sid in sorted(frees)]
            frees = []
        out.append((e[0], e[1]))
    return out + [("f", sid) for sid in sorted(frees)]


def sizes(events: list[tuple]) -> dict[int, int]:
    """Bytes of each storage id.

    >>> sizes([("a", 0, 64), ("a", 1, 8)])
    {0: 64, 1: 8}
    """
    return {e[1]: e[2] for e in events if e[0] == "a"}


def check_aligned(streams: list[list[tuple]], shapes: list[tuple[int, int]]) -> None:
    """Refuse, naming the first op where they differ, streams that are not one program.

    >>> check_aligned([[("i", "aten::mm")], [("i", "aten::bmm")]], [(2, 16), (3, 16)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: module: the step runs other ops at (b, s) = (3, 16) ...
    """
    ref = structure(streams[0])
    for stream, shape in zip(streams[1:], shapes[1:]):
        other = structure(stream)
        if other == ref:
            continue
        k = next((i for i, (x, y) in enumerate(zip(ref, other)) if x != y), min(len(ref), len(other)))
        where = ref[k] if k < len(ref) else other[k]
        raise NotModelledError("module", f"the step runs other ops at (b, s) = {shape} than at "
                               f"{shapes[0]} (event {k}: {where[0]} {where[1]}): its ops depend on "
                               "the shape (a branch on a size, a kernel chosen by size)",
                               "use a hand-written program (memcalc.families) for this model")


def solve(rows: list[list[int]], values: list[int]) -> list[Fraction]:
    """The exact solution of a square linear system (Gaussian elimination over Fractions).

    >>> solve([[1, 1], [1, 2]], [3, 5])
    [Fraction(1, 1), Fraction(2, 1)]
    """
    n = len(rows)
    m = [[Fraction(x) for x in row] + [Fraction(v)] for row, v in zip(rows, values)]
    for c in range(n):
        p = next(r for r in range(c, n) if m[r][c] != 0)
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c and m[r][c] != 0:
                f = m[r][c] / m[c][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_sizes(per_shape: list[dict[int, int]], shapes: list[tuple[int, int]],
              monos: tuple) -> dict[int, Poly]:
    """Each storage's bytes as a Poly over `monos`, solved from its bytes at `shapes`.

    >>> fit_sizes([{0: 8 * b * s + 4} for b, s in [(2, 1), (3, 1)]], [(2, 1), (3, 1)], ((0, 0), (1, 0)))
    {0: Poly(4 + 8*b)}
    """
    rows = [[b ** i * s ** j for i, j in monos] for b, s in shapes]
    inverse_cache: dict[tuple, dict] = {}
    out = {}
    for sid in per_shape[0]:
        values = tuple(d[sid] for d in per_shape)
        if values not in inverse_cache:
            coeffs = solve(rows, list(values))
            if any(c.denominator != 1 for c in coeffs):
                raise NotModelledError("module", f"storage {sid}'s bytes {values} at {shapes} are no "
                                       "integer polynomial in b and s of degree <= 1 in b and 2 in s",
                                       "use a hand-written program (memcalc.families)")
            inverse_cache[values] = Poly({m: int(c) for m, c in zip(monos, coeffs)})
        out[sid] = inverse_cache[values]
    return out


def check_fit(fitted: dict[int, Poly], actual: dict[int, int], shape: tuple[int, int]) -> None:
    """Refuse when a fitted size misses the bytes a run at a shape not used to fit measured.

    >>> check_fit({0: Poly.bs(4)}, {0: 4 * 5 * 7}, (5, 7))
    >>> check_fit({0: Poly.bs(4)}, {0: 5}, (5, 7))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: module: storage 0 measured 5 bytes at (b, s) = (5, 7), its fit ...
    """
    for sid, poly in fitted.items():
        got = poly.eval(*shape)
        if got != actual[sid]:
            raise NotModelledError("module", f"storage {sid} measured {actual[sid]} bytes at (b, s) = "
                                   f"{shape}, its fit {poly} gives {got}",
                                   "use a hand-written program (memcalc.families)")
