"""TrainingConfig.from_trainer_args against transformers' own TrainingArguments (its field list,
its defaults, the JSON to_json_string() writes) and DeepSpeed configs."""
import dataclasses
import json

import pytest

from memcalc.inputs.trainers import trainer_args
from memcalc.core.errors import MemcalcError, NotModelledError, UnknownNameError
from memcalc.inputs.training import TrainingConfig

transformers = pytest.importorskip("transformers")
NO_CLIP = {"max_grad_norm": 0.0}  # 0: no clipping (TrainingConfig.max_grad_norm None)


def _args(**fields):
    return transformers.TrainingArguments(output_dir="/tmp/memcalc-test-trainer", report_to="none",
                                          **{**NO_CLIP, **fields})


def test_every_trainingarguments_field_is_accounted_for():
    """A new transformers release adding a field turns this red."""
    known = set(trainer_args.READ) | set(trainer_args.REFUSED_UNLESS_DEFAULT) | set(trainer_args.INERT)
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    assert names - known == set()
    assert known - names == set()
    for group in (trainer_args.READ, trainer_args.REFUSED_UNLESS_DEFAULT):
        assert not set(group) & set(trainer_args.INERT)


def test_defaults_are_transformers_defaults():
    fields = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    for name, value in trainer_args.DEFAULTS.items():
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert default == value, name


def test_defaults_give_the_trainers_step():
    """Defaults (clipping off): micro-batch 8, fp32, fused AdamW, no checkpointing, no cache,
    labels and num_items_in_batch from the Trainer's call path."""
    by_hand = TrainingConfig(micro_batch=8, seq_len=512, precision="fp32", optimizer="adamw",
                             optimizer_impl="fused", weight_decay=0.0, checkpointing="none",
                             device="cuda", attention_mask="ones", labels="separate",
                             num_items_in_batch=True, hf_trainer=True)
    assert TrainingConfig.from_trainer_args(_args(), seq_len=512) == by_hand
    assert TrainingConfig.from_trainer_args(NO_CLIP, seq_len=512) == by_hand


def test_object_dict_and_json_agree(tmp_path):
    args = _args(bf16=True, gradient_checkpointing=True, gradient_accumulation_steps=4,
                 optim="adamw_torch", per_device_train_batch_size=2, weight_decay=0.1, use_cpu=True)
    path = tmp_path / "args.json"
    path.write_text(args.to_json_string())
    by_hand = TrainingConfig(micro_batch=2, seq_len=1024, grad_accum=4, precision="bf16-amp",
                             optimizer="adamw", optimizer_impl=None, weight_decay=0.1,
                             checkpointing="per-layer", device="cpu", attention_mask="ones",
                             labels="separate", num_items_in_batch=True, hf_trainer=True)
    for given in (args, args.to_dict(), str(path), json.loads(path.read_text())):
        assert TrainingConfig.from_trainer_args(given, seq_len=1024) == by_hand


def test_clipping_and_fine_tuning_optimizers():
    """transformers' default max_grad_norm=1.0 clips; 0 does not; the bitsandbytes and
    Adafactor names map onto memcalc's fine-tuning optimizers."""
    assert TrainingConfig.from_trainer_args({}, seq_len=64).max_grad_norm == 1.0
    assert TrainingConfig.from_trainer_args(NO_CLIP, seq_len=64).max_grad_norm is None
    for optim, name in (("adamw_bnb_8bit", "adamw-8bit"), ("adamw_8bit", "adamw-8bit"),
                        ("paged_adamw_8bit", "paged-adamw-8bit"), ("paged_adamw_32bit", "paged-adamw"),
                        ("adafactor", "adafactor")):
        t = TrainingConfig.from_trainer_args({"optim": optim}, seq_len=64)
        assert (t.optimizer, t.optimizer_impl) == (name, None)


def test_sgd_and_padding():
    t = TrainingConfig.from_trainer_args({**NO_CLIP, "optim": "sgd", "optim_args": "momentum=0.9",
                                          "fp16": True}, seq_len=64, device="cpu",
                                         attention_mask="padded", pad_tokens=3)
    assert (t.optimizer, t.precision, t.attention_mask, t.pad_tokens) == ("sgd-momentum", "fp16-amp", "padded", 3)


@pytest.mark.parametrize("stage, sharding", [(1, "zero1"), (2, "zero2"), (3, "zero3")])
def test_deepspeed_zero_stage(tmp_path, stage, sharding):
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                                "reduce_bucket_size": "auto"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    t = TrainingConfig.from_trainer_args({**NO_CLIP, "deepspeed": str(path)}, seq_len=128, world_size=4)
    assert (t.sharding, t.world_size) == (sharding, 4)


@pytest.mark.parametrize("fields, field", [
    ({"optim": "lion_32bit"}, "trainer_args.optim"),
    ({"optim": "adamw_bnb_8bit", "optim_args": "x=1"}, "trainer_args.optim_args"),
    ({"torch_compile": True}, "trainer_args.torch_compile"),
    ({"label_smoothing_factor": 0.1}, "trainer_args.label_smoothing_factor"),
    ({"per_device_batch_size": 4}, "trainer_args.per_device_batch_size"),
    ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}},
     "trainer_args.activation_checkpointing_kwargs"),
    ({"deepspeed": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}},
     "deepspeed.zero_optimization.offload_param"),
    ({"deepspeed": {"zero_optimization": {"stage": 2}}, "bf16": True}, "trainer_args.deepspeed"),
])
def test_refused_by_name(fields, field):
    with pytest.raises(MemcalcError) as err:
        TrainingConfig.from_trainer_args({**NO_CLIP, **fields}, seq_len=64)
    assert str(err.value).startswith(field + ":")
    assert isinstance(err.value, (NotModelledError, UnknownNameError)) or "fix:" in str(err.value)


def test_unreadable_json(tmp_path):
    path = tmp_path / "args.json"
    path.write_text("{not json")
    with pytest.raises(MemcalcError, match="^trainer_args: .*not valid JSON"):
        TrainingConfig.from_trainer_args(str(path), seq_len=64)


@pytest.mark.parametrize("preset", sorted(__import__("memcalc.inputs.presets", fromlist=["PRESETS"]).PRESETS))
def test_check_answers_a_default_trainingarguments_for_every_preset(preset, tmp_path, capsys):
    """`memcalc check --trainer-args` on the JSON a default TrainingArguments writes
    (to_json_string: every field, the Trainer's mask of ones, labels and num_items_in_batch, no
    kernel named) answers (exit 0 under a budget nothing exceeds) for every preset memcalc ships:
    no refusal (exit 2). The allocated basis keeps it cheap: the device basis replays the same
    estimate's sequence and refuses nothing of its own for a preset (memcalc.engine.reserved
    refuses only traced programs)."""
    from memcalc.cli import main

    path = tmp_path / "args.json"
    path.write_text(transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none").to_json_string())
    code = main(["check", "--model", preset, "--trainer-args", str(path), "--seq-len", "512",
                 "--budget", "1000000GB", "--basis", "allocated"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("fits: allocated peak "), out
