"""`memcalc check` / memcalc.check: verdicts, exit codes, and suggested changes that fit when applied."""
import json

import pytest

import memcalc
from memcalc.allocator.outside import outside_bytes
from memcalc.engine.reserved import reserved_for
from memcalc.cli import main
from memcalc.inputs.gpus import GPUS
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

NO_CLIP = {"max_grad_norm": 0.0}  # DeepSpeed/DDP runs: clipping is modelled on one process


def _write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def _run(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_fits_and_does_not_fit(tmp_path, capsys):
    small = _write(tmp_path, "small.json", {**NO_CLIP, "per_device_train_batch_size": 1})
    big = _write(tmp_path, "big.json", {**NO_CLIP, "per_device_train_batch_size": 32, "bf16": True})
    code, out, _ = _run(capsys, ["check", "--trainer-args", small, "--model", "gpt2",
                                 "--seq-len", "1024", "--gpu", "RTX-4090"])
    assert code == 0 and out.startswith("fits: device peak ")
    code, out, _ = _run(capsys, ["check", "--trainer-args", big, "--model", "gpt2",
                                 "--seq-len", "1024", "--gpu", "RTX-4090"])
    assert code == 1 and out.startswith("does not fit: device peak ") and "fits with " in out


@pytest.mark.parametrize("basis", ["device", "allocated"])
def test_every_suggested_change_fits_when_applied(tmp_path, capsys, basis):
    """Apply each suggestion to the user's TrainingArguments and check it again: on the device basis
    (the default) against the report's device bytes and the GPU's whole memory, on the allocated basis
    against peak_bytes and the usable memory."""
    fields = {**NO_CLIP, "per_device_train_batch_size": 32, "bf16": True}
    path = _write(tmp_path, "args.json", fields)
    code, out, _ = _run(capsys, ["check", "--trainer-args", path, "--model", "gpt2", "--seq-len",
                                 "1024", "--gpu", "RTX-4090", "--json", "--basis", basis])
    report = json.loads(out)
    assert code == 1 and report["changes"]
    budget = GPUS["RTX-4090"].total_bytes if basis == "device" else GPUS["RTX-4090"].usable_bytes
    for change in report["changes"]:
        t = TrainingConfig.from_trainer_args(fields, seq_len=1024).with_(**change["training"])
        r = memcalc.estimate(ModelSpec.preset("gpt2"), t)
        if basis == "allocated":
            assert r.peak_bytes == change["peak_bytes"] <= budget
            continue
        # device: the step replayed under the card's limit (less the CUDA context) never runs out;
        # near the limit the allocator frees its cached blocks and retries, so the unlimited
        # device_bytes may lie above the budget while the step still fits (memcalc.queries.basis)
        limit = budget - outside_bytes("cuda", "RTX-4090")
        replay = reserved_for(ModelSpec.preset("gpt2"), t, device_limit=limit)
        assert replay.oom is None and r.peak_bytes <= limit
        expected = r.device_bytes if r.device_bytes <= budget else \
            max(replay.peak_reserved_bytes, r.peak_bytes) + budget - limit
        assert expected == change["peak_bytes"] <= budget


def test_python_entry():
    v = memcalc.check(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=512), "RTX-4090")
    assert v.fits and v.headroom_bytes == v.budget_bytes - v.peak_bytes > 0


@pytest.mark.parametrize("args, field", [
    ({"optim": "no_such_optim"}, "trainer_args.optim"),
    ({"deepspeed": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}},
     "deepspeed.zero_optimization.offload_optimizer"),
    ("{broken", "trainer_args"),
])
def test_bad_input_exits_2_naming_the_field(tmp_path, capsys, args, field):
    path = _write(tmp_path, "args.json", args if isinstance(args, str) else {**NO_CLIP, **args})
    code, _, err = _run(capsys, ["check", "--trainer-args", path, "--model", "gpt2",
                                 "--seq-len", "128", "--gpu", "RTX-4090"])
    assert code == 2 and err.startswith(f"memcalc: error: {field}: ") and "fix:" in err


def test_deepspeed_flag(tmp_path, capsys):
    ds = _write(tmp_path, "ds.json", {"zero_optimization": {"stage": 3}, "gradient_clipping": "auto"})
    args = _write(tmp_path, "args.json", NO_CLIP)
    code, out, _ = _run(capsys, ["check", "--trainer-args", args, "--deepspeed", ds, "--model",
                                 "gpt2", "--seq-len", "128", "--gpu", "H100-80GB",
                                 "--world-size", "4", "--json"])
    assert code == 0 and json.loads(out)["fits"]
