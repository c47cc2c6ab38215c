"""Traced programs (memcalc.traced, issue 25): a user's own nn.Module traced under FakeTensorMode,
its sizes fitted in b and s, held to the validator's real-tensor measurement of the same step
(validate.measure.module) at shapes not used to fit, and refusals by op name."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import memcalc  # noqa: E402
from memcalc.core.errors import MemcalcError, NotModelledError  # noqa: E402
from memcalc.inputs.training import TrainingConfig  # noqa: E402
from tests.traced_models import VOCAB, llama_factory, llama_loss, nanogpt_factory, nanogpt_loss  # noqa: E402
from validate.measure.module import measure_module  # noqa: E402


@pytest.fixture(autouse=True)
def _own_trace_cache(tmp_path, monkeypatch):
    """Each test traces afresh (memcalc.traced.disk), in a folder of its own."""
    monkeypatch.setenv("MEMCALC_TRACE_CACHE", str(tmp_path))


def _tiny():
    return torch.nn.Sequential(torch.nn.Embedding(40, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 40))


def _ce(model, ids):
    return torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())


@pytest.mark.parametrize("b,s,precision,optimizer", [(3, 50, "fp32", "adamw"), (1, 33, "bf16-amp", "sgd-momentum"),
                                                      (6, 7, "bf16", "adam")])
def test_tiny_module_is_byte_exact(b, s, precision, optimizer):
    """A shape used by no fit (b = 1 has its own fit), against real tensors."""
    spec = memcalc.ModelSpec.from_module(_tiny, inputs=40, loss=_ce, name="tiny")
    t = TrainingConfig(micro_batch=b, seq_len=s, device="cpu", precision=precision, optimizer=optimizer)
    report = memcalc.estimate(spec, t)
    real = measure_module(_tiny, 40, _ce, t)
    assert (report.peak_bytes, report.first_step_peak_bytes) == (real.peak_bytes, real.first_step_peak_bytes)


def test_the_disk_cache_answers_the_second_time(tmp_path, monkeypatch):
    import memcalc.traced.build as build

    t = TrainingConfig(micro_batch=2, seq_len=16, device="cpu")
    first = memcalc.estimate(memcalc.ModelSpec.from_module(_tiny, inputs=40, loss=_ce, name="tiny"), t).peak_bytes
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = memcalc.ModelSpec.from_module(_tiny, inputs=40, loss=_ce, name="tiny")  # a new key in the process

    def no_trace(*_args):
        raise AssertionError("traced again: the answer must come from the file")

    monkeypatch.setattr(build, "fitted_step", no_trace)
    assert memcalc.estimate(again, t).peak_bytes == first


def test_downstream_queries_read_a_traced_program():
    spec = memcalc.ModelSpec.from_module(_tiny, inputs=40, loss=_ce, name="tiny")
    t = TrainingConfig(micro_batch=2, seq_len=16, device="cpu")
    report = memcalc.estimate(spec, t)
    b, s = report.expr.free_symbols if hasattr(report.expr, "free_symbols") else (None, None)
    assert {str(x) for x in report.expr.free_symbols} <= {"b", "s"}
    at = {sym: v for sym, v in zip(sorted(report.expr.free_symbols, key=str), (2, 16))}
    assert int(report.expr.subs(at)) == report.peak_bytes
    assert spec.param_count == 40 * 16 + 2 * 16 + 16 * 40 + 40


class _Routed(torch.nn.Module):
    """Tokens routed by value: a data-dependent shape."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40)

    def forward(self, ids):
        x = self.emb(ids).flatten(0, 1)
        picked = torch.nonzero(ids.flatten() % 2).squeeze(1)
        return self.out(x[picked]).sum()


def test_data_dependent_shapes_are_refused_by_op():
    spec = memcalc.ModelSpec.from_module(_Routed, inputs=40, name="routed")
    with pytest.raises(NotModelledError, match="aten::nonzero"):
        memcalc.estimate(spec, TrainingConfig(micro_batch=2, seq_len=8, device="cpu"))


def test_untraced_options_are_refused_by_field():
    spec = memcalc.ModelSpec.from_module(_tiny, inputs=40, loss=_ce, name="tiny")
    with pytest.raises(MemcalcError, match="^checkpointing"):
        memcalc.estimate(spec, TrainingConfig(micro_batch=2, seq_len=8, device="cpu", checkpointing="per-layer"))
    with pytest.raises(MemcalcError, match="^device"):
        memcalc.estimate(spec, TrainingConfig(micro_batch=2, seq_len=8, device="cuda"))


ROWS = [("llama", "fp32", "none", "adamw"), ("llama", "bf16-amp", "per-layer", "adamw"),
        ("nanogpt", "fp32", "per-layer", "sgd-momentum"), ("nanogpt", "bf16-amp", "none", "adamw")]


@pytest.mark.slow
@pytest.mark.parametrize("family,precision,checkpointing,optimizer", ROWS)
def test_models_written_here_match_real_tensors(family, precision, checkpointing, optimizer):
    factory, loss = {"llama": (llama_factory, llama_loss), "nanogpt": (nanogpt_factory, nanogpt_loss)}[family]
    spec = memcalc.ModelSpec.from_module(factory, inputs=VOCAB, loss=loss, name=family)
    t = TrainingConfig(micro_batch=3, seq_len=40, device="cpu", precision=precision,
                       checkpointing=checkpointing, optimizer=optimizer)
    real = measure_module(factory, VOCAB, loss, t)
    assert memcalc.estimate(spec, t).peak_bytes == real.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_traced_hf_model_agrees_with_the_hand_written_program(family):
    """Two independent derivations of the same step: the traced HF model and memcalc's program."""
    from memcalc.inputs.specs import ModelSpec
    from validate.measure.step import hf_call_kwargs
    from validate.models.hf import build_hf

    hand = {"gpt2": ModelSpec.make(family="gpt2", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                                   max_position_embeddings=256, embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1),
            "llama": ModelSpec.make(family="llama", vocab_size=500, hidden_size=64, num_layers=2, num_heads=4,
                                    num_kv_heads=2, intermediate_size=128, tie_embeddings=False, qkv_bias=False,
                                    out_bias=False, mlp_bias=False, activation="silu")}[family]
    t = TrainingConfig(micro_batch=3, seq_len=40, device="cpu", precision="bf16-amp", checkpointing="per-layer")
    traced = ModelSpec.from_module(lambda training: build_hf(hand, training)[0], inputs=hand.vocab_size,
                                   loss=lambda model, ids: model(**hf_call_kwargs(t, ids, {})).loss)
    ours, theirs = memcalc.estimate(traced, t).peak_bytes, memcalc.estimate(hand, t).peak_bytes
    assert abs(ours - theirs) <= 1e-4 * theirs


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["starcoder2", "olmo3"])
def test_model_types_without_a_program_are_traced(model_type):
    from memcalc.inputs.specs import ModelSpec
    from memcalc.traced.hf import hf_loss
    from memcalc.traced.spec import TRACED

    cfg = {"model_type": model_type, "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
    spec = ModelSpec.from_hf_config(cfg, fallback="trace")
    t = TrainingConfig(micro_batch=3, seq_len=40, device="cpu", precision="fp32")
    real = measure_module(TRACED[spec.trace_key].factory, 256, hf_loss, t)
    assert memcalc.estimate(spec, t).peak_bytes == real.peak_bytes


@torch.library.custom_op("memcalc_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _Custom(torch.nn.Module):
    """A custom op with a CPU kernel and no fake (meta) implementation."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40)

    def forward(self, ids):
        return _ce(lambda i: self.out(_twice(self.emb(i))), ids)


def test_ops_without_a_meta_kernel_are_refused_by_op():
    spec = memcalc.ModelSpec.from_module(_Custom, inputs=40, name="custom")
    with pytest.raises(NotModelledError, match="memcalc_test::twice has no meta kernel"):
        memcalc.estimate(spec, TrainingConfig(micro_batch=2, seq_len=8, device="cpu"))


def test_transformers_masks_answer_under_fake_tensors_as_for_real_ones():
    """memcalc.traced.hf_patches: FakeTensors count as 'tracing' in transformers' masking_utils,
    which then materialises a causal mask real tensors never make; while a trace runs they do not."""
    import transformers.masking_utils as mu
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memcalc.traced.hf_patches import real_tensor_answers

    with FakeTensorMode():
        t = torch.zeros(2, 3)
        positions = torch.arange(3).expand(2, 3)
        assert mu.is_tracing(t) and mu.find_packed_sequence_indices(positions) is not None
        with real_tensor_answers():
            assert not mu.is_tracing(t) and mu.find_packed_sequence_indices(positions) is None
        assert mu.is_tracing(t)


@pytest.mark.slow
def test_a_fake_trace_of_hf_gpt2_equals_its_real_step():
    """The 65,536 B the validator's fake backend reads above the real step (HF GPT-2 h64, 2 x 64)
    are gone from the traced step: same storages, same peaks."""
    from memcalc.core.poly import Poly
    from memcalc.inputs.specs import ModelSpec
    from memcalc.traced.fit import sizes, structure
    from memcalc.traced.program import FittedStep, moments
    from memcalc.traced.runner import trace_step
    from validate.measure.step import hf_call_kwargs
    from validate.models.hf import build_hf

    spec = ModelSpec.make(family="gpt2", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                          max_position_embeddings=256)
    t = TrainingConfig(micro_batch=2, seq_len=64, device="cpu")
    peaks = []
    for fake in (True, False):
        ev = trace_step(lambda training: build_hf(spec, training)[0], t, 2, 64, 1000,
                        lambda model, ids: model(**hf_call_kwargs(t, ids, {})).loss, fake=fake).events
        steady, first = moments(FittedStep(structure(ev), {k: Poly.const(v) for k, v in sizes(ev).items()}, {}))
        peaks.append((max(m.total.eval(1, 1) for m in steady), max(m.total.eval(1, 1) for m in first),
                      sorted(sizes(ev).values())))
    assert peaks[0] == peaks[1]
