"""Reserved memory on CPU: the recorded allocation sequence of a run against the engine's own.

A row measured with `python -m validate run --reserved` carries its real storage allocation and free
sequence (validate.measure.allocations: every storage the live-tensor tracker sees, real byte sizes,
over model construction and every measured step). Both that sequence and the engine's sequence for
the same (model, training) (memcalc.engine.allocations.allocation_events) go through the caching
allocator replica with torch's default settings (memcalc.allocator.replay.replay_events, which
rounds each request as CUDA's allocator does), and the two reserved peaks are compared:

- `recorded_reserved_bytes`: the replica's peak reserved over the recorded sequence;
- `predicted_reserved_bytes`: the replica's peak reserved over the engine's sequence;
- `reserved_error_pct`: (predicted - recorded) / recorded, the figure the issue holds to 0.1%;
- `reserved`: the details: event and allocation counts, sequence digests (validate.measure.
  allocations.sequence_digest, so a later engine can be checked against the record without the
  sequence), reserved at the end of each step, and where the sequences first differ.

The same rows are summarised by `summary` (worst and mean error, rows compared) and
`python -m validate.run.reserved RESULTS.jsonl`.
"""
from __future__ import annotations

import inspect
import json
import statistics
import sys
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from validate.measure.sequence import (canonical, from_steps, pool_events, segment_tokens,
                                       sequence_digest, step_starts)

TARGET_PCT = 0.1
"""Issue 23 item 4: engine-sequence vs recorded-sequence reserved peaks agree within 0.1%."""

EngineEvents = Callable[..., object]


# ---- the engine's sequence ----------------------------------------------------------------------
@dataclass
class EngineRun:
    """The engine's events (replay_events' input) and, where the engine says them, each event's
    step (-1 construction, 0 the first step, 1.. steady steps: the validator's numbering) and label."""

    events: list
    steps: list[int] | None = None
    labels: list[str] | None = None


def engine_allocation_events() -> EngineEvents | None:
    """memcalc.engine.allocations.allocation_events, or None while the engine has none."""
    try:
        from memcalc.engine.allocations import allocation_events
    except ImportError:
        return None
    return allocation_events


def _engine_run_labelled(spec, training, steps: int) -> EngineRun | None:
    """memcalc.engine.allocations.engine_sequence(...).events(steps), whose Events carry their step
    (0 construction, 1 the first step, ...), phase and storage label; None where it is missing."""
    try:
        from memcalc.engine.allocations import engine_sequence as labelled
    except ImportError:
        return None
    events = labelled(spec, training).events(steps)
    return EngineRun([e.as_tuple() for e in events], [e.step - 1 for e in events],
                     [f"{e.phase} {e.label}" for e in events])


def engine_sequence(spec, training, steps: int, engine: EngineEvents | None = None):
    """(EngineRun, None) from the engine, or (None, why not).

    `engine(spec, training[, steps=])` returns replay_events' input (a list of ("alloc", handle,
    nbytes) / ("free", handle) events), or an object with such a list as `.events` (and, optionally,
    `.steps` and `.labels` as EngineRun has them). Without one, the
    engine's own (memcalc.engine.allocations), with its steps and labels where it gives them.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec, tc = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8)
    >>> engine_sequence(spec, tc, 3, engine=lambda s, t, steps: [("alloc", 0, steps)])[0].events
    [('alloc', 0, 3)]
    >>> engine_sequence(spec, tc, 3, engine=lambda s, t: 1 / 0)[1]
    'the engine raised ZeroDivisionError: division by zero'
    """
    try:
        if engine is None:
            run = _engine_run_labelled(spec, training, steps)
            if run is not None:
                return run, None
            engine = engine_allocation_events()
            if engine is None:
                return None, "memcalc.engine.allocations.allocation_events does not exist in this memcalc"
        try:
            kwargs = {"steps": steps} if "steps" in inspect.signature(engine).parameters else {}
        except (TypeError, ValueError):
            kwargs = {}
        out = engine(spec, training, **kwargs)
    except Exception as err:  # kept in the row: an engine crash is a finding, not a stop
        return None, f"the engine raised {type(err).__name__}: {err}"[:500]
    return EngineRun(list(getattr(out, "events", out)), getattr(out, "steps", None),
                     getattr(out, "labels", None)), None


# ---- comparing two sequences --------------------------------------------------------------------
def _step_name(k: int) -> str:
    return "build" if k < 0 else f"step {k}"


def _token_text(token: tuple, label: str | None) -> str:
    kind, x = token
    text = {"a": f"alloc of {x} B", "f": f"free of alloc #{x} of this step",
            "F": f"free of an earlier {x} B storage"}[kind]
    return text + (f" [{label}]" if label else "")


def step_divergences(recorded: list, marks: list, engine: EngineRun, ops: list | None = None) -> list[dict]:
    """Per pool (large, then small) and step (build, step 0, step 1, ...), where the two sequences
    first differ once each run of frees between two allocations is put in one order
    (validate.measure.sequence.free_runs_sorted: such runs leave the allocator in the same state
    whatever their order). The pools are compared apart: with torch's default settings each pool's
    reserved bytes follow from its own requests alone (validate.measure.sequence.SMALL_POOL_MAX).
    Empty when every step of both pools agrees. Without the engine's steps, the whole sequences are
    compared as one. `ops`: the recorded events' labels (AllocationRecorder.ops); `index` counts the
    pool's events in that step.

    >>> rec = [("alloc", 0, 10), ("alloc", 1, 20), ("free", 1), ("free", 0)]
    >>> eng = EngineRun([("alloc", 5, 10), ("alloc", 6, 20), ("free", 5), ("free", 6)], [-1, 0, 0, 0])
    >>> step_divergences(rec, [(1, "inputs")], eng)
    []
    >>> eng = EngineRun([("alloc", 5, 10), ("alloc", 6, 24), ("free", 5)], [-1, 0, 0], ["", "x", ""])
    >>> d = step_divergences(rec, [(1, "inputs")], eng)[0]
    >>> d["pool"], d["step"], d["index"], d["recorded"], d["engine"]
    ('small', 'step 0', 0, 'alloc of 20 B', 'alloc of 24 B [x]')
    """
    starts = step_starts(marks)
    rec_steps = [bisect_right(starts, i) - 1 for i in range(len(recorded))]
    out = []
    for pool in ("large", "small"):
        r_ev, r_lab, r_st = pool_events(recorded, pool, ops, rec_steps)
        e_ev, e_lab, e_st = pool_events(engine.events, pool, engine.labels, engine.steps)
        if e_st is None:
            segments = [("all", segment_tokens(r_ev, [], r_lab)[0], segment_tokens(e_ev, [], e_lab)[0])]
        else:
            n = max(len(starts), max(e_st, default=-1) + 1)
            cut = lambda st, k: next((i for i, s in enumerate(st) if s >= k), len(st))  # noqa: E731
            rs = segment_tokens(r_ev, [cut(r_st, k) for k in range(n)], r_lab)
            es = segment_tokens(e_ev, [cut(e_st, k) for k in range(n)], e_lab)
            segments = list(zip([_step_name(k) for k in range(-1, n)], rs, es))
        for name, r, e in segments:
            i = next((j for j in range(min(len(r), len(e))) if r[j][0] != e[j][0]), min(len(r), len(e)))
            if i == len(r) == len(e):
                continue
            out.append({"pool": pool, "step": name, "index": i, "recorded_events": len(r),
                        "engine_events": len(e),
                        "recorded": _token_text(*r[i]) if i < len(r) else "end of step",
                        "engine": _token_text(*e[i]) if i < len(e) else "end of step"})
    return out


def size_difference(recorded: list[int], engine: list[int], top: int = 5) -> dict:
    """Allocation sizes one sequence has more often than the other (the most frequent first).

    >>> size_difference([512, 512, 100], [512, 200])
    {'recorded_only': [[100, 1], [512, 1]], 'engine_only': [[200, 1]]}
    """
    r = Counter(x for x in recorded if x > 0)
    e = Counter(x for x in engine if x > 0)
    key = lambda kv: (-kv[1], kv[0])  # noqa: E731
    return {"recorded_only": [[s, c] for s, c in sorted((r - e).items(), key=key)[:top]],
            "engine_only": [[s, c] for s, c in sorted((e - r).items(), key=key)[:top]]}


def reserved_by_step(curve: list[tuple[int, int]], starts: list[int], n_events: int) -> list[int]:
    """Peak reserved reached by the end of each step (the build counts with step 0).

    >>> reserved_by_step([(-1, 0), (0, 20), (5, 40)], [0, 4], 8)
    [20, 40]
    """
    ends = starts[1:] + [n_events]
    return [max((v for i, v in curve if i < end), default=0) for end in ends]


# ---- a row's fields -----------------------------------------------------------------------------
BUILD = ("from the steps: each sequence's construction replaced by its storages live when the first step "
         "begins, in the order made (validate.measure.sequence.from_steps)")


def recorded_from_steps(events: list, marks: list, ops: list | None = None) -> tuple[list, list, list | None]:
    """The recorded run from its first step on (validate.measure.sequence.from_steps), marks moved.

    >>> recorded_from_steps([("alloc", 0, 8), ("free", 0), ("alloc", 1, 4)], [(2, "inputs")])
    ([('alloc', 1, 4)], [(0, 'inputs')], None)
    """
    starts = step_starts(marks)
    if not starts:
        return events, marks, ops
    events, ops, shift = from_steps(events, starts[0], ops)
    return events, [(i + shift, label) for i, label in marks], ops


def engine_from_steps(run: EngineRun) -> EngineRun:
    """The engine's run from its first step on (construction: its live storages), when its steps are
    known (unchanged otherwise).

    >>> r = engine_from_steps(EngineRun([("alloc", 0, 8), ("free", 0), ("alloc", 1, 4)], [-1, -1, 0]))
    >>> r.events, r.steps
    ([('alloc', 1, 4)], [0])
    """
    if run.steps is None:
        return run
    first = next((i for i, s in enumerate(run.steps) if s >= 0), len(run.steps))
    events, labels, shift = from_steps(run.events, first, run.labels)
    kept = len(events) - (len(run.events) - first)
    return EngineRun(events, [-1] * kept + list(run.steps[first:]), labels)


def reserved_fields(events: list, marks: list, spec, training, steps: int,
                    engine: EngineEvents | None = None, ops: list | None = None) -> dict:
    """The row fields of --reserved for one recorded run (`ops`: each event's ATen op, for the
    description of where the sequences differ).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> ev = [("alloc", "w", 3 << 20), ("alloc", "x", 700), ("free", "x")]
    >>> f = reserved_fields(ev, [(1, "inputs")], ModelSpec.preset("gpt2"),
    ...                     TrainingConfig(micro_batch=1, seq_len=8), 3, engine=lambda s, t: ev[:2])
    >>> f["recorded_reserved_bytes"] >> 20, f["predicted_reserved_bytes"] >> 20, f["reserved_error_pct"]
    (22, 22, 0.0)
    >>> f["reserved"]["identical"], f["reserved"]["first_divergence"]["recorded"]
    (False, 'free of alloc #0 of this step')
    """
    from memcalc.allocator.replay import replay_events

    from validate.run.compare import error_pct

    engine_run, why = engine_sequence(spec, training, steps, engine)
    cut = engine_run is None or engine_run.steps is not None  # an engine without steps: whole runs
    raw_events = len(events)
    if cut:
        events, marks, ops = recorded_from_steps(events, marks, ops)
    seq = canonical(events)
    rec = replay_events(events)
    starts = step_starts(marks)
    detail = {"settings": "torch defaults (PYTORCH_CUDA_ALLOC_CONF unset)",
              "build": BUILD if cut else "as run (the engine gives no steps)",
              "recorded_raw_events": raw_events, "recorded_events": len(seq),
              "recorded_allocs": sum(1 for x in seq if x > 0), "recorded_digest": sequence_digest(seq),
              "recorded_allocated_bytes": rec.peak_allocated_bytes,
              "recorded_segments": sum(1 for k, _ in rec.segment_events if k == "segment_alloc"),
              "recorded_reserved_by_step": reserved_by_step(rec.reserved_curve, starts, len(seq))}
    fields = {"recorded_reserved_bytes": rec.peak_reserved_bytes, "predicted_reserved_bytes": None,
              "reserved_error_pct": None, "reserved": detail}
    if getattr(spec, "moe", None):
        detail["routing"] = ("the run routed tokens as its router decided; the engine's sequence routes them "
                             "its own way (allocation_events takes no routing)")
    if engine_run is None:
        detail["no_engine_sequence"] = why
        return fields
    engine_run = engine_from_steps(engine_run)
    eseq = canonical(engine_run.events)
    pred = replay_events(engine_run.events)
    fields["predicted_reserved_bytes"] = pred.peak_reserved_bytes
    fields["reserved_error_pct"] = error_pct(pred.peak_reserved_bytes, rec.peak_reserved_bytes)
    divergences = step_divergences(events, marks, engine_run, ops)
    detail.update(engine_events=len(eseq), engine_allocs=sum(1 for x in eseq if x > 0),
                  engine_digest=sequence_digest(eseq), engine_allocated_bytes=pred.peak_allocated_bytes,
                  engine_segments=sum(1 for k, _ in pred.segment_events if k == "segment_alloc"),
                  identical=seq == eseq, equivalent=not divergences,
                  equivalent_large=not any(d["pool"] == "large" for d in divergences),
                  first_divergence=divergences[0] if divergences else None, divergences=divergences)
    if engine_run.steps is not None:
        estarts = [next((i for i, s in enumerate(engine_run.steps) if s >= k), len(eseq))
                   for k in range(len(starts))]
        detail["engine_reserved_by_step"] = reserved_by_step(pred.reserved_curve, estarts, len(eseq))
    if seq != eseq:
        detail["sizes"] = size_difference(seq, eseq)
    return fields


def engine_reserved_bytes(spec, training, steps: int = 3) -> int:
    """The engine's reserved peak as `reserved_fields` takes it (its sequence from the steps on,
    replayed with torch's defaults): what a recorded row's predicted_reserved_bytes is re-checked with.
    GPT-2 small in fp32 holds 0.5 GB of parameters and as much of gradients, so more than 1 GiB.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> tc = TrainingConfig(micro_batch=1, seq_len=8)
    >>> engine_allocation_events() is None or engine_reserved_bytes(ModelSpec.preset("gpt2"), tc) > 1 << 30
    True
    """
    from memcalc.allocator.replay import replay_events

    run, why = engine_sequence(spec, training, steps)
    if run is None:
        raise LookupError(why)
    return replay_events(engine_from_steps(run).events).peak_reserved_bytes


# ---- the report ---------------------------------------------------------------------------------
def compared_rows(rows: list[dict]) -> list[dict]:
    """Rows with both reserved peaks."""
    return [r for r in rows if r.get("reserved_error_pct") is not None]


def summary(rows: list[dict], target: float = TARGET_PCT) -> dict:
    """Worst and mean |error| of engine-sequence vs recorded-sequence reserved peaks.

    >>> rows = [{"name": "a", "reserved_error_pct": 0.0, "reserved": {"identical": True, "equivalent": True}},
    ...         {"name": "b", "reserved_error_pct": -0.5, "reserved": {"identical": False}},
    ...         {"name": "c", "recorded_reserved_bytes": 1, "reserved": {}}]
    >>> s = summary(rows); s["compared"], s["worst_pct"], s["worst_name"], s["within_target"], s["identical"]
    (2, -0.5, 'b', 1, 1)
    """
    done = compared_rows(rows)
    errs = [r["reserved_error_pct"] for r in done]
    worst = max(done, key=lambda r: abs(r["reserved_error_pct"]), default=None)
    dense = [r for r in done if not routed(r)]
    dense_worst = max(dense, key=lambda r: abs(r["reserved_error_pct"]), default=None)
    return {"rows": len(rows), "recorded": sum(1 for r in rows if r.get("recorded_reserved_bytes")),
            "compared": len(done), "target_pct": target,
            "dense_compared": len(dense),
            "dense_worst_pct": dense_worst["reserved_error_pct"] if dense_worst else None,
            "dense_worst_name": dense_worst.get("name") if dense_worst else None,
            "dense_mean_abs_pct": (round(statistics.fmean(abs(r["reserved_error_pct"]) for r in dense), 4)
                                   if dense else None),
            "dense_within_target": sum(1 for r in dense if abs(r["reserved_error_pct"]) <= target),
            "within_target": sum(1 for e in errs if abs(e) <= target),
            "identical": sum(1 for r in done if (r.get("reserved") or {}).get("identical")),
            "equivalent": sum(1 for r in done if (r.get("reserved") or {}).get("equivalent")),
            "equivalent_large": sum(1 for r in done if (r.get("reserved") or {}).get("equivalent_large")),
            "first_diverging_step": Counter(_first_at(r) for r in done
                                            if not (r.get("reserved") or {}).get("equivalent")),
            "worst_pct": worst["reserved_error_pct"] if worst else None,
            "worst_name": worst.get("name") if worst else None,
            "mean_abs_pct": round(statistics.fmean(abs(e) for e in errs), 4) if errs else None,
            "mean_pct": round(statistics.fmean(errs), 4) if errs else None,
            "not_compared": Counter(_why_not(r) for r in rows if r.get("reserved_error_pct") is None)}


def routed(row: dict) -> bool:
    """A mixture-of-experts row: its run routed tokens as the router decided (validate.models.
    moe_routing), the engine's sequence routes them its own way (allocation_events takes no routing),
    so the expert tensors' sizes differ by construction.

    >>> routed({"model": {"moe": {"num_experts": 8}}}), routed({"model": {"moe": None}})
    (True, False)
    """
    return bool((row.get("model") or {}).get("moe"))


def _first_at(row: dict) -> str:
    d = (row.get("reserved") or {}).get("first_divergence") or {}
    return f"{d.get('pool')} pool, {d.get('step')}"


def _why_not(row: dict) -> str:
    detail = row.get("reserved") or {}
    return (detail.get("no_engine_sequence") or row.get("no_reserved") or row.get("error")
            or "no recorded sequence")[:120]


def summary_lines(s: dict) -> list[str]:
    """The report as text (the CLI prints it after a --reserved run)."""
    if not s["compared"]:
        lines = [f"reserved: {s['recorded']} of {s['rows']} rows recorded, none compared"]
    else:
        lines = [f"reserved (engine sequence vs recorded sequence, replayed with torch's defaults): "
                 f"{s['compared']} rows compared, worst {s['worst_pct']:+.4f}% ({s['worst_name']}), "
                 f"mean |error| {s['mean_abs_pct']:.4f}%, within {s['target_pct']}%: "
                 f"{s['within_target']}/{s['compared']}; without the mixture-of-experts rows (routing "
                 f"not given to the engine's sequence): {s['dense_compared']} rows, worst "
                 f"{s['dense_worst_pct']}% ({s['dense_worst_name']}), mean |error| {s['dense_mean_abs_pct']}%, "
                 f"within {s['target_pct']}%: {s['dense_within_target']}/{s['dense_compared']}; "
                 f"sequences identical {s['identical']}, "
                 f"allocator-equivalent {s['equivalent']} (large pool alone {s['equivalent_large']}); "
                 f"first difference in "
                 + (", ".join(f"{k} ({n})" for k, n in sorted(s["first_diverging_step"].items(), key=str))
                    or "no step")]
    lines += [f"reserved: not compared ({n} rows): {why}" for why, n in s["not_compared"].items()]
    return lines


def markdown(rows: list[dict]) -> str:
    """The reserved columns as a markdown table (MiB), with the first divergence where they differ."""
    out = ["", "## Reserved: recorded sequence vs engine sequence (the replica, torch's defaults)", "",
           "| config | recorded reserved | engine reserved | error % | events rec / eng | first divergence |",
           "|---|---:|---:|---:|---|---|"]
    for r in rows:
        d = r.get("reserved") or {}
        mib = lambda x: "-" if x is None else f"{x / 2**20:.1f}"  # noqa: E731
        err = r.get("reserved_error_pct")
        div = d.get("first_divergence")
        where = ("identical" if d.get("identical") else "equivalent" if d.get("equivalent") else
                 f"{div['pool']} pool, {div['step']}, event {div['index']}: {div['recorded']} / {div['engine']}"
                 if div else
                 (d.get("no_engine_sequence") or r.get("no_reserved") or "-"))
        out.append(f"| {r.get('name')} | {mib(r.get('recorded_reserved_bytes'))} | "
                   f"{mib(r.get('predicted_reserved_bytes'))} | {'-' if err is None else f'{err:+.4f}'} | "
                   f"{d.get('recorded_events', '-')} / {d.get('engine_events', '-')} | {where} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """python -m validate.run.reserved RESULTS.jsonl [--json]: the report of a --reserved run."""
    from validate.run.compare import read_jsonl

    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    paths = [a for a in args if a != "--json"]
    if len(paths) != 1:
        print("validate.run.reserved: give one results file; fix: python -m validate.run.reserved "
              "validate/results/cpu-ci-reserved.jsonl", file=sys.stderr)
        return 2
    if not Path(paths[0]).is_file():
        print(f"validate.run.reserved: {paths[0]} does not exist; fix: give a results file of "
              "python -m validate run --reserved", file=sys.stderr)
        return 2
    try:
        rows = list({r["key"]: r for r in read_jsonl(paths[0])}.values())
    except (OSError, ValueError, KeyError) as err:
        print(f"validate.run.reserved: {paths[0]}: {err}; fix: give a results file of "
              "python -m validate run --reserved", file=sys.stderr)
        return 2
    s = summary(rows)
    print(json.dumps(s, sort_keys=True) if as_json else "\n".join(summary_lines(s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
