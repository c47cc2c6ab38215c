"""Record mode of the memory ledger (memcalc.engine.depth): every instant logged unpruned, with
the live storages counted per (category, size terms) and packed into one integer (`packed`,
SLOT bits a key) and the total's coefficients into another (`packed_total`, TOTAL_SLOT bits a
monomial), so that the depth derivation compares instants with integer arithmetic; and what
reads them back (RecordedLive, unpack_dense, lifted).
"""
from __future__ import annotations

import struct
from bisect import bisect_right

from memcalc.core.poly import Poly
from memcalc.tape.graph import Storage, count_slack
from memcalc.tape.ledger import Memory

SLOT = 40
"""Bits per (category, size) in `packed` (no count of live storages comes near 2**30)."""
TOTAL_SLOT = 192
"""Bits per monomial in `packed_total` (no byte count comes near 2**190)."""


class RecordingMemory(Memory):
    """Memory in record mode: every mark logged, the live storages counted per (category, size
    terms) and packed into one integer (memcalc.engine.depth)."""


    def __init__(self, record: bool | dict = True, granularity: int = 1) -> None:
        """`record`: True, or a dict of bit offsets (`index`) shared between runs."""
        super().__init__(granularity)
        self.sizes: dict[int, tuple] = {}
        """id(a held storage) -> (it, what holding it changed) (`holds` has its references)."""
        self.log: list[tuple] = []
        """every mark, unpruned, in order, as (key, label, categories seen, stamp,
        `packed`, `packed_total`): key (phase, micro, where, n-th mark there); the live storages
        {(category, size terms): how many} (every number of a moment is linear in these) are
        `packed`, which `recorded_live` reads back (the stamp: how many activations before)."""
        self._live_keys_seen: list[tuple] = []
        """the (category, size terms) held so far, by local number (_recorded_key)."""
        self._counts: list[int] = []
        """live storages of each, by local number."""
        self._activations: list[list[int]] = []
        """the stamps at which each became live (0 to 1), by local number."""
        self._stamp = 0
        self._cats: tuple[str, ...] = ()  # the categories seen, in order
        self._by_value: dict[tuple, tuple] = {}  # (category, *size terms) -> _recorded_key
        self._sizes_seen: list[Poly] = []  # the size Polys _recorded holds by id
        self._recorded: dict[tuple[int, str], tuple] = {}
        """(id(size Poly), category) -> what holding a storage of it changes
        (_recorded_key)."""
        self.index: dict[tuple, int] = record if isinstance(record, dict) else {}
        """(category, size terms) -> bit offset in `packed`; pass a dict as `record` to share
        the numbering between runs."""
        self._bits: dict[tuple, tuple[int, int]] = {}  # (category, size terms) -> (local number, 1 << offset)
        self.packed = 0
        self.packed_total: int | None = 0
        """The total's coefficients as one integer, monomial ("mono", m) at index[("mono", m)]
        (TOTAL_SLOT bits each, balanced digits); None once a size has a fractional coefficient."""
        self._packed_sizes: dict[tuple, int] = {}
        """The live counts as one integer, count << index[key] summed: linear like them, so
        memcalc.engine.depth compares linear combinations of instants with one integer equality."""
        self._seen: dict[tuple, int] = {}

    def _recorded_key(self, size: Poly, cat: str, rounded: bool = True) -> tuple:
        """(local number, its bit in `packed`, its bytes in `packed_total`) of a storage of this size
        Poly and category, cached by the Poly's id (_size_key keeps it, so the id is never
        reused); the key numbered in the shared index, its category seen and its size in
        size_counts (rounded ones) when first held, in hold's order."""
        value = (cat, *size.terms.items())  # most sizes are new Polys of sizes held before
        if rounded:
            rec = self._by_value.get(value)
            if rec is not None:
                self._sizes_seen.append(size)  # kept, so its id is never reused
                self._recorded[id(size), cat] = rec
                return rec
        size_key = self._size_key(size)
        if rounded and size_key not in self.size_counts:  # (record mode keeps no counts there)
            self.size_counts[size_key] = [size, 0]
            self._order[size_key] = len(self._order)
        both = (cat, size_key)
        local = self._bits.get(both)
        if local is None:
            self._category(cat)
            self._cats = tuple(self._by_category)
            shift = self.index.get(both)
            if shift is None:
                shift = self.index[both] = SLOT * len(self.index)
            local = self._bits[both] = (len(self._counts), 1 << shift)
            self._live_keys_seen.append(both)
            self._counts.append(0)
            self._activations.append([])
        total = 0
        if self.packed_total is not None:
            total = self._packed_sizes.get(size_key)
            if total is None:
                total = self._packed_size(size_key)  # may turn packed_total off
        rec = (local[0], local[1], total)
        if rounded:
            self._recorded[id(size), cat] = self._by_value[value] = rec
        return rec

    def _packed_size(self, size_key: tuple) -> int:
        found = self._packed_sizes.get(size_key)
        if found is None:
            found = 0
            for mono, c in size_key:
                if not isinstance(c, int):
                    self.packed_total = None  # sequence parallelism: b*s/t (memcalc.engine.depth copes)
                    return 0
                slot = self.index.setdefault(("mono", mono), -1 - sum(1 for k in self.index if k[0] == "mono"))
                found += c << (TOTAL_SLOT * (-1 - slot))
            self._packed_sizes[size_key] = found
        return found

    def hold(self, st: Storage, category: str | None = None) -> None:
        """Add one reference to a storage, counted on the first in its live key, `packed` and
        `packed_total`."""
        key = id(st)
        holds = self.holds
        if key in holds:
            holds[key] += 1
            return
        holds[key] = 1
        size = st.size
        if st.count is None:
            rec = self._recorded.get((id(size), category or st.category))
            if rec is None:
                rec = self._recorded_key(size, category or st.category)
        else:  # one expert's, in a 'worst' bound: its rounding at its most
            size = size + Poly.const(count_slack(size, st.count, self.granularity))
            rec = self._recorded_key(size, category or st.category, False)
        self.sizes[key] = (st, rec)
        local, bit, total = rec
        counts = self._counts
        c = counts[local]
        counts[local] = c + 1
        if not c:
            self._stamp = stamp = self._stamp + 1
            self._activations[local].append(stamp)
        self.packed += bit
        if self.packed_total is not None:
            self.packed_total += total

    def release(self, st: Storage) -> None:
        """Drop one reference; uncount the storage on the last."""
        key = id(st)
        holds = self.holds
        c = holds[key] - 1
        if c:
            holds[key] = c
            return
        del holds[key]
        local, bit, total = self.sizes.pop(key)[1]
        self._counts[local] -= 1
        self.packed -= bit
        if self.packed_total is not None:
            self.packed_total -= total

    def mark(self, label: str) -> None:
        """Log this instant, keyed (`log`)."""
        where, seen = (self.phase, self.micro, self.where), self._seen
        n = seen.get(where, -1) + 1
        seen[where] = n
        self.log.append((where + (n,), label, self._cats, self._stamp, self.packed, self.packed_total))

    def recorded_live(self) -> "RecordedLive":
        """What reads a recorded mark's live storages back from its stamp and `packed`."""
        return RecordedLive([(self.index[k], k) for k in self._live_keys_seen], self._activations)


class RecordedLive:
    """A recorded mark's live storages {(category, size terms): how many}, read back from its
    `packed` counts, in the order they became live (the last time, up to the mark's stamp), the
    order a dict of them kept up by hold and release would have.

    >>> from memcalc.tape.graph import Storage
    >>> a, b = Storage(Poly.bs(2), "activations", "a"), Storage(Poly.const(4), "weights", "w")
    >>> mem = RecordingMemory()
    >>> mem.hold(a); mem.hold(b); mem.hold(a); mem.release(a); mem.release(a); mem.mark("x"); mem.hold(a)
    >>> _, _, cats, stamp, packed, _ = mem.log[0]
    >>> cats, mem.recorded_live()(stamp, packed)
    (('activations', 'weights'), {('weights', (((0, 0), 4),)): 1})
    """

    def __init__(self, slots: list[tuple[int, tuple]], activations: list[list[int]]) -> None:
        """`slots`: (bit offset in `packed`, live key) by local number; `activations`: the
        stamps at which each became live."""
        width = SLOT // 8  # (a whole number of bytes: 4 low, 1 high, SLOT = 40)
        order = sorted(zip(slots, activations), key=lambda item: item[0][0])
        fmt, at = "<", 0
        for (shift, _), _ in order:
            fmt += f"{shift // 8 - at}xIB" if shift // 8 > at else "IB"
            at = shift // 8 + width
        self._counts = struct.Struct(fmt)
        """Every slot's count, as (low 32 bits, high 8 bits), in one unpacking."""
        self._size = at
        self._keys = [(key, stamps) for (_, key), stamps in order]
        self._read: dict[tuple[int, int], dict] = {}  # (stamp, packed) -> live storages

    def __call__(self, stamp: int, packed: int) -> dict:
        found = self._read.get((stamp, packed))
        if found is None:
            found = self._read[stamp, packed] = self._live(stamp, packed)
        return dict(found)  # (a copy: callers may rewrite theirs, memcalc.engine.depth_runs.pair_growing)

    def _live(self, stamp: int, packed: int) -> dict:
        data = packed.to_bytes(max(self._size, (packed.bit_length() + 7) // 8), "little")
        parts = self._counts.unpack_from(data)
        found = []
        for (key, stamps), low, high in zip(self._keys, parts[::2], parts[1::2]):
            if low or high:
                found.append((stamps[bisect_right(stamps, stamp) - 1], key, low | high << 32))
        found.sort()
        return {key: c for _, key, c in found}


def unpack_dense(x: int, k: int) -> tuple:
    """The first k balanced digits of a packed total (RecordingMemory.packed_total): its coefficient of
    each monomial, in the order of their slots, zeros included.

    >>> unpack_dense(5 - (3 << TOTAL_SLOT), 3)
    (5, -3, 0)
    """
    out, slot = [], TOTAL_SLOT
    mask, half, full = (1 << slot) - 1, 1 << (slot - 1), 1 << slot
    for _ in range(k):
        d = x & mask
        if d >= half:
            d -= full
        out.append(d)
        x = (x - d) >> slot
    return tuple(out)


LIFT_BIAS = 180
"""lifted: each coefficient of a lifted total is held as itself + 2**LIFT_BIAS in
its TOTAL_SLOT bits, so under 2**LIFT_BIAS in size it leaves the slot's top bits clear
(a guard bit for comparing all slots with one subtraction, and room for sums of slots)."""


def lifted(totals: list[tuple[int, int]], k: int) -> tuple[list[int], list[int], int] | None:
    """The packed totals (RecordingMemory.packed_total) at N1 and N2 units of each family as one
    integer of 2k slots, the coefficients of its total lifted to (b, s, n) (unpack_dense(t1, k)
    + unpack_dense(t2 - t1, k), what memcalc.engine.depth compares) each biased by 2**LIFT_BIAS, so that
    one integer subtraction compares every coefficient (memcalc.tape.frontier.kept_packed); with each one's sum of
    coefficients and the guard bits. None where a coefficient is 2**LIFT_BIAS or more in size
    (then the tuples are compared).

    >>> t1, t2 = 5 - (3 << TOTAL_SLOT), 7 - (3 << TOTAL_SLOT)
    >>> xs, sums, guard = lifted([(t1, t2)], 2)
    >>> sums, unpack_dense(xs[0] - (guard >> (TOTAL_SLOT - 1 - LIFT_BIAS)), 4)
    ([4], (5, -3, 2, 0))
    """
    slot, width = TOTAL_SLOT, TOTAL_SLOT * k
    if 2 * k >= 1 << (slot - 2 - LIFT_BIAS):
        return None
    ones = sum(1 << (slot * i) for i in range(2 * k))  # 1 in every slot
    bias, guard = ones << LIFT_BIAS, ones << (slot - 1)
    clear = ones * (((1 << slot) - 1) ^ ((1 << (LIFT_BIAS + 1)) - 1))  # bits LIFT_BIAS+1 .. slot-1
    low, top, bias_k, modulus = (1 << width) - 1, 1 << (2 * width), bias & ((1 << width) - 1), (1 << slot) - 1
    half = modulus >> 1
    xs, sums = [], []
    for t1, t2 in totals:
        x = t1 + ((t2 - t1) << width) + bias
        if not 0 <= x < top or x & clear or (x & low) - bias_k != t1:
            return None
        xs.append(x)
        # the coefficients' sum: t2 = t1 + (t2 - t1) is the sum of digits * 2**(slot * i), and
        # 2**slot is 1 modulo 2**slot - 1; every digit under 2**LIFT_BIAS, the sum is too small
        # for the modulus to wrap it (2k slots, k monomials: far under 2**(slot - 2 - LIFT_BIAS))
        r = t2 % modulus
        sums.append(r - modulus if r > half else r)
    return xs, sums, guard
