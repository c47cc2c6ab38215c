"""Re-check recorded measurements against the current engine (no torch, no GPU needed).

    python scripts/check_recorded.py                       # validate/results/*.jsonl, cuda rows, 3%
    python scripts/check_recorded.py validate/results/cpu-ci.jsonl --device cpu     # 0.05%

For each recorded row of the device (row['device'], else training.device), rebuild the ModelSpec
and TrainingConfig from the row's `model` and `training` dicts, recompute memcalc.estimate, and
judge the recorded measurement with validate.run.compare.verdict against the new prediction:
|predicted - measured| / measured over the tolerance fails; an OOM row fails when the engine now
predicts less than the card's memory (extra.total_bytes); a row the engine refuses fails (unless
--allow-unpredicted). Rows whose measurement errored, and rows of configurations with parts that
estimate() does not take (e.g. 'parallel', validate/distributed/measure.py's data-parallel runs), are
listed and skipped. The last row of each
configuration counts (a resumed run appends). The default tolerance is the device's bound in
validate.matrices.tolerances (the one table). Exit 1 on any failure, and when there is no row of
the device to check (asked to check, nothing was: a check that cannot fail is no check); 0
otherwise; 2 on bad input.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 2**20


SINGLE_DEVICE_FIELDS = {"model", "training", "hf_config"}


def _config(row: dict) -> dict:
    """The configuration a row's key encodes (model, training, hf_config, and any other part)."""
    try:
        key = json.loads(row.get("key") or "{}")
    except json.JSONDecodeError:
        key = {}
    return key if isinstance(key, dict) and key else {k: row.get(k) for k in SINGLE_DEVICE_FIELDS}


def row_device(row: dict) -> str | None:
    return row.get("device") or (row.get("training") or {}).get("device")


def _predict(estimate, spec, training, row: dict) -> int:
    """The row's prediction as the validator made it: a MoE row that recorded each steady step's
    routing (extra.moe.routing_counts, validate/models/moe_routing.py) with those counts, each micro-step
    with its own (validate.run.routed_steps), the largest over the steps; any other row with its own
    TrainingConfig."""
    routings = ((row.get("extra") or {}).get("moe") or {}).get("routing_counts")
    if not routings:
        return estimate(spec, training).peak_bytes
    from validate.run.routed_steps import predict_steps  # each micro-step with its own routing

    return max(r.peak_bytes for r in predict_steps(estimate, spec, training, routings))


def recheck(row: dict, tolerance: float, allow_unpredicted: bool = False) -> dict:
    """{'name', 'status', 'measured', 'recorded_pred', 'pred', 'error_pct', 'fail'} for one row."""
    from memcalc import estimate
    from memcalc.core.errors import MemcalcError
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from validate.run.compare import error_pct, verdict

    out = {"name": row.get("name"), "label": row.get("label"), "status": row.get("status"),
           "measured": row.get("measured_peak_bytes"), "recorded_pred": row.get("predicted_peak_bytes"),
           "recorded_error_pct": row.get("error_pct"), "pred": None, "error_pct": None, "fail": None}
    if row.get("status") == "error" or (row.get("status") == "ok" and row.get("measured_peak_bytes") is None):
        out["skip"] = "not measured: " + str(row.get("error", "no measurement"))[:200]
        return out
    extra_fields = sorted(set(_config(row)) - SINGLE_DEVICE_FIELDS)
    if extra_fields:  # e.g. 'parallel' (validate/distributed/measure.py): not what estimate() predicts
        out["skip"] = f"not a single-device configuration (has {', '.join(extra_fields)})"
        return out
    try:
        spec = ModelSpec.make(**row["model"])
        training = TrainingConfig.make(**row["training"])
        out["pred"] = _predict(estimate, spec, training, row)
    except MemcalcError as err:
        out["no_prediction"] = str(err)
    except Exception as err:  # an engine bug on a recorded configuration: a failure, with its name
        out["no_prediction"] = f"memcalc.estimate raised {type(err).__name__}: {err}"
    out["error_pct"] = error_pct(out["pred"], out["measured"])
    new = {**row, "predicted_peak_bytes": out["pred"], "error_pct": out["error_pct"],
           "no_prediction": out.get("no_prediction")}
    out["fail"] = verdict(new, tolerance, require_prediction=not allow_unpredicted)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="results files (default validate/results/*.jsonl)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tolerance", type=float,
                        help="allowed |error| in %% (default: the device's, validate.matrices.tolerances)")
    parser.add_argument("--allow-unpredicted", action="store_true",
                        help="rows the engine refuses (NotModelledError) do not fail")
    parser.add_argument("--json", action="store_true", help="one JSON object per checked row")
    args = parser.parse_args(argv)
    from validate.matrices.tolerances import DEVICE_DEFAULTS

    tolerance = args.tolerance if args.tolerance is not None else DEVICE_DEFAULTS[args.device].peak_pct
    paths = args.paths or sorted(glob.glob(str(ROOT / "validate" / "results" / "*.jsonl")))
    for p in paths:
        if not Path(p).is_file():
            print(f"check_recorded: {p}: no such file; fix: give a results .jsonl file", file=sys.stderr)
            return 2

    from validate.run.compare import read_jsonl

    start = time.perf_counter()
    checked, failed, skipped = 0, [], []
    for p in paths:
        latest: dict[str, dict] = {}
        for row in read_jsonl(p):
            if row_device(row) == args.device:
                latest.pop(row["key"], None)
                latest[row["key"]] = row
        for row in latest.values():
            result = recheck(row, tolerance, args.allow_unpredicted)
            result["file"] = Path(p).name
            if args.json:
                print(json.dumps(result, sort_keys=True))
            if result.get("skip"):
                skipped.append(result)
                continue
            checked += 1
            if result["fail"]:
                failed.append(result)
    for r in failed:
        print(f"FAIL {r['file']}:{r['name']}: {r['fail']} (measured {r['measured']} B, now predicted "
              f"{r['pred']} B; recorded error {r['recorded_error_pct']}%) [{r['label']}]")
    reasons: dict[str, list[str]] = {}
    for r in skipped:
        reasons.setdefault(r["skip"], []).append(f"{r['file']}:{r['name']}")
    for why, names in reasons.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        print(f"skip {len(names)}: {why}: {', '.join(names[:3])}{more}")
    if not checked:
        print(f"check_recorded: no {args.device} row to re-predict in {len(paths)} file(s) ({len(skipped)} "
              f"skipped): nothing was checked; fix: record {args.device} results first "
              f"(docs/GPU_RUN.md for cuda) or ask for a device that has them", file=sys.stderr)
        return 1
    print(f"check_recorded: {checked} {args.device} rows re-predicted in {time.perf_counter() - start:.1f} s, "
          f"{len(failed)} outside +-{tolerance}% or unexplained, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
