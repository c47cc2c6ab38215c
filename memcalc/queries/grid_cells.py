"""Exact allocator-rounded peaks at many (b, s) points: candidates pruned per cell, int64 arithmetic.

A moment's rounded total is its polynomial plus, for each live storage, the bytes the CUDA caching
allocator adds to reach a multiple of g = 512 (memcalc.allocator.rules): between the constant part of
the rounding (MomentSet.rounding_parts) and that plus the most each varying size can add. So a
moment whose largest possible rounded total stays at or under another moment's smallest one on a
region of shapes never sets the peak there, and is left out for the points in that region.

The regions are cells of one fixed log-scale partition of each axis (8 cells per octave; each
integer below 8 its own cell), so which moments can win in a cell is decided once per model and
regime and kept. The points of a call are binned into cells (two float64 bit shifts), sorted by
the set of moments that can win in their cell, and each set is evaluated exactly in int64 on its
points only: most cells leave one moment, so a point costs a few array operations, not one per
moment. The residue of each size, -size mod g, is taken with a mask (g = 2**9 divides 2**64, so
int64 arithmetic that wraps still gives it exactly).
"""
from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING

from memcalc.core.limits import MAX_SHAPE

if TYPE_CHECKING:
    from types import ModuleType

    import numpy

    from memcalc.engine.codegen import MomentSet

# 8 cells per octave (hi/lo <= 9/8): most cells leave one moment (llama-2-7b: 3433 of 3520, the rest 2)
MANTISSA_BITS = 3
AXIS_CELLS = (MAX_SHAPE.bit_length() + 1) << MANTISSA_BITS  # cell keys of 1..MAX_SHAPE on one axis
CHUNK = 1 << 16  # points binned, sorted and evaluated at a time: int64 arrays of 512 KiB, in cache
INT64_SAFE = 2 ** 61  # every partial sum of the evaluation and the pruning stays under 2**63


def cell_of(np: ModuleType, v: numpy.ndarray) -> numpy.ndarray:
    """Cell key of each positive int64 value (< 2**53, exact in float64): 8 * floor(log2 v) plus
    the 3 bits after the leading one, read from the float64 bit pattern.

    >>> import numpy as np
    >>> cell_of(np, np.array([1, 2, 3, 7, 8, 9, 16, 17, 18, 19])).tolist()
    [0, 8, 12, 22, 24, 25, 32, 32, 33, 33]
    """
    key = v.astype(np.float64).view(np.int64)  # sign 0, 11 exponent bits (bias 1023), 52 mantissa bits
    key >>= 52 - MANTISSA_BITS
    key -= 1023 << MANTISSA_BITS
    return key


def cell_range(np: ModuleType, key: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(smallest, largest) integer of each cell key (empty cells have smallest > largest).

    >>> import numpy as np
    >>> [a.tolist() for a in cell_range(np, np.array([0, 12, 24, 32, 33]))]
    [[1, 3, 8, 16, 18], [1, 3, 8, 17, 19]]
    """
    def start(k: numpy.ndarray) -> numpy.ndarray:
        mant = (1 << MANTISSA_BITS) + (k & ((1 << MANTISSA_BITS) - 1))
        return np.ceil(np.ldexp(mant.astype(np.float64), (k >> MANTISSA_BITS) - MANTISSA_BITS)).astype(np.int64)

    return start(key), start(key + 1) - 1


class CellEvaluator:
    """The rounded peak max_i(total_i + rounding_i) of one MomentSet at arrays of points, with
    the moments that can win kept per cell (built once per model and regime, cached by the
    caller). Exact: equals max(MomentSet.rounded_totals(b, s)) at every point."""

    def __init__(self, np: ModuleType, moment_set: MomentSet, g: int):
        self.np, self.g = np, g
        moments = moment_set.moments
        consts, sizes, per_moment = moment_set.rounding_parts(g)
        self.monos = sorted({mono for m in moments for mono in m.total.terms} | {(0, 0)})
        self.lows = [{**m.total.terms, (0, 0): m.total.terms.get((0, 0), 0) + c}
                     for m, c in zip(moments, consts)]  # total + the rounding every point has
        self.sizes = [{mono: c % g for mono, c in size.terms.items() if c % g} for size in sizes]
        most = [g - gcd(g, *size.values()) for size in self.sizes]  # -size mod g is a multiple of the gcd
        self.rounds = [sorted(mine.items()) for mine in per_moment]  # (size index, storages)
        spread = [sum(n * most[k] for k, n in mine) for mine in self.rounds]
        low = np.array([[row.get(mono, 0) for mono in self.monos] for row in self.lows], dtype=object)
        high = low.copy()
        high[:, 0] += np.array(spread, dtype=object)
        self._low, self._high = low, high  # Python ints until the int64 range is checked
        self.lookups = [self._lookups(np, mine) for mine in self.rounds]
        self.table = np.full(0, -1, dtype=np.int32)  # cell -> group (-1: not learned), grown by rows of b
        self.groups: list[tuple[int, ...]] = []  # group -> moments that can win in its cells
        self._group_of: dict[bytes, int] = {}

    def _lookups(self, np: ModuleType, mine: list[tuple[int, int]]) -> tuple[list, list]:
        """A moment's rounding split into ([(monomial, table)], [(size index, storages)]): the
        sizes c * m + d of one monomial m round by m mod g alone, so together they are one
        g-entry table indexed by m mod g; other sizes keep their own residue."""
        tables: dict[tuple[int, int], numpy.ndarray] = {}
        rest = []
        for k, n in mine:
            size = self.sizes[k]
            varying = [m for m in size if m != (0, 0)]
            if len(varying) != 1:
                rest.append((k, n))
                continue
            r = np.arange(self.g, dtype=np.int64)  # every value of m mod g
            part = n * (-(size[varying[0]] * r + size.get((0, 0), 0)) % self.g)
            tables[varying[0]] = tables.get(varying[0], 0) + part
        return sorted(tables.items()), rest

    def fits_int64(self, b_max: int, s_max: int) -> bool:
        """Whether every quantity of the evaluation and the pruning stays in int64 up to the
        largest cell holding (b_max, s_max)."""
        np = self.np
        hi_b = int(cell_range(np, cell_of(np, np.array([b_max])))[1][0])
        hi_s = int(cell_range(np, cell_of(np, np.array([s_max])))[1][0])
        values = [hi_b ** i * hi_s ** j for i, j in self.monos]
        worst = max(sum(abs(int(c)) * v for c, v in zip(row, values)) for rows in (self._low, self._high)
                    for row in rows)
        return 2 * worst < INT64_SAFE

    def peaks(self, b: numpy.ndarray, s: numpy.ndarray) -> numpy.ndarray:
        """Rounded peaks at 1-d int64 arrays b, s (the caller checked fits_int64), a cache-sized
        chunk at a time (fresh large temporaries cost page faults)."""
        out = self.np.empty(b.shape, dtype=self.np.int64)
        for start in range(0, b.size, CHUNK):
            stop = start + CHUNK
            self._peaks_chunk(b[start:stop], s[start:stop], out[start:stop])
        return out

    def _peaks_chunk(self, b: numpy.ndarray, s: numpy.ndarray, out: numpy.ndarray) -> None:
        np = self.np
        key = cell_of(np, b)
        key *= AXIS_CELLS
        key += cell_of(np, s)
        if key.max() >= self.table.size:  # grown to the largest micro_batch seen (73 KiB below 128)
            grown = np.full((int(key.max()) // AXIS_CELLS + 1) * AXIS_CELLS, -1, dtype=np.int32)
            grown[:self.table.size] = self.table
            self.table = grown
        group = self.table[key]
        if group.min() < 0:
            self._learn(np.flatnonzero(np.bincount(key[group < 0])))  # np.unique imports numpy.ma: 80 ms
            group = self.table[key]
        counts = np.bincount(group, minlength=len(self.groups))
        major = int(counts.argmax())  # most points: evaluated in place on the whole chunk
        self._evaluate(self.groups[major], b, s, out)
        if counts[major] == b.size:
            return
        counts[major] = 0
        rest = np.flatnonzero(group != major)  # the others, sorted by group (a radix sort)
        minor = group[rest]
        order = rest[np.argsort(minor.astype(np.uint16) if len(self.groups) < 2 ** 16 else minor, kind="stable")]
        bo, so, found = b[order], s[order], np.empty(order.shape, dtype=np.int64)
        start = 0
        for k, end in enumerate(np.cumsum(counts).tolist()):
            if end > start:
                self._evaluate(self.groups[k], bo[start:end], so[start:end], found[start:end])
            start = end
        out[order] = found

    def _evaluate(self, keep: tuple[int, ...], b: numpy.ndarray, s: numpy.ndarray,
                  out: numpy.ndarray) -> None:
        """out = max over the moments `keep` of total + rounding at every point, in int64."""
        np, mask = self.np, self.g - 1
        powers: dict[tuple[int, int], numpy.ndarray] = {(1, 0): b, (0, 1): s}
        residues: dict[int, numpy.ndarray] = {}
        indices: dict[tuple[int, int], numpy.ndarray] = {}

        def mono(m: tuple[int, int]) -> numpy.ndarray:
            if m not in powers:
                i, j = m
                powers[m] = mono((i - 1, j)) * b if i else mono((i, j - 1)) * s
            return powers[m]

        def combine(terms: list, const: int) -> numpy.ndarray:  # sum(c * mono) + const, a new array
            acc = None
            for m, c in terms:
                if acc is None:
                    acc = mono(m) * c
                else:
                    acc += mono(m) * c
            if acc is None:
                return np.full(b.shape, const, dtype=np.int64)
            if const:
                acc += const
            return acc

        def residue(k: int) -> numpy.ndarray:
            if k not in residues:
                size = self.sizes[k]
                acc = combine([(m, -c) for m, c in size.items() if m != (0, 0)], -size.get((0, 0), 0))
                residues[k] = np.bitwise_and(acc, mask, out=acc)  # -size mod g, g a power of two
            return residues[k]

        def index(m: tuple[int, int]) -> numpy.ndarray:  # m mod g
            if m not in indices:
                indices[m] = mono(m) & mask
            return indices[m]

        for n, i in enumerate(keep):
            low = self.lows[i]
            total = combine([(m, c) for m, c in low.items() if m != (0, 0)], low.get((0, 0), 0))
            tables, rest = self.lookups[i]
            for m, table in tables:
                total += table[index(m)]
            for k, count in rest:
                total += residue(k) * count if count != 1 else residue(k)
            if n == 0:
                out[...] = total
            else:
                np.maximum(out, total, out=out)

    def _learn(self, keys: numpy.ndarray) -> None:
        """_learn_cells, 256 cells at a time (its temporaries are cells x 4 x moments x monomials)."""
        for start in range(0, keys.size, 256):
            self._learn_cells(keys[start:start + 256])

    def _learn_cells(self, keys: numpy.ndarray) -> None:
        """Which moments can win in each new cell: all but those whose highest rounded total
        stays at or under the lowest one of a moment largest at a corner of the cell, term by
        term over the cell (b**i * s**j grows in b and s, so a positive coefficient's term is
        largest at the top corner, a negative one's at the bottom)."""
        np = self.np
        b0, b1 = cell_range(np, keys // AXIS_CELLS)
        s0, s1 = cell_range(np, keys % AXIS_CELLS)
        low, high = self._low.astype(np.int64), self._high.astype(np.int64)
        powers = np.array(self.monos, dtype=np.int64)  # (M, 2)

        def monos(bv: numpy.ndarray, sv: numpy.ndarray) -> numpy.ndarray:  # (cells, M)
            return bv[:, None] ** powers[:, 0] * sv[:, None] ** powers[:, 1]

        lo, hi = monos(b0, s0), monos(b1, s1)
        corners = np.stack([lo, monos(b0, s1), monos(b1, s0), hi], 1)  # (cells, 4, M)
        tops = (corners @ low.T).argmax(-1)  # (cells, 4): a moment largest at each corner
        diff = high[None, None, :, :] - low[tops][:, :, None, :]  # (cells, 4, moments, M)
        bound = np.where(diff > 0, diff * hi[:, None, None, :], diff * lo[:, None, None, :]).sum(-1)
        moments = np.arange(low.shape[0])
        is_top = (tops[:, :, None] == moments).any(1)  # (cells, moments)
        keep = is_top | ~((bound <= 0) & (tops[:, :, None] != moments)).any(1)
        ids = []
        for row in np.packbits(keep, axis=1):  # the set of moments kept, 8 to a byte
            found = self._group_of.get(row.tobytes())
            if found is None:
                found = self._group_of[row.tobytes()] = len(self.groups)
                self.groups.append(tuple(np.flatnonzero(np.unpackbits(row)[:keep.shape[1]]).tolist()))
            ids.append(found)
        self.table[keys] = ids
