"""trl.GRPOTrainer (memcalc.families.trl_grpo, memcalc.inputs.trainers.grpo_args) against TRL
itself: GRPOConfig's field list and defaults, the refusals by name, and invariants of the phases
drawn over the families GRPO runs on (the measured rows are validate's grpo00-03)."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memcalc
from memcalc.core.errors import MemcalcError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.trainers import grpo_args
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.grpo import grpo_phases

CPU = {"use_cpu": True, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 32}


@pytest.mark.slow
def test_every_grpoconfig_field_is_accounted_for():
    """A TRL release adding a GRPOConfig field turns this red; every default is TRL's."""
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init} - base
    assert names == grpo_args.own_names()
    assert set(grpo_args.READ) | set(grpo_args.REFUSED_UNLESS_DEFAULT) <= set(grpo_args.DEFAULTS)
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    for name, value in grpo_args.DEFAULTS.items():
        f = fields[name]
        assert (f.default if f.default is not dataclasses.MISSING else f.default_factory()) == value, name


@pytest.mark.slow
def test_grpoconfig_object_gives_the_step(tmp_path):
    """A GRPOConfig object and its dict give the same step: rows are completions, beta reads as
    the reference pass, TRL's defaults (bf16 autocast, checkpointing)."""
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=8,
                          num_generations=4, max_completion_length=32, beta=0.04, use_cpu=True)
    t = TrainingConfig.from_trainer_args(args, seq_len=64, trainer="grpo")
    assert TrainingConfig.from_trainer_args(args.to_dict(), seq_len=64, trainer="grpo") == t
    assert (t.micro_batch, t.trl, t.grpo_completion_len, t.grpo_reference, t.precision, t.checkpointing) == \
        (8, "grpo", 32, True, "bf16-amp", "per-layer")


@pytest.mark.parametrize("fields, name", [
    ({"use_vllm": True}, "trainer_args.use_vllm"),
    ({"loss_type": "cispo"}, "trainer_args.loss_type"),
    ({"temperature": 0.7}, "trainer_args.temperature"),
    ({"top_p": 0.9}, "trainer_args.top_p"),
    ({"entropy_coef": 0.01}, "trainer_args.entropy_coef"),
    ({"steps_per_generation": 4}, "trainer_args.steps_per_generation"),
    ({"gradient_accumulation_steps": 2}, "trainer_args.gradient_accumulation_steps"),
    ({"max_completion_length": 64}, "trainer_args.max_completion_length"),
    ({"num_generations": 3}, "trainer_args.num_generations"),
    ({"bettaa": 0.1}, "trainer_args.bettaa"),
])
def test_refused_by_name(fields, name):
    with pytest.raises(MemcalcError) as err:
        TrainingConfig.from_trainer_args({**CPU, **fields}, seq_len=64, trainer="grpo")
    assert err.value.field == name


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["gpt2", "qwen2-0.5b"]), st.sampled_from([2, 4]), st.integers(4, 40),
       st.integers(2, 24), st.booleans())
def test_grpo_phase_invariants(preset, generations, completion, prompt, lora):
    """A reference pass never lowers any phase; its copy doubles the weights the step holds,
    LoRA's (adapters off) holds none; the step's peak is never below its scoring phase's
    buffered tensors' (the step holds the same batch and the gradients)."""
    from memcalc.inputs.lora import LoRA

    model = ModelSpec.preset(preset).with_(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=None,
                                           vocab_size=1000, max_position_embeddings=1024)
    if preset != "gpt2":
        model = model.with_(intermediate_size=128)
    args = {**CPU, "num_generations": generations, "max_completion_length": completion, "bf16": False,
            "gradient_checkpointing": False}
    t = TrainingConfig.from_trainer_args(args, seq_len=prompt + completion, trainer="grpo")
    if lora:
        t = t.with_(lora=LoRA(rank=4, targets="all-linear"))
    plain, ref = grpo_phases(model, t), grpo_phases(model, t.with_(grpo_reference=True))
    assert ref.step >= plain.step and ref.scoring >= plain.scoring and ref.generation >= plain.generation
    assert plain.peak_bytes == max(plain.generation, plain.scoring, plain.step)
    weights = memcalc.estimate(model, t).components["weights"]
    held = memcalc.estimate(model, t.with_(grpo_reference=True)).components["weights"]
    assert held == (weights if lora else 2 * weights)


def test_generation_grows_with_the_completions():
    """The last decode step's cache grows with max_completion_length: past the prefill, longer
    completions raise the generation phase (the prompt and the batch fixed)."""
    model = ModelSpec.preset("gpt2").with_(num_layers=2, hidden_size=64, num_heads=4, vocab_size=500)
    args = {**CPU, "bf16": False, "gradient_checkpointing": False}
    peaks = []
    for completion in (16, 200, 400):
        t = TrainingConfig.from_trainer_args({**args, "max_completion_length": completion},
                                             seq_len=8 + completion, trainer="grpo")
        peaks.append(grpo_phases(model, t))
    assert not peaks[0].decode_decides and peaks[2].decode_decides
    assert peaks[0].generation < peaks[1].generation < peaks[2].generation


def test_check_names_each_phase_and_refuses_vllm(tmp_path, capsys):
    """memcalc check --trainer grpo prints each phase's peak and the one that decides (the
    phases' own programs, a second route to grpo_phases' figures); vLLM gets one line and exit 2."""
    import json

    from memcalc.cli import main

    config = tmp_path / "grpo.json"
    config.write_text(json.dumps({**CPU, "beta": 0.04, "bf16": False, "gradient_checkpointing": False}))
    args = ["check", "--trainer", "grpo", "--trainer-args", str(config), "--model", "gpt2", "--num-layers",
            "2", "--seq-len", "64", "--budget", "80GB", "--device", "cpu", "--json"]
    assert main(args) == 0  # fits
    phases = json.loads(capsys.readouterr().out)["grpo_phases"]
    model = ModelSpec.preset("gpt2").with_(num_layers=2)
    t = TrainingConfig.from_trainer_args({**CPU, "beta": 0.04, "bf16": False, "gradient_checkpointing": False},
                                         seq_len=64, trainer="grpo")
    expected = grpo_phases(model, t)
    assert (phases["generation"], phases["scoring"], phases["step"], phases["deciding"]) == \
        (expected.generation, expected.scoring, expected.step, expected.deciding)
    config.write_text(json.dumps({**CPU, "use_vllm": True}))
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == 2 and "use_vllm" in capsys.readouterr().err
