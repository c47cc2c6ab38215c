"""Replays through the caching-allocator replica: a recorded CUDA trace, or a plain alloc/free sequence.

`replay_snapshot` rebuilds the allocator's state at the trace's first event (memcalc.allocator.
snapshot.start_state) and serves every recorded request with the replica, under the recorded
settings or the ones asked for. What the trace decides and no rule does:
- cudaMalloc's address: when the replica reserves a segment it takes the address the recording's
  segment_alloc got for the same request (same size, overlapping no live segment), else a fresh one.
  Addresses order equal-size cached blocks (best fit is (stream, size, address)).
- A run of recorded segment_free events is the replica's own release when its next request would free
  exactly those segments (no cached block fits, cudaMalloc fails at the device limit, and
  release_available_cached_blocks or release_cached_blocks frees that set; or the garbage collector
  runs): the replica then releases by its own rules in that request. Any other run is the program's
  own release, torch.cuda.empty_cache(), and the replica calls empty_cache() there.
- Frees follow the trace: a block returns to the cache at its free_completed event.
- A recorded out-of-memory error (an `oom` event) is a request that failed: with a device limit the
  replica tries it (and frees it at once if it fits, with a note); without one it reserves nothing,
  as the recording did not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from memcalc.allocator.replica import AllocatorOutOfMemory, CachingAllocator
from memcalc.allocator.settings import AllocatorSettings
from memcalc.allocator.snapshot import StartState, load_snapshot, start_state
from memcalc.core.errors import MemcalcError
from memcalc.core.gc_pause import gc_paused


@dataclass
class ReplayResult:
    """What a replay reserved and where every request landed.

    placements: one (segment, offset) per recorded alloc event, segment = the base address of a
    segment alive when the trace began, or ("new", k) for the k-th segment the replay reserved
    (("oom", None) where the replica ran out of memory). segment_events: ("segment_alloc" |
    "segment_free" | "segment_map" | "segment_unmap", bytes), in order. reserved_curve: (event index,
    reserved bytes after it) at every change, starting with (-1, reserved at the start).
    recorded_peak_*: the same peaks in the recording (reserved from its segment events, requested
    from its alloc/free events)."""

    placements: list = field(default_factory=list)
    segment_events: list = field(default_factory=list)
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_requested_bytes: int = 0
    reserved_curve: list = field(default_factory=list)
    start_reserved_bytes: int = 0
    start_allocated_bytes: int = 0
    recorded_peak_reserved_bytes: int | None = None
    recorded_peak_requested_bytes: int | None = None
    settings: AllocatorSettings | None = None
    device_limit: int | None = None
    ooms: list = field(default_factory=list)
    empty_cache_at: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def replay_snapshot(snapshot_or_path: dict | str | Path, *, device_limit: int | None = None,
                    expandable_segments: bool | None = None, max_split_size_mb: int | None = None,
                    roundup_power2_divisions: int | list | None = None,
                    garbage_collection_threshold: float | None = None, device: int = 0) -> ReplayResult:
    """Replay a CUDA memory snapshot's trace through the replica (settings left None: as recorded).

    >>> import pickle, tempfile, os
    >>> MB = 2**20
    >>> snap = {"segments": [{"address": 1 << 40, "total_size": 20 * MB, "stream": 0,
    ...          "segment_type": "large", "blocks": [{"size": 20 * MB, "state": "inactive"}]}],
    ...         "device_traces": [[{"action": "alloc", "addr": (1 << 40) + 0, "size": 3 * MB, "stream": 0},
    ...                            {"action": "alloc", "addr": (1 << 40) + 3 * MB, "size": 5 * MB, "stream": 0}]]}
    >>> r = replay_snapshot(snap)
    >>> [(hex(s), o // MB) for s, o in r.placements], r.peak_reserved_bytes // MB
    ([('0x10000000000', 0), ('0x10000000000', 3)], 20)
    """
    snap = snapshot_or_path if isinstance(snapshot_or_path, dict) else load_snapshot(snapshot_or_path)
    recorded = AllocatorSettings.from_snapshot(snap.get("allocator_settings") or {})
    settings = recorded.with_overrides(
        expandable_segments=expandable_segments, max_split_size_mb=max_split_size_mb,
        roundup_power2_divisions=roundup_power2_divisions,
        garbage_collection_threshold=garbage_collection_threshold)
    if device_limit is not None and device_limit <= 0:
        raise MemcalcError("device_limit", f"must be a positive number of bytes, got {device_limit}",
                           "pass the bytes cudaMalloc can get, or None for no limit")
    state = start_state(snap, device, recorded)
    a = CachingAllocator(settings, device_limit)
    live = {}
    for seg in state.segments:
        for (addr, _, _), blk in zip(seg.allocated, a.add_segment(seg.base, seg.size, seg.stream,
                                                                    seg.small, seg.allocated)):
            live[addr] = blk
    out = ReplayResult(settings=settings, device_limit=device_limit, start_reserved_bytes=a.reserved_bytes,
                       start_allocated_bytes=a.allocated_bytes, reserved_curve=[(-1, a.reserved_bytes)])
    if state.inferred_sizes:
        out.notes.append(f"{state.inferred_sizes} blocks allocated before the trace had no recorded size: "
                         f"round_size(requested), {state.widened} widened over an unsplit remainder")
    if state.private_pool_segments:
        out.notes.append(f"{state.private_pool_segments} segments belong to private pools (CUDA graphs, "
                         "MemPool), which the replica does not keep apart: replayed in the default pools")
    with gc_paused():
        _run_trace(a, state.trace, live, out)
    out.recorded_peak_reserved_bytes, out.recorded_peak_requested_bytes = _recorded_peaks(
        state, out.start_reserved_bytes)
    _finish(a, out)
    return out


def _run_trace(a: CachingAllocator, trace: list[dict], live: dict, out: ReplayResult) -> None:
    """Every recorded event through the replica (module docstring: what the trace decides)."""
    placements, curve, hints = out.placements, out.reserved_curve, a.address_hints
    reserved, missing, n = a.reserved_bytes, 0, len(trace)
    release_run = False
    for i, e in enumerate(trace):
        act = e["action"]
        if act != "segment_free":
            release_run = False  # a run of segment_free events ends at any other event
        if act == "alloc":
            try:
                blk = a.malloc(e["size"], e.get("stream", 0))
            except AllocatorOutOfMemory:
                out.ooms.append(len(placements))
                placements.append(("oom", None))
            else:
                live[e["addr"]] = blk
                seg = blk.seg
                placements.append((seg.key, blk.addr - seg.base))
            hints.clear()
        elif act == "free_completed":
            blk = live.pop(e["addr"], None)
            if blk is None:
                missing += 1
            else:
                a.free_completed(blk)
        elif act == "free_requested":
            blk = live.get(e["addr"])
            if blk is not None:
                a.free_requested(blk)
        elif act == "segment_alloc":
            hints.append((e["addr"], e["size"]))
        elif act == "segment_free":
            if not release_run:
                release_run = True
                if not _replica_releases(a, trace, i, n):
                    a.empty_cache()
                    out.empty_cache_at.append(i)
        elif act == "oom":
            if a.limit is not None:  # the replica tries the request under its own limit
                try:
                    a.free(a.malloc(e["size"], e.get("stream", 0)))
                    out.notes.append(f"event {i}: the recording ran out of memory here, the replica did not")
                except AllocatorOutOfMemory:
                    pass
            hints.clear()
        if a.reserved_bytes != reserved:
            reserved = a.reserved_bytes
            curve.append((i, reserved))
    if missing:
        out.notes.append(f"{missing} free events named no block the replay holds")


def _replica_releases(a: CachingAllocator, trace: list[dict], i: int, n: int) -> bool:
    """Whether the segment_free run at `i` is what the replica's next request releases by itself
    (CachingAllocator.release_plan: the same segments), rather than the program's empty_cache()."""
    run, j = set(), i
    while j < n and trace[j]["action"] in ("segment_free", "segment_alloc", "snapshot", "user_defined"):
        if trace[j]["action"] == "segment_free":
            run.add(trace[j]["addr"])
        j += 1
    if j == n or trace[j]["action"] not in ("alloc", "oom"):
        return False
    plan = a.release_plan(trace[j]["size"], trace[j].get("stream", 0))
    return plan is True or plan == run


def _recorded_peaks(state: StartState, start_reserved: int) -> tuple[int, int]:
    """The recording's own peaks: reserved (start + segment events), requested (alloc/free sizes)."""
    trace = state.trace
    reserved = peak_reserved = start_reserved
    requested = sum(r for seg in state.segments for _, _, r in seg.allocated)
    peak_requested = requested
    for e in trace:
        act = e["action"]
        if act in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            peak_reserved = max(peak_reserved, reserved)
        elif act in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        elif act == "alloc":
            requested += e["size"]
            peak_requested = max(peak_requested, requested)
        elif act == "free_completed":
            requested -= e["size"]
    return peak_reserved, peak_requested


def _finish(a: CachingAllocator, out: ReplayResult) -> None:
    out.segment_events = a.segment_events
    out.peak_reserved_bytes = a.peak_reserved_bytes
    out.peak_allocated_bytes = a.peak_allocated_bytes
    out.peak_requested_bytes = a.peak_requested_bytes


def replay_events(events: Iterable[tuple], settings: AllocatorSettings | str | None = None,
                  device_limit: int | None = None) -> ReplayResult:
    """Replay a plain sequence through the replica, from an empty allocator.

    Events: ("alloc", handle, nbytes) or ("alloc", handle, nbytes, stream); ("free", handle);
    ("empty_cache",). `handle` is any hashable the caller names the allocation by. `settings`: an
    AllocatorSettings, a PYTORCH_CUDA_ALLOC_CONF string, or None (torch's defaults). The result's
    placements, peaks, segment_events and reserved_curve (event index, reserved bytes) are as in
    replay_snapshot; ooms lists the indices of the allocs the replica could not serve under
    device_limit (their frees are skipped).

    >>> r = replay_events([("alloc", "a", 3 << 20), ("alloc", "b", 500), ("free", "a"), ("alloc", "c", 2 << 20)])
    >>> r.peak_reserved_bytes >> 20, r.peak_allocated_bytes, r.segment_events
    (22, 3146240, [('segment_alloc', 20971520), ('segment_alloc', 2097152)])
    >>> replay_events([("alloc", 0, 30 << 20)], device_limit=20 << 20).ooms
    [0]
    """
    if isinstance(settings, str):
        settings = AllocatorSettings.parse(settings)
    a = CachingAllocator(settings, device_limit)
    out = ReplayResult(settings=a.settings, device_limit=device_limit, reserved_curve=[(-1, 0)])
    with gc_paused():
        _run_events(a, events, out)
    _finish(a, out)
    return out


def _run_events(a: CachingAllocator, events: Iterable[tuple], out: ReplayResult) -> None:
    live, reserved = {}, 0
    placements, curve = out.placements, out.reserved_curve
    for i, e in enumerate(events):
        kind = e[0]
        if kind == "alloc":
            try:
                blk = a.malloc(e[2], e[3] if len(e) > 3 else 0)
            except AllocatorOutOfMemory:
                out.ooms.append(len(placements))
                placements.append(("oom", None))
            else:
                live[e[1]] = blk
                placements.append((blk.seg.key, blk.addr - blk.seg.base))
        elif kind == "free":
            blk = live.pop(e[1], None)
            if blk is not None:
                a.free(blk)
        elif kind == "empty_cache":
            a.empty_cache()
        else:
            raise MemcalcError(f"events[{i}]", f"unknown event {kind!r}",
                               "use ('alloc', handle, nbytes), ('free', handle) or ('empty_cache',)")
        if a.reserved_bytes != reserved:
            reserved = a.reserved_bytes
            curve.append((i, reserved))
