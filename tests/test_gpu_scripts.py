"""The GPU-run scripts (scripts/gpu_run.sh and helpers, docs/GPU_RUN.md), tried on CPU: a dry run
end to end, a run cut at its deadline, a run interrupted by a signal, the summary, and the
re-check of recorded results against the current engine (which is how CI re-checks GPU records:
test_recorded_gpu_results_match_the_engine)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CPU_RESULTS = ROOT / "validate" / "results" / "cpu-ci.jsonl"


def _env(**extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, "WHEELS": "none"}
    env.pop("_GPU_RUN_LOGGED", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _py(script, *args, **env):
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)], capture_output=True,
                          text=True, env=_env(**env), cwd=ROOT, timeout=300)


def _cpu_rows(n=None):
    rows = [json.loads(line) for line in CPU_RESULTS.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("status") == "ok" and r.get("measured_peak_bytes")]
    if not rows:
        pytest.skip("no measured rows in validate/results/cpu-ci.jsonl")
    return rows[:n] if n else rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return path


# ---- static checks ---------------------------------------------------------------------------
def test_scripts_parse_and_fetch_lists_its_pins():
    for sh in ("gpu_run.sh", "fetch_gpu_wheels.sh"):
        assert subprocess.run(["bash", "-n", str(SCRIPTS / sh)]).returncode == 0, sh
    pins = subprocess.run(["bash", str(SCRIPTS / "fetch_gpu_wheels.sh"), "--list"], capture_output=True,
                          text=True, check=True).stdout.split()
    names = {p.split("==")[0]: p.split("==")[1] for p in pins}
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
            "transformers"} <= set(names)
    assert "torch" not in names and names["pydantic"].startswith("2.")
    full = subprocess.run(["bash", str(SCRIPTS / "fetch_gpu_wheels.sh"), "--list", "--full"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert {"sympy", "mpmath", "tqdm", "nvidia-ml-py"} <= {p.split("==")[0] for p in full}
    # pydantic pins its core exactly: the pair must agree (checked where that pydantic is installed)
    from importlib.metadata import PackageNotFoundError, requires, version

    try:
        if version("pydantic") == names["pydantic"]:
            assert f"pydantic-core=={names['pydantic-core']}" in (requires("pydantic") or [])
    except PackageNotFoundError:
        pass


def test_bad_arguments_exit_2(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPTS / "gpu_run.sh"), str(tmp_path / "o"), "ci", "soon"],
                          capture_output=True, text=True, env=_env())
    assert proc.returncode == 2 and "TIMEOUT" in proc.stderr
    proc = subprocess.run(["bash", str(SCRIPTS / "gpu_run.sh")], capture_output=True, text=True, env=_env())
    assert proc.returncode == 2 and "OUT_DIR" in proc.stdout


# ---- gpu_summary -----------------------------------------------------------------------------
def test_summary_of_cuda_rows(tmp_path):
    base = _cpu_rows(3)
    ok = {**base[0], "device": "cuda", "device_name": "NVIDIA H200", "name": "a",
          "predicted_peak_bytes": 1020 * 2**20, "measured_peak_bytes": 1000 * 2**20, "error_pct": 2.0,
          "first_step": {"measured": 1010 * 2**20, "predicted": 1000 * 2**20, "error_pct": -1.0},
          "extra": {"max_memory_reserved": 1100 * 2**20, "nvml_used_peak": 1600 * 2**20,
                    "total_bytes": 143771 * 2**20}}
    bad = {**ok, "key": base[1]["key"], "name": "b", "error_pct": -4.0,
           "predicted_peak_bytes": 960 * 2**20}
    oom = {**base[2], "device": "cuda", "name": "c", "status": "oom", "measured_peak_bytes": None,
           "predicted_peak_bytes": 200 * 2**30, "error_pct": None,
           "extra": {"total_bytes": 143771 * 2**20}}
    err = {"key": "x", "name": "d", "label": "d", "status": "error", "error": "RuntimeError: boom",
           "device": "cuda", "predicted_peak_bytes": None, "measured_peak_bytes": None, "error_pct": None}
    results = _write(tmp_path / "gpu-quick.jsonl", [ok, bad, oom, err])
    tp = tmp_path / "throughput.json"
    tp.write_text(json.dumps({"device_name": "NVIDIA H200", "model": {"name": "gpt2-medium", "num_layers": 24},
                              "micro_batch": 8, "seq_len": 1024,
                              "variants": {"fp32": {"status": "ok", "median_s": 0.4, "achieved_tflops": 50.0},
                                           "bf16-amp": {"status": "ok", "median_s": 0.1}},
                              "derived": {"amp_speedup_bf16_vs_fp32": 4.0}}))
    proc = _py("gpu_summary.py", results, "--throughput", tp, "--tolerance", 3, "--json",
               tmp_path / "s.json", "--md", tmp_path / "gpu-quick.md")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["rows"] == 4 and s["by_status"] == {"ok": 2, "oom": 1, "error": 1}
    assert s["worst_error_pct"] == -4.0 and s["worst_name"] == "b" and s["mean_abs_error_pct"] == 3.0
    assert s["within_tolerance"] == 1 and {f["name"] for f in s["failures"]} == {"b", "d"}
    assert s["reserved_minus_allocated_mib"]["max"] == 90.0  # 1100 - max(1000, first step 1010)
    assert s["nvml_minus_reserved_mib"]["median"] == 500.0
    assert s["throughput"]["derived"]["amp_speedup_bf16_vs_fp32"] == 4.0
    assert (tmp_path / "gpu-quick.md").read_text().count("FAIL") == 2
    last = proc.stdout.strip().splitlines()
    assert last[-4].startswith("SUMMARY gpu-quick.jsonl") and "OOM 1" in last[-3]
    assert last[-1].startswith("SUMMARY reserved % vs measured max_memory_reserved: snapshot replay {'n': 0}")
    assert "amp_speedup_bf16_vs_fp32 = 4.0" in proc.stdout


@pytest.mark.slow
# ---- check_recorded --------------------------------------------------------------------------
def test_check_recorded_on_the_cpu_results_within_the_tables_bound():
    """Every recorded single-device CPU row within the CPU bound of validate.matrices.tolerances
    (the default; tests/test_recorded_rows.py holds each to its topic's)."""
    _cpu_rows()
    proc = _py("check_recorded.py", CPU_RESULTS, "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 outside +-0.05%" in proc.stdout


@pytest.mark.slow
def test_check_recorded_flags_drift_ooms_and_skips_errors(tmp_path):
    a, b, c, d = _cpu_rows(4)
    rows = [
        {**a, "device": "cuda"},  # matches the engine
        {**b, "device": "cuda", "measured_peak_bytes": int(b["measured_peak_bytes"] * 1.10)},  # drift
        {**c, "device": "cuda", "status": "oom", "measured_peak_bytes": None, "extra": {"total_bytes": 1}},
        {**d, "device": "cuda", "status": "oom", "measured_peak_bytes": None, "extra": {"total_bytes": 2**50}},
        {"key": "e", "name": "e", "device": "cuda", "status": "error", "error": "RuntimeError: boom"},
        {**a, "key": "cpu-row"},  # another device: not checked
        {**c, "device": "cuda", "key": json.dumps({**json.loads(c["key"]), "parallel": {"world_size": 2}}),
         "measured_peak_bytes": 1},  # a data-parallel run (validate/distributed/measure.py): not estimate()'s
    ]
    path = _write(tmp_path / "gpu.jsonl", rows)
    proc = _py("check_recorded.py", path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 2 and f":{b['name']}:" in fails[0] + fails[1] and "OOM although" in proc.stdout
    assert "4 cuda rows re-predicted" in proc.stdout and "2 skipped" in proc.stdout
    assert "not a single-device configuration (has parallel)" in proc.stdout
    proc = _py("check_recorded.py", path, "--tolerance", 20)
    assert proc.returncode == 1 and proc.stdout.count("FAIL") == 1  # the OOM the engine says fits


def _cuda_rows() -> list[str]:
    rows = []
    for path in sorted(CPU_RESULTS.parent.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if (row.get("device") or (row.get("training") or {}).get("device")) == "cuda":
                rows.append(f"{path.name}:{row.get('name')}")
    return rows


def test_recorded_gpu_results_match_the_engine():
    """The re-check of recorded GPU results (validate/results/*.jsonl, cuda rows, the table's CUDA
    bound), skipped, visibly, while none has been recorded."""
    if not _cuda_rows():
        pytest.skip("no cuda rows in validate/results/: the GPU kit (scripts/gpu_run.sh, docs/GPU_RUN.md) "
                    "has not been run, so no CUDA prediction has been measured")
    proc = _py("check_recorded.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_recorded_fails_when_it_has_nothing_to_check(tmp_path):
    """Asked to check cuda rows where there are none, the checker fails: a check that cannot fail
    is no check."""
    path = _write(tmp_path / "cpu-only.jsonl", _cpu_rows(2))
    proc = _py("check_recorded.py", path, "--device", "cuda")
    assert proc.returncode == 1 and "nothing was checked" in proc.stderr, proc.stdout + proc.stderr
    assert _py("check_recorded.py", path, "--device", "cpu").returncode == 0


def test_check_recorded_bad_path():
    proc = _py("check_recorded.py", "/nonexistent.jsonl")
    assert proc.returncode == 2 and "no such file" in proc.stderr


# ---- gpu_run.sh on CPU -----------------------------------------------------------------------
def _run_sh(tmp_path, *args, timeout=400, **env):
    env = _env(WORK=tmp_path / "work", **env)
    return subprocess.run(["bash", str(SCRIPTS / "gpu_run.sh"), *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path):
    out = tmp_path / "out"
    proc = _run_sh(tmp_path, "--dry-run", out, LIMIT=2,
                   THROUGHPUT_ARGS="--variants fp32,fp32+per-layer,bf16-amp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["ci.jsonl", "ci.md", "env.json", "gpu_run.log",
                                                     "summary.json", "throughput.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == 2 and summary["by_status"] == {"ok": 2} and summary["within_tolerance"] == 2
    env = json.loads((out / "env.json").read_text())
    assert all(v.startswith("ok") for v in env["imports"].values()), env["imports"]
    tp = json.loads((out / "throughput.json").read_text())
    assert set(tp["variants"]) == {"fp32", "fp32+per-layer", "bf16-amp"}
    assert all(v["status"] == "ok" and v["median_s"] > 0 for v in tp["variants"].values())
    assert tp["derived"]["ckpt_flops_overhead_pct"] > 30
    assert "| configuration |" in (out / "ci.md").read_text()
    lines = proc.stdout.strip().splitlines()
    assert lines[-4].startswith("SUMMARY ci.jsonl: 2 rows") and "within +-1.0%: 2/2" in lines[-3]
    assert "validate exit status: 0" in (out / "gpu_run.log").read_text()


@pytest.mark.slow
def test_run_cut_at_its_deadline_keeps_and_resumes_rows(tmp_path):
    import gzip
    import pickle
    import memcalc

    snap = _one_trace()
    recorded = memcalc.replay_snapshot(snap).recorded_peak_reserved_bytes
    seed = [{**_cpu_rows(1)[0], "extra": {"snapshot": "a.pickle.gz", "max_memory_reserved": recorded}}]
    (tmp_path / "work" / "snapshots").mkdir(parents=True)
    with gzip.open(tmp_path / "work" / "snapshots" / "a.pickle.gz", "wb") as f:
        pickle.dump(snap, f)
    _write(tmp_path / "work" / "ci.jsonl", seed)  # as left by an earlier call on a warm machine
    out = tmp_path / "out"
    proc = _run_sh(tmp_path, out, "ci", 200, DEVICE="cpu", LIMIT=2, VALIDATE_S=1, THROUGHPUT_S=0)
    assert proc.returncode == 124, proc.stdout[-3000:]
    assert "resuming: 1 rows" in proc.stdout and "cut at its 1s budget" in proc.stdout
    assert len((out / "ci.jsonl").read_text().splitlines()) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == 1
    assert summary["reserved_checks"]["replay_vs_measured_reserved_pct"] == {"n": 1, "worst": 0.0, "mean_abs": 0.0}
    assert (out / "ci.md").exists() and not (out / "throughput.json").exists()
    import tarfile

    with tarfile.open(out / "snapshots.tar") as tar:
        assert tar.getnames() == ["a.pickle.gz"]


@pytest.mark.slow
def test_signal_stops_the_run_and_leaves_its_files(tmp_path):
    out = tmp_path / "out"
    env = _env(WORK=tmp_path / "work", DEVICE="cpu", LIMIT=5, THROUGHPUT_S=0)
    proc = subprocess.Popen(["bash", str(SCRIPTS / "gpu_run.sh"), str(out), "ci", "300"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        log = out / "gpu_run.log"
        # the validator's own start stamp ("[gpu_run +Ns] validate: Ns budget: ..."), not any line that
        # says "validate:" (the git stamp quotes the last commit's subject)
        started = re.compile(r"\] validate: \d+s budget")
        while time.time() < deadline and not (log.exists() and started.search(log.read_text())):
            time.sleep(0.5)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stdout[-3000:]
    assert "interrupted by signal" in stdout and "SUMMARY ci.jsonl" in stdout
    assert {"gpu_run.log", "env.json", "summary.json"} <= {p.name for p in out.iterdir()}
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "work") not in ps  # the validator was stopped too


@pytest.mark.slow
def test_throughput_refuses_missing_cuda(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = _py("gpu_throughput.py", "--out", tmp_path / "t.json")
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr


def test_fetch_script_needs_no_network_for_help():
    assert shutil.which("bash")
    proc = subprocess.run(["bash", str(SCRIPTS / "fetch_gpu_wheels.sh"), "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "gpu-wheels" in proc.stdout


# ---- CUDA snapshots per row (validate.measure.cuda_snapshot) and their replay in the summary --------
SNAPSHOTS = ROOT / "tests" / "data" / "cuda-snapshots"


class _FakeCudaMemory:
    """torch.cuda.memory's history API on CPU: hands back a real recorded snapshot."""

    def __init__(self, snap, fail=None):
        self.snap, self.fail, self.calls = snap, fail, []

    def _record_memory_history(self, **kwargs):
        self.calls.append(kwargs)
        if self.fail == "record" and kwargs.get("enabled"):
            raise RuntimeError("no CUDA")

    def _snapshot(self):
        return self.snap


def _one_trace():
    import memcalc

    path = SNAPSHOTS / "cs336-small-forward.pickle"
    return memcalc.load_snapshot(str(path))


def test_cuda_snapshot_per_row_with_a_fake_cuda(tmp_path):
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from validate.measure import cuda_snapshot

    spec, tc = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8)
    fake, extra = _FakeCudaMemory(_one_trace()), {}
    cuda_snapshot.configure(tmp_path / "snaps")
    try:
        with cuda_snapshot.recording(spec, tc, None, extra, memory=fake):
            pass
        failing, extra2 = _FakeCudaMemory(None, fail="record"), {}
        with cuda_snapshot.recording(spec, tc, None, extra2, memory=failing):
            pass
    finally:
        cuda_snapshot.configure(None)
    assert fake.calls[0] == {"enabled": "all", "context": None, "stacks": "python",
                             "max_entries": cuda_snapshot.MAX_ENTRIES}
    assert fake.calls[-1] == {"enabled": None}  # history recording turned off after the row
    path = tmp_path / "snaps" / extra["snapshot"]
    assert extra["snapshot"] == cuda_snapshot.snapshot_name(spec, tc) and path.stat().st_size == extra["snapshot_bytes"]
    assert extra["snapshot_events"] == sum(len(t) for t in _one_trace()["device_traces"])
    assert "_record_memory_history: RuntimeError: no CUDA" in extra2["snapshot_error"]
    with cuda_snapshot.recording(spec, tc, None, {}, memory=None):  # not configured: nothing at all
        pass


def test_summary_replays_each_rows_snapshot(tmp_path):
    """gpu_summary --snapshots: the replica's replay of each row's snapshot and the engine's reserved
    figure against max_memory_reserved, NVML against the engine's device bytes."""
    import gzip
    import pickle
    import memcalc

    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_summary
    finally:
        sys.path.remove(str(SCRIPTS))
    snap = _one_trace()
    folder = tmp_path / "snaps"
    folder.mkdir()
    with gzip.open(folder / "a.pickle.gz", "wb") as f:
        pickle.dump(snap, f)
    (folder / "broken.pickle.gz").write_bytes(b"not a snapshot")
    recorded = memcalc.replay_snapshot(snap).recorded_peak_reserved_bytes
    base = _cpu_rows(2)
    rows = [{**base[0], "name": "a", "status": "ok",
             "extra": {"snapshot": "a.pickle.gz", "max_memory_reserved": recorded,
                       "nvml_used_peak": recorded + (500 << 20)}},
            {**base[1], "name": "b", "status": "ok",
             "extra": {"snapshot": "broken.pickle.gz", "max_memory_reserved": 100 << 20}},
            {**base[1], "key": "c", "name": "c", "status": "oom", "extra": {}}]
    checks = gpu_summary.reserved_checks(rows, folder, engine=lambda r: (
        (101 << 20, (601 << 20)) if r["name"] == "b" else (recorded, recorded + (500 << 20))))
    a, b = checks["rows"]
    assert a["replayed_reserved"] == a["trace_reserved"] == recorded and a["replay_error_pct"] == 0.0
    assert a["engine_error_pct"] == 0.0 and a["device_error_pct"] == 0.0
    assert b["replayed_reserved"] is None and "snapshot_error" in b and b["engine_error_pct"] == 1.0
    assert checks["replay_vs_measured_reserved_pct"] == {"n": 1, "worst": 0.0, "mean_abs": 0.0}
    assert checks["engine_vs_measured_reserved_pct"] == {"n": 2, "worst": 1.0, "mean_abs": 0.5}
    assert len(gpu_summary.reserved_lines(checks)) == 4
    results = _write(tmp_path / "gpu-quick.jsonl", rows)
    proc = _py("gpu_summary.py", results, "--snapshots", folder, "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "s.json").read_text())["reserved_checks"]
    assert s["replay_vs_measured_reserved_pct"]["worst"] == 0.0 and len(s["rows"]) == 2
