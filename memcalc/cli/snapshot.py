"""`memcalc snapshot PATH`: a recorded CUDA memory snapshot replayed, and the expandable-segments what-if.

    memcalc snapshot memory.pickle [--expandable-segments] [--max-split-size-mb N]
                                   [--device-limit-gb X] [--json]
"""
from __future__ import annotations

import argparse
from pathlib import Path

GB = 1e9


def add_snapshot_parser(sub: argparse._SubParsersAction) -> None:
    """The `snapshot` subcommand's arguments."""
    p = sub.add_parser("snapshot", help="replay a CUDA memory snapshot: recorded vs replayed reserved "
                                        "memory, and the expandable-segments what-if")
    p.add_argument("path", help="a pickle written by torch.cuda.memory._dump_snapshot()")
    p.add_argument("--expandable-segments", action="store_true",
                   help="replay with expandable_segments:True (the what-if compares with the default)")
    p.add_argument("--max-split-size-mb", type=int, default=None, help="replay with max_split_size_mb:N")
    p.add_argument("--device-limit-gb", type=float, default=None,
                   help="bytes cudaMalloc can get, in GB (default: no limit)")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_snapshot(args: argparse.Namespace) -> dict:
    """Run `snapshot`: recorded vs replayed peaks, placement agreement, the what-if."""
    from memcalc.allocator.replay import replay_snapshot
    from memcalc.allocator.settings import AllocatorSettings
    from memcalc.allocator.snapshot import load_snapshot, recorded_placements, start_state
    from memcalc.core.errors import MemcalcError

    if args.device_limit_gb is not None and args.device_limit_gb <= 0:
        raise MemcalcError("--device-limit-gb", f"must be > 0, got {args.device_limit_gb}", "e.g. 80")
    limit = None if args.device_limit_gb is None else int(args.device_limit_gb * GB)
    snap = load_snapshot(args.path)
    asked = dict(max_split_size_mb=args.max_split_size_mb, device_limit=limit)
    default = replay_snapshot(snap, expandable_segments=False, **asked)
    main = replay_snapshot(snap, expandable_segments=True, **asked) if args.expandable_segments else default
    what_if = main if args.expandable_segments else replay_snapshot(snap, expandable_segments=True, **asked)
    recorded = AllocatorSettings.from_snapshot(snap.get("allocator_settings") or {})
    same = main.settings == recorded
    agree = None
    if same:
        truth = recorded_placements(start_state(snap, 0, recorded))
        agree = 100 * sum(a == b for a, b in zip(main.placements, truth)) / max(len(truth), 1)
    change = 100 * (what_if.peak_reserved_bytes - default.peak_reserved_bytes) / default.peak_reserved_bytes
    out = {"path": str(args.path), "events": len(snap["device_traces"][0]), "allocs": len(main.placements),
           "recorded": {"settings": recorded.conf_string(),
                        "peak_reserved_bytes": main.recorded_peak_reserved_bytes,
                        "peak_requested_bytes": main.recorded_peak_requested_bytes},
           "replayed": {"settings": main.settings.conf_string(), "device_limit": limit,
                        "peak_reserved_bytes": main.peak_reserved_bytes,
                        "peak_allocated_bytes": main.peak_allocated_bytes,
                        "peak_requested_bytes": main.peak_requested_bytes,
                        "placements_agree_pct": agree, "ooms": len(main.ooms),
                        "empty_cache_calls": len(main.empty_cache_at), "notes": main.notes},
           "what_if": {"settings": "expandable_segments:True",
                       "peak_reserved_bytes": what_if.peak_reserved_bytes, "change_pct": round(change, 2),
                       "ooms": len(what_if.ooms)}}
    if not args.json:
        _print(out, Path(args.path).name, default.peak_reserved_bytes)
    return out


def _print(out: dict, name: str, default_peak: int) -> None:
    rec, rep, wi = out["recorded"], out["replayed"], out["what_if"]
    print(f"{name}: {out['events']:,} events, {out['allocs']:,} allocations "
          f"(settings recorded: {rec['settings'] or 'defaults'}; replayed: {rep['settings'] or 'defaults'})")
    print(f"{'':<16}{'recorded':>12}{'replayed':>12}")
    for what in ("reserved", "requested"):
        rec_gb, rep_gb = rec[f"peak_{what}_bytes"] / GB, rep[f"peak_{what}_bytes"] / GB
        print(f"{'peak ' + what:<16}{rec_gb:>9.2f} GB{rep_gb:>9.2f} GB")
    print(f"{'peak allocated':<16}{'-':>12}{rep['peak_allocated_bytes'] / GB:>9.2f} GB"
          "   (blocks, rounded as max_memory_allocated counts them)")
    if rep["placements_agree_pct"] is not None:
        print(f"the replay puts {rep['placements_agree_pct']:.2f}% of the allocations where the recording did")
    if rep["empty_cache_calls"]:
        print(f"the recording released its cache {rep['empty_cache_calls']} time(s) outside any request: "
              "replayed as torch.cuda.empty_cache()")
    for note in rep["notes"]:
        print(f"note: {note}")
    if rep["ooms"]:
        print(f"the replica ran out of memory on {rep['ooms']} requests under the device limit")
    sign = "+" if wi["change_pct"] >= 0 else "-"
    print(f"with expandable_segments:True this step reserves {wi['peak_reserved_bytes'] / GB:.2f} GB "
          f"({sign}{abs(wi['change_pct']):.1f}% against {default_peak / GB:.2f} GB without)")
