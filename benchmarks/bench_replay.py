"""Speed of the caching-allocator replica: replaying the largest recorded CUDA trace.

    PYTHONPATH=. python benchmarks/bench_replay.py [SNAPSHOT ...] [--repeat N]

For each snapshot (default: the largest in tests/data/cuda-snapshots): the time to load it
(memcalc.load_snapshot, restricted unpickler), to replay it from the loaded dict
(memcalc.replay_snapshot: start-state reconstruction + every event), with expandable_segments=True,
and replay_events over the same requests from an empty allocator. Best and median of N runs, in
wall-clock seconds and in this process's CPU seconds (the figure to quote on a shared machine).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from memcalc import load_snapshot, replay_events, replay_snapshot

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "cuda-snapshots"


def _times(fn, repeat: int) -> tuple[float, float, float, float]:
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), statistics.median(wall), min(cpu), statistics.median(cpu)


def _as_events(snap: dict) -> list[tuple]:
    """The trace's requests as replay_events input (alloc / free_completed by recorded address)."""
    out, serial, live = [], 0, {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = serial
            out.append(("alloc", serial, e["size"], e["stream"]))
            serial += 1
        elif e["action"] == "free_completed" and e["addr"] in live:
            out.append(("free", live.pop(e["addr"])))
    return out


def main(argv: list[str]) -> None:
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 7
    paths = [Path(a) for a in argv if a.endswith((".pickle", ".pkl", ".gz"))]
    paths = paths or [max(DATA.glob("*.pickle"), key=lambda p: p.stat().st_size)]
    for path in paths:
        snap = load_snapshot(path)
        n = len(snap["device_traces"][0])
        events = _as_events(snap)
        rows = [("load_snapshot", _times(lambda: load_snapshot(path), repeat)),
                ("replay_snapshot", _times(lambda: replay_snapshot(snap), repeat)),
                ("replay_snapshot expandable", _times(lambda: replay_snapshot(snap, expandable_segments=True), repeat)),
                (f"replay_events ({len(events):,} events)", _times(lambda: replay_events(events), repeat))]
        print(f"{path.name}: {n:,} events (best / median of {repeat}, seconds: wall, then CPU)")
        for name, (best, med, cpu_best, cpu_med) in rows:
            print(f"  {name:<34} {best:.4f} / {med:.4f}    cpu {cpu_best:.4f} / {cpu_med:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
