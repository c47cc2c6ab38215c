"""The recorded allocation sequence (validate.measure.allocations) and the reserved comparison with the
engine's sequence (validate.run.reserved, `python -m validate run --reserved`).

Independent checks: the recorder's sequence against torch's own profiler (the CPU allocator reports
every allocation and free it serves, c10/core/impl/alloc_cpu + reportMemoryUsage), the recorded
sequence's live peak against the tracker's measured peak, and the comparison harness against
sequences whose differences are known."""
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from memcalc.allocator.replay import replay_events  # noqa: E402
from memcalc.inputs.specs import ModelSpec  # noqa: E402
from memcalc.inputs.training import TrainingConfig  # noqa: E402
from validate.measure.allocations import AllocationRecorder, measure_recorded  # noqa: E402
from validate.measure.sequence import (canonical, events_of, pack, replayed_live_peak,  # noqa: E402
                                       sequence_digest, step_starts, unpack)
from validate.run import reserved as rv  # noqa: E402
from validate.run.compare import error_pct  # noqa: E402

TINY = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                      implementation="reference")
TC = TrainingConfig(micro_batch=2, seq_len=8, device="cpu", optimizer="adamw")


def _program():
    a = torch.randn(64, 32)
    b = torch.randn(32, 48)
    c = a @ b
    d = c.relu()
    del a
    e = d.sum(0)
    del c, d
    return b, e


def test_recorder_matches_the_profilers_allocator_events():
    """The CPU allocator's own report (torch.profiler, profile_memory=True: bytes each op allocated
    net of what it freed, and frees outside ops as [memory] events) of a program without kernel
    scratch: the same sizes, allocated and freed in the same order."""
    from torch.profiler import ProfilerActivity, profile

    _program()  # warm: lazy initialisation allocates nothing the second time
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        kept = _program()
    del kept
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    reported = [e.self_cpu_memory_usage for e in events if e.self_cpu_memory_usage]
    with AllocationRecorder() as rec:
        kept = _program()
    del kept  # after the recorder: not recorded
    sizes, mine = {}, []
    for e in rec.events:
        if e[0] == "alloc":
            sizes[e[1]] = e[2]
            mine.append(e[2])
        else:
            mine.append(-sizes[e[1]])
    assert mine == reported == [8192, 6144, 12288, 12288, -8192, 192, -12288, -12288]


def test_resize_is_a_new_block_then_the_old_one_freed():
    out = torch.empty(0)
    with AllocationRecorder() as rec:
        x = torch.ones(10)
        torch.add(x, x, out=out)  # 0 -> 40 bytes: an allocation, no free (0 bytes never allocate)
        out.resize_(100)  # 40 -> 400 bytes
    assert rec.events == [("alloc", 0, 40), ("alloc", 1, 40), ("alloc", 2, 400), ("free", 1)]
    assert rec.live == 440


@pytest.fixture(scope="module")
def run():
    return measure_recorded(TINY, TC, steps=3)


def test_recorded_sequence_holds_the_measured_peak(run):
    """The sequence alone gives the tracker's steady-state peak: nothing the peak counts is missing."""
    marks = [label for _, label in run.marks]
    assert marks.count("inputs") == 3 and marks.count("optimizer") == 3
    assert replayed_live_peak(run.events, run.marks, after_step=1) == run.measurement.peak_bytes
    assert replayed_live_peak(run.events, run.marks, after_step=0) == max(
        run.measurement.peak_bytes, run.measurement.first_step_peak_bytes)
    seq = canonical(run.events)
    assert unpack(pack(seq)) == seq and canonical(events_of(seq)) == seq


def test_recording_goes_on_past_the_kernels_the_tracker_looks_inside():
    """bitsandbytes' CPU optimizer update is run with the tracker entered again (tracker.SEE_INSIDE):
    the end of that inner `with` is not the end of the recording (every step is in the sequence)."""
    pytest.importorskip("bitsandbytes")
    tc = TC.model_copy(update={"optimizer": "adamw-8bit"})
    rec = measure_recorded(TINY, tc, steps=3)
    marks = [label for _, label in rec.marks]
    assert marks.count("inputs") == 3 and marks.count("optimizer") == 3
    assert replayed_live_peak(rec.events, rec.marks, after_step=1) == rec.measurement.peak_bytes


@pytest.mark.slow
def test_same_run_same_sequence(run):
    assert sequence_digest(canonical(measure_recorded(TINY, TC, steps=3).events)) == sequence_digest(
        canonical(run.events))


def test_reserved_fields_against_known_engines(run):
    same = rv.reserved_fields(run.events, run.marks, TINY, TC, 3, engine=lambda *_: run.events)
    assert same["reserved_error_pct"] == 0.0 and same["reserved"]["identical"]
    assert same["recorded_reserved_bytes"] == replay_events(run.events).peak_reserved_bytes
    assert same["reserved"]["recorded_digest"] == same["reserved"]["engine_digest"]
    by_step = same["reserved"]["recorded_reserved_by_step"]
    assert len(by_step) == 3 and by_step == sorted(by_step) and by_step[-1] == same["recorded_reserved_bytes"]

    # an engine that frees the storages of each run of frees in reverse order (the allocator cannot
    # tell), one that allocates one small-pool storage 512 B too large in step 1's backward, and one
    # that makes it 30 MiB larger (a large-pool request instead)
    seq = canonical(run.events)
    backward = [i for i, label in run.marks if label == "backward"]
    k = next(i for i in range(backward[1], len(seq)) if 0 < seq[i] <= (1 << 20) - 512)
    bounds = step_starts(run.marks)
    steps = [sum(1 for b in bounds if b <= i) - 1 for i in range(len(seq))]

    def reversed_frees(s):
        out, run_ = [], []
        for x in s + [1]:
            if x < 0:
                run_.append(x)
            else:
                out += run_[::-1] + [x]
                run_ = []
        return out[:-1]

    def engine_with(s):
        return lambda *_: rv.EngineRun(events_of(s), steps, ["x"] * len(s))

    assert reversed_frees(seq) != seq
    equiv = rv.reserved_fields(run.events, run.marks, TINY, TC, 3, engine=engine_with(reversed_frees(seq)))
    assert equiv["reserved"]["equivalent"] and not equiv["reserved"]["identical"]
    assert equiv["reserved_error_pct"] == 0.0

    small = list(seq)
    small[k] += 512
    d = rv.reserved_fields(run.events, run.marks, TINY, TC, 3, engine=engine_with(small),
                           ops=run.ops)["reserved"]
    assert not d["identical"] and not d["equivalent"] and d["equivalent_large"]
    assert [(x["pool"], x["step"]) for x in d["divergences"]] == [("small", "step 1")]
    first = d["first_divergence"]
    assert first["engine"] == f"alloc of {small[k]} B [x]"
    assert first["recorded"].startswith(f"alloc of {seq[k]} B [aten.")
    assert d["sizes"]["engine_only"] == [[small[k], 1]]

    large = list(seq)
    large[k] += 30 << 20
    diff = rv.reserved_fields(run.events, run.marks, TINY, TC, 3, engine=engine_with(large))
    d = diff["reserved"]
    assert [(x["pool"], x["step"]) for x in d["divergences"]] == [("large", "step 1"), ("small", "step 1")]
    assert d["first_divergence"]["engine"] == f"alloc of {large[k]} B [x]"
    assert diff["predicted_reserved_bytes"] > diff["recorded_reserved_bytes"]
    assert diff["reserved_error_pct"] > 0.1
    assert d["engine_reserved_by_step"][0] == d["recorded_reserved_by_step"][0]

    if rv.engine_allocation_events() is None:
        missing = rv.reserved_fields(run.events, run.marks, TINY, TC, 3)
        assert missing["predicted_reserved_bytes"] is None and "no_engine_sequence" in missing["reserved"]


def test_summary_and_report(tmp_path, capsys):
    rows = [{"key": "a", "name": "a", "reserved_error_pct": 0.05, "recorded_reserved_bytes": 1,
             "reserved": {"identical": False}},
            {"key": "b", "name": "b", "reserved_error_pct": 0.0, "recorded_reserved_bytes": 1,
             "reserved": {"identical": True}},
            {"key": "c", "name": "c", "no_reserved": "runs through transformers.Trainer"}]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rv.main([str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["compared"], s["worst_pct"], s["mean_abs_pct"], s["within_target"], s["identical"]) == (
        2, 0.05, 0.025, 2, 1)
    assert s["not_compared"] == {"runs through transformers.Trainer": 1}
    assert rv.main([str(tmp_path / "none.jsonl")]) == 2
    assert "| a |" in rv.markdown(rows)


def test_cli_reserved_row(tmp_path, monkeypatch, capsys):
    """python -m validate run --reserved: the row carries both reserved peaks and the first divergence
    (an engine stub that allocates one 1 MiB storage and nothing else)."""
    from validate.run import cli

    monkeypatch.setattr(rv, "engine_allocation_events", lambda: lambda *_: [("alloc", 0, 1 << 20)])
    monkeypatch.setattr(rv, "_engine_run_labelled", lambda *_: None)  # the stub, not the engine
    out = tmp_path / "one.jsonl"
    rc = cli.main(["run", "--model", "gpt2", "--num-layers", "1", "--hidden-size", "16", "--num-heads",
                   "2", "--vocab-size", "64", "--implementation", "reference", "--micro-batch", "1",
                   "--seq-len", "8", "--device", "cpu", "--reserved", "--json", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["predicted_reserved_bytes"] == 2 << 20 and not row["reserved"]["identical"]
    assert row["recorded_reserved_bytes"] >= row["reserved"]["recorded_allocated_bytes"] > 0
    assert row["reserved"]["first_divergence"]["engine"] == "alloc of 1048576 B"
    assert "Reserved" in out.with_suffix(".md").read_text()
    assert "1 rows compared" in capsys.readouterr().out


def test_stored_sequences_recompare_without_running(tmp_path, monkeypatch, capsys):
    """--sequences keeps the recorded run; validate.run.recompare gives the same fields from it as the
    run itself (same engine stub), and new ones when the engine changes, without running the row."""
    from validate.run import cli, recompare

    stub = [[("alloc", 0, 1 << 20)]]
    monkeypatch.setattr(rv, "engine_allocation_events", lambda: lambda *_: stub[0])
    monkeypatch.setattr(rv, "_engine_run_labelled", lambda *_: None)
    out, seqs = tmp_path / "one.jsonl", tmp_path / "seqs"
    args = ["run", "--model", "gpt2", "--num-layers", "1", "--hidden-size", "16", "--num-heads", "2",
            "--vocab-size", "64", "--implementation", "reference", "--micro-batch", "1", "--seq-len", "8",
            "--device", "cpu", "--reserved", "--sequences", str(seqs), "--out", str(out)]
    assert cli.main(args) == 0
    row = json.loads(out.read_text().splitlines()[-1])
    again = recompare.recompare_row(row, seqs)
    assert {k: again[k] for k in row} == row
    stub[0] = [("alloc", 0, 30 << 20)]
    assert recompare.main([str(out), "--sequences", str(seqs), "--out", str(tmp_path / "new.jsonl")]) == 0
    new = json.loads((tmp_path / "new.jsonl").read_text())
    assert new["predicted_reserved_bytes"] == 30 << 20 and new["measured_peak_bytes"] == row["measured_peak_bytes"]
    assert "1 rows compared" in capsys.readouterr().out
    assert "| configuration |" in (tmp_path / "new.md").read_text()
    assert recompare.main([str(out), "--sequences", str(tmp_path / "none")]) == 2
    assert cli.main(args[:-5] + ["--sequences", str(seqs)]) == 2  # --sequences without --reserved


def test_cli_reserved_needs_the_cpu_backend(capsys):
    from validate.run import cli

    rc = cli.main(["run", "--model", "gpt2", "--micro-batch", "1", "--seq-len", "8", "--device", "cuda",
                   "--reserved"])
    err = capsys.readouterr().err
    assert rc == 2 and "reserved" in err and len(err.strip().splitlines()) == 1


# ---- the recorded ci rows against the current engine (no torch run: the record is the measurement) ----
RESERVED_RESULTS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-reserved.jsonl"


def _recorded_rows():
    if not RESERVED_RESULTS.exists():
        pytest.skip("no validate/results/cpu-ci-reserved.jsonl")
    rows = [json.loads(line) for line in RESERVED_RESULTS.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("reserved_error_pct") is not None]


def _check_rows(rows):
    """Each recorded row against the engine now: the measurement (the recorded sequence's reserved
    peak) is the record's, the engine's reserved peak is recomputed as the row's was. A row that was
    within 0.1% still is; a row that was not is not further off."""
    if rv.engine_allocation_events() is None:
        pytest.skip("this memcalc has no memcalc.engine.allocations.allocation_events")
    assert rows
    for r in rows:
        spec, tc = ModelSpec(**r["model"]), TrainingConfig(**r["training"])
        err = error_pct(rv.engine_reserved_bytes(spec, tc, 3), r["recorded_reserved_bytes"])
        allowed = max(rv.TARGET_PCT, abs(r["reserved_error_pct"]))
        assert abs(err) <= allowed, (r["name"], err, r["reserved_error_pct"])


def test_recorded_reserved_rows_still_agree_with_the_engine_sample():
    """The recorded rows against the engine now (a sample of the dense rows; the slow lane checks all)."""
    _check_rows([r for r in _recorded_rows() if not rv.routed(r)][:6])


@pytest.mark.slow
def test_recorded_reserved_rows_still_agree_with_the_engine():
    _check_rows(_recorded_rows())
