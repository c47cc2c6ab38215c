"""Walk a forward program through forward, backward and the optimizer step, tracking every
storage's lifetime, and keep the moments that can set the peak.

Rules, each from PyTorch's own machinery (and each checked against validate.measure.tracker timelines):
- forward: an op's outputs are allocated, then tensors whose last forward use has passed are
  freed unless an autograd node saved them (Python references end at last use);
- backward (torch/csrc/autograd/engine.cpp): nodes run in reverse creation order; a node
  allocates its input gradients, then frees what it saved and its incoming gradient;
  a gradient arriving where one is already buffered is summed out of place (input_buffer.cpp);
  a parameter's first gradient is stolen into .grad, later ones are added in place
  (accumulate_grad.h);
- checkpoint regions (torch/utils/checkpoint.py, non-reentrant, early stop): nothing inside is
  saved in forward, the region's inputs are; backward recomputes the region up to its last
  saving op, then runs the region's backward.
A moment is kept unless another moment of the same phase dominates it for every b, s >= 1.
"""
from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import compress
from operator import ge
from typing import TYPE_CHECKING

from memcalc.core.poly import Poly
from memcalc.tape.graph import (Alias, FreeTemps, Grad, Graph, Node, Returns, Storage, Temp, Value, count_slack,
                                per_token)

if TYPE_CHECKING:
    from memcalc.parallel.fsdp import Fsdp


@dataclass
class Moment:
    """Live bytes at one instant, with the breakdown by category."""

    phase: str
    label: str
    total: Poly
    by_category: dict[str, Poly]
    sizes: tuple = ()  # (size Poly, how many live storages have it): for allocator rounding
    per_unit: "Moment | None" = None
    """What each repeat of the layer stack adds (memcalc.engine.depth), when derived."""


def grad_category(param: Value) -> str:
    """The report's component of a parameter's gradient: adapter_gradients for LoRA adapters
    (category adapter_weights), else gradients."""
    return "adapter_gradients" if param.storage.category == "adapter_weights" else "gradients"


class Memory:
    """Live storages with hold counts, the running total, and the kept moments.

    Storages are keyed by id() and the Storage object itself is kept while held, so an id can
    never be reused by another storage while it is counted. Totals are coefficient lists over
    the monomials held so far (`_monos`), updated in place by hold and release from each size's
    terms, looked up once per size object (`_info`); mark compares them as tuples and keeps the
    instant as copies, made into a Moment when `moments` reads it (most kept instants are
    dropped again by later, larger ones).
    """

    PRUNE_AT = 24  # frontier size that triggers the convex-combination pruning

    SLOT = 40
    """Bits per (category, size) in `packed` (no count of live storages comes near 2**30)."""
    TOTAL_SLOT = 192
    """Bits per monomial in `packed_total` (no byte count comes near 2**190)."""

    def __new__(cls, record: bool | dict = False, granularity: int = 1) -> "Memory":  # noqa: ARG004
        """A RecordingMemory when `record` is given (record mode's own hold, release and mark)."""
        return object.__new__(RecordingMemory if record is not False and cls is Memory else cls)

    def __init__(self, record: bool | dict = False, granularity: int = 1) -> None:
        self.granularity = granularity
        """The allocator's rounding that storages with a Storage.count are bounded for: such a
        storage counts as its size plus the most rounding can add to it (count_slack) and is
        left out of the sizes the allocator rounds (size_counts, a moment's `sizes`)."""
        self.holds: dict = {}
        """id(a held storage) -> [its references, it, its `_info`, its category, the category's
        coefficients]; in a RecordingMemory its references alone (`sizes` has the rest)."""
        self.sizes: dict[int, tuple] = {}
        """In a RecordingMemory, id(a held storage) -> (it, what holding it changed)."""
        self._total: list = []
        """The live bytes' coefficients over `_monos`, updated in place (no Poly per hold)."""
        self._by_category: dict[str, list] = {}
        """The same per category, in the order each was first held (a freed one stays, at 0):
        None where the category never held the monomial."""
        self._first_held: dict[str, list[int]] = {}
        """Per category, the coordinates in the order it first held them (its Poly's order)."""
        self._snaps: dict[str, tuple] = {}
        """A copy of each category of `_by_category` (same order), taken when a kept moment
        reads it after its coefficients changed (`_dirty`): kept moments share unchanged ones."""
        self._dirty: set[str] = set()
        """The categories changed since their copy was taken (the total changed with any of them)."""
        self._total_snap: tuple = ()
        self._polys: dict[int, tuple[object, Poly]] = {}
        """id(a copy in `_snaps`, or a dense total) -> (it, its Poly): one Poly per copy."""
        self._live_keys: dict[tuple, int] = {}
        """Size terms -> live storages of it, the sizes with some alive (a kept moment's
        `sizes`, copied; ordered as in size_counts when the moment is read)."""
        self._order: dict[tuple, int] = {}  # size terms -> position in size_counts
        self._monos: list = []
        """Every monomial held so far: the coordinates of `_total` and the dense totals in `_dense`."""
        self._dense: dict[str, list[tuple]] = {}
        """Per phase, the totals of the kept moments (`frontiers`) as tuples over `_monos`."""
        self._hint: dict[str, int | None] = {}
        """Per phase, the index in `_dense` of the kept total that last rejected a mark, tried
        first at the next (consecutive instants are mostly under the same one)."""
        self._at: str | None = None
        """The phase of the last mark; `_at_dense` and `_at_hint` are its entries of `_dense` and
        `_hint` (the hint kept here while the phase lasts)."""
        self._at_dense: list[tuple] = []
        self._sums: dict[str, list] = {}
        """Per phase, the coefficient sums of `_dense` (a total at least another one
        coefficient by coefficient has at least its sum: one comparison rules a test out)."""
        self._at_sums: list = []
        self._at_hint: int | None = None
        self._settled: dict[str, int] = {}
        """Per phase, how many of the kept totals (the first ones) the last convex pruning left:
        no pair of those holds one of them under a mix (prune_convex_dense's `settled`)."""
        self.frontiers: dict[str, list] = {}
        """Per phase, the kept moments: a Moment, or as mark took it (label, dense total,
        category copies, live sizes) until `moments` reads it."""
        self.phase = "setup"
        self.size_counts: dict[tuple, list] = {}  # size terms -> [Poly, live storages of it]
        self._keys: dict[int, tuple[Poly, tuple]] = {}  # id(size Poly) -> (it, its size terms)
        self._info: dict[int, tuple] = {}
        """id(size Poly) -> (it, its size terms, its size_counts entry, its terms as (coordinate
        in `_total`, c), the same negated): what hold and release need of a size."""
        self._shared: dict[tuple, tuple] = {}  # a size's terms and their types -> its `_info` but the Poly
        self.where: object = None
        """Where the step is (a node index, (node, recomputed node), or a name): with `micro`
        and the phase, the structural key of a recorded mark (memcalc.engine.depth)."""
        self.micro = 0
        self.log: list[tuple] | None = [] if record is not False else None
        """With record: every mark, unpruned, in order, as (key, label, categories seen, stamp,
        `packed`, `packed_total`): key (phase, micro, where, n-th mark there); the live storages
        {(category, size terms): how many} (every number of a moment is linear in these) are
        `packed`, which `recorded_live` reads back (the stamp: how many activations before)."""
        self._live_keys_seen: list[tuple] = []
        """With record: the (category, size terms) held so far, by local number (_recorded_key)."""
        self._counts: list[int] = []
        """With record: live storages of each, by local number."""
        self._activations: list[list[int]] = []
        """With record: the stamps at which each became live (0 to 1), by local number."""
        self._stamp = 0
        self._cats: tuple[str, ...] = ()  # with record: the categories seen, in order
        self._by_value: dict[tuple, tuple] = {}  # with record: (category, *size terms) -> _recorded_key
        self._sizes_seen: list[Poly] = []  # with record: the size Polys _recorded holds by id
        self._recorded: dict[tuple[int, str], tuple] = {}
        """With record: (id(size Poly), category) -> what holding a storage of it changes
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

    @property
    def moments(self) -> list[Moment]:
        """Every kept moment, all phases."""
        for phase, frontier in self.frontiers.items():
            for i, m in enumerate(frontier):
                if isinstance(m, tuple):  # as mark took it
                    frontier[i] = self._moment(phase, *m)
        out = [m for moments in self.frontiers.values() for m in moments]
        for m in out:
            if isinstance(m.sizes, dict):  # mark's copy of _live_keys, as (size, live storages)
                m.sizes = tuple((self.size_counts[k][0], m.sizes[k]) for k in sorted(m.sizes, key=self._order.get))
        return out

    def _moment(self, phase: str, label: str, total: tuple, categories: dict, sizes: dict) -> Moment:
        """The Moment of a kept instant as mark took it: the Polys of its copies."""
        polys = self._polys
        found = polys.get(id(total))
        if found is None:  # a dense total: monomials not held yet then are 0
            found = polys[id(total)] = (total, Poly(dict(zip(self._monos, total))))
        by_category, monos = {}, self._monos
        for cat, terms in categories.items():
            poly = polys.get(id(terms))
            if poly is None:
                n = len(terms)  # coordinates first held later are 0 (None) in it
                poly = polys[id(terms)] = (terms, Poly({monos[i]: terms[i] for i in self._first_held[cat]
                                                        if i < n and terms[i]}))
            by_category[cat] = poly[1]
        return Moment(phase, label, found[1], by_category, sizes)

    @property
    def total(self) -> Poly:
        """The live bytes."""
        return Poly(dict(zip(self._monos, self._total)))

    @property
    def by_category(self) -> dict[str, Poly]:
        """The live bytes per category, in the order each was first held."""
        monos = self._monos
        return {cat: Poly({monos[i]: vec[i] for i in self._first_held[cat] if vec[i]})
                for cat, vec in self._by_category.items()}

    def _category(self, cat: str) -> list:
        """The coefficients of a category, first held now or before."""
        mine = self._by_category.get(cat)
        if mine is None:
            mine = self._by_category[cat] = [None] * len(self._monos)
            self._first_held[cat] = []
            self._snaps[cat] = ()
        return mine

    def _first_in(self, cat: str, i: int, c: object) -> None:
        """A coordinate a category holds for the first time: 0 + c (as a dict's get(m, 0) + c)."""
        self._by_category[cat][i] = 0 + c
        self._first_held[cat].append(i)

    def _size_key(self, size: Poly) -> tuple:
        """The size's terms, sorted (the key of its storages' counts); the Poly is kept, so its
        id is never reused while cached."""
        found = self._keys.get(id(size))
        if found is None:
            found = self._keys[id(size)] = (size, tuple(sorted(size.terms.items())))
        return found[1]

    def _size_info(self, size: Poly, rounded: bool) -> tuple:
        """`_info` of a size first held, shared by every size of the same terms (a new
        coordinate for each monomial first held: 0 in every kept moment's dense total); a size
        bounded for its rounding (not `rounded`) counts in no size_counts entry."""
        terms = tuple(size.terms.items())
        # int and Fraction coefficients of equal value are equal keys: the types tell them apart
        like = (terms, tuple(map(type, size.terms.values())))
        shared = self._shared.get(like) if rounded else None
        if shared is None:
            size_key = tuple(sorted(terms))
            if not rounded:
                entry = [size, 0]
            else:
                entry = self.size_counts.get(size_key)
                if entry is None:
                    entry = self.size_counts[size_key] = [size, 0]
                    self._order[size_key] = len(self._order)
            dense = []
            for mono, c in terms:
                if mono not in self._monos:
                    self._monos.append(mono)
                    self._total.append(0)
                    for vec in self._by_category.values():
                        vec.append(None)
                    for kept in self._dense.values():
                        kept[:] = [v + (0,) for v in kept]
                dense.append((self._monos.index(mono), c))
            shared = (size_key, entry, tuple(dense), tuple((i, c * -1) for i, c in dense))
            if rounded:
                self._shared[like] = shared
        info = self._info[id(size)] = (size,) + shared
        return info

    def hold(self, st: Storage, category: str | None = None) -> None:
        """Add one reference to a storage, allocating it on the first."""
        holds = self.holds
        found = holds.get(id(st))
        if found is not None:
            found[0] += 1
            return
        cat = category or st.category
        if st.count is None:
            size = st.size
            info = self._info.get(id(size))
            if info is None:
                info = self._size_info(size, True)
            entry = info[2]
            n = entry[1] = entry[1] + 1
            if info[1]:  # a moment's `sizes` leave out zero sizes
                self._live_keys[info[1]] = n
        else:  # one expert's, in a 'worst' bound: its rounding at its most
            size = st.size + Poly.const(count_slack(st.size, st.count, self.granularity))
            info = self._size_info(size, False)
        mine = self._by_category.get(cat)
        if mine is None:
            mine = self._category(cat)
        holds[id(st)] = [1, st, info, cat, mine]
        terms = info[3]
        if terms:
            total = self._total
            for i, c in terms:
                total[i] += c
                try:
                    mine[i] += c
                except TypeError:  # None: the category's first of this monomial
                    self._first_in(cat, i, c)
            self._dirty.add(cat)

    def release(self, st: Storage) -> None:
        """Drop one reference; free the storage on the last."""
        key = id(st)
        holds = self.holds
        found = holds[key]
        n = found[0] - 1
        if n:
            found[0] = n
            return
        del holds[key]
        _, _, info, cat, mine = found
        if st.count is None:
            entry = info[2]
            n = entry[1] = entry[1] - 1
            size_key = info[1]
            if not size_key:
                pass
            elif n:
                self._live_keys[size_key] = n
            else:
                del self._live_keys[size_key]
        terms = info[4]
        if terms:
            total = self._total
            for i, c in terms:
                total[i] += c
                mine[i] += c  # held before: never None
            self._dirty.add(cat)

    def alive(self, st: Storage) -> bool:
        """Whether the storage is allocated."""
        return id(st) in self.holds

    def mark(self, label: str) -> None:
        """Record this instant as a candidate for the peak, unless a kept moment of the same
        phase is at least as large at every shape. The comparisons run on dense coefficient
        tuples (keep's test, Poly.dominates); the Moment is made when `moments` reads it."""
        if self.phase is not self._at:
            self._enter(self.phase)
        total, dense, sums = self._total, self._at_dense, self._at_sums
        t = sum(total)
        hint = self._at_hint
        if hint is not None and sums[hint] >= t and all(map(ge, dense[hint], total)):
            return
        below = None
        # one coefficient tried alone first: the one a kept total most often exceeds where it is
        # not below (the first held after the constant's, in practice activations' b*s)
        k = 1 if len(total) > 1 else 0
        tk = total[k] if total else 0  # (no monomial yet: the first kept total, (), is at least it)
        for i, u in enumerate(dense):
            at_least = sums[i]
            if at_least >= t and all(map(ge, u, total)):
                self._at_hint = i
                return
            if t >= at_least and tk >= u[k] and all(map(ge, total, u)):
                if below is None:
                    below = [i]
                else:
                    below.append(i)
        frontier = self.frontiers[self._at]
        if below is not None:
            for i in reversed(below):
                del frontier[i], dense[i], sums[i]
            settled = self._settled
            if below[0] < settled[self._at]:
                settled[self._at] -= bisect_left(below, settled[self._at])
        v = tuple(total)
        dirty = self._dirty
        if dirty:  # (the total changed with them)
            self._total_snap = v
            snaps, by_category = self._snaps, self._by_category
            for cat in dirty:
                snaps[cat] = tuple(by_category[cat])
            dirty.clear()
        frontier.append((label, self._total_snap, dict(self._snaps), dict(self._live_keys)))
        dense.append(v)
        sums.append(t)
        self._at_hint = len(dense) - 1
        if len(frontier) >= self.PRUNE_AT:
            kept = prune_convex_dense(dense, self._settled[self._at])
            self._settled[self._at] = len(kept)
            frontier[:] = [frontier[i] for i in kept]
            dense[:] = [dense[i] for i in kept]
            sums[:] = [sums[i] for i in kept]
            self._at_hint = None

    def _enter(self, phase: str) -> None:
        """mark's phase: its kept totals and hint (the last phase's hint put by)."""
        if self._at is not None:
            self._hint[self._at] = self._at_hint
        dense = self._dense.get(phase)
        if dense is None:
            self.frontiers[phase], dense, self._hint[phase], self._sums[phase] = [], [], None, []
            self._settled[phase] = 0
            self._dense[phase] = dense
        self._at, self._at_dense, self._at_hint = phase, dense, self._hint[phase]
        self._at_sums = self._sums[phase]


class RecordingMemory(Memory):
    """Memory in record mode (Memory(record=...) makes one): every mark logged, the live
    storages counted per (category, size terms) and packed into one integer (memcalc.engine.depth)."""

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
                shift = self.index[both] = self.SLOT * len(self.index)
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
                found += c << (self.TOTAL_SLOT * (-1 - slot))
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
        """Log this instant, keyed (Memory.log)."""
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
    >>> mem = Memory(record=True)
    >>> mem.hold(a); mem.hold(b); mem.hold(a); mem.release(a); mem.release(a); mem.mark("x"); mem.hold(a)
    >>> _, _, cats, stamp, packed, _ = mem.log[0]
    >>> cats, mem.recorded_live()(stamp, packed)
    (('activations', 'weights'), {('weights', (((0, 0), 4),)): 1})
    """

    def __init__(self, slots: list[tuple[int, tuple]], activations: list[list[int]]) -> None:
        """`slots`: (bit offset in `packed`, live key) by local number; `activations`: the
        stamps at which each became live."""
        width = Memory.SLOT // 8  # (a whole number of bytes: 4 low, 1 high, SLOT = 40)
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
        return dict(found)  # (a copy: callers may rewrite theirs, memcalc.engine.depth._growing)

    def _live(self, stamp: int, packed: int) -> dict:
        data = packed.to_bytes(max(self._size, (packed.bit_length() + 7) // 8), "little")
        parts = self._counts.unpack_from(data)
        found = []
        for (key, stamps), low, high in zip(self._keys, parts[::2], parts[1::2]):
            if low or high:
                found.append((stamps[bisect_right(stamps, stamp) - 1], key, low | high << 32))
        found.sort()
        return {key: c for _, key, c in found}


def keep(frontier: list[Moment], total: Poly) -> bool:
    """Whether a moment of `total` bytes joins `frontier` (the kept moments of one phase): not
    when a kept one is at least as large at every shape; kept ones it dominates are dropped.

    >>> f = [Moment("forward", "x", Poly.bs(2), {})]
    >>> keep(f, Poly.bs(1)), keep(f, Poly.bs(3)), f
    (False, True, [])
    """
    for m in frontier:
        if m.total.dominates(total):
            return False
    frontier[:] = [m for m in frontier if not total.dominates(m.total)]
    return True


def replay(moments: list[Moment]) -> list[Moment]:
    """The moments Memory.mark keeps of `moments` (in step order), phase by phase: keep's
    dominance and prune_convex, on dense coefficient tuples.

    >>> m = [Moment("forward", str(k), Poly.bs(k), {}) for k in (1, 3, 2)]
    >>> [x.label for x in replay(m)]
    ['3']
    """
    monos = list({mono: None for m in moments for mono in m.total.terms})
    frontiers: dict[str, tuple[list[Moment], list[tuple]]] = {}
    for m in moments:
        terms = m.total.terms
        v = tuple([terms.get(mono, 0) for mono in monos])
        frontier, dense = frontiers.setdefault(m.phase, ([], []))
        if any(all(map(ge, u, v)) for u in dense):
            continue
        below = {i for i, u in enumerate(dense) if all(map(ge, v, u))}
        if below:
            frontier[:] = [x for i, x in enumerate(frontier) if i not in below]
            dense[:] = [u for i, u in enumerate(dense) if i not in below]
        frontier.append(m)
        dense.append(v)
        if len(frontier) >= Memory.PRUNE_AT:
            kept = prune_convex_dense(dense)
            frontier[:] = [frontier[i] for i in kept]
            dense[:] = [dense[i] for i in kept]
    return [m for kept, _ in frontiers.values() for m in kept]


def _below_mix(m: Poly, m1: Poly, m2: Poly) -> bool:
    """True when m <= lam*m1 + (1-lam)*m2 coefficient-wise for some lam in [0, 1]; then
    m(b, s) <= max(m1(b, s), m2(b, s)) at every shape, so m can never set the peak.

    >>> _below_mix(Poly.bs(5) + Poly.const(5), Poly.bs(10), Poly.const(10))
    True
    """
    monos = set(m.terms) | set(m1.terms) | set(m2.terms)
    return _below_mix_dense(*(tuple(p.terms.get(mono, 0) for mono in monos) for p in (m, m1, m2)))


def prune_convex(moments: list[Moment]) -> list[Moment]:
    """Drop moments lying under a mix of two others (e.g. the layers between the first and the
    last of a backward pass, whose totals are affine in the layer index).

    >>> a, b, c = (Moment("p", "", Poly({(0, 0): k, (1, 1): 10 - k}), {}) for k in (0, 5, 10))
    >>> [m.total.terms[(0, 0)] for m in prune_convex([a, b, c]) if (0, 0) in m.total.terms]
    [10]
    """
    monos = list({mono: None for m in moments for mono in m.total.terms})
    vecs = [tuple(m.total.terms.get(mono, 0) for mono in monos) for m in moments]
    return [moments[j] for j in prune_convex_dense(vecs)]


def prune_convex_dense(vecs: list[tuple], settled: int = 0) -> list[int]:
    """prune_convex on coefficient tuples over the same monomials (built once, not per pair as
    _below_mix reads them): the indices kept, in order. The first `settled` are what a pruning
    of the same test left (no pair of them holds one of them below: each was tested against
    every pair of the others then), so only their pairs with a later one are tested.

    >>> prune_convex_dense([(0, 10), (5, 5), (10, 0)])
    [0, 2]
    """
    kept = list(range(len(vecs)))
    xs, full = _guarded(vecs)
    i = 0
    while i < len(kept):
        b = kept[i]
        v = vecs[b]
        if _below_near(v, i, kept, vecs):
            kept.pop(i)
            continue
        others = kept[:i] + kept[i + 1:]
        covers = None
        if xs is not None:  # where each other is at least v: the guard bits left by a subtraction
            x = xs[b]
            covers = [((xs[j] | full) - x) & full for j in others]
        fresh = bisect_left(others, settled) if b < settled else 0  # the first of `others` not settled
        if _below_some_mix(v, [vecs[j] for j in others], covers, full, fresh):
            kept.pop(i)
        else:
            i += 1
    return kept


def _below_near(v: tuple, i: int, kept: list[int], vecs: list[tuple]) -> bool:
    """Whether v (vecs[kept[i]]) is under a mix of two kept totals next to it (before and
    after, or the two after it), the pairs that most often hold one below (the
    layers between two others, affine in the layer): pairs _below_some_mix tests (x before y,
    covering v together, max(x, y) >= v), tried first.

    >>> _below_near((5, 5), 1, [0, 1, 2], [(0, 10), (5, 5), (10, 0)])
    True
    """
    n = len(kept)
    for a, b in ((i - 1, i + 1), (i + 1, i + 2)):
        if a >= 0 and b < n:
            x, y = vecs[kept[a]], vecs[kept[b]]
            if all(map(ge, map(max, x, y), v)) and _below_mix_dense(v, x, y):
                return True
    return False


def _guarded(vecs: list[tuple]) -> tuple[list[int] | None, int]:
    """Each tuple as one integer, a slot of w + 1 bits per coefficient (its excess over the
    least one, under 2**w), and the guard bits (bit w of each slot): then
    ((x | guard) - y) & guard has the guard bit of each coefficient where x >= y (no slot
    borrows from the next). (None, 0) when a coefficient is not an int, or there is none.

    >>> xs, guard = _guarded([(1, 5), (3, 2)])
    >>> ((xs[0] | guard) - xs[1]) & guard == 1 << 7  # (1, 5) >= (3, 2) in the second only
    True
    """
    if not vecs or not vecs[0]:
        return None, 0
    for v in vecs:
        for c in v:
            if c.__class__ is not int:
                return None, 0
    lo = min(map(min, vecs))
    w = (max(map(max, vecs)) - lo).bit_length()
    slot = w + 1
    shifts = [slot * k for k in range(len(vecs[0]))]
    xs = [sum([(c - lo) << k for c, k in zip(v, shifts)]) for v in vecs]
    return xs, sum(1 << (w + k) for k in shifts)


def _below_some_mix(v: tuple, others: list[tuple], covers: list[int] | None = None, full: int = 0,
                    fresh: int = 0) -> bool:
    """Whether v lies under a mix of some pair of `others` (_below_mix_dense(v, x, y), x before
    y), of the pairs whose y is others[fresh] or later. A mix of x and y is at most max(x, y)
    in each coefficient, so only pairs that cover v coefficient by coefficient can hold it
    below (a bit per coefficient, unless `covers` gives each other's bits, `full` all of them):
    the partners of x are those covering what x does not (the same `need` is looked up once).

    >>> _below_some_mix((5, 5), [(0, 10), (9, 0), (10, 0)]), _below_some_mix((5, 5), [(0, 10), (4, 9)])
    (True, False)
    """
    if covers is None:
        full = (1 << len(v)) - 1
        bits = [1 << k for k in range(len(v))]
        covers = [sum(compress(bits, map(ge, x, v))) for x in others]
    partners: dict[int, list[int]] = {}
    for j, cover in enumerate(covers):
        need = full & ~cover
        found = partners.get(need)
        if found is None:
            found = partners[need] = [k for k, c in enumerate(covers) if c & need == need]
        x = others[j]
        for k in found[bisect_right(found, j if j >= fresh else fresh - 1):]:
            if _below_mix_dense(v, x, others[k]):
                return True
    return False


def _below_mix_dense(v: tuple, v1: tuple, v2: tuple) -> bool:
    """_below_mix on coefficient tuples over the same monomials.

    >>> _below_mix_dense((5, 5), (0, 10), (10, 0)), _below_mix_dense((6, 5), (0, 10), (10, 0))
    (True, False)
    """
    lo, hi = 0.0, 1.0
    for c, c1, c2 in zip(v, v1, v2):
        slope, need = c1 - c2, c - c2  # lam * slope >= need
        if slope > 0:
            bound = need / slope
            if bound > lo:  # lo = max(lo, bound)
                lo = bound
        elif slope < 0:
            bound = need / slope
            if bound < hi:  # hi = min(hi, bound)
                hi = bound
        elif need > 0:
            return False
        if lo > hi:
            return False
    return True


def _grad_count(count: Poly | None, size: Poly) -> Poly | None:
    """A gradient of one expert's tensor in a 'worst' bound is that expert's too (Storage.count)."""
    return count if count is not None and per_token(size, count) is not None else None


class StepSimulator:
    """Simulate micro-steps of forward and backward over one Graph.

    >>> from memcalc.tape.graph import Graph, Grad
    >>> g = Graph(); w = g.param("w", Poly.const(64)); x = g.input("x", Poly.bs(4))
    >>> y = g.op("mul", [x, w], Poly.bs(4), saves=[x, w], backward=[Grad(1)])
    >>> g.keep.append(y); sim = StepSimulator(g); sim.setup(); sim.hold_inputs(); sim.micro_step()
    >>> max(m.total.eval(1, 1) for m in sim.mem.moments)
    140
    """

    def __init__(self, graph: Graph, fsdp: "Fsdp | None" = None, record: bool | dict = False,
                 memory: "Memory | None" = None) -> None:
        self.g = graph
        self.fsdp = fsdp
        # `memory`: another Memory to walk the step through (memcalc.engine.allocations records events)
        self.mem = Memory(record, graph.granularity) if memory is None else memory
        self.param_grads: dict[int, Storage] = {}
        self._param_buffers: dict[int, Storage] = {}
        self._consumers = self._param_consumers()
        self._pending: dict[int, int] = {}
        self._leaf_grads: list[Storage] = []
        self._last_use = self._forward_last_use()

    # ---- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Parameters and buffers are allocated before the step."""
        for v in self.g.params + self.g.buffers:
            self.mem.hold(v.storage)
        if self.fsdp is not None:
            self.fsdp.setup(self.mem)

    def _param_consumers(self) -> dict[int, int]:
        """How many nodes deliver a gradient to each trainable parameter (by id)."""
        counts: dict[int, int] = {}
        for node in self.g.nodes:
            if not node.backward:
                continue
            inputs, params = node.inputs, set()
            for step in node.backward:
                if type(step) is Grad:
                    v = inputs[step.index]
                    if v.is_param and v.requires_grad:
                        params.add(id(v))
            for key in params:
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _forward_last_use(self) -> dict[int, int]:
        last: dict[int, int] = {}
        for i, node in enumerate(self.g.nodes):
            for v in node.inputs:
                last[id(v.storage)] = i
        return last

    # ---- forward --------------------------------------------------------------------------
    def forward(self) -> None:
        """Run the forward program, holding saved tensors (or region inputs)."""
        mem, nodes = self.mem, self.g.nodes
        holds, hold, release, mark = mem.holds, mem.hold, mem.release, mem.mark
        last_use = self._last_use
        mem.phase = "forward"
        expiring: dict[int, list[Storage]] = {}
        kept = {id(v.storage) for v in self.g.keep + self.g.leaves}
        self._region_inputs: dict[int, list[Storage]] = {}
        self._region_held: dict[int, set[int]] = {}  # the ids of each region's list
        produced_in: dict[int, int | None] = {}
        fsdp, previous = self.fsdp, "root"
        mem.where = "forward start"
        if fsdp is not None:
            fsdp.pre_forward(mem, "root", None)
        for i, node in enumerate(nodes):
            mem.where = i
            if node.hook is not None and fsdp is not None:
                kind, group = node.hook
                if kind == "begin":
                    fsdp.pre_forward(mem, group, previous)
                    previous = group
                else:
                    fsdp.post_forward(mem, group)
            new = [v.storage for v in node.outputs if id(v.storage) not in holds]  # not mem.alive
            region = node.region
            for st in new:
                hold(st)
                produced_in[id(st)] = region
            mark(node.name)
            if region is None:
                for st in node.saved:
                    hold(st)
            else:
                self._hold_region_inputs(node, produced_in)
            for st in new:
                key = id(st)
                if key in kept:
                    continue
                end = last_use.get(key, i)
                end = i if end < i else end
                found = expiring.get(end)
                if found is None:
                    expiring[end] = [st]
                else:
                    found.append(st)
            for st in expiring.pop(i, ()):
                release(st)
        mem.where = "forward end"
        if fsdp is not None:
            fsdp.root_post_forward(mem)
        mark("end of forward")

    def _hold_region_inputs(self, node: Node, produced_in: dict) -> None:
        region = node.region
        held = self._region_inputs.get(region)
        if held is None:
            held = self._region_inputs[region] = []
            self._region_held[region] = set()
        ids, holds = self._region_held[region], self.mem.holds
        for v in node.inputs:
            st = v.storage
            key = id(st)
            if v.is_param or produced_in.get(key, "outside") == region:
                continue
            if key in ids or key not in holds:  # already held for the region, or not mem.alive
                continue
            held.append(st)
            ids.add(key)
            self.mem.hold(st)

    # ---- backward -------------------------------------------------------------------------
    def backward(self) -> None:
        """Run backward from the kept loss; parameter grads accumulate into .grad."""
        mem, nodes = self.mem, self.g.nodes
        mem.phase = "backward"
        mem.where = "backward start"
        grads: dict[int, Storage] = {}
        self._pending = dict(self._consumers)
        loss = self.g.keep[0]
        seed = Storage(loss.size, "activation_grads", "grad of loss")
        mem.hold(seed)
        grads[id(loss)] = seed
        mem.mark("loss grad")
        if self.fsdp is not None:
            self.fsdp.pre_backward(mem, "root")
        recomputed: dict[int, Storage] = {}
        started_regions: set[int] = set()
        for i in range(len(nodes) - 1, -1, -1):
            node = nodes[i]
            mem.where = i
            region = node.region
            if node.hook is not None:
                kind, group = node.hook
                if self.fsdp is not None and kind == "end":
                    self.fsdp.pre_backward(mem, group)
                elif self.fsdp is not None:
                    self.fsdp.post_backward(mem, group, self.param_grads)
                if region is not None and self._first_of_region(i):
                    self._release_region_inputs(region)
                continue
            outputs = node.outputs
            if len(outputs) == 1:  # (most nodes)
                found = grads.pop(id(outputs[0]), None)
                incoming = [] if found is None else [found]
            else:
                incoming = [g for g in [grads.pop(id(v), None) for v in outputs] if g is not None]
            if not incoming:
                # a region whose first op gets no gradient (a frozen q and k under LoRA, at one
                # sequence with no reshape copy before q @ k^T) still ends here: checkpoint's
                # frame drops its inputs once the region's saved tensors are released
                if region is not None and self._first_of_region(i):
                    self._release_region_inputs(region)
                continue
            # checkpoint's unpack hook recomputes at the first saved tensor backward needs:
            # region nodes that saved nothing (adds, casts, scalar muls) run before it (measured)
            if region is not None and region not in started_regions and node.saved:
                started_regions.add(region)
                recomputed = self._recompute(region, i)
                mem.where = i
            self._run_node(node, incoming, grads, None if region is None else recomputed)
            if region is not None and self._first_of_region(i):
                self._release_region_inputs(region)
        mem.where = "backward end"
        for v in self.g.keep + self.g.leaves:
            mem.release(v.storage)
        for st in list(grads.values()) + self._leaf_grads:
            mem.release(st)
        self._leaf_grads = []
        if self.fsdp is not None:
            self.fsdp.end_of_backward(mem, self.param_grads)
        mem.mark("end of backward")

    def _first_of_region(self, i: int) -> bool:
        nodes = self.g.nodes
        return i == 0 or nodes[i - 1].region != nodes[i].region

    def _release_region_inputs(self, region: int) -> None:
        for st in self._region_inputs.get(region, ()):
            self.mem.release(st)

    def _recompute(self, region: int, last: int) -> dict[int, Storage]:
        """Re-run the region's forward up to its last saving op (early stop); return
        original -> recomputed storage. The generated autograd code saves an op's inputs before
        it calls the kernel and its outputs after, so when the last saving op saves only
        inputs the recompute stops before that op allocates anything (measured: a checkpointed
        Llama layer's recompute ends at down_proj's weight cast, with no mm). A recomputed
        tensor is freed after its last use in the region, or, if Python still refers to it past
        the stopping point, when the recompute stops (checkpoint.py raises
        _StopRecomputationError, unwinding the frames). A weight cast autocast caches
        (Graph.cached_casts) lives until the recompute stops: checkpoint re-enters autocast for
        the recompute, the outermost autocast then, whose cache is cleared only when it exits
        (torch/utils/checkpoint.py, torch/amp/autocast_mode.py __exit__; measured: a
        checkpointed GPT-NeoX layer's bias casts, saved by no op, freed together at the stop)."""
        mem, nodes, cached_casts = self.mem, self.g.nodes, self.g.cached_casts
        hold, release, mark = mem.hold, mem.release, mem.mark
        first = trigger = last
        while first > 0 and nodes[first - 1].region == region:
            first -= 1
        while last + 1 < len(nodes) and nodes[last + 1].region == region:
            last += 1  # trailing nodes without gradients (scope ends) still hold references
        stop = max((j for j in range(first, last + 1) if nodes[j].saved), default=first - 1)
        last_use: dict[int, int] = {}
        for j in range(first, last + 1):
            for v in nodes[j].inputs:
                last_use[id(v.storage)] = j
        copies: dict[int, Storage] = {}
        held: dict[int, int] = {}  # copy key -> index after which Python drops it
        dropped: dict[int, list[int]] = {}  # index -> the keys of `held` dropped after it, in order
        for j in range(first, stop + 1):
            node = nodes[j]
            mem.where = (trigger, j)
            for v in node.outputs:
                st = v.storage
                key = id(st)
                if key in copies or st in [u.storage for u in node.inputs]:  # (Storage: eq is identity)
                    continue  # already made, or a view of an input
                if j == stop and st not in node.saved:
                    continue  # the last pack is of an input: the stop comes before the kernel
                copy = copies[key] = Storage(st.size, "activations", "recomputed", st.count)
                hold(copy)
                end = held[key] = last + 1 if key in cached_casts else last_use.get(key, j)
                end = j if end < j else end  # dropped at the first index >= end from here
                if end in dropped:  # (after `stop` when Python holds it: freed at the stop)
                    dropped[end].append(key)
                else:
                    dropped[end] = [key]
            mark(f"recompute {node.name}")
            for st in node.saved:
                hold(copies.get(id(st), st))
            for key in dropped.pop(j, ()):
                release(copies[key])
                del held[key]
        for key in held:
            release(copies[key])
        return copies

    def _run_node(self, node: Node, incoming: list[Storage], grads: dict,
                  recomputed: dict[int, Storage] | None) -> None:
        """engine.cpp call_function: compute all input grads, free the incoming grads and the
        node's saved tensors (their `recomputed` copies in a checkpoint region, at the node's
        Returns step when it has one), then deliver the grads (where sums happen)."""
        mem = self.mem
        hold, mark = mem.hold, mem.mark
        temps: list[Storage] = []
        deliveries: list[tuple[Value, Storage]] = []
        label = None
        released = False
        for step in node.backward:
            kind = type(step)
            if kind is Grad:
                target = node.inputs[step.index]
                if not target.requires_grad:
                    continue
                size = step.size or target.grad_size or target.size
                count = target.storage.count
                st = Storage(size, grad_category(target) if target.is_param else "activation_grads",
                             f"grad {target.label}", None if count is None else _grad_count(count, size))
                hold(st)
                if label is None:
                    label = f"{node.name} backward"
                mark(label)
                deliveries.append((target, st))
            elif kind is Alias:
                target = node.inputs[step.index]
                if target.requires_grad and incoming:
                    hold(incoming[0])
                    deliveries.append((target, incoming[0]))
            elif kind is Temp:
                st = Storage(step.size, "activation_grads", f"{node.name} temp")
                hold(st)
                temps.append(st)
                if label is None:
                    label = f"{node.name} backward"
                mark(label)
            elif kind is FreeTemps:
                k = len(temps) if step.first is None else step.first
                for st in temps[:k]:
                    mem.release(st)
                temps = temps[k:]
            elif kind is Returns and recomputed is not None and not released:
                released = True  # apply's unpacked recomputed tensors die before validate_outputs
                for st in node.saved:
                    mem.release(recomputed.get(id(st), st))
        release = mem.release
        for st in temps:
            release(st)
        for st in incoming:
            release(st)
        if recomputed is None:
            for st in node.saved:
                release(st)
        elif not released:
            for st in node.saved:
                release(recomputed.get(id(st), st))
        for target, st in deliveries:
            self._deliver(target, st, grads)

    def _deliver(self, target: Value, st: Storage, grads: dict) -> None:
        """Hand a gradient to its input: an activation's input buffer, or a parameter's
        AccumulateGrad node, which runs once every consumer of the parameter has delivered
        (a tied weight's two gradients are first summed in its input buffer)."""
        if target.leaf:  # AccumulateGrad of a leaf activation: .grad lives with the graph
            self._leaf_grads.append(st)
            return
        if not target.is_param:
            self._buffer(grads, id(target), st, target.size)
            return
        key = id(target)
        self._buffer(self._param_buffers, key, st, target.grad_size or target.size)
        self._pending[key] -= 1
        if self._pending[key] == 0:
            self._accumulate(key, self._param_buffers.pop(key), grad_category(target))

    def _buffer(self, buffers: dict, key: int, st: Storage, size: Poly) -> None:
        """input_buffer.cpp: the first gradient is stored, a later one summed out of place."""
        old = buffers.get(key)
        if old is None:
            buffers[key] = st
            return
        total = Storage(size, "activation_grads", "grad sum", _grad_count(st.count, size))
        self.mem.hold(total)
        self.mem.mark("sum of gradients")
        self.mem.release(st)
        self.mem.release(old)
        buffers[key] = total

    def _accumulate(self, key: int, st: Storage, category: str = "gradients") -> None:
        """accumulate_grad.h: steal the gradient into an empty .grad (copy an aliased one);
        add in place into an existing .grad (gradient accumulation)."""
        mem = self.mem
        old = self.param_grads.get(key)
        if old is not None:
            mem.release(st)
            return
        own = Storage(st.size, category, "grad")  # same bytes, now owned by .grad
        mem.hold(own)
        mem.release(st)
        self.param_grads[key] = own

    # ---- a micro-step ---------------------------------------------------------------------
    def micro_step(self) -> None:
        """Forward, backward; parameter grads survive (gradient accumulation)."""
        self.forward()
        self.backward()

    def hold_inputs(self) -> None:
        """The batch is made before the first micro-step and dropped after optimizer.step()."""
        for v in self.g.inputs:
            self.mem.hold(v.storage)
