"""Reading snapshots safely, and `memcalc snapshot` on the command line."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from memcalc import load_snapshot, replay_snapshot
from memcalc.core.errors import MemcalcError

DATA = Path(__file__).parent / "data" / "cuda-snapshots"
SMALL = DATA / "cs336-small-forward.pickle"


class _Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "x": _Evil(str(marker))}))
    with pytest.raises(MemcalcError, match="refusing (posix|os).system"):
        load_snapshot(path)
    with pytest.raises(MemcalcError):
        replay_snapshot(path)
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the same file, read by plain pickle, does run the command
    assert marker.exists()


@pytest.mark.parametrize("payload, problem", [
    (pickle.dumps([1, 2, 3]), "holds a list, not a dict"),
    (pickle.dumps({"segments": []}), "no 'device_traces' key"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "teleport", "addr": 0, "size": 1}]]}),
     "unknown trace action 'teleport'"),
    (b"not a pickle at all", "is not a pickle"),
])
def test_a_file_that_is_not_a_snapshot_gets_one_line(tmp_path, payload, problem):
    path = tmp_path / "bad.pickle"
    path.write_bytes(payload)
    with pytest.raises(MemcalcError, match=problem) as err:
        load_snapshot(path)
    assert "\n" not in str(err.value)


def test_the_snapshot_gzipped_reads_the_same(tmp_path):
    import gzip

    path = tmp_path / "s.pickle.gz"
    path.write_bytes(gzip.compress(SMALL.read_bytes()))
    assert load_snapshot(path) == load_snapshot(SMALL)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcalc.cli", *args], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1])


def test_cli_snapshot_prints_the_peaks_and_the_what_if():
    out = _cli("snapshot", str(SMALL))
    assert out.returncode == 0, out.stderr
    assert "the replay puts 100.00% of the allocations where the recording did" in out.stdout
    assert "with expandable_segments:True this step reserves 1.05 GB (-4.9%" in out.stdout


def test_cli_snapshot_json_carries_the_peaks():
    out = _cli("snapshot", str(SMALL), "--json", "--max-split-size-mb", "64")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["recorded"]["peak_reserved_bytes"] == 1107296256  # the trace's own segment events
    assert data["replayed"]["settings"] == "max_split_size_mb:64"
    assert data["replayed"]["placements_agree_pct"] is None  # settings differ from the recording's
    assert data["what_if"]["peak_reserved_bytes"] > 0


def test_cli_snapshot_bad_file_exits_2_with_one_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("# not a snapshot\n")
    out = _cli("snapshot", str(path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "is not a pickle" in out.stderr


MIB = 1 << 20
BASE = 1 << 40


def _snapshot(blocks: list[dict], trace: list[dict]) -> dict:
    """One 20 MiB large-pool segment at BASE with the given final blocks, and a trace."""
    return {"segments": [{"device": 0, "address": BASE, "total_size": 20 * MIB, "stream": 0,
                          "segment_type": "large", "blocks": blocks}],
            "device_traces": [[{"stream": 0, **e} for e in trace]]}


def test_a_block_freed_by_the_trace_owns_an_unsplit_remainder_of_at_most_1_mib():
    """P (3 MiB requested) was allocated before the trace and is freed in it; Q (final, 16.5 MiB
    block) starts 3.5 MiB in. The 0.5 MiB between them cannot be a cached large-pool block
    (should_split leaves only remainders above 1 MiB): P's block is 3.5 MiB."""
    snap = _snapshot([{"size": int(3.5 * MIB), "state": "inactive"},
                      {"size": int(16.5 * MIB), "requested_size": 16 * MIB, "state": "active_allocated"}],
                     [{"action": "free_completed", "addr": BASE, "size": 3 * MIB}])
    r = replay_snapshot(snap)
    assert r.start_allocated_bytes == 20 * MIB and "1 widened" in r.notes[0]


def test_the_first_request_into_the_gap_after_an_unknown_block_shows_where_it_ends():
    """P (3 MiB requested) is followed by 17 MiB free at the start. The recording put the first
    request into that gap 3.5 MiB in, while P was allocated: the gap starts there (a request takes
    the front of a free block), so P's block is 3.5 MiB and the replay puts the request there too."""
    trace = [{"action": "alloc", "addr": BASE + int(3.5 * MIB), "size": 2 * MIB},
             {"action": "free_completed", "addr": BASE, "size": 3 * MIB}]
    snap = _snapshot([{"size": int(3.5 * MIB), "state": "inactive"},
                      {"size": 2 * MIB, "requested_size": 2 * MIB, "state": "active_allocated"},
                      {"size": int(14.5 * MIB), "state": "inactive"}], trace)
    assert replay_snapshot(snap).placements == [(BASE, int(3.5 * MIB))]


def test_a_release_the_allocator_makes_itself_is_not_taken_for_empty_cache():
    """Recorded under max_split_size_mb:64 at a 120 MiB limit: a cached 100 MiB (oversize) segment
    and a cached 20 MiB one. An 80 MiB request finds no cached block (100 >= 80 + 20,
    get_free_block), cudaMalloc(80 MiB) fails at the limit, and release_available_cached_blocks frees
    the 100 MiB segment alone. The replay must do the same, not empty the whole cache: the next 3 MiB
    request lands in the 20 MiB segment that stayed."""
    b20, b100, b80 = BASE, BASE + 20 * MIB, BASE + 120 * MIB
    snap = {"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"},
            "segments": [{"device": 0, "address": b20, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
                          "blocks": [{"size": 3 * MIB, "requested_size": 3 * MIB, "state": "active_allocated"},
                                     {"size": 17 * MIB, "state": "inactive"}]},
                         {"device": 0, "address": b80, "total_size": 80 * MIB, "stream": 0, "segment_type": "large",
                          "blocks": [{"size": 80 * MIB, "requested_size": 80 * MIB, "state": "active_allocated"}]}],
            "device_traces": [[{"action": "segment_free", "addr": b100, "size": 100 * MIB, "stream": 0},
                               {"action": "segment_alloc", "addr": b80, "size": 80 * MIB, "stream": 0},
                               {"action": "alloc", "addr": b80, "size": 80 * MIB, "stream": 0},
                               {"action": "alloc", "addr": b20, "size": 3 * MIB, "stream": 0}]]}
    r = replay_snapshot(snap, device_limit=120 * MIB)
    assert r.placements == [(("new", 0), 0), (b20, 0)] and r.empty_cache_at == []
    assert r.segment_events == [("segment_free", 100 * MIB), ("segment_alloc", 80 * MIB)]
