"""The step runner applies a TrainingConfig faithfully; checkpointing really saves memory."""
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # every test here runs real training steps

from memcalc.inputs.specs import ModelSpec  # noqa: E402
from memcalc.inputs.training import TrainingConfig  # noqa: E402
from validate.measure.backends import measure  # noqa: E402
from validate.measure.step import build_trainee, run_steps  # noqa: E402

REF_GPT2 = ModelSpec.make(family="gpt2", vocab_size=512, hidden_size=64, num_layers=4, num_heads=4,
                          max_position_embeddings=128, implementation="reference")
REF_LLAMA = ModelSpec.make(family="llama", vocab_size=512, hidden_size=64, num_layers=4,
                           num_heads=4, num_kv_heads=2, intermediate_size=176,
                           max_position_embeddings=128, implementation="reference")


class Spy:
    """A meter that records phases and, at the optimizer phase, the grads' dtypes."""

    def __init__(self, trainee=None):
        self.trainee, self.marks, self.grad_dtypes = trainee, [], set()

    def reset_peak(self):
        pass

    def peak(self):
        return 0

    def mark(self, label):
        self.marks.append(label)
        if label == "optimizer" and self.trainee is not None:
            self.grad_dtypes |= {p.grad.dtype for p in self.trainee.model.parameters()
                                 if p.grad is not None}


def _run(spec, **fields):
    training = TrainingConfig(micro_batch=2, seq_len=32, device="cpu", **fields)
    trainee = build_trainee(spec, training)
    spy = Spy(trainee)
    run_steps(trainee, training, spy, spec.vocab_size, steps=2)
    return trainee, spy


@pytest.mark.parametrize("precision,param,grad,scaler", [
    ("fp32", torch.float32, torch.float32, False),
    ("fp16-amp", torch.float32, torch.float32, True),
    ("bf16-amp", torch.float32, torch.float32, False),
    ("bf16", torch.bfloat16, torch.bfloat16, False),
])
def test_precision_sets_param_and_grad_dtypes(precision, param, grad, scaler):
    trainee, spy = _run(REF_GPT2, precision=precision)
    assert {p.dtype for p in trainee.model.parameters()} == {param}
    assert spy.grad_dtypes == {grad}
    assert (trainee.scaler is not None) == scaler


def test_autocast_runs_the_matmuls_in_low_precision():
    seen = []
    training = TrainingConfig(micro_batch=2, seq_len=32, device="cpu", precision="bf16-amp")
    trainee = build_trainee(REF_LLAMA, training)
    trainee.model.blocks[0].mlp.up_proj.register_forward_hook(lambda _mod, _inp, out: seen.append(out.dtype))
    run_steps(trainee, training, Spy(), REF_LLAMA.vocab_size, steps=2)
    assert seen == [torch.bfloat16, torch.bfloat16]


@pytest.mark.parametrize("impl,foreach,fused", [("foreach", True, False), ("fused", False, True),
                                                ("for-loop", False, False)])
@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum", "adam", "adamw"])
def test_optimizer_and_impl(optimizer, impl, foreach, fused):
    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", optimizer=optimizer,
                              optimizer_impl=impl)
    opt = build_trainee(REF_GPT2.with_(num_layers=1), training).optimizer
    assert (opt.defaults["foreach"], opt.defaults["fused"]) == (foreach, fused)
    assert type(opt).__name__ == {"sgd": "SGD", "sgd-momentum": "SGD", "adam": "Adam",
                                  "adamw": "AdamW"}[optimizer]
    if optimizer.startswith("sgd"):
        assert opt.defaults["momentum"] == (0.9 if optimizer == "sgd-momentum" else 0.0)
    assert opt.defaults["weight_decay"] == training.resolved_weight_decay


def test_grad_accum_runs_micro_steps_then_one_optimizer_step():
    _, spy = _run(REF_GPT2, grad_accum=3)
    one_step = spy.marks[: len(spy.marks) // 2]
    assert one_step == ["inputs"] + ["forward", "backward"] * 3 + ["optimizer"]


def test_optimizer_state_exists_in_steady_state():
    trainee, _ = _run(REF_GPT2, optimizer="adam")
    state = trainee.optimizer.state
    assert len(state) == len(list(trainee.model.parameters()))
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in state.values())


@pytest.mark.parametrize("spec,backend", [
    (REF_GPT2, "cpu"), (REF_LLAMA, "fake"),
    pytest.param(REF_LLAMA.with_(implementation="hf"), "cpu")],
    ids=["ref-gpt2", "ref-llama-fake", "hf-llama"])
def test_checkpointing_reduces_measured_memory(spec, backend):
    base = TrainingConfig(micro_batch=2, seq_len=64, device="cpu", attention="eager")
    peak = {ck: measure(spec, base.with_(checkpointing=ck), backend=backend).peak_bytes
            for ck in ("none", "per-layer", "sqrt", "selective")}
    assert peak["per-layer"] < peak["sqrt"] < peak["none"]
    assert peak["selective"] < peak["none"]


def test_first_step_differs_from_steady_state_by_optimizer_state():
    m = measure(REF_GPT2, TrainingConfig(micro_batch=2, seq_len=32, device="cpu", optimizer="adam"))
    assert m.first_step_peak_bytes < m.peak_bytes
    # in steady state exp_avg and exp_avg_sq (2 x 4 bytes/param) are alive during forward
    assert m.phases["forward"] - m.first_step_phases["forward"] == pytest.approx(
        8 * REF_GPT2.param_count, rel=0.01)


def test_reference_and_hf_models_have_the_spec_parameter_count():
    from validate.models.hf import build_hf
    from validate.models.reference import build_reference

    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu")
    for spec in (REF_GPT2, REF_LLAMA, REF_LLAMA.with_(tie_embeddings=True, qkv_bias=True)):
        n_ref = sum(p.numel() for p in build_reference(spec, training).parameters())
        n_hf = sum(p.numel() for p in build_hf(spec, training)[0].parameters())
        assert n_ref == n_hf == spec.param_count


def test_seq_len_beyond_positions_is_bad_input():
    from memcalc.core.errors import MemcalcError

    with pytest.raises(MemcalcError, match="seq_len"):
        build_trainee(REF_GPT2, TrainingConfig(micro_batch=1, seq_len=129, device="cpu"))


def test_steps_the_fp16_scaler_skips_are_not_measured():
    """A GradScaler whose scale overflows fp16 skips optimizer.step() (no state made): those steps
    are not the step memcalc predicts, so run_steps runs on until `steps` were taken (an OLMo-2
    fp16-amp step whose optimizer steps are all skipped holds no optimizer state: 72% under the
    steady step memcalc predicts)."""
    from memcalc.core.errors import MemcalcError
    from validate.measure.step import MAX_SKIPPED

    training = TrainingConfig(micro_batch=2, seq_len=16, device="cpu", precision="fp16-amp")
    trainee = build_trainee(REF_GPT2, training)
    trainee.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 26)  # inf gradients at first
    run = run_steps(trainee, training, Spy(), REF_GPT2.vocab_size, steps=3)
    skipped = [s for s in run.steps if s.skipped]
    assert skipped and len(run.steps) == 3 + len(skipped)
    assert not run.first.skipped and trainee.optimizer.state  # the counted steps made the states
    trainee = build_trainee(REF_GPT2, training)
    trainee.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 120)  # more skips than tolerated
    with pytest.raises(MemcalcError, match="skipped"):
        run_steps(trainee, training, Spy(), REF_GPT2.vocab_size, steps=3)
    assert MAX_SKIPPED < 120 - 26
