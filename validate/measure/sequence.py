"""Allocation sequences as data, no torch needed: the canonical form of a sequence of
("alloc", handle, nbytes) / ("free", handle) events (validate.measure.allocations records them;
memcalc.allocator.replay.replay_events reads them), its digest, a compact packing, steps, and the
allocator-equivalent form in which frees between two allocations are put in one order.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import sys
import zlib
from array import array
from pathlib import Path


def step_starts(marks: list[tuple[int, str]]) -> list[int]:
    """Event index where each step begins (the step runner marks 'inputs' first in every step).

    >>> step_starts([(5, "inputs"), (9, "forward"), (20, "inputs"), (22, "forward")])
    [5, 20]
    """
    return [i for i, label in marks if label == "inputs"]


def replayed_live_peak(events: list, marks: list, after_step: int = 0) -> int:
    """Largest live bytes (exact sizes) at any event from step `after_step` on: the tracker's
    steady-state peak measured again from the sequence alone (a check that nothing is missing).

    >>> replayed_live_peak([("alloc", 0, 10), ("free", 0), ("alloc", 1, 4)], [(2, "inputs")], 0)
    4
    """
    starts = step_starts(marks)
    begin = starts[after_step] if after_step < len(starts) else len(events)
    live, sizes, peak = 0, {}, 0
    for i, e in enumerate(events):
        if e[0] == "alloc":
            sizes[e[1]] = e[2]
            live += e[2]
        else:
            live -= sizes.pop(e[1])
        if i >= begin - 1:
            peak = max(peak, live)
    return peak


def canonical(events: list) -> list[int]:
    """The sequence as integers: an allocation is its byte size, a free is -(k + 1) for the
    k-th allocation (handles renamed in allocation order, so any two namings of one sequence agree).

    >>> canonical([("alloc", "a", 512), ("alloc", "b", 100), ("free", "a"), ("alloc", "a", 7), ("free", "a")])
    [512, 100, -1, 7, -3]
    """
    order: dict = {}
    out, count = [], 0
    for e in events:
        if e[0] == "alloc":
            order[e[1]] = count
            count += 1
            out.append(int(e[2]))
        elif e[0] == "free":
            k = order.pop(e[1], None)
            if k is not None:
                out.append(-(k + 1))
    return out


def sequence_digest(seq: list[int]) -> str:
    """sha256 of the canonical sequence as little-endian int64 (the first 16 hex digits).

    >>> sequence_digest([512, -1]) == sequence_digest(canonical([("alloc", 9, 512), ("free", 9)]))
    True
    """
    return hashlib.sha256(_int64(seq).tobytes()).hexdigest()[:16]


def pack(seq: list[int]) -> bytes:
    """zlib-compressed little-endian int64 (what `unpack` reads back).

    >>> unpack(pack([512, 100, -1])) == [512, 100, -1]
    True
    """
    return zlib.compress(_int64(seq).tobytes(), 9)


def unpack(data: bytes) -> list[int]:
    """The canonical sequence `pack` compressed."""
    arr = array("q")
    arr.frombytes(zlib.decompress(data))
    if arr.itemsize != 8:  # pragma: no cover - array('q') is 8 bytes on every platform torch runs on
        raise ValueError("int64 arrays are not 8 bytes here")
    if sys.byteorder != "little":  # pragma: no cover
        arr.byteswap()
    return arr.tolist()


def events_of(seq: list[int]) -> list[tuple]:
    """replay_events' input for a canonical sequence.

    >>> events_of([512, 100, -1])
    [('alloc', 0, 512), ('alloc', 1, 100), ('free', 0)]
    """
    out, k = [], 0
    for x in seq:
        if x > 0:
            out.append(("alloc", k, x))
            k += 1
        else:
            out.append(("free", -x - 1))
    return out


def _int64(seq: list[int]) -> array:
    arr = array("q", seq)
    if sys.byteorder != "little":  # pragma: no cover
        arr.byteswap()
    return arr




def segment_tokens(events: list, bounds: list[int], labels: list | None = None) -> list[list[tuple]]:
    """The events cut at `bounds` (event indices where a segment begins, after the first at 0), each
    segment as allocator-equivalent tokens: ("a", nbytes) for an allocation, ("f", k) for the free of
    the segment's k-th allocation, ("F", nbytes) for the free of a storage an earlier segment made;
    each run of frees between two allocations sorted (`free_runs_sorted`), each token paired with its
    event's label (a free without one: its allocation's; None without `labels`).

    >>> ev = [("alloc", 7, 10), ("alloc", 8, 20), ("free", 8), ("free", 7), ("alloc", 9, 5), ("free", 9)]
    >>> [[t for t, _ in seg] for seg in segment_tokens(ev, [2])]
    [[('a', 10), ('a', 20)], [('F', 10), ('F', 20), ('a', 5), ('f', 0)]]
    >>> again = [("alloc", 1, 8), ("alloc", 2, 8), ("free", 1), ("alloc", 1, 4), ("free", 1)]
    >>> [t for t, _ in segment_tokens(again, [])[0]]
    [('a', 8), ('a', 8), ('f', 0), ('a', 4), ('f', 2)]
    """
    sizes: dict = {}
    made_by: dict = {}
    cuts = [0] + list(bounds) + [len(events)]
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        local: dict = {}
        seg, count = [], 0
        for i in range(lo, hi):
            e = events[i]
            label = labels[i] if labels is not None else None
            if e[0] == "alloc":  # a handle may be used again after its free: numbered anew
                sizes[e[1]] = e[2]
                made_by[e[1]] = label
                local[e[1]] = count
                count += 1
                seg.append((("a", e[2]), label))
            elif e[1] in sizes:
                k = local.get(e[1])
                seg.append((("f", k) if k is not None else ("F", sizes[e[1]]), label or made_by.get(e[1])))
        out.append(free_runs_sorted(seg))
    return out


def free_runs_sorted(tokens: list[tuple]) -> list[tuple]:
    """(token, label) pairs with each run of consecutive frees sorted by token: the caching
    allocator's state after a run of frees does not depend on their order (free_block coalesces each
    block with its free neighbours, c10/cuda/CUDACachingAllocator.cpp try_merge_blocks, so the cached
    blocks after the run are the maximal free ranges whatever the order, and a free reserves or
    releases nothing), so two sequences that differ only there reserve alike.

    >>> free_runs_sorted([(("a", 1), None), (("f", 2), "x"), (("F", 9), "y"), (("f", 0), "z")])
    [(('a', 1), None), (('F', 9), 'y'), (('f', 0), 'z'), (('f', 2), 'x')]
    """
    out, run = [], []
    for item in tokens:
        if item[0][0] == "a":
            out += sorted(run, key=lambda t: t[0])
            run = []
            out.append(item)
        else:
            run.append(item)
    return out + sorted(run, key=lambda t: t[0])


SMALL_POOL_MAX = 1 << 20
"""kSmallSize (c10/cuda/CUDACachingAllocator.cpp): requests of at most 1 MiB (after rounding to 512 B,
which never crosses it) are served from the small pool, larger ones from the large pool (get_pool);
memcalc.allocator.settings.K_SMALL_SIZE. With the default settings and no device limit the pools
never touch each other (a request searches its own pool, and cudaMalloc never fails, so nothing is
released), so each pool's reserved bytes follow from its own sub-sequence."""


def pool_of(nbytes: int) -> str:
    """'small' or 'large': the pool a request of nbytes goes to.

    >>> pool_of(1 << 20), pool_of((1 << 20) + 1)
    ('small', 'large')
    """
    return "small" if nbytes <= SMALL_POOL_MAX else "large"


def pool_events(events: list, pool: str, labels: list | None = None, steps: list | None = None) -> tuple:
    """(events, labels, steps) of one pool: its allocations and their frees, in order (labels and
    steps None when not given).

    >>> pool_events([("alloc", 0, 10), ("alloc", 1, 2 << 20), ("free", 0), ("free", 1)], "large")
    ([('alloc', 1, 2097152), ('free', 1)], None, None)
    """
    mine: set = set()
    keep = []
    for i, e in enumerate(events):
        if e[0] == "alloc":
            if pool_of(e[2]) == pool:
                mine.add(e[1])
                keep.append(i)
        elif e[1] in mine:
            keep.append(i)
    pick = lambda xs: None if xs is None else [xs[i] for i in keep]  # noqa: E731
    return [events[i] for i in keep], pick(labels), pick(steps)


def from_steps(events: list, first: int, labels: list | None = None) -> tuple[list, list | None, int]:
    """The sequence as the steps see it: the events before index `first` (the model's construction)
    replaced by one allocation per storage still live at `first`, in the order they were made.
    Returns (events, labels, shift): an index i >= first of the old sequence is i + shift in the new.

    Why: issue 23 compares the order of the measured steps' allocations. How a model is built is
    not the step, and the validator's build is not a user's: it builds a bf16 model in fp32 and
    casts it (validate/measure/step.py build_trainee: every fp32 parameter freed after its bf16
    copy, where from_pretrained(torch_dtype=...) makes bf16 parameters directly), and transformers'
    construction makes temporaries (the rotary inv_freq computation, an lm_head weight that tying
    replaces) that the engine's construction (parameters, then buffers) does not model. The
    engine's sequence is cut the same way, so both start from their live storages, packed.

    >>> ev = [("alloc", 0, 8), ("alloc", 1, 4), ("free", 0), ("alloc", 2, 2), ("alloc", 3, 1), ("free", 2)]
    >>> from_steps(ev, 4, list("abcdef"))
    ([('alloc', 1, 4), ('alloc', 2, 2), ('alloc', 3, 1), ('free', 2)], ['b', 'd', 'e', 'f'], -2)
    """
    live: dict = {}
    for i, e in enumerate(events[:first]):
        if e[0] == "alloc":
            live[e[1]] = i
        else:
            live.pop(e[1], None)
    keep = sorted(live.values())
    head = [events[i] for i in keep]
    new_labels = None if labels is None else [labels[i] for i in keep] + list(labels[first:])
    return head + list(events[first:]), new_labels, len(head) - first


# ---- a recorded run kept on disk (python -m validate run --reserved --sequences DIR) ----------------
def stored_name(key: str) -> str:
    """File name of a row's stored sequence: a digest of its key (validate.run.case.config_key).

    >>> n = stored_name('{"a":1}'); n.endswith(".json.gz"), len(n), n == stored_name('{"a":2}')
    (True, 24, False)
    """
    return hashlib.sha256(key.encode()).hexdigest()[:16] + ".json.gz"


def save_run(folder: str | Path, key: str, events: list, marks: list, ops: list | None = None) -> Path:
    """Keep a recorded run (canonical sequence, marks, each event's op) as folder/stored_name(key), so
    that validate.run.recompare compares it with a later engine without running the row again.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> _ = save_run(d, "k", [("alloc", 9, 512), ("free", 9)], [(0, "inputs")], ["aten.ones.default", ""])
    >>> load_run(d, "k")
    ([('alloc', 0, 512), ('free', 0)], [(0, 'inputs')], ['aten.ones.default', ''])
    """
    seq = canonical(events)
    if len(seq) != len(events):  # a free of a storage never allocated: the marks would shift
        raise ValueError("the sequence frees a handle it never allocated")
    path = Path(folder) / stored_name(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=6) as f:
        json.dump({"key": key, "seq": seq, "marks": [list(m) for m in marks], "ops": ops}, f)
    return path


def load_run(folder: str | Path, key: str) -> tuple[list, list, list | None] | None:
    """(events, marks, ops) that save_run kept for `key`, or None when there is none."""
    path = Path(folder) / stored_name(key)
    if not path.is_file():
        return None
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    if data.get("key") != key:  # pragma: no cover - a digest collision
        return None
    return events_of(data["seq"]), [tuple(m) for m in data["marks"]], data.get("ops")


__all__ = ["stored_name", "save_run", "load_run", "canonical", "sequence_digest",
           "from_steps", "pack", "unpack", "events_of", "step_starts",
           "replayed_live_peak", "free_runs_sorted", "segment_tokens", "pool_of", "pool_events",
           "SMALL_POOL_MAX"]
