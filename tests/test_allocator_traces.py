"""The caching-allocator replica against real CUDA traces (tests/data/cuda-snapshots, PROVENANCE.md).

Ground truth is read from the recording itself, independently of memcalc's code: where each alloc
event's address lies among the segments alive at that moment (the segments alive when the trace
began: final segments the trace did not reserve, plus those it releases without reserving; then every
segment_alloc / segment_free), as ../shared/cuda-snapshots/truth.py does. The replay must put every
request in the same segment at the same offset, and (for traces without segment_free) reserve and
release segments of the same sizes in the same order. A trace with segment_free events reached the
device limit or emptied the cache: it is replayed with device_limit = its recorded peak reserved.
"""
from __future__ import annotations

import bisect
import pickle
from pathlib import Path

import pytest

from memcalc import replay_snapshot

DATA = Path(__file__).parent / "data" / "cuda-snapshots"
TRACES = sorted(DATA.glob("*.pickle"))


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")


def _truth(path: Path) -> dict:
    return _truth_of(_NoGlobals(path.open("rb")).load())


def _truth_of(snap: dict) -> dict:
    """Placements, segment events and peak reserved as the recording shows them."""
    trace = snap["device_traces"][0]
    end = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == 0}
    reserved_by_trace = {e["addr"] for e in trace if e["action"] == "segment_alloc"}
    live = {a: n for a, n in end.items() if a not in reserved_by_trace}
    seen = set()
    for e in trace:
        if e["action"] == "segment_alloc":
            seen.add(e["addr"])
        elif e["action"] == "segment_free" and e["addr"] not in seen:
            live[e["addr"]] = e["size"]
    name = {a: a for a in live}
    reserved = peak = sum(live.values())
    placements, segment_events, k = [], [], 0
    for e in trace:
        if e["action"] == "segment_alloc":
            live[e["addr"]], name[e["addr"]] = e["size"], ("new", k)
            k += 1
            reserved += e["size"]
            peak = max(peak, reserved)
            segment_events.append(("segment_alloc", e["size"]))
        elif e["action"] == "segment_free":
            del live[e["addr"]]
            reserved -= e["size"]
            segment_events.append(("segment_free", e["size"]))
        elif e["action"] == "alloc":
            bases = sorted(live)
            base = bases[bisect.bisect_right(bases, e["addr"]) - 1]
            assert base <= e["addr"] < base + live[base]
            placements.append((name[base], e["addr"] - base))
    return {"placements": placements, "segment_events": segment_events, "peak_reserved": peak}


def test_the_traces_are_here():
    assert len(TRACES) >= 5, "tests/data/cuda-snapshots holds the shared traces (PROVENANCE.md)"


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_replay_places_every_request_where_the_recording_did(path):
    truth = _truth(path)
    at_limit = any(kind == "segment_free" for kind, _ in truth["segment_events"])
    r = replay_snapshot(path, device_limit=truth["peak_reserved"] if at_limit else None)
    assert len(r.placements) == len(truth["placements"])
    wrong = [i for i, (a, b) in enumerate(zip(r.placements, truth["placements"])) if a != b]
    assert not wrong, f"{len(wrong)} placements differ, first at alloc {wrong[0]}"
    if not at_limit:
        assert r.segment_events == truth["segment_events"]
    assert r.peak_reserved_bytes == truth["peak_reserved"] == r.recorded_peak_reserved_bytes
    assert not r.ooms


def test_the_at_limit_trace_empties_the_cache_where_the_program_did():
    """Its 287 segment_free events come before any request: no request of the replica releases
    them (cached blocks fit its first request), so the replay takes them as torch.cuda.empty_cache()."""
    path = DATA / "cs336-ctx256-forward-at-limit.pickle"
    truth = _truth(path)
    r = replay_snapshot(path, device_limit=truth["peak_reserved"])
    assert r.empty_cache_at == [0]
    assert r.segment_events == truth["segment_events"]  # not required by the issue, but true here


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_reserved_never_below_allocated_on_the_traces(path):
    r = replay_snapshot(path, expandable_segments=True)
    assert r.peak_reserved_bytes >= r.peak_allocated_bytes >= r.peak_requested_bytes
    assert min(v for _, v in r.reserved_curve) >= 0
