"""Hypothesis strategies for bad (and some good) input: arbitrary values for every field of
ModelSpec and TrainingConfig, budgets, grid arrays, HF config trees, odd files, CLI argv lists.
Profiles come from tests/strategies.py (quick by default; MEMCALC_HYPOTHESIS_PROFILE=long).

`outcome(call)` is the property every test here checks: a result that passes `sane`, or the
project's MemcalcError; never another exception, never over CALL_SECONDS.
"""
from __future__ import annotations

import contextlib
import io
import math
import signal
import time

from hypothesis import strategies as st

import tests.strategies  # noqa: F401  (registers and loads the profiles)
from memcalc.core.errors import MemcalcError

CALL_SECONDS = 5.0

WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-2 ** 70, 2 ** 70),
    st.sampled_from([2 ** 31, 2 ** 40, 2 ** 63, 10 ** 6, 10 ** 9, 10 ** 30]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["12", "false", "true", "", "gpt2", "nan", "inf", "1e3", "-1"]),
    st.binary(max_size=4), st.lists(st.integers(0, 3), max_size=2), st.just({}))

SMALL_MODEL = dict(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                   max_position_embeddings=128)
SMALL_TRAINING = dict(micro_batch=1, seq_len=16, device="cpu")

MODEL_GOOD = {"family": st.sampled_from(["gpt2", "llama"]), "implementation": st.sampled_from(["hf", "reference"]),
              "vocab_size": st.integers(1, 128), "hidden_size": st.sampled_from([8, 16]),
              "num_layers": st.integers(1, 3), "num_heads": st.sampled_from([1, 2, 4]),
              "num_kv_heads": st.sampled_from([None, 1, 2]), "head_dim": st.sampled_from([None, 4, 8]),
              "intermediate_size": st.sampled_from([None, 16, 32]),
              "max_position_embeddings": st.sampled_from([8, 64, 128]),
              "tie_embeddings": st.booleans(), "qkv_bias": st.booleans(), "out_bias": st.booleans(),
              "mlp_bias": st.booleans(), "activation": st.sampled_from(["gelu_new", "gelu", "gelu_tanh", "silu"]),
              "embd_dropout": st.sampled_from([0.0, 0.1]), "attn_dropout": st.sampled_from([0.0, 0.1]),
              "resid_dropout": st.sampled_from([0.0, 0.1]), "name": st.text(max_size=8)}
TRAINING_GOOD = {"micro_batch": st.integers(1, 4), "seq_len": st.integers(1, 64), "grad_accum": st.integers(1, 3),
                 "precision": st.sampled_from(["fp32", "fp16-amp", "bf16-amp", "bf16"]),
                 "optimizer": st.sampled_from(["sgd", "sgd-momentum", "adam", "adamw"]),
                 "optimizer_impl": st.sampled_from([None, "foreach", "fused", "for-loop"]),
                 "weight_decay": st.sampled_from([None, 0.0, 0.1]),
                 "checkpointing": st.sampled_from(["none", "per-layer", "sqrt", "every-k", "selective"]),
                 "checkpoint_every": st.sampled_from([None, 1, 2]), "attention": st.sampled_from(["eager", "sdpa"]),
                 "device": st.sampled_from(["cpu", "cuda"]), "world_size": st.sampled_from([1, 2, 4]),
                 "sharding": st.sampled_from(["none", "zero1", "zero2", "zero3"]),
                 "tensor_parallel": st.sampled_from([1, 2]), "sequence_parallel": st.booleans(),
                 "fsdp_mixed_precision": st.booleans()}


@st.composite
def field_dicts(draw, good: dict, base: dict):
    """`base` with a few fields drawn from their good values or from WEIRD."""
    out = dict(base)
    for name in draw(st.lists(st.sampled_from(sorted(good)), max_size=4, unique=True)):
        out[name] = draw(st.one_of(good[name], WEIRD) if draw(st.booleans()) else good[name])
    return out


def model_fields():
    return field_dicts(MODEL_GOOD, SMALL_MODEL)


def training_fields():
    return field_dicts(TRAINING_GOOD, SMALL_TRAINING)


BUDGETS = st.one_of(WEIRD, st.integers(0, 2 ** 52), st.floats(-1e20, 1e20),
                    st.from_regex(r"\A-?[0-9]{0,6}(\.[0-9]{0,3})?(e-?[0-9]{1,4})? ?(B|KB|MB|GB|GiB|TiB|G|XB|PB)?\Z"),
                    st.sampled_from(["H100-80GB", "a100-80gb", "80XB", "1,000", "1e400GB", "local", "H100"]))

JSON_TREES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=12)

CONFIG_KEYS = ["model_type", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
               "tie_word_embeddings", "activation_function", "embd_pdrop", "attn_pdrop", "resid_pdrop",
               "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "max_position_embeddings", "attention_bias",
               "mlp_bias", "hidden_act", "attention_dropout", "_name_or_path"]


@st.composite
def hf_configs(draw):
    """A config dict: a known model_type, known keys with small or arbitrary JSON values."""
    cfg = {"model_type": draw(st.sampled_from(["gpt2", "llama", "mistral", "qwen2", "bert", 5]))}
    small = st.one_of(st.integers(1, 64), st.sampled_from([True, False, "false", 0.1]))
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=8, unique=True)):
        cfg[key] = draw(st.one_of(small, JSON_TREES))
    return cfg


GRID_VALUES = st.one_of(
    st.lists(st.integers(-2, 2 ** 64), min_size=0, max_size=4),
    st.lists(st.lists(st.integers(1, 64), max_size=3), max_size=3),
    st.lists(st.floats(), max_size=3), st.integers(-5, 5000), st.sampled_from([[True], ["a"], [None], [[]]]),
    st.lists(st.integers(1, 32), min_size=1, max_size=6))
GRID_NAMES = st.sampled_from(["micro_batch", "seq_len", "num_layers", "precision", "bogus", "world_size",
                              "tensor_parallel", "attention"])

FLAG_VALUES = st.one_of(st.sampled_from(["1", "2", "16", "0", "-1", "abc", "", "1e3", "nan", "inf", "1000000000",
                                         "4096", "5", "gpt2", "llama-2-7b", "H100-80GB", "80GB", "80XB",
                                         "fp32", "bf16", "zero3", "eager", "reference", "(", "/dev/zero"]),
                        st.text(max_size=6))
FLAGS = ["--model", "--hf-config", "--implementation", "--num-layers", "--hidden-size", "--num-heads",
         "--micro-batch", "--seq-len", "--grad-accum", "--precision", "--optimizer", "--weight-decay",
         "--checkpointing", "--checkpoint-every", "--attention", "--device", "--world-size", "--sharding",
         "--tensor-parallel", "--budget", "--gpu", "--solve", "--global-batch", "--utilisation", "--top",
         "--json", "--fsdp-mixed-precision", "--formula", "--out"]


@st.composite
def argvs(draw):
    """A CLI argv: a subcommand (or junk), a small model, then flags with any values."""
    command = draw(st.sampled_from(["estimate", "capacity", "plan", "gpus", "bogus", "tables", ""]))
    argv = [command] if command else []
    if command in ("estimate", "capacity", "plan"):
        argv += ["--model", "gpt2", "--num-layers", draw(st.sampled_from(["1", "2"]))]
    if command == "tables":
        return argv + ["--out", "/dev/null/x", "--presets", "gpt2", "--no-plots"]
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=4)):
        argv += [flag] if flag in ("--json", "--fsdp-mixed-precision", "--formula") else [flag, draw(FLAG_VALUES)]
    return argv


# ---- the property ---------------------------------------------------------------------------
class Hang(Exception):
    """A call ran past CALL_SECONDS."""


WALL_FACTOR = 6  # a blocked read uses no CPU: the wall-clock limit catches it


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise Hang past `seconds` of CPU time (independent of the machine's load; CI runners and
    this 2-core box run several suites at once) or WALL_FACTOR x `seconds` of wall time."""
    def _alarm(_signum, _frame):
        raise Hang(f"over {seconds} s of CPU time or {WALL_FACTOR * seconds} s of wall time")

    old = {sig: signal.signal(sig, _alarm) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, WALL_FACTOR * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def outcome(call, sane=lambda _result: None, seconds: float = CALL_SECONDS):
    """('ok', result) after `sane(result)` passes, or ('error', MemcalcError); anything else
    (another exception, a hang, an insane result) raises AssertionError."""
    start = time.monotonic()
    try:
        with time_limit(seconds):
            result = call()
    except MemcalcError as err:
        assert str(err).startswith(err.field + ":") and err.field, f"message does not name a field: {err}"
        assert "\n" not in str(err), f"not one line: {err!r}"
        return "error", err
    except Hang:
        raise AssertionError(f"hang: over {seconds} s") from None
    except Exception as err:  # the property: no other exception escapes
        raise AssertionError(f"raw {type(err).__name__}: {err}") from err
    assert time.monotonic() - start < WALL_FACTOR * seconds + 1
    sane(result)
    return "ok", result


def run_cli(argv: list[str], seconds: float = CALL_SECONDS) -> tuple[int, str, str]:
    """memcalc.cli.main(argv) in-process: (exit code, stdout, stderr); raw exceptions propagate."""
    from memcalc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(seconds):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return code, out.getvalue(), err.getvalue()


# ---- sanity checks of results, written independently of memcalc.core.arguments -------------------------
def runnable(model, training) -> bool:
    """Whether the step is one the implementation can run and memcalc models (independent rules)."""
    t = training.tensor_parallel
    fixed_positions = model.family == "gpt2" or model.implementation == "reference"
    return (not (fixed_positions and training.seq_len > model.max_position_embeddings)
            and model.num_heads % t == 0 and model.kv_heads % t == 0 and model.ffn_size % t == 0
            and model.num_layers <= 1024 and training.world_size // t <= 2048)  # memcalc.core.limits


def sane_report(model, training):
    def check(r):
        assert runnable(model, training), "a number for a step that cannot run"
        assert isinstance(r.peak_bytes, int) and r.peak_bytes > 0
        assert r.peak_bytes == max(r.phases.values())
        assert isinstance(r.first_step_peak_bytes, int) and r.first_step_peak_bytes > 0
        assert all(isinstance(v, int) and v >= 0 for v in r.components.values())
    return check


def sane_capacity(r):
    assert isinstance(r.value, int) and r.value >= 0 and r.budget_bytes >= 0
    if r.value:
        assert r.peak_bytes <= r.budget_bytes
    if r.next_peak_bytes is not None and r.field != "world_size":
        assert r.next_peak_bytes > r.budget_bytes


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
