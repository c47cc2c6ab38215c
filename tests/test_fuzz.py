"""Fuzz: arbitrary values for every field, budget, grid array, config file and CLI argv give a
sane result or the project's one-line error; never another exception, never a hang (issue 16).
The long profile: MEMCALC_HYPOTHESIS_PROFILE=long; the 10,000-input campaign:
scripts/fuzz_campaign.py."""
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memcalc
import memcalc.queries.capacity
import memcalc.inputs.gpus
from memcalc import ModelSpec, TrainingConfig
from tests.fuzz_strategies import (
    BUDGETS,
    GRID_NAMES,
    GRID_VALUES,
    JSON_TREES,
    WEIRD,
    argvs,
    hf_configs,
    model_fields,
    outcome,
    run_cli,
    sane_capacity,
    sane_report,
    training_fields,
)

SMALL = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                       max_position_embeddings=128)
STEP = TrainingConfig(micro_batch=1, seq_len=16, device="cpu")
tmp_settings = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def _estimate(model, training):
    return outcome(lambda: memcalc.estimate(model, training), sane_report(model, training))


@given(model_fields(), training_fields())
def test_any_fields_give_a_report_or_our_error(mfields, tfields):
    kind, model = outcome(lambda: ModelSpec(**mfields))
    kind2, training = outcome(lambda: TrainingConfig(**tfields))
    if kind == kind2 == "ok":
        _estimate(model, training)


@given(WEIRD, WEIRD)
def test_wrong_argument_types(model, training):
    outcome(lambda: memcalc.estimate(model, training))
    outcome(lambda: memcalc.estimate(SMALL, training))
    outcome(lambda: ModelSpec.preset(model))
    outcome(lambda: ModelSpec.from_hf_config(model))


@given(BUDGETS, st.sampled_from(["fits", "max_micro_batch", "max_seq_len", "max_layers", "min_world_size"]))
def test_budgets(budget, solver):
    training = STEP.with_(sharding="zero3") if solver == "min_world_size" else STEP
    check = (lambda r: isinstance(r, bool)) if solver == "fits" else sane_capacity
    outcome(lambda: getattr(memcalc.queries.capacity, solver)(SMALL, training, budget), check)


@given(hf_configs())
def test_hf_config_dicts(config):
    kind, model = outcome(lambda: ModelSpec.from_hf_config(config))
    if kind == "ok" and model.num_layers <= 8 and model.hidden_size <= 256:
        _estimate(model, STEP.with_(seq_len=8))


@tmp_settings
@given(st.one_of(JSON_TREES.map(json.dumps), st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_config_files(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    outcome(lambda: ModelSpec.from_hf_config(str(path)))


def _odd_paths(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "bigint.json").write_text('{"model_type": "gpt2", "n_layer": ' + "9" * 5000 + "}")
    (tmp_path / "big.json").write_bytes(b" " * (2 ** 20 + 1))
    (tmp_path / "dir").mkdir()
    return [tmp_path / "fifo", tmp_path / "loop", tmp_path / "deep.json", tmp_path / "bigint.json",
            tmp_path / "big.json", tmp_path / "dir", "/dev/zero", "a" * 5000, "a\0b", b"config.json", ""]


def test_odd_files_are_refused_quickly(tmp_path):
    for path in _odd_paths(tmp_path):
        kind, err = outcome(lambda p=path: ModelSpec.from_hf_config(p), seconds=2)
        assert kind == "error" and err.field == "hf_config", path
        code, _, stderr = run_cli(["estimate", "--hf-config", str(path)], seconds=2)
        assert code == 2 and stderr.startswith("memcalc: error: hf_config:"), (path, stderr)


@given(st.dictionaries(GRID_NAMES, GRID_VALUES, max_size=3))
def test_grid_arrays(arrays):
    def sane(grid):
        shape = np.broadcast_shapes(*[np.shape(v) for v in arrays.values()]) if arrays else ()
        assert grid.shape == shape and (grid > 0).all()
        if grid.size:  # a second method: estimate() at the first point
            point = {n: np.broadcast_to(np.asarray(v), shape).flat[0] for n, v in arrays.items()}
            fields = {n: v.item() if hasattr(v, "item") else v for n, v in point.items()}  # [None]: object array
            model = SMALL.with_(**{k: v for k, v in fields.items() if k in ModelSpec.model_fields})
            training = STEP.with_(**{k: v for k, v in fields.items() if k in TrainingConfig.model_fields})
            assert grid.flat[0] == memcalc.estimate(model, training).peak_bytes
    outcome(lambda: memcalc.estimate_grid(SMALL, STEP, **arrays), sane)


@given(WEIRD | st.integers(1, 64), WEIRD | st.integers(1, 128), WEIRD | st.floats(0, 1),
       st.sampled_from(["A100-80GB", "H100", None, 5]))
def test_plan_arguments(global_batch, seq_len, utilisation, gpu):
    def sane(plans):
        assert all(p.peak_bytes <= memcalc.inputs.gpus.gpu(gpu).usable_bytes for p in plans)
    outcome(lambda: memcalc.plan(SMALL.with_(num_layers=1), gpu, global_batch, seq_len,
                                 utilisation=utilisation), sane)


@settings(max_examples=60)
@given(argvs())
def test_cli_exit_codes(argv):
    code, _, stderr = run_cli(argv)
    assert code in (0, 2), (argv, code, stderr)
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("memcalc: error: "), (argv, stderr)


@pytest.mark.parametrize("flag,value,field", [
    ("--budget", "80XB", "budget"), ("--budget", "nan", "budget"), ("--budget", "80G", "budget"),
    ("--budget", "1,000", "budget"), ("--budget", "1e400GB", "budget"), ("--gpu", "H100", "gpu"),
    ("--seq-len", "4096", "seq_len"), ("--world-size", "1000000000", "world_size"),
    ("--weight-decay", "inf", "weight_decay"), ("--implementation", "", "implementation")])
def test_cli_names_the_flag(flag, value, field):
    argv = ["capacity", "--model", "gpt2", "--num-layers", "1", flag, value]
    if flag not in ("--budget", "--gpu"):
        argv += ["--gpu", "H100-80GB"]
    code, _, stderr = run_cli(argv)
    assert code == 2 and stderr.startswith(f"memcalc: error: {field}:"), stderr


@pytest.mark.parametrize("argv,field", [
    (["plan", "--model", "gpt2", "--gpu", "A100-80GB", "--global-batch", "8", "--seq-len", "128",
      "--top", "0"], "top"),
    (["plan", "--model", "llama-2-7b", "--num-layers", "1", "--num-heads", "12", "--num-kv-heads", "12",
      "--hidden-size", "1536", "--gpu", "A100-80GB", "--global-batch", "8", "--seq-len", "128",
      "--tensor-parallel", "5"], "tensor_parallel"),
    (["estimate", "--model", "gpt2", "--seq-len", "4096"], "seq_len")])
def test_cli_refuses_what_it_used_to_answer(argv, field):
    code, _, stderr = run_cli(argv)
    assert code == 2 and stderr.startswith(f"memcalc: error: {field}:"), stderr


def test_tables_out_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    code, _, stderr = run_cli(["tables", "--out", str(tmp_path / "file" / "x"), "--no-plots"])
    assert code == 2 and stderr.startswith("memcalc: error: out:"), stderr
