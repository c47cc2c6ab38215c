"""Issue 16's campaign: >= 10,000 generated bad (and some good) API inputs and >= 1,000 CLI
invocations (memcalc.cli.main(argv) in-process), each with a 5 s limit. Counts raw exceptions,
hangs, exit codes other than 0/2, results that fail their sanity check (a number for a step that
cannot run), and error messages that do not name the field the input changed.

    PYTHONPATH=. python scripts/fuzz_campaign.py [--api 10000] [--cli 1000] [--seed 0]

Uses random (seeded), not hypothesis: a second generator beside tests/test_fuzz.py.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import memcalc
import memcalc.queries.capacity
from memcalc import ModelSpec, TrainingConfig
from tests.fuzz_strategies import (
    CALL_SECONDS,
    Hang,
    run_cli,
    runnable,
    sane_capacity,
    time_limit,
)

BAD = [None, True, False, -1, 0, 1, 2, 3, 7, 2.5, 1.0, float("nan"), float("inf"), -float("inf"), 10 ** 30,
       2 ** 63, 2 ** 64 + 1, 10 ** 6, 10 ** 9, 4096, 65521, "12", "false", "true", "", "gpt2", "x" * 5000,
       b"x", [], [1], {}, {"a": 1}, np.int64(4), np.float64(2.0), np.uint64(2 ** 63 + 1), object()]
MODEL_FIELDS = {"family": ["gpt2", "llama"], "implementation": ["hf", "reference"], "vocab_size": [32, 64],
                "hidden_size": [16, 32], "num_layers": [1, 2, 3], "num_heads": [1, 2, 4],
                "num_kv_heads": [None, 1, 2], "head_dim": [None, 8], "intermediate_size": [None, 32, 64],
                "max_position_embeddings": [16, 128], "tie_embeddings": [True, False],
                "qkv_bias": [True, False], "out_bias": [True, False], "mlp_bias": [True, False],
                "activation": ["gelu_new", "gelu", "gelu_tanh", "silu"], "embd_dropout": [0.0, 0.1],
                "attn_dropout": [0.0, 0.1], "resid_dropout": [0.0, 0.1], "name": ["m"]}
TRAINING_FIELDS = {"micro_batch": [1, 2, 3], "seq_len": [8, 16, 33, 256], "grad_accum": [1, 2],
                   "precision": ["fp32", "fp16-amp", "bf16-amp", "bf16"],
                   "optimizer": ["sgd", "sgd-momentum", "adam", "adamw"],
                   "optimizer_impl": [None, "foreach", "fused", "for-loop"], "weight_decay": [None, 0.0, 0.1],
                   "checkpointing": ["none", "per-layer", "sqrt", "every-k", "selective"],
                   "checkpoint_every": [None, 1, 2], "attention": ["eager", "sdpa"], "device": ["cpu", "cuda"],
                   "world_size": [1, 2, 4, 3000], "sharding": ["none", "zero1", "zero2", "zero3"],
                   "tensor_parallel": [1, 2, 3], "sequence_parallel": [False, True],
                   "fsdp_mixed_precision": [False, True]}
SMALL = dict(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, max_position_embeddings=128)
STEP = dict(micro_batch=1, seq_len=16, device="cpu")
BUDGETS = BAD + ["80GB", "24GiB", "1e-3GB", "80XB", "nan", "inf", "80G", "1,000", "1e400GB", "-5GB", "H100",
                 "h100-80gb", "1PB", "1e9999TB", " 12 MiB ", "0", "local", 10 ** 15, 2 ** 50, -0.5, 1e300]


class Tally:
    def __init__(self):
        self.counts = collections.Counter()
        self.failures: list[str] = []

    def fail(self, kind: str, what: str):
        self.counts[kind] += 1
        if len(self.failures) < 40:
            self.failures.append(f"{kind}: {what[:300]}")


def _pick(rng, fields: dict, base: dict, bad_rate: float) -> tuple[dict, str | None]:
    out, changed = dict(base), None
    for name in rng.sample(sorted(fields), rng.randint(0, 3)):
        if rng.random() < bad_rate:
            out[name], changed = rng.choice(BAD), name
        else:
            out[name] = rng.choice(fields[name])
    return out, changed


def api_call(rng, tmp: str):
    """One generated call: (label, thunk, sanity check or None)."""
    kind = rng.choice(["model", "training", "budget", "grid", "plan", "hf_dict", "hf_file", "types", "preset"])
    if kind == "model":
        fields, _ = _pick(rng, MODEL_FIELDS, SMALL, 0.5)
        return kind, lambda: _estimate(ModelSpec(**fields), TrainingConfig(**STEP))
    if kind == "training":
        fields, _ = _pick(rng, TRAINING_FIELDS, STEP, 0.5)
        return kind, lambda: _estimate(ModelSpec(**SMALL), TrainingConfig(**fields))
    if kind == "budget":
        solver = rng.choice(["fits", "max_micro_batch", "max_seq_len", "max_layers", "min_world_size"])
        budget = rng.choice(BUDGETS)
        t = dict(STEP, sharding="zero3") if solver == "min_world_size" else STEP
        check = (lambda r: isinstance(r, bool)) if solver == "fits" else sane_capacity
        return f"{solver}({budget!r:.40})", lambda: check(getattr(memcalc.queries.capacity, solver)(
            ModelSpec(**SMALL), TrainingConfig(**t), budget)) or True
    if kind == "grid":
        arrays = {rng.choice(["micro_batch", "seq_len", "num_layers", "precision", "tensor_parallel",
                              "world_size", "bogus"]): _grid_values(rng) for _ in range(rng.randint(0, 3))}
        fields, _ = _pick(rng, TRAINING_FIELDS, STEP, 0.0)
        fields["device"] = rng.choice(["cpu", "cuda"])  # a first cuda grid call costs milliseconds
        return f"grid({list(arrays)})", lambda: _grid(ModelSpec(**SMALL), TrainingConfig(**fields), arrays)
    if kind == "plan":
        args = [rng.choice(BAD + [8, 16]), rng.choice(BAD + [16, 128, 4096]), rng.choice(BAD + [0.4, 1.0])]
        gpu = rng.choice(["A100-80GB", "H100", None, 5, "V100-16GB"])
        return f"plan({args!r:.60})", lambda: _plan(gpu, *args)
    if kind == "hf_dict":
        cfg = _hf_dict(rng)
        return f"hf({json.dumps(cfg, default=str)[:60]})", lambda: _hf(cfg)
    if kind == "hf_file":
        path = _odd_file(rng, tmp)
        return f"hf_file({str(path)[:60]})", lambda: _hf(path)
    if kind == "types":
        a, b = rng.choice(BAD + [ModelSpec(**SMALL)]), rng.choice(BAD + [TrainingConfig(**STEP)])
        return "types", lambda: _estimate(a, b)
    name = rng.choice(BAD + ["GPT2", "llama-2-7", "gpt2"])
    return f"preset({name!r:.30})", lambda: ModelSpec.preset(name)


def _estimate(model, training):
    r = memcalc.estimate(model, training)
    assert runnable(model, training), "a number for a step that cannot run"
    assert r.peak_bytes == max(r.phases.values()) > 0
    return r


def _grid_values(rng):
    return rng.choice([np.arange(1, rng.randint(1, 6)), [[1, 2], [3]], [1.5, 2.0],
                       np.array([2 ** 63 + 1], np.uint64), [-1, 2], [0], rng.randint(-2, 300),
                       ["fp32", "bf16"], [True], [None], [[]], np.arange(1, 4)[:, None],
                       [10 ** 9], [2, 3], np.arange(1, 100), [{}], "sdpa", [10 ** 13]])


def _grid(model, training, arrays):
    grid = memcalc.estimate_grid(model, training, **arrays)
    shape = np.broadcast_shapes(*[np.shape(v) for v in arrays.values()]) if arrays else ()
    assert grid.shape == shape and (grid > 0).all()
    if grid.size:  # second method: estimate() at the first point
        point = {n: np.broadcast_to(np.asarray(v), shape).flat[0].item() for n, v in arrays.items()}
        m = model.with_(**{k: v for k, v in point.items() if k in ModelSpec.model_fields})
        t = training.with_(**{k: v for k, v in point.items() if k in TrainingConfig.model_fields})
        assert grid.flat[0] == _estimate(m, t).peak_bytes
    return grid


def _plan(gpu, global_batch, seq_len, utilisation):
    model = ModelSpec(**dict(SMALL, num_layers=1))
    plans = memcalc.plan(model, gpu, global_batch, seq_len, utilisation=utilisation)
    t = TrainingConfig(micro_batch=1, seq_len=seq_len)
    assert not plans or runnable(model, t), "plans for a step that cannot run"
    return plans


def _hf(config):
    model = ModelSpec.from_hf_config(config)
    if model.num_layers <= 4 and model.hidden_size <= 128 and model.vocab_size <= 4096:
        _estimate(model, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    return model


def _hf_dict(rng) -> dict:
    cfg = {"model_type": rng.choice(["gpt2", "llama", "qwen2", "mistral", "bert", None, 5, ["gpt2"]])}
    keys = ["vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "tie_word_embeddings",
            "activation_function", "attn_pdrop", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "attention_bias", "mlp_bias", "hidden_act",
            "max_position_embeddings", "head_dim", "_name_or_path"]
    small = {"vocab_size": 64, "n_embd": 16, "n_layer": 1, "n_head": 2, "hidden_size": 16, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 32}
    if rng.random() < 0.5:
        cfg.update(small)
    for key in rng.sample(keys, rng.randint(0, 4)):
        cfg[key] = rng.choice(BAD[:30] + [_deep(rng.randint(1, 50))])
    return cfg


def _deep(n: int):
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


_FILES: dict = {}


def _odd_file(rng, tmp: str):
    if not _FILES:
        os.mkfifo(f"{tmp}/fifo")
        os.symlink(f"{tmp}/loop", f"{tmp}/loop")
        os.mkdir(f"{tmp}/dir")
        for name, text in {"deep": "[" * 100000 + "]" * 100000, "bigint": '{"n_layer": ' + "9" * 5000 + "}",
                           "list": "[]", "null": "null", "number": "5", "bad": "{", "latin": "\udcff",
                           "huge": " " * (2 ** 20 + 10), "empty": "",
                           "ok": json.dumps(dict(model_type="gpt2", n_layer=1, n_embd=16, n_head=2,
                                                 vocab_size=64)),
                           "bool": json.dumps(dict(model_type="llama", vocab_size=8, hidden_size=8,
                                                   num_hidden_layers=1, num_attention_heads=2,
                                                   intermediate_size=8, attention_bias="false"))}.items():
            with open(f"{tmp}/{name}.json", "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(text)
        _FILES["paths"] = [f"{tmp}/{n}" for n in ("fifo", "loop", "dir", "deep.json", "bigint.json", "list.json",
                                                  "null.json", "number.json", "bad.json", "latin.json", "huge.json",
                                                  "empty.json", "ok.json", "bool.json", "missing.json")]
        _FILES["paths"] += ["/dev/zero", "/dev/null", "a" * 5000, "a\0b", b"x.json", "", 5, None, [], tmp]
    return rng.choice(_FILES["paths"])


# ---- CLI --------------------------------------------------------------------------------------
FLAG_GOOD = {"--micro-batch": ["1", "2"], "--seq-len": ["16", "64"], "--precision": ["fp32", "bf16-amp"],
             "--checkpointing": ["none", "per-layer"], "--device": ["cpu", "cuda"], "--attention": ["eager", "sdpa"],
             "--optimizer": ["adamw", "sgd"], "--grad-accum": ["1", "2"], "--world-size": ["1", "2"],
             "--sharding": ["none", "zero3"], "--weight-decay": ["0", "0.1"], "--num-heads": ["2", "4", "12"]}
FLAG_BAD = ["abc", "", "-1", "0", "1e3", "nan", "inf", "1000000000", "4096", "5", "1,000", "(", "/dev/zero", "x" * 300]


def cli_argv(rng, tmp: str) -> tuple[list[str], str | None]:
    """A valid base invocation with one flag (sometimes) set to a bad value: (argv, its field when
    the bad value is garbage for any flag, so the message must name it)."""
    command = rng.choice(["estimate", "capacity", "plan", "gpus", "tables", "junk"])
    base = ["--model", "gpt2", "--num-layers", rng.choice(["1", "2"]), "--hidden-size", "48"]
    argv = {"estimate": ["estimate", *base], "capacity": ["capacity", *base, "--gpu", "H100-80GB"],
            "plan": ["plan", *base, "--gpu", "A100-80GB", "--global-batch", "8", "--seq-len", "128"],
            "gpus": ["gpus"], "tables": ["tables", "--out", f"{tmp}/ok.json/x", "--no-plots"],
            "junk": [rng.choice(["", "-x", "estimat", "--json"])]}[command]
    for flag in rng.sample(sorted(FLAG_GOOD), rng.randint(0, 2)):
        if command in ("estimate", "capacity") or (command == "plan" and flag not in ("--micro-batch", "--seq-len",
                                                                                          "--grad-accum")):
            argv += [flag, rng.choice(FLAG_GOOD[flag])]
    named = None
    if command in ("estimate", "capacity", "plan") and rng.random() < 0.8:
        flag = rng.choice(sorted(FLAG_GOOD) + ["--implementation", "--hf-config", "--model", "--top", "--budget",
                                               "--gpu", "--utilisation", "--solve", "--tensor-parallel",
                                               "--global-batch", "--checkpoint-every"])
        value = rng.choice(FLAG_BAD)
        if flag == "--budget" and command == "capacity":
            argv = [a for a in argv if a not in ("--gpu", "H100-80GB")]
        if flag in ("--model", "--hf-config"):
            argv = [a for a in argv if a != "--model" and a != "gpt2"]
        argv += [flag, value]
        if value in ("abc", "(", "1,000") and flag not in ("--top", "--global-batch", "--utilisation"):
            named = flag[2:].replace("-", "_")
        if flag in ("--budget",) and command == "capacity" and value in ("abc", "nan", "inf", "1,000", "(", ""):
            named = "budget"
    if rng.random() < 0.3 and command != "junk":
        argv.append("--json")
    return argv, named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", type=int, default=10000)
    parser.add_argument("--cli", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tally = Tally()
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.api):
            label, thunk = api_call(rng, tmp)
            tally.counts["api calls"] += 1
            t0 = time.monotonic()
            try:
                with time_limit(CALL_SECONDS):
                    thunk()
                tally.counts["api results (sane)"] += 1
            except memcalc.MemcalcError as err:
                tally.counts["api project errors"] += 1
                if not str(err).startswith(f"{err.field}: ") or "\n" in str(err):
                    tally.fail("malformed message", f"{label}: {err}")
            except Hang:
                tally.fail("hang over 5 s", label)
            except AssertionError as err:
                tally.fail("insane result", f"{label}: {err}")
            except Exception as err:  # noqa: BLE001  (counted, not hidden)
                tally.fail("raw exception", f"{label}: {type(err).__name__}: {err}")
            tally.counts["slowest api ms"] = max(tally.counts["slowest api ms"], int(1000 * (time.monotonic() - t0)))
        for _ in range(args.cli):
            argv, named = cli_argv(rng, tmp)
            tally.counts["cli runs"] += 1
            try:
                code, _, stderr = run_cli(argv)
            except Hang:
                tally.fail("hang over 5 s", f"cli {argv}")
                continue
            except Exception as err:  # noqa: BLE001  (counted, not hidden)
                tally.fail("raw exception", f"cli {argv}: {type(err).__name__}: {err}")
                continue
            tally.counts[f"cli exit {code}"] += 1
            if code not in (0, 2):
                tally.fail("exit code not 0/2", f"{argv} -> {code}: {stderr}")
            elif code == 2:
                lines = stderr.strip().splitlines()
                if len(lines) != 1 or not lines[0].startswith("memcalc: error: ") or "; fix: " not in lines[0]:
                    tally.fail("malformed message", f"{argv}: {stderr!r}")
                elif named and not lines[0].startswith(f"memcalc: error: {named}:"):
                    tally.fail("message names another field", f"{argv}: {lines[0]}")
            elif named:
                tally.fail("exit 0 on garbage", f"{argv}")
    for key in sorted(tally.counts):
        print(f"{key:>32}: {tally.counts[key]}")
    problems = sum(v for k, v in tally.counts.items()
                   if k in ("hang over 5 s", "raw exception", "insane result", "exit code not 0/2",
                            "malformed message", "message names another field", "exit 0 on garbage"))
    print(f"{'problems':>32}: {problems}")
    print(f"{'seconds':>32}: {time.time() - start:.0f}")
    for line in tally.failures:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
