"""The validate CLI: bad input is one line on stderr and exit 2; a real run prints JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, code=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "validate", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def _one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


COMMON = ["run", "--micro-batch", "1", "--seq-len", "16", "--device", "cpu"]


def test_unknown_model_type(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    _one_line_error(_run(*COMMON, "--hf-config", str(cfg)), "model_type", "fix")


def test_config_not_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{not json")
    _one_line_error(_run(*COMMON, "--hf-config", str(cfg)), "hf_config", "JSON")


@pytest.mark.slow
def test_shape_that_cannot_run():
    _one_line_error(_run(*COMMON[:-4], "--model", "gpt2", "--micro-batch", "1", "--seq-len",
                         "4096", "--device", "cpu"), "seq_len", "max_position_embeddings")


def test_bad_field_value_and_unknown_preset():
    _one_line_error(_run(*COMMON, "--model", "gpt2", "--precision", "fp8"), "precision")
    _one_line_error(_run(*COMMON, "--model", "gtp2"), "model", "gpt2")
    _one_line_error(_run("run", "--model", "gpt2", "--device", "cpu"), "micro_batch")
    _one_line_error(_run("run", "--matrix", "nope"), "matrix")


def test_missing_torch_is_one_line():
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['validate', 'run'];"
            "runpy.run_module('validate', run_name='__main__')")
    _one_line_error(_run(code=code), "torch", "pip install")


@pytest.mark.slow
def test_one_configuration_prints_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 300, "hidden_size": 32,
                               "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 64}))
    proc = _run("run", "--hf-config", str(cfg), "--micro-batch", "2", "--seq-len", "32",
                "--precision", "bf16-amp", "--optimizer", "adamw", "--optimizer-impl", "foreach",
                "--checkpointing", "none", "--attention", "sdpa", "--device", "cpu", "--json",
                "--no-predict", "--out", str(tmp_path / "one.jsonl"))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["implementation"] == "hf:LlamaForCausalLM:sdpa"
    assert row["measured_peak_bytes"] > 0 and row["training"]["precision"] == "bf16-amp"
    assert (tmp_path / "one.md").exists()
