"""accelerate's config YAML and torchtitan's job TOML (issue 28, item 3), read from published files
(tests/data/accelerate/SOURCES.md, tests/data/torchtitan/SOURCES.md): every key read, inert with a
reason, or refused by name; `memcalc check --accelerate-config / --torchtitan-config`."""
import json
from pathlib import Path

import pytest

from memcalc import MemcalcError, ModelSpec, TrainingConfig, estimate
from memcalc.cli import main
from memcalc.inputs.gpus import GPUS
from memcalc.inputs.trainers import accelerate
from memcalc.inputs.trainers.accelerate import read_accelerate
from memcalc.inputs.trainers.torchtitan import read_torchtitan

ACCEL = Path(__file__).parent / "data" / "accelerate"
TITAN = Path(__file__).parent / "data" / "torchtitan"
NO_CLIP = {"max_grad_norm": 0.0}  # clipping is modelled on one process


@pytest.mark.parametrize("path, fields", [
    ("examples/config_yaml_templates/multi_gpu.yaml", {"world_size": 2, "precision": "bf16-amp"}),
    ("examples/config_yaml_templates/single_gpu.yaml", {"precision": "bf16-amp"}),
    ("tests/distributed/accelerate_configs/fsdp2.yaml", {"world_size": 2, "sharding": "zero3"}),
])
def test_accelerate_published_configs_read(path, fields):
    assert read_accelerate(ACCEL / path) == (fields, None)


@pytest.mark.parametrize("path, field", [
    ("examples/config_yaml_templates/fsdp.yaml", "accelerate.mixed_precision"),  # FSDP + bf16
    ("examples/slurm/fsdp_config.yaml", "accelerate.fsdp_config.fsdp_version"),  # FSDP1
    ("tests/test_configs/latest_fsdp.yaml", "accelerate.fsdp_config.fsdp_version"),
    ("examples/torch_native_parallelism/configs/tp_hsdp.yaml", "accelerate.parallelism_config"),
    ("examples/config_yaml_templates/deepspeed.yaml", "deepspeed.fp16.enabled"),  # its zero_stage1_config.json
])
def test_accelerate_published_configs_refused_by_name(path, field):
    with pytest.raises(MemcalcError) as err:
        read_accelerate(ACCEL / path)
    assert err.value.field == field and err.value.fix


def test_accelerate_every_cluster_config_field_is_accounted_for():
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    import dataclasses

    fields = {f.name for cls in (config_args.BaseConfig, config_args.ClusterConfig) for f in dataclasses.fields(cls)}
    known = set(accelerate.INERT) | set(accelerate.READ) | set(accelerate.REFUSED_UNLESS_EMPTY)
    assert fields - known == set()


def test_accelerate_unknown_and_inline_deepspeed():
    with pytest.raises(MemcalcError, match="accelerate.num_gpus"):
        read_accelerate({"distributed_type": "MULTI_GPU", "num_gpus": 2})
    fields, ds = read_accelerate({"distributed_type": "DEEPSPEED", "num_processes": 4,
                                  "deepspeed_config": {"zero_stage": 2, "zero3_init_flag": False}})
    assert fields == {"world_size": 4} and ds["zero_optimization"] == {"stage": 2}
    with pytest.raises(MemcalcError, match="deepspeed.gradient_clipping"):  # DeepSpeed's own clipping
        read_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2,
                                                                               "gradient_clipping": 1.0}})
    with pytest.raises(MemcalcError, match="offload_optimizer"):
        read_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3,
                                                                               "offload_optimizer_device": "cpu"}})


def test_torchtitan_published_config_read():
    fields = read_torchtitan(TITAN / "qwen3_qwen3_32b.toml")
    # [training] local_batch_size = 2, seq_len = 4096, max_norm = 1.0; [activation_checkpoint] mode = "full";
    # [optimizer] AdamW with job_config's defaults (implementation fused, weight_decay 0.1); one device:
    # autocast to mixed_precision_param (bfloat16 by default)
    assert fields == {"world_size": 1, "micro_batch": 2, "seq_len": 4096, "grad_accum": 1, "max_grad_norm": 1.0,
                      "precision": "bf16-amp", "optimizer": "adamw", "optimizer_impl": "fused",
                      "weight_decay": 0.1, "checkpointing": "per-layer", "labels": "separate"}


@pytest.mark.parametrize("name, field", [
    ("llama4_llama4_17bx128e.toml", "torchtitan.parallelism.pipeline_parallel_degree"),  # PP 4: not modelled yet
    ("llama3_llama3_70b.toml", "torchtitan.parallelism.tensor_parallel_degree"),
    ("llama3_llama3_8b.toml", "torchtitan.activation_checkpoint.mode"),  # selective 'op'
    ("llama3_debug_model.toml", "torchtitan.activation_checkpoint.mode"),  # selective '2'
    ("qwen3_qwen3_0.6b.toml", "torchtitan.activation_checkpoint.mode"),
])
def test_torchtitan_published_configs_refused_by_name(name, field):
    with pytest.raises(MemcalcError) as err:
        read_torchtitan(TITAN / name)
    assert err.value.field == field


def test_torchtitan_fsdp_and_accumulation():
    with pytest.raises(MemcalcError, match="data_parallel_shard_degree"):
        read_torchtitan(TITAN / "qwen3_qwen3_32b.toml", world_size=8)  # dp_shard -1 -> 8: torchtitan's FSDP
    ddp = read_torchtitan({"training": {"local_batch_size": 2, "global_batch_size": 32},
                           "parallelism": {"data_parallel_replicate_degree": 4, "data_parallel_shard_degree": 1},
                           "activation_checkpoint": {"mode": "none"}}, world_size=4)
    assert (ddp["world_size"], ddp["grad_accum"]) == (4, 4)
    with pytest.raises(MemcalcError, match="torchtitan.training.flavour"):
        read_torchtitan({"training": {"flavour": 1}})


def _check(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_cli_torchtitan(capsys):
    code, out, _ = _check(capsys, ["check", "--torchtitan-config", str(TITAN / "qwen3_qwen3_32b.toml"),
                                   "--model", "qwen3-0.6b", "--gpu", "H100-80GB", "--json", "--basis", "allocated"])
    by_hand = TrainingConfig(micro_batch=2, seq_len=4096, precision="bf16-amp", optimizer_impl="fused",
                             weight_decay=0.1, checkpointing="per-layer", max_grad_norm=1.0, labels="separate")
    assert code == 0 and json.loads(out)["peak_bytes"] == estimate(ModelSpec.preset("qwen3-0.6b"), by_hand).peak_bytes
    code, _, err = _check(capsys, ["check", "--torchtitan-config", str(TITAN / "llama4_llama4_17bx128e.toml"),
                                   "--model", "llama-3-8b", "--gpu", "H100-80GB"])
    assert code == 2 and err.startswith("memcalc: error: torchtitan.parallelism.pipeline_parallel_degree: 4")


def test_cli_accelerate(tmp_path, capsys):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({**NO_CLIP, "per_device_train_batch_size": 2}))
    code, out, _ = _check(capsys, ["check", "--accelerate-config", str(ACCEL / "tests/distributed/accelerate_configs"
                                                                        "/fsdp2.yaml"), "--trainer-args", str(args),
                                   "--model", "qwen2-0.5b", "--seq-len", "1024", "--gpu", "A100-40GB", "--json",
                                   "--basis", "allocated"])
    by_hand = TrainingConfig.from_trainer_args({**NO_CLIP, "per_device_train_batch_size": 2}, seq_len=1024,
                                               world_size=2).with_(sharding="zero3")
    peak = estimate(ModelSpec.preset("qwen2-0.5b"), by_hand).peak_bytes
    assert code == 0 and json.loads(out)["peak_bytes"] == peak <= GPUS["A100-40GB"].usable_bytes
    code, _, err = _check(capsys, ["check", "--accelerate-config", str(ACCEL / "examples/slurm/fsdp_config.yaml"),
                                   "--model", "gpt2", "--seq-len", "128", "--gpu", "A100-40GB"])
    assert code == 2 and "accelerate.fsdp_config.fsdp_version" in err


def test_torchtitan_every_job_config_field_is_accounted_for():
    """JobConfig's sections and fields (tests/data/torchtitan/job_config_fields.json, read from torchtitan's
    job_config.py) are each read, inert (a whole section, with why) or refused by name."""
    from memcalc.inputs.trainers.torchtitan import INERT_SECTIONS, KEYS

    sections = json.loads((TITAN / "job_config_fields.json").read_text())["sections"]
    assert set(sections) <= set(INERT_SECTIONS) | set(KEYS)
    for section, fields in sections.items():
        if section in KEYS:
            assert set(fields) <= set(KEYS[section]), section
