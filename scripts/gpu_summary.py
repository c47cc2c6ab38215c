"""Summarise a validation run: worst and mean error, OOMs, errors, reserved and NVML overheads,
and the throughput figures; a short table printed last (the device tool returns the output's end).

    python scripts/gpu_summary.py OUT/gpu-quick.jsonl [--throughput OUT/throughput.json]
        [--tolerance 3] [--json OUT/summary.json] [--md OUT/gpu-quick.md] [--title gpu-quick]
        [--snapshots FOLDER]

Reserved and device bytes, per row that has them: the measured max_memory_reserved against (a) the
caching-allocator replica's replay of the row's own snapshot (--snapshots: the files
`python -m validate run --cuda-snapshots FOLDER` wrote; memcalc.replay_snapshot with the recorded
settings) and (b) the engine's reserved prediction (memcalc.estimate(...).reserved_peak_bytes, where
this memcalc has it); NVML's used memory against the engine's device bytes (.device_bytes).

--md writes the validator's markdown table (validate.run.compare.markdown_table) when the file is
missing, e.g. after the run was cut short before the validator wrote it. Needs no torch.
Exit status 0 whatever the errors (it is a report); 2 when the results file cannot be read.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 2**20
VARIANT_ORDER = ("fp32", "fp32+per-layer", "bf16-amp", "bf16-amp+per-layer", "fp32-tf32", "fp16-amp",
                 "bf16-amp+selective")  # scripts/gpu_throughput.py VARIANTS


def _mib(x) -> str:
    return "-" if x is None else f"{x / MIB:,.0f}"


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": round(min(values), 2), "median": round(statistics.median(values), 2),
            "max": round(max(values), 2)}


def summarise(rows: list[dict], tolerance: float) -> dict:
    """Counts, error statistics and allocator overheads of a results file's rows."""
    from validate.run.compare import verdict

    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r.get("status", "?")] = by_status.get(r.get("status", "?"), 0) + 1
    ok = [r for r in rows if r.get("status") == "ok" and r.get("error_pct") is not None]
    errs = [r["error_pct"] for r in ok]
    worst = max(ok, key=lambda r: abs(r["error_pct"]), default=None)
    first = [r["first_step"]["error_pct"] for r in ok
             if (r.get("first_step") or {}).get("error_pct") is not None]
    failures = [(r.get("name"), why) for r in rows if (why := verdict(r, tolerance))]
    reserved_over, nvml_over, reserved_ratio = [], [], []
    for r in rows:
        extra = r.get("extra") or {}
        res, nvml = extra.get("max_memory_reserved"), extra.get("nvml_used_peak")
        alloc = max(r.get("measured_peak_bytes") or 0, (r.get("first_step") or {}).get("measured") or 0)
        if res and alloc:
            reserved_over.append((res - alloc) / MIB)
            reserved_ratio.append(res / alloc)
        if res and nvml:
            nvml_over.append((nvml - res) / MIB)
    return {
        "rows": len(rows), "by_status": by_status, "tolerance_pct": tolerance,
        "within_tolerance": sum(1 for e in errs if abs(e) <= tolerance), "with_error_pct": len(errs),
        "worst_error_pct": worst["error_pct"] if worst else None,
        "worst_name": worst.get("name") if worst else None,
        "mean_abs_error_pct": round(statistics.fmean(abs(e) for e in errs), 4) if errs else None,
        "mean_error_pct": round(statistics.fmean(errs), 4) if errs else None,
        "first_step_worst_error_pct": max(first, key=abs) if first else None,
        "failures": [{"name": n, "why": w} for n, w in failures],
        "reserved_minus_allocated_mib": _stats(reserved_over),
        "reserved_over_allocated": _stats(reserved_ratio),
        "nvml_minus_reserved_mib": _stats(nvml_over),
        "measure_wall_s": round(sum(r.get("wall_s") or 0 for r in rows), 1),
        "devices": sorted({r.get("device_name") or "?" for r in rows}),
        "torch": sorted({r.get("torch_version") or "?" for r in rows}),
        "transformers": sorted({str(r.get("transformers_version")) for r in rows}),
    }


def _pct(predicted, measured):
    return None if predicted is None or not measured else round((predicted - measured) / measured * 100, 4)


def _err_stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "worst": max(values, key=abs),
            "mean_abs": round(statistics.fmean(abs(v) for v in values), 4)}


def engine_reserved(row: dict) -> tuple[int | None, int | None]:
    """(reserved_peak_bytes, device_bytes) of memcalc.estimate for the row's configuration, each None
    where this memcalc has no such figure or cannot predict the row."""
    try:
        import memcalc
        from memcalc.inputs.specs import ModelSpec
        from memcalc.inputs.training import TrainingConfig

        report = memcalc.estimate(ModelSpec(**row["model"]), TrainingConfig(**row["training"]))
        return getattr(report, "reserved_peak_bytes", None), getattr(report, "device_bytes", None)
    except Exception:  # a report: the row shows '-'
        return None, None


def replay_row_snapshot(row: dict, folder: Path | None) -> dict:
    """The replica's replay of the row's snapshot: {'replayed', 'recorded'} peak reserved bytes (the
    trace's own segment events give 'recorded'), or {'error': why}."""
    name = (row.get("extra") or {}).get("snapshot")
    if folder is None or not name:
        return {}
    try:
        import memcalc

        r = memcalc.replay_snapshot(str(folder / name))
        return {"replayed": r.peak_reserved_bytes, "recorded": r.recorded_peak_reserved_bytes,
                "placements": len(r.placements)}
    except Exception as err:  # one broken file must not stop the summary
        return {"error": f"{type(err).__name__}: {err}"[:200]}


def reserved_checks(rows: list[dict], folder: Path | None, engine=engine_reserved) -> dict:
    """Per row and over all rows: replayed snapshot vs measured reserved, engine reserved vs
    measured reserved, engine device bytes vs NVML used (errors in %)."""
    per_row, replay_err, engine_err, device_err = [], [], [], []
    for r in rows:
        extra = r.get("extra") or {}
        measured, nvml = extra.get("max_memory_reserved"), extra.get("nvml_used_peak")
        if r.get("status") != "ok" or not measured:
            continue
        snap = replay_row_snapshot(r, folder)
        resv, device = engine(r)
        item = {"name": r.get("name"), "measured_reserved": measured, "nvml_used": nvml,
                "replayed_reserved": snap.get("replayed"), "trace_reserved": snap.get("recorded"),
                "engine_reserved": resv, "engine_device": device,
                "replay_error_pct": _pct(snap.get("replayed"), measured),
                "engine_error_pct": _pct(resv, measured), "device_error_pct": _pct(device, nvml)}
        if snap.get("error"):
            item["snapshot_error"] = snap["error"]
        per_row.append(item)
        for key, acc in (("replay_error_pct", replay_err), ("engine_error_pct", engine_err),
                         ("device_error_pct", device_err)):
            if item[key] is not None:
                acc.append(item[key])
    return {"replay_vs_measured_reserved_pct": _err_stats(replay_err),
            "engine_vs_measured_reserved_pct": _err_stats(engine_err),
            "engine_device_vs_nvml_pct": _err_stats(device_err), "rows": per_row}


def reserved_lines(checks: dict) -> list[str]:
    """The reserved/device comparison per row, then one SUMMARY line."""
    if not checks["rows"]:
        return []
    lines = [f"{'config':<24} {'resv MiB':>9} {'replay':>9} {'engine':>9} {'nvml MiB':>9} {'eng dev':>9}"]
    for it in checks["rows"]:
        lines.append(f"{str(it['name'])[:24]:<24} {_mib(it['measured_reserved']):>9} "
                     f"{_mib(it['replayed_reserved']):>9} {_mib(it['engine_reserved']):>9} "
                     f"{_mib(it['nvml_used']):>9} {_mib(it['engine_device']):>9}")
    return lines + [""]


def table(rows: list[dict], tolerance: float) -> list[str]:
    """One short line per configuration: measured, predicted, error, reserved, NVML, status."""
    from validate.run.compare import verdict

    lines = [f"{'config':<24} {'meas MiB':>9} {'pred MiB':>9} {'err %':>7} {'resv MiB':>9} "
             f"{'nvml MiB':>9} {'wall s':>7}  status"]
    for r in rows:
        extra = r.get("extra") or {}
        err = r.get("error_pct")
        why = verdict(r, tolerance)
        status = r.get("status", "?") if why is None else f"FAIL {why}"[:60]
        lines.append(f"{str(r.get('name'))[:24]:<24} {_mib(r.get('measured_peak_bytes')):>9} "
                     f"{_mib(r.get('predicted_peak_bytes')):>9} "
                     f"{'-' if err is None else f'{err:+.2f}':>7} "
                     f"{_mib(extra.get('max_memory_reserved')):>9} {_mib(extra.get('nvml_used_peak')):>9} "
                     f"{r.get('wall_s') or 0:>7.1f}  {status}")
    return lines


def throughput_lines(tp: dict) -> list[str]:
    lines = [f"throughput ({tp.get('device_name')}, {tp.get('model', {}).get('name')} "
             f"L{tp.get('model', {}).get('num_layers')} b{tp.get('micro_batch')} s{tp.get('seq_len')}):"]
    variants = tp.get("variants") or {}
    order = [n for n in VARIANT_ORDER if n in variants] + sorted(set(variants) - set(VARIANT_ORDER))
    for name in order:
        v = variants[name]
        if v.get("status") == "ok":
            tflops = (f", {v['achieved_tflops']:.3g} TFLOP/s"
                      if v.get("achieved_tflops") is not None else "")
            mfu = f", MFU {v['mfu_pct']}%" if v.get("mfu_pct") is not None else ""
            lines.append(f"  {name:<20} {v['median_s'] * 1000:9.1f} ms/step{tflops}{mfu}")
        else:
            lines.append(f"  {name:<20} {v.get('status')}: {str(v.get('error'))[:80]}")
    for key, value in (tp.get("derived") or {}).items():
        if value is not None:
            lines.append(f"  {key} = {value}")
    if tp.get("skipped"):
        lines.append(f"  skipped (budget): {', '.join(tp['skipped'])}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="JSON lines results file of python -m validate run")
    parser.add_argument("--throughput", help="JSON of scripts/gpu_throughput.py")
    parser.add_argument("--tolerance", type=float, default=3.0, help="allowed |error| in %%")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--md", help="write the markdown table here if the file is missing")
    parser.add_argument("--title", help="title of the markdown table")
    parser.add_argument("--snapshots", help="folder of the rows' CUDA snapshots (validate run --cuda-snapshots)")
    args = parser.parse_args(argv)
    try:
        from validate.run.compare import markdown_table, read_jsonl
    except ImportError as err:  # e.g. no pydantic: the environment check already said why
        print(f"gpu_summary: cannot import validate.run.compare ({err}); no summary", file=sys.stderr)
        return 2

    path = Path(args.results)
    rows = read_jsonl(path) if path.exists() else []
    # a resumed run appends: keep the latest row of each configuration, in file order
    latest = {}
    for r in rows:
        latest.pop(r["key"], None)
        latest[r["key"]] = r
    rows = list(latest.values())
    summary = summarise(rows, args.tolerance)
    checks = reserved_checks(rows, Path(args.snapshots) if args.snapshots else None)
    summary["reserved_checks"] = checks
    tp = None
    if args.throughput and Path(args.throughput).exists():
        try:
            tp = json.loads(Path(args.throughput).read_text())
            summary["throughput"] = {"derived": tp.get("derived"),
                                     "median_s": {k: v.get("median_s") for k, v in
                                                  (tp.get("variants") or {}).items()}}
        except (OSError, json.JSONDecodeError) as err:
            summary["throughput"] = {"error": str(err)}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, sort_keys=True))
    if args.md and rows and not Path(args.md).exists():
        title = args.title or path.stem
        Path(args.md).write_text(f"# validate: {title}\n\n{len(rows)} configurations, tolerance "
                                 f"+-{args.tolerance}%, steady-state peak (steps >= 2), bytes shown "
                                 f"in MiB (written by scripts/gpu_summary.py).\n\n"
                                 + markdown_table(rows, args.tolerance))

    out = []
    if tp:
        out += throughput_lines(tp) + [""]
    out += table(rows, args.tolerance) + [""] + reserved_lines(checks)
    s = summary
    worst = "-" if s["worst_error_pct"] is None else f"{s['worst_error_pct']:+.2f}% ({s['worst_name']})"
    mean = "-" if s["mean_abs_error_pct"] is None else f"{s['mean_abs_error_pct']:.2f}%"
    out += [
        f"SUMMARY {path.name}: {s['rows']} rows {s['by_status']}, devices {', '.join(s['devices'])}, "
        f"torch {', '.join(s['torch'])}, transformers {', '.join(s['transformers'])}",
        f"SUMMARY error: worst {worst}, mean |error| {mean}, mean {s['mean_error_pct']}, "
        f"within +-{args.tolerance}%: {s['within_tolerance']}/{s['with_error_pct']}, "
        f"failures {len(s['failures'])}, OOM {s['by_status'].get('oom', 0)}, "
        f"errors {s['by_status'].get('error', 0)}",
        f"SUMMARY reserved-allocated MiB {s['reserved_minus_allocated_mib']}, reserved/allocated "
        f"{s['reserved_over_allocated']}, NVML-reserved MiB {s['nvml_minus_reserved_mib']}",
        f"SUMMARY reserved % vs measured max_memory_reserved: snapshot replay "
        f"{checks['replay_vs_measured_reserved_pct']}, engine {checks['engine_vs_measured_reserved_pct']}; "
        f"engine device bytes vs NVML used {checks['engine_device_vs_nvml_pct']}",
    ]
    print("\n".join(out), flush=True)
    if not path.exists():
        print(f"gpu_summary: {path} does not exist", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
