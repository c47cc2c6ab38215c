"""The recorded runs of memcalc.engine.depth (N1, N2 and N3 units, every instant logged by
memcalc.tape.record) matched instant by instant: each mark keyed by its place in the program
(before the stack, op k of a unit, after it), checked affine in the number of units, the middle
units' instants checked to lie between the ends', and the parameters split into before, one
unit's and after.
"""
from __future__ import annotations

from typing import Callable

from memcalc.engine.instants import Instant, Vec, combine, label_at
from memcalc.engine.layout import ENDS, N1, N2, N3, Layout, NotRepeating
from memcalc.engine.simulation import StepRun

def pair_growing(runs: list[StepRun], sizes: dict) -> None:
    """Storages whose size grows with depth (a causal-mask buffer of every layer, (L, P, P)):
    a size seen at one depth only, paired with one at each other depth, the sizes affine in
    n. Each is rewritten in the runs' logs as ("grow", i) (its size at N1) and ("grow-d", i),
    counted n - N1 times per storage (its growth per unit), so that every number stays linear
    in the live counts; `sizes` gets both."""
    keys = [set(run.sizes) for run in runs]
    alone = [sorted(k - keys[(i + 1) % 3] - keys[(i + 2) % 3], key=lambda k: runs[i].sizes[k].eval(1, 1))
             for i, k in enumerate(keys)]
    if not len(alone[0]) == len(alone[1]) == len(alone[2]):
        raise NotRepeating("storage sizes that do not pair across depths")
    if alone[0]:  # every mark's live storages read back, its `packed` stale once rewritten
        for run in runs:
            run.moments = [entry[:3] + (run.live(*entry[3:5]), None) + entry[5:] for entry in run.moments]
    for i, (k1, k2, k3) in enumerate(zip(*alone)):
        p1, p2, p3 = (run.sizes[k] for run, k in zip(runs, (k1, k2, k3)))
        if (p2 - p1).terms != (p3 - p2).terms:
            raise NotRepeating("a storage whose size is not affine in depth")
        sizes["grow", i], sizes["grow-d", i] = p1, p2 - p1
        for run, k, n in zip(runs, (k1, k2, k3), (N1, N2, N3)):
            for _, _, _, live, _, _ in run.moments:
                for cat, size in [key for key in live if key[1] == k]:
                    c = live.pop((cat, size))
                    live[cat, ("grow", i)] = c
                    if n != N1:
                        live[cat, ("grow-d", i)] = c * (n - N1)


def _positions(run: StepRun, lay: Layout, n: int) -> tuple[Callable, dict]:
    """A function from a mark's `where` to (position key, unit index or None), and its values
    at the nodes before and in the units (each node is marked in forward), by node index."""
    starts = run.layer_starts
    if len(starts) != lay.depth(n) + 1:
        raise NotRepeating("the program does not mark its layers")
    edges = [starts[lay.prefix + j * lay.unit] for j in range(n + 1)]
    width = edges[1] - edges[0]
    if any(b - a != width for a, b in zip(edges, edges[1:])):
        raise NotRepeating("units of different lengths")

    def node(i: int) -> tuple[tuple, int | None]:
        if i < edges[0]:
            return ("pre", i), None
        if i >= edges[-1]:
            return ("post", i - edges[-1]), None
        return ("unit", (i - edges[0]) % width), (i - edges[0]) // width

    def where(w: object) -> tuple[object, int | None]:
        if isinstance(w, int):
            return node(w)
        if isinstance(w, tuple):
            (ka, ja), (kb, jb) = known.get(w[0]) or node(w[0]), known.get(w[1]) or node(w[1])
            if ja != jb:
                raise NotRepeating("a recomputation across units")
            return (ka, kb), ja
        return w, None

    first = edges[0]
    known = {i: (("pre", i), None) for i in range(first)}
    places = [("unit", r) for r in range(width)]  # (node's values, each key made once)
    known.update(zip(range(first, edges[-1]), ((pos, j) for j in range(n) for pos in places)))
    return where, known


def _instants_by_key(run: StepRun, lay: Layout, n: int, ordered: bool = True) -> tuple[dict, list]:
    """{instant key: {unit or None: its mark}} of a recorded run (RecordingMemory.log's entries: key,
    label, categories, live storages, packed, packed total; the live storages a Vec where
    `packed` is None, pair_growing, else the mark's stamp, which StepRun.live reads back), and the
    (key, unit, mark) step order (when `ordered`, else [])."""
    where, cache = _positions(run, lay, n)
    out: dict[tuple, dict] = {}
    order: list = []
    add = order.append
    get = out.get
    for entry in run.moments:
        phase, micro, w, count = entry[0]
        found = cache.get(w)
        if found is None:  # each mark's place is looked up once per node (forward, backward)
            found = cache[w] = where(w)
        pos, j = found
        key = (phase, micro, pos, count)
        members = get(key)
        if members is None:
            out[key] = {j: entry}
        elif j in members:
            raise NotRepeating(f"two instants at {key}")
        else:
            members[j] = entry
        if ordered:
            add((key, j, entry))
    for key, members in out.items():
        if None not in members and len(members) != n and any(j not in members for j in range(2, n - 2)):
            raise NotRepeating(f"instant {key} not in every middle unit")
    return out, order


def _absent(members: dict, n: int) -> frozenset:
    """The ENDS units an instant is not in (the first unit's backward prefetches no next group)."""
    return frozenset(e for e in ENDS if e % n not in members)



def derive_instants(runs: list[StepRun], lay: Layout) -> list[tuple]:
    """The instants of three recorded runs (N1, N2, N3 units), checked; in step order, each as
    (instant key, its mark at N1 units, at N2 units) (RecordingMemory.log's entries, _instants_by_key), which
    instant_of makes an Instant of (most instants fall under others and never need one)."""
    (f1, _), (f2, _), (f3, order3) = (_instants_by_key(run, lay, n, n == N3) for run, n in zip(runs, (N1, N2, N3)))
    if f1.keys() != f2.keys() or f1.keys() != f3.keys():
        raise NotRepeating("different instants at different depths")
    for key, members in f1.items():  # each instant in the same ENDS units at every depth
        if None in members:
            continue
        m2, m3 = f2[key], f3[key]
        if len(members) == N1 and len(m2) == N2 and len(m3) == N3:  # in every unit
            continue
        if not _absent(members, N1) == _absent(m2, N2) == _absent(m3, N3):
            raise NotRepeating(f"instant {key} in different units at different depths")
    units = {end % N3: (end % N1, end % N2) for end in ENDS}  # its unit at N3 -> at N1 and N2
    units[None] = (None, None)  # (before or after the units)
    out = []
    add = out.append
    for key, j, (_, l3, c3, v3, p3, _) in order3:  # each kept instant of ENDS units once
        found = units.get(j)
        if found is None:  # a middle unit's (check_middle)
            continue
        j1, j2 = found
        e1, e2 = f1[key][j1], f2[key][j2]
        _, l1, c1, v1, p1, _ = e1
        _, l2, c2, v2, p2, _ = e2
        if p1 is not None and p2 is not None and p3 is not None:
            affine = p1 + p3 == p2 << 1  # on_line's test on the packed counts
        else:
            affine = on_line((v1, p1), (v2, p2), (v3, p3), 1, 1, 2)
        if not affine or (l3 != l1 if l1 == l2 else label_at(l1, l2, N3) != l3) or not c1 == c2 == c3:
            raise NotRepeating(f"instant {key} not affine in depth")
        add((key, e1, e2))
    check_middle(f3, N3)  # (N1 and N2 units have no middle unit between the second and second-last)
    return out


def instant_of(instant: tuple, read1: Callable, read2: Callable) -> Instant:
    """The Instant of one of derive_instants' instants (`read1`, `read2`: the runs' StepRun.live
    at N1 and N2 units)."""
    key, (_, l1, c1, v1, p1, t1), (_, l2, _, v2, p2, t2) = instant
    return Instant(key[0], key[2], (l1, l2), c1, v1 if p1 is None else (read1, v1, p1),
                  v2 if p2 is None else (read2, v2, p2), (t1, t2))


def first_step_instants(steady: list[Instant], states: tuple[Vec, Vec]) -> list[Instant]:
    """The first step's instants: the steady state's without the optimizer states (`states`:
    at N1 units and a unit's more) before optimizer.step() creates them, that is in forward,
    backward and clip_grad_norm_ (memcalc.tape.step; a bitsandbytes optimizer's CPU qmaps,
    made with the optimizer, stay), the same from there on."""
    out = []
    for inst in steady:
        if inst.phase in ("forward", "backward") or inst.labels[0] == "clip_grad_norm_":
            base, per = combine(inst.base, states[0], 1, -1), combine(inst.step, states[1], 1, -1)
            if any(c < 0 for c in base.values()):
                raise NotRepeating("states the steady state does not hold")
            cats = inst.cats if any(k[0] == "optimizer" for k in base) else \
                tuple(c for c in inst.cats if c != "optimizer")
            inst = Instant(inst.phase, inst.where, inst.labels, cats, base, combine(base, per, 1, 1))
        out.append(inst)
    return out



def on_line(u: tuple, v: tuple, w: tuple, x: int, y: int, z: int) -> bool:
    """x*u + y*w == z*v for (live storages, packed) instants (v lies on the line through u
    and w), x, y, z >= 0: on the packed integers when all three have one (each count is under
    2**30 and x, y, z small, so no digit carries into the next: equal integers are equal
    counts), else key by key.

    >>> on_line(({"a": 1}, 1), ({"a": 2}, 2), ({"a": 3}, 3), 1, 1, 2)
    True
    >>> on_line(({"a": 1}, None), ({"a": 2}, None), ({}, None), 1, 1, 2)
    False
    """
    if u[1] is not None and v[1] is not None and w[1] is not None:
        return x * u[1] + y * w[1] == z * v[1]
    u, v, w = u[0], v[0], w[0]
    get_u, get_v, get_w = u.get, v.get, w.get
    return all(x * get_u(k, 0) + y * get_w(k, 0) == z * get_v(k, 0) for k in {**u, **v, **w})


def check_middle(fams: dict, n: int) -> None:
    """Every middle unit's instant is the interpolation of the second and the second-last
    unit's: (n-3) * M_j == (n-2-j) * M_1 + (j-1) * M_(n-2), so the largest is at an end."""
    if n <= 4:
        return
    for key, members in fams.items():
        if None in members:
            continue
        if 1 not in members or n - 2 not in members:
            raise NotRepeating(f"instant {key} in the middle units only")
        first, last = members[1], members[n - 2]
        for j in range(2, n - 2):
            mid = members[j]
            if first[4] is not None and mid[4] is not None and last[4] is not None:  # on_line's test
                affine = (n - 2 - j) * first[4] + (j - 1) * last[4] == (n - 3) * mid[4]
            else:
                affine = on_line(first[3:5], mid[3:5], last[3:5], n - 2 - j, j - 1, n - 3)
            if not affine:
                raise NotRepeating(f"instant {key} not affine across units")


def derive_shapes(shapes: list[list]) -> tuple[list, list, list]:
    """Parameters as before + one unit's * (n - N1) + after, from N1 and N2 units, checked at N3.

    >>> derive_shapes([["e", "u", "u", "u", "h"], ["e", "u", "u", "u", "u", "h"], ["e"] + ["u"] * 5 + ["h"]])
    (['e', 'u', 'u', 'u'], ['u'], ['h'])
    """
    p1, p2, p3 = shapes
    a = 0  # the longest common start, then one unit's parameters inserted
    while a < len(p1) and p1[a] == p2[a]:
        a += 1
    d = len(p2) - len(p1)
    one = p2[a:a + d]
    if d < 0 or p2[a + d:] != p1[a:] or p1[:a] + one * (N3 - N1) + p1[a:] != p3:
        raise NotRepeating("parameters do not repeat")
    return p1[:a], one, p1[a:]
