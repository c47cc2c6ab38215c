"""The memory ledger: live storages with hold counts, the running total by category, and the
moments kept as candidates for the peak (memcalc.tape.frontier). The step's walk
(memcalc.tape.simulate) holds and releases storages and marks instants; record mode
(memcalc.tape.record) logs every instant instead.
"""
from __future__ import annotations

from memcalc.core.poly import Poly
from memcalc.tape.frontier import Frontier
from memcalc.tape.graph import Storage, count_slack
from memcalc.tape.moment import Moment


class Memory:
    """Live storages with hold counts, the running total, and the kept moments.

    Storages are keyed by id() and the Storage object itself is kept while held, so an id can
    never be reused by another storage while it is counted. Totals are coefficient lists over
    the monomials held so far (`_monos`), updated in place by hold and release from each size's
    terms, looked up once per size object (`_info`); mark compares them as tuples and keeps the
    instant as copies, made into a Moment when `moments` reads it (most kept instants are
    dropped again by later, larger ones).
    """

    def __init__(self, granularity: int = 1) -> None:
        self.granularity = granularity
        """The allocator's rounding that storages with a Storage.count are bounded for: such a
        storage counts as its size plus the most rounding can add to it (count_slack) and is
        left out of the sizes the allocator rounds (size_counts, a moment's `sizes`)."""
        self.holds: dict = {}
        """id(a held storage) -> [its references, it, its `_info`, its category, the category's
        coefficients]; in a RecordingMemory its references alone (`sizes` has the rest)."""
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
        """Every monomial held so far: the coordinates of `_total` and of the frontiers' totals."""
        self._at: str | None = None
        """The phase of the last mark; `_at_frontier` its frontier."""
        self._at_frontier: Frontier | None = None
        self.frontiers: dict[str, Frontier] = {}
        """Per phase, the kept moments (memcalc.tape.frontier: their totals as tuples over
        `_monos`), each item a Moment, or as mark took it (label, dense total, category copies,
        live sizes) until `moments` reads it."""
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

    @property
    def moments(self) -> list[Moment]:
        """Every kept moment, all phases."""
        for phase, frontier in self.frontiers.items():
            items = frontier.items
            for i, m in enumerate(items):
                if isinstance(m, tuple):  # as mark took it
                    items[i] = self._moment(phase, *m)
        out = [m for frontier in self.frontiers.values() for m in frontier.items]
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
                    for frontier in self.frontiers.values():
                        frontier.dense[:] = [v + (0,) for v in frontier.dense]
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
        phase is at least as large at every shape (memcalc.tape.frontier.Frontier on dense
        coefficient tuples); the Moment is made when `moments` reads it."""
        if self.phase is not self._at:
            self._enter(self.phase)
        total, frontier = self._total, self._at_frontier
        t = sum(total)
        if not frontier.offer(total, t):
            return
        v = tuple(total)
        dirty = self._dirty
        if dirty:  # (the total changed with them)
            self._total_snap = v
            snaps, by_category = self._snaps, self._by_category
            for cat in dirty:
                snaps[cat] = tuple(by_category[cat])
            dirty.clear()
        frontier.add(v, t, (label, self._total_snap, dict(self._snaps), dict(self._live_keys)))

    def _enter(self, phase: str) -> None:
        """mark's phase and its frontier."""
        frontier = self.frontiers.get(phase)
        if frontier is None:
            frontier = self.frontiers[phase] = Frontier()
        self._at, self._at_frontier = phase, frontier
