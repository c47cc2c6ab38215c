"""The memcalc command: output, --json, one-line errors with exit 2; the cold estimate stays free of sympy."""
import json
import os
import subprocess
import sys

import pytest

import memcalc
from memcalc.cli import main

ENV = {**os.environ, "PYTHONPATH": os.getcwd()}


def run(*args):
    return subprocess.run([sys.executable, "-m", "memcalc.cli", *args], capture_output=True, text=True, env=ENV)


def test_public_api_is_pinned():
    assert sorted(memcalc.__all__) == sorted([
        "MemcalcError", "SpecError", "UnknownNameError", "MemoryReport", "estimate", "sqrt_segment_size",
        "candidates", "optimal_segment_size",
        "ModelSpec", "TrainingConfig", "LoRA", "model_state_bytes", "zero_paper_mixed_precision_bytes",
        "max_micro_batch", "max_seq_len", "max_layers", "fits", "Capacity", "estimate_grid", "plan",
        "check", "Verdict", "estimate_lengths", "LengthsReport", "watch",
        "Plan", "plan_cluster", "Layout", "GPUS", "GPU", "parse_budget", "local_gpus",
        "load_snapshot", "replay_snapshot", "replay_events", "AllocatorSettings"])
    for name in memcalc.__all__:
        assert getattr(memcalc, name) is not None


def test_estimate_json_matches_the_api(capsys):
    assert main(["estimate", "--model", "gpt2", "--micro-batch", "2", "--seq-len", "256", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    r = memcalc.estimate(memcalc.ModelSpec.preset("gpt2"), memcalc.TrainingConfig(micro_batch=2, seq_len=256))
    assert out["peak_bytes"] == r.peak_bytes and out["components"] == r.components


def test_estimate_text_and_formula(capsys):
    main(["estimate", "--model", "gpt2", "--num-layers", "2", "--formula", "--precision", "bf16-amp"])
    text = capsys.readouterr().out
    assert "GiB" in text and "backward" in text and "peak(b, s) = Max(" in text


def test_formula_in_depth(capsys):
    """12 layers repeat (memcalc.engine.depth): the formula is in b, s and L; `activations` alone."""
    main(["estimate", "--model", "gpt2", "--formula", "--checkpointing", "per-layer"])
    assert "peak(b, s, L) = Max(" in capsys.readouterr().out
    main(["estimate", "--model", "gpt2", "--formula", "activations", "--checkpointing", "per-layer"])
    assert "activations(b, s, L) = " in capsys.readouterr().out


@pytest.mark.parametrize("args,field", [
    (["estimate", "--model", "gpt3"], "model"),
    (["estimate", "--model", "gpt2", "--micro-batch", "0"], "micro_batch"),
    (["estimate", "--model", "gpt2", "--micro-batch", "x"], "micro_batch"),
    (["estimate", "--model", "gpt2", "--precision", "fp8"], "precision"),
    (["estimate"], "model"),
    (["capacity", "--model", "gpt2", "--gpu", "H100"], "gpu"),
    (["capacity", "--model", "gpt2", "--budget=-3GB"], "budget"),
    (["plan", "--model", "gpt2", "--gpu", "L4", "--global-batch", "0", "--seq-len", "8"], "global_batch"),
    (["estimate", "--hf-config", "/no/such/config.json"], "hf_config"),
    (["frobnicate"], "command"),
])
def test_bad_input_is_one_line_and_exit_2(args, field, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"memcalc: error: {field}: ") and "; fix: " in err


def test_capacity_plan_gpus_json(capsys):
    main(["capacity", "--model", "gpt2", "--seq-len", "512", "--gpu", "L4", "--json"])
    cap = json.loads(capsys.readouterr().out)
    assert cap["fits"] and cap["peak_bytes"] <= cap["budget_bytes"] < cap["next_peak_bytes"]
    main(["plan", "--model", "gpt2", "--num-layers", "2", "--gpu", "L4", "--global-batch", "8",
          "--seq-len", "128", "--json"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["headroom_bytes"] >= 0 for p in plans)
    main(["gpus", "--json"])
    gpus = json.loads(capsys.readouterr().out)
    assert {g["name"] for g in gpus["catalogue"]} >= {"H100-80GB", "A100-80GB"}
    assert gpus["local"] or gpus["local_note"]


def test_cold_estimate_answers_without_sympy():
    """The cold-process speed is a benchmark figure (benchmarks/bench_estimate.py), not a timed
    test; what keeps it cheap is checked here: the estimate answers without importing sympy."""
    proc = run("estimate", "--model", "gpt2", "--micro-batch", "4", "--seq-len", "1024")
    assert proc.returncode == 0, proc.stderr
    assert "sympy" not in run("estimate", "--model", "gpt2", "--json").stderr


def test_estimate_does_not_import_sympy():
    code = ("import sys; from memcalc.cli import main; main(['estimate','--model','gpt2','--num-layers','1']);"
            "print('sympy' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV).stdout
    assert out.strip().splitlines()[-1] == "False False"
