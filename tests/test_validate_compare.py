"""Result rows, JSON lines with resume, markdown, tolerance verdicts, matrix coverage."""
import itertools
import json
from types import SimpleNamespace


from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run import compare
from validate.run import runner
from validate.run.case import Case, config_key
from validate.run.compare import error_pct, markdown_table, read_jsonl, result_row, verdict

SPEC = ModelSpec.make(family="gpt2", vocab_size=100, hidden_size=16, num_layers=2, num_heads=2,
                      implementation="reference")
TC = TrainingConfig(micro_batch=1, seq_len=8, device="cpu")


def _measurement(peak=1000, first=900):
    return SimpleNamespace(status="ok", peak_bytes=peak, first_step_peak_bytes=first,
                           phases={"forward": 800, "backward": peak, "optimizer": 700},
                           backend="cpu", device="cpu", device_name="x", torch_version="t",
                           implementation="reference:ReferenceGPT2:sdpa", sdpa_backend=None,
                           param_dtype="float32", extra={}, wall_s=0.1)


def _report(peak=1010):
    return SimpleNamespace(peak_bytes=peak, first_step_peak_bytes=900,
                           phases={"forward": 800, "backward": peak, "optimizer": 690},
                           components={"weights": 10})


def test_error_pct_sign_and_rounding():
    assert error_pct(110, 100) == 10.0 and error_pct(90, 100) == -10.0
    assert error_pct(None, 1) is None and error_pct(1, None) is None


def test_result_row_has_config_prediction_measurement_and_phases():
    row = result_row(Case("c", SPEC, TC), _report(), _measurement())
    assert row["predicted_peak_bytes"] == 1010 and row["measured_peak_bytes"] == 1000
    assert row["error_pct"] == 1.0
    assert row["phases"]["optimizer"] == {"predicted": 690, "measured": 700, "error_pct": -1.4286}
    assert row["first_step"]["error_pct"] == 0.0
    assert row["model"]["hidden_size"] == 16 and row["training"]["seq_len"] == 8
    assert row["key"] == config_key(SPEC, TC)
    json.dumps(row)  # JSON-ready


def test_verdict_tolerance_oom_and_missing_prediction():
    assert verdict({"status": "ok", "error_pct": 0.99}, 1.0) is None
    assert "outside" in verdict({"status": "ok", "error_pct": 1.01}, 1.0)
    assert "no prediction" in verdict({"status": "ok", "error_pct": None}, 1.0)
    assert verdict({"status": "ok", "error_pct": None}, 1.0, require_prediction=False) is None
    oom = {"status": "oom", "predicted_peak_bytes": 200, "extra": {"total_bytes": 100}}
    assert verdict(oom, 1.0) is None  # predicted not to fit, and it did not
    assert "OOM" in verdict({**oom, "predicted_peak_bytes": 50}, 1.0)


def test_jsonl_append_resume_and_torn_line(tmp_path, monkeypatch):
    calls = []

    def fake_measure(_spec, training, *_backend_hf_config, **_steps):
        calls.append(training.micro_batch)
        return _measurement(peak=1000 * training.micro_batch)

    monkeypatch.setattr("validate.measure.backends.measure", fake_measure)
    monkeypatch.setattr(runner, "predict", lambda *_case: (_report(), None))
    out = tmp_path / "r.jsonl"
    cases = [Case(f"c{b}", SPEC, TC.with_(micro_batch=b)) for b in (1, 2, 3)]
    runner.run_cases(cases[:2], out, "cpu")
    with out.open("a") as f:
        f.write('{"key": "torn')  # a crash mid-write
    rows = runner.run_cases(cases, out, "cpu")
    assert calls == [1, 2, 3]  # resumed: the first two were not measured again
    assert [r["name"] for r in rows] == ["c1", "c2", "c3"]
    assert len(read_jsonl(out)) == 3


def test_failed_measurement_is_recorded_and_retried(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("validate.measure.backends.measure", broken)
    out = tmp_path / "r.jsonl"
    rows = runner.run_cases([Case("c", SPEC, TC)], out, "cpu")
    assert rows[0]["status"] == "error" and "boom" in rows[0]["error"]
    assert compare.done_keys(out) == set()  # errors are retried on resume


def test_markdown_table():
    row = result_row(Case("c", SPEC, TC), _report(1050), _measurement())
    table = markdown_table([row], 1.0)
    assert "| configuration | predicted (MiB) | measured (MiB) | error | status |" in table
    assert "+5.0000%" in table and "FAIL" in table


def test_ci_matrix_covers_every_value_and_the_important_pairs():
    from validate.matrices import get_matrix, topic_cases

    everything = get_matrix("ci")
    cases = topic_cases("training-options", "cpu")  # the two pairwise designs, rows ciNN
    assert [c.name for c in cases] == [f"ci{i:02d}" for i in range(len(cases))]
    assert {c.training.optimizer for c in everything} - {c.training.optimizer for c in cases} == {
        "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor"}  # the optimizers topic
    impl = lambda c: c.spec.implementation  # noqa: E731
    family = lambda c: ("qwen2" if c.hf_config else c.spec.family) + "-" + impl(c)  # noqa: E731
    t = lambda f: (lambda c: getattr(c.training, f))  # noqa: E731
    axes = {"family": family, "precision": t("precision"), "checkpointing": t("checkpointing"),
            "optimizer": t("optimizer"), "impl": t("optimizer_impl"), "attention": t("attention"),
            "grad_accum": t("grad_accum")}
    expected = {"family": 5, "precision": 4, "checkpointing": 5, "optimizer": 4, "impl": 3,
                "attention": 2, "grad_accum": 2}
    for name, get in axes.items():
        assert len({get(c) for c in cases}) == expected[name], name
    for a, b in itertools.combinations(axes, 2):
        assert len({(axes[a](c), axes[b](c)) for c in cases}) == expected[a] * expected[b], (a, b)
    assert all(c.training.device == "cpu" for c in cases)
    assert any(c.hf_config and c.hf_config["model_type"] == "qwen2" and c.spec.qkv_bias for c in cases)


def test_family_rows_cover_every_family_with_each_setting():
    from memcalc.inputs.training import CHECKPOINTINGS
    from validate.matrices import topic_cases

    cases = topic_cases("families-from-config", "cpu")
    family = lambda c: c.hf_config["model_type"]  # noqa: E731
    assert {family(c) for c in cases} == {"qwen3", "mistral", "qwen2", "gemma", "gemma2", "gemma3_text"}
    for value in {family(c) for c in cases}:
        rows = [c for c in cases if family(c) == value]
        assert {c.training.precision for c in rows} >= {"fp32", "bf16-amp"} or len(rows) >= 4, value
    windowed = [c for c in cases if c.spec.sliding_window is not None]
    reached = {(c.training.attention, c.training.seq_len >= c.spec.sliding_window) for c in windowed}
    assert reached == {(a, r) for a in ("eager", "sdpa") for r in (True, False)}
    assert {c.training.checkpointing for c in cases} == set(CHECKPOINTINGS)
    assert all(c.training.attention == "eager" for c in cases if family(c) == "gemma2")


def test_gpu_matrices_are_cuda_and_well_formed():
    from validate.matrices import get_matrix

    for name in ("gpu-quick", "gpu-full"):
        cases = get_matrix(name)
        assert cases and all(c.training.device == "cuda" for c in cases)
        assert len({c.key for c in cases}) == len(cases)
        assert all(c.training.seq_len <= c.spec.max_position_embeddings for c in cases)
