"""CUDA memory snapshots (torch.cuda.memory._dump_snapshot), read safely, and the allocator's state
when the recorded trace began.

A snapshot is a pickle of builtin containers and scalars: {"segments": [...], "device_traces":
[[event, ...] per device], "allocator_settings": {...}, ...}. `load_snapshot` reads it with an
unpickler that resolves no global at all, so a file can never run code: a pickle that names any
class or function (os.system via __reduce__, a torch class) is refused before anything is built.

The recorded trace rarely starts from an empty allocator. `start_state` rebuilds the state at its
first event:
- segments alive at the start: the final segments the trace did not reserve, plus the segments the
  trace releases (segment_free) without having reserved them;
- blocks allocated at the start: the final allocated blocks at addresses the trace never allocates
  (their size is in the snapshot), plus the blocks the trace frees before allocating them (only their
  requested size is recorded);
- everything else in a start segment is one cached free block per gap (free blocks are coalesced).
The size of a block freed by the trace but allocated before it is not recorded. The replay takes
round_size(requested) under the recorded settings (DeviceCachingAllocator::round_size), and when the
block lies in a large-pool segment and is followed by a gap of at most 1 MiB before the next
allocated block or the segment's end, the block owns that gap: a cached block of the large pool is
always larger than 1 MiB (should_split leaves a remainder only when it is above kSmallSize, and every
large-pool block is), so such a gap can only be the remainder alloc_found_block did not split off.
In the small pool every remainder of 512 B or more is split, so round_size(requested) is exact.
When the gap after such a block is larger, the trace may still show where the block ends: the first
request it puts into that gap while the block is allocated lands at the gap's start (a request takes
the front of a free block). Without such a request the block is round_size(requested), except an
oversize block (>= max_split_size), which is never split and so took a whole free block: it owns the
gap. (Checked on recordings the replica makes of itself, cut between any two requests, under four
settings with and without a device limit: tests/test_allocator_recordings.py.)
"""
from __future__ import annotations

import gzip
import io
import pickle
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from memcalc.allocator.settings import K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorSettings
from memcalc.core.errors import MemcalcError

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
           "snapshot", "user_defined", "segment_map", "segment_unmap")
FIX = "pass the file torch.cuda.memory._dump_snapshot() wrote, after torch.cuda.memory._record_memory_history()"


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler that resolves no global: builtin containers and scalars only."""

    def find_class(self, module: str, name: str):  # noqa: ANN201
        raise pickle.UnpicklingError(f"refusing {module}.{name}")

    def persistent_load(self, pid: object):  # noqa: ANN201
        raise pickle.UnpicklingError(f"refusing persistent id {pid!r}")


def load_snapshot(path: str | Path) -> dict:
    """A CUDA memory snapshot read from `path` (plain or gzipped pickle), refusing anything but data.

    >>> import pickle, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "s.pickle")
    >>> pickle.dump({"segments": [], "device_traces": [[]]}, open(f, "wb"))
    >>> sorted(load_snapshot(f))
    ['device_traces', 'segments']
    >>> pickle.dump({"segments": 1}, open(f, "wb")); load_snapshot(f)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    memcalc.core.errors.MemcalcError: ...s.pickle: is a pickle but not a CUDA memory snapshot: 'segments' is not...
    """
    p = Path(path)
    if not p.is_file():
        raise MemcalcError(str(path), "no such file", FIX)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise MemcalcError(str(path), f"is a damaged gzip file ({err})", FIX) from None
    try:
        data = _BuiltinsOnly(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as err:
        if str(err).startswith("refusing"):
            raise MemcalcError(str(path), f"{err}: a memory snapshot holds only builtin containers and "
                               "scalars, so this file is not one and is not read", FIX) from None
        raise MemcalcError(str(path), f"is not a pickle ({err})", FIX) from None
    except Exception as err:  # noqa: BLE001  a truncated or foreign file: any unpickling failure
        raise MemcalcError(str(path), f"is not a pickle ({type(err).__name__}: {err})", FIX) from None
    check_snapshot(data, str(path))
    return data


def check_snapshot(data: object, where: str = "snapshot") -> None:
    """Refuse, naming the first thing wrong, anything that is not a snapshot with a trace.

    >>> check_snapshot({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 8}]]})
    >>> check_snapshot({"segments": []})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    memcalc.core.errors.MemcalcError: snapshot: is a pickle but not a CUDA memory snapshot: no 'device_traces' key...
    """
    def bad(problem: str) -> MemcalcError:
        return MemcalcError(where, f"is a pickle but not a CUDA memory snapshot: {problem}", FIX)

    if not isinstance(data, dict):
        raise bad(f"holds a {type(data).__name__}, not a dict")
    for key in ("segments", "device_traces"):
        if key not in data:
            raise bad(f"no {key!r} key")
        if not isinstance(data[key], list):
            raise bad(f"{key!r} is not a list")
    for seg in data["segments"]:
        if not isinstance(seg, dict) or not {"address", "total_size", "blocks"} <= seg.keys():
            raise bad("a segment lacks address, total_size or blocks")
    for trace in data["device_traces"]:
        if not isinstance(trace, list):
            raise bad("a device trace is not a list")
        for e in trace:
            if not isinstance(e, dict) or not {"action", "addr", "size"} <= e.keys():
                raise bad("a trace event lacks action, addr or size")
            if e["action"] not in ACTIONS:
                raise bad(f"unknown trace action {e['action']!r}")
            if not isinstance(e["addr"], int) or not isinstance(e["size"], int):
                raise bad("a trace event's addr or size is not an integer")


def _refuse_expandable() -> None:
    raise MemcalcError("allocator_settings.expandable_segments", "this snapshot was recorded with "
                       "expandable_segments:True, whose segments replay_snapshot cannot rebuild yet",
                       "replay a snapshot recorded with expandable_segments:False (then ask for "
                       "expandable_segments=True as a what-if)")


@dataclass
class StartSegment:
    """A segment alive when the trace began: allocated blocks (address, size, requested), by address."""

    base: int
    size: int
    stream: int
    small: bool
    allocated: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class StartState:
    """The allocator's state at the first recorded event, and the trace that follows it."""

    segments: list[StartSegment]
    trace: list[dict]
    inferred_sizes: int = 0  # blocks allocated before the trace whose size the replay decided
    widened: int = 0  # of which the replay widened over an unsplit remainder
    private_pool_segments: int = 0  # segments of a CUDA graph's or MemPool's private pool of <= 1 MiB


def start_state(snap: dict, device: int, recorded: AllocatorSettings) -> StartState:
    """The state when the trace of `device` began (module docstring: the rules).

    >>> MB = 2**20
    >>> snap = {"segments": [{"address": 0, "total_size": 20 * MB, "segment_type": "large",
    ...                       "blocks": [{"size": 20 * MB, "state": "inactive"}]}],
    ...         "device_traces": [[{"action": "free_completed", "addr": 0, "size": 3 * MB + 1}]]}
    >>> [(a, s / MB, r) for a, s, r in start_state(snap, 0, AllocatorSettings()).segments[0].allocated]
    [(0, 3.00048828125, 3145729)]
    """
    traces = snap["device_traces"]
    if device >= len(traces) or not traces[device]:
        raise MemcalcError(f"device_traces[{device}]", "recorded no events", "record history with "
                           "torch.cuda.memory._record_memory_history() before the step, then dump")
    trace = traces[device]
    reserved_in_trace, allocated_in_trace, freed_segments = set(), set(), []
    unknown: dict[int, int] = {}  # address -> requested: freed by the trace before any alloc there
    first_free: dict[int, int] = {}  # address -> index of that first free event
    for index, e in enumerate(trace):
        act, addr = e["action"], e["addr"]
        if act == "alloc":
            allocated_in_trace.add(addr)
        elif act == "free_completed" or act == "free_requested":
            if addr not in allocated_in_trace and addr not in unknown:
                unknown[addr], first_free[addr] = e["size"], index
        elif act == "segment_alloc":
            reserved_in_trace.add(addr)
        elif act == "segment_free":
            if addr not in reserved_in_trace:
                freed_segments.append(e)
        elif act == "segment_map" or act == "segment_unmap":
            _refuse_expandable()
    if any(s.get("is_expandable") for s in snap["segments"]):
        _refuse_expandable()
    end = [s for s in snap["segments"] if s.get("device", 0) == device]
    segs = {s["address"]: StartSegment(s["address"], s["total_size"], s.get("stream", 0),
                                       s.get("segment_type") == "small")
            for s in end if s["address"] not in reserved_in_trace}
    for e in freed_segments:
        if e["addr"] not in segs:
            segs[e["addr"]] = StartSegment(e["addr"], e["size"], e.get("stream", 0), e["size"] == K_SMALL_BUFFER)
    known: dict[int, tuple[int, int]] = {}  # address -> (size, requested): final blocks, sizes recorded
    for s in end:
        if s["address"] in segs:
            at = s["address"]
            for b in s["blocks"]:
                if b.get("state", "") in ("active_allocated", "active_pending_free") and at not in allocated_in_trace:
                    known[at] = (b["size"], b.get("requested_size", b["size"]))
                at += b["size"]
    for addr in known:
        unknown.pop(addr, None)
    state = StartState(sorted(segs.values(), key=lambda s: s.base), trace)
    state.private_pool_segments = sum(1 for s in end if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0))
    open_gaps = _place_blocks(state, known, unknown, recorded)
    _close_gaps_from_trace(state, open_gaps, first_free, recorded)
    return state


def _place_blocks(state: StartState, known: dict[int, tuple[int, int]], unknown: dict[int, int],
                  recorded: AllocatorSettings) -> list[tuple[int, int, StartSegment, int]]:
    """Put every block allocated before the trace into its start segment, deciding unknown sizes;
    returns the free gaps after an unknown-size large-pool block: (start, end, segment, index)."""
    open_gaps = []
    bases = [s.base for s in state.segments]
    for addr in sorted({*known, *unknown}):
        i = bisect_right(bases, addr) - 1
        if i < 0 or addr >= bases[i] + state.segments[i].size:
            raise MemcalcError(f"trace address {addr:#x}", "a block freed (or held) before the trace lies "
                               "in no segment alive when the trace began", "pass an unmodified snapshot")
        state.segments[i].allocated.append((addr, -1, -1))
    for seg in state.segments:
        blocks, out = seg.allocated, []
        for j, (addr, _, _) in enumerate(blocks):
            nxt = blocks[j + 1][0] if j + 1 < len(blocks) else seg.base + seg.size
            if addr in known:
                size, requested = known[addr]
                out.append((addr, min(size, nxt - addr), requested))
                continue
            requested = unknown[addr]
            size = recorded.round_size(requested)
            gap = nxt - addr - size
            state.inferred_sizes += 1
            if gap < 0 or (not seg.small and 0 < gap <= K_SMALL_SIZE):
                size += gap
                state.widened += gap > 0
            elif gap > 0 and not seg.small:
                open_gaps.append((addr + size, nxt, seg, len(out)))
            out.append((addr, size, requested))
        seg.allocated = out
    return open_gaps


def _close_gaps_from_trace(state: StartState, gaps: list[tuple[int, int, StartSegment, int]],
                           first_free: dict[int, int], recorded: AllocatorSettings) -> None:
    """Where an unknown-size large-pool block ends when more than 1 MiB of free space follows it.

    The first request the trace puts into that gap while the block is still allocated lands at the
    gap's true start (alloc_found_block serves the front of a free block): the block ends there.
    When no request enters the gap while the block lives, the block is round_size(requested), except
    an oversize one (>= max_split_size): such a block is never split (should_split), so when it was
    allocated it took a whole free block, and it is taken to own the gap."""
    if not gaps:
        return
    gaps.sort(key=lambda g: g[0])
    starts = [g[0] for g in gaps]
    ends = [end if seg.allocated[j][1] >= recorded.max_split_size else start for start, end, seg, j in gaps]
    done = [False] * len(gaps)
    for index, e in enumerate(state.trace):
        if e["action"] != "alloc":
            continue
        i = bisect_right(starts, e["addr"]) - 1
        if i < 0 or done[i] or e["addr"] >= gaps[i][1]:
            continue
        done[i] = True
        start, _, seg, j = gaps[i]
        if index < first_free[seg.allocated[j][0]]:
            ends[i] = e["addr"]
    for (start, _, seg, j), end in zip(gaps, ends):
        addr, _, requested = seg.allocated[j]
        if end != start:
            seg.allocated[j] = (addr, end - addr, requested)
            state.widened += 1


def recorded_placements(state: StartState) -> list[tuple[object, int]]:
    """Where the recording put each alloc: (segment, offset), segment named as replay_snapshot names
    it (the base of a segment alive at the start, or ("new", k) for the k-th the trace reserved).

    >>> snap = {"segments": [], "device_traces": [[
    ...     {"action": "segment_alloc", "addr": 4096, "size": 2**21}, {"action": "alloc", "addr": 4608, "size": 8}]]}
    >>> recorded_placements(start_state(snap, 0, AllocatorSettings()))
    [(('new', 0), 512)]
    """
    live = {s.base: s.size for s in state.segments}
    names: dict[int, object] = {b: b for b in live}
    bases, out, k = sorted(live), [], 0
    for e in state.trace:
        act, addr = e["action"], e["addr"]
        if act == "segment_alloc":
            live[addr], names[addr] = e["size"], ("new", k)
            k += 1
            bases.insert(bisect_right(bases, addr), addr)
        elif act == "segment_free" and addr in live:
            del live[addr]
            bases.remove(addr)
        elif act == "alloc":
            i = bisect_right(bases, addr) - 1
            inside = i >= 0 and addr < bases[i] + live[bases[i]]
            out.append((names[bases[i]], addr - bases[i]) if inside else (None, addr))
    return out
