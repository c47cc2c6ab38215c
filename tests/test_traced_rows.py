"""Traced models as validation rows (validate/matrices/rows/traced.json, issue 25): the row field
`traced` builds a traced spec whose case key is what the model is traced from (never the
process-local registration), and the pieces a row needs: references resolved lazily, fp32
grouped matmuls (MoE experts) traced as the CPU kernel runs them, batch functions as inputs."""
from __future__ import annotations

import pytest

from validate.matrices.load import build_case, read_topic

ROW = {"name": "x", "traced": {"factory": "tests.traced_models:llama_factory", "loss": "tests.traced_models:llama_loss",
                               "inputs": 96, "name": "llama-style"},
       "training": {"micro_batch": 3, "seq_len": 40}}


def test_a_traced_rows_key_names_its_source_not_its_registration():
    first, again = build_case(ROW, {}, "traced", "cpu"), build_case(ROW, {}, "traced", "cpu")
    assert first.spec.trace_key != again.spec.trace_key  # two registrations in this process...
    assert first.key == again.key and "trace_key" not in first.key  # ...one configuration
    assert '"factory":"tests.traced_models:llama_factory"' in first.key


def test_every_traced_topic_row_builds_a_traced_spec():
    for topic in ("traced", "traced-extra"):
        data = read_topic(topic)
        for row in data["rows"]:
            case = build_case(row, data, topic, "cpu")
            assert case.spec.family == "traced" and case.traced == row["traced"], row["name"]


def test_a_model_type_with_a_program_is_not_a_traced_row():
    from memcalc.core.errors import SpecError

    row = {"name": "y", "traced": {"hf": True}, "hf_config": {"model_type": "gpt2", "n_layer": 2},
           "training": {"micro_batch": 1, "seq_len": 8}}
    with pytest.raises(SpecError, match="hand-written program"):
        build_case(row, {}, "traced", "cpu")


def test_a_reference_passes_its_targets_signature():
    """memcalc.traced.runner calls factory(training) when the factory takes an argument."""
    import inspect

    from memcalc.traced.spec import ModuleRef

    assert list(inspect.signature(ModuleRef("tests.traced_models:llama_factory")).parameters) == ["training"]


torch = pytest.importorskip("torch")


class _Experts(torch.nn.Module):
    """Tokens times top-2 rows through 4 experts with torch._grouped_mm, as transformers'
    grouped_mm_experts_forward (fixed routing: every expert gets the same share)."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(40, 16), torch.nn.Linear(16, 40)
        self.w = torch.nn.Parameter(torch.randn(4, 16, 32) * 0.1)

    def forward(self, ids):
        x = self.emb(ids).flatten(0, 1).repeat_interleave(2, dim=0)  # (tokens * 2, 16)
        offs = torch.cumsum(torch.full((4,), x.shape[0] // 4, dtype=torch.int32), 0, dtype=torch.int32)
        y = torch._grouped_mm(x, self.w, offs=offs)[:, :16]
        logits = self.out(y.view(-1, 2, 16).sum(1))
        return torch.nn.functional.cross_entropy(logits, ids.flatten())


@pytest.mark.slow
def test_fp32_grouped_matmuls_are_traced_as_the_cpu_kernel_runs_them(tmp_path, monkeypatch):
    """torch's meta kernel refuses fp32 operands (its CUDA rule), the CPU kernel runs them:
    memcalc.traced.fake_kernels makes the output the CPU kernel makes; the same bytes as real tensors."""
    import memcalc
    from memcalc.inputs.training import TrainingConfig
    from validate.measure.module import measure_module

    monkeypatch.setenv("MEMCALC_TRACE_CACHE", str(tmp_path))
    t = TrainingConfig(micro_batch=4, seq_len=40, device="cpu")
    spec = memcalc.ModelSpec.from_module(_Experts, inputs=40, name="experts")
    real = measure_module(_Experts, 40, None, t)
    report = memcalc.estimate(spec, t)
    assert (report.peak_bytes, report.first_step_peak_bytes) == (real.peak_bytes, real.first_step_peak_bytes)


class _Chunked(torch.nn.Module):
    """Pads the sequence to a multiple of 64, as a chunked scan does (Qwen3-Next's gated delta
    rule): a size that steps with s, constant over the fitting shapes (16-40)."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40)

    def forward(self, ids):
        x = self.emb(ids)
        padded = torch.nn.functional.pad(x, (0, 0, 0, (-ids.shape[1]) % 64))  # (b, 64 ceil(s / 64), 8)
        y = self.out(padded)[:, :ids.shape[1]]
        return torch.nn.functional.cross_entropy(y.flatten(0, 1), ids.flatten())


@pytest.mark.slow
def test_a_size_that_steps_with_s_is_refused_by_the_far_check(tmp_path, monkeypatch):
    import memcalc
    from memcalc.core.errors import NotModelledError
    from memcalc.inputs.training import TrainingConfig

    monkeypatch.setenv("MEMCALC_TRACE_CACHE", str(tmp_path))
    spec = memcalc.ModelSpec.from_module(_Chunked, inputs=40, name="chunked", far_seq_len=1040)
    with pytest.raises(NotModelledError, match=r"at \(b, s\) = \(4, 1040\)"):
        memcalc.estimate(spec, TrainingConfig(micro_batch=2, seq_len=100, device="cpu"))
