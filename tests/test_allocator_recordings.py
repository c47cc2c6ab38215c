"""replay_snapshot's reconstruction, on recordings the replica makes of itself.

A random program (two streams, frees, empty_cache calls, out-of-memory errors under a device limit)
runs on the replica, which writes a snapshot as torch does: the trace of alloc / free_requested /
free_completed / segment_alloc / segment_free / oom events, and the final segments with their blocks.
The trace is then cut between two requests, as a recording that began mid-run is: the blocks
allocated before the cut whose size no event records, the segments freed after it, and the releases
(the program's empty_cache, or the allocator's own under the limit) must all be inferred. The replay
must put every request where the recording did (ground truth read from the trace by
tests.test_allocator_traces._truth_of) and, where no segment was released, reserve the same segments.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import tests.strategies  # noqa: F401  (registers and loads the hypothesis profile)
from memcalc import replay_snapshot
from memcalc.allocator.replica import AllocatorOutOfMemory, CachingAllocator
from memcalc.allocator.settings import AllocatorSettings
from tests.test_allocator_traces import _truth_of

MIB = 1 << 20
CONFS = ["", "max_split_size_mb:64", "roundup_power2_divisions:4",
         "max_split_size_mb:40,roundup_power2_divisions:[1:2,>:8]"]


class _Recorder(CachingAllocator):
    """The replica, writing the trace torch's allocator records (record_trace's events)."""

    def __init__(self, settings: AllocatorSettings, limit: int | None):
        super().__init__(settings, limit)
        self.trace: list[dict] = []

    def alloc_block(self, pool, size, alloc_size, stream):  # noqa: ANN001, ANN201
        b = super().alloc_block(pool, size, alloc_size, stream)
        if b is not None:
            self.trace.append({"action": "segment_alloc", "addr": b.addr, "size": b.size, "stream": stream})
        return b

    def release_block(self, b):  # noqa: ANN001, ANN201
        super().release_block(b)
        self.trace.append({"action": "segment_free", "addr": b.addr, "size": b.size, "stream": b.stream})


@st.composite
def recordings(draw: st.DrawFn) -> tuple[dict, int | None]:
    conf = draw(st.sampled_from(CONFS))
    limit = draw(st.one_of(st.none(), st.integers(60, 400).map(lambda m: m * MIB)))
    a, live = _Recorder(AllocatorSettings.parse(conf), limit), {}
    sizes = draw(st.lists(st.one_of(st.integers(1, MIB), st.integers(MIB, 12 * MIB),
                                    st.integers(10 * MIB, 100 * MIB)), min_size=1, max_size=6))
    for h in range(draw(st.integers(5, 80))):
        step = draw(st.integers(0, 99))
        if live and step < 45:
            b, stream = live.pop(draw(st.sampled_from(sorted(live))))
            addr, requested = b.addr, b.requested
            a.trace.append({"action": "free_requested", "addr": addr, "size": requested, "stream": stream})
            a.free(b)
            a.trace.append({"action": "free_completed", "addr": addr, "size": requested, "stream": stream})
        elif step < 48:
            a.empty_cache()
        else:
            stream, n = draw(st.sampled_from([0, 0, 5])), draw(st.sampled_from(sizes))
            try:
                b = a.malloc(n, stream)
            except AllocatorOutOfMemory:
                a.trace.append({"action": "oom", "addr": 0, "size": a.settings.round_size(n), "stream": stream})
                continue
            live[h] = (b, stream)
            a.trace.append({"action": "alloc", "addr": b.addr, "size": n, "stream": stream})
    segments: dict[int, list] = {}
    for b in [b for b, _ in live.values()] + [b for p in (a.small_pool, a.large_pool) for b in p.map.values()]:
        segments.setdefault(b.seg.base, []).append(b)
    cut = draw(st.integers(0, len(a.trace)))
    while 0 < cut < len(a.trace) and a.trace[cut - 1]["action"] in ("segment_alloc", "segment_free"):
        cut += 1  # a recording begins between requests, not inside one
    snap = {"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf}, "device_traces": [a.trace[cut:]],
            "segments": [{"device": 0, "address": base, "total_size": sum(b.size for b in blocks),
                          "stream": blocks[0].stream, "segment_type": "small" if blocks[0].pool.small else "large",
                          "blocks": [{"size": b.size, "requested_size": b.requested,
                                      "state": "active_allocated" if b.allocated else "inactive"}
                                     for b in sorted(blocks, key=lambda b: b.addr)]}
                         for base, blocks in segments.items()]}
    return snap, limit


@given(recordings())
def test_a_recording_cut_between_requests_replays_exactly(recording):
    snap, limit = recording
    if not any(e["action"] == "alloc" for e in snap["device_traces"][0]):
        return
    truth = _truth_of(snap)
    released = any(kind == "segment_free" for kind, _ in truth["segment_events"])
    r = replay_snapshot(snap, device_limit=truth["peak_reserved"] if released and limit else None)
    assert r.placements == truth["placements"]
    if not released:
        assert r.segment_events == truth["segment_events"]
