"""Regression tests of the robustness sweep: each input below once escaped as a raw exception, a
hang, or a silent wrong reading (a string "false" read as true); now each is one line naming the
field, exit 2 from the CLI, a MemcalcError from the API. The table-driven sweep that found them
probes every subcommand, flag and config reader the same way (fields x wrong-typed JSON values).
"""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import memcalc
from memcalc import LoRA, ModelSpec, TrainingConfig
from memcalc.inputs import lora
from memcalc.inputs.hf import keys as hf_keys
from memcalc.families.registry import hf_type
from memcalc.inputs.trainers import axolotl, deepspeed, trainer_args
from memcalc.core.errors import MemcalcError
from tests.fuzz_strategies import JSON_TREES, outcome, run_cli

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32,
         "max_position_embeddings": 128}
QWEN2_MOE = {**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 8, "shared_expert_intermediate_size": 16}
GEMMA2 = {**LLAMA, "model_type": "gemma2", "head_dim": 8, "sliding_window": 16, "query_pre_attn_scalar": 8}
MISTRAL = {**LLAMA, "model_type": "mistral", "sliding_window": 16}
GPT_OSS = {**LLAMA, "model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2,
           "head_dim": 8, "sliding_window": 16}
CHECK = ["check", "--model", "gpt2", "--num-layers", "1", "--seq-len", "16", "--gpu", "H100-80GB"]


def _refused(argv: list[str], field: str) -> str:
    code, _, stderr = run_cli(argv, seconds=5)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, (argv, code, stderr)
    assert lines[0].startswith(f"memcalc: error: {field}:"), lines[0]
    return lines[0]


# ---- HF config.json: values a reader computed with before ModelSpec validated them ------------
@pytest.mark.parametrize("config,field", [
    ({**QWEN2_MOE, "num_hidden_layers": "2"}, "hf_config.num_hidden_layers"),  # was TypeError (range)
    ({**QWEN2_MOE, "num_hidden_layers": 2.0}, "hf_config.num_hidden_layers"),
    ({**QWEN2_MOE, "num_hidden_layers": 10 ** 9}, "hf_config.num_hidden_layers"),  # was a hang
    ({**GEMMA2, "hidden_size": [16]}, "hf_config.hidden_size"),  # was TypeError (%)
    ({**GEMMA2, "num_attention_heads": 0}, "hf_config.num_attention_heads"),  # was ZeroDivisionError
    ({**GEMMA2, "num_attention_heads": "2"}, "hf_config.num_attention_heads"),
    ({**GEMMA2, "layer_types": 5}, "hf_config.layer_types"),  # was TypeError (list(5))
    ({**GPT_OSS, "layer_types": True}, "hf_config.layer_types"),
    ({**LLAMA, "num_hidden_layers": 10 ** 9, "layer_types": ["full_attention"]},
     "hf_config.layer_types"),  # was a hang: 10**9 expected names built before comparing
    ({**MISTRAL, "num_hidden_layers": 10 ** 9, "layer_types": []}, "hf_config.layer_types"),
    ({**LLAMA, "model_type": "smollm3", "num_hidden_layers": 10 ** 9}, "hf_config.num_hidden_layers"),  # hang
    ({**LLAMA, "model_type": "smollm3", "no_rope_layer_interval": 0},
     "hf_config.no_rope_layer_interval"),  # was ZeroDivisionError
    ({**LLAMA, "model_type": "smollm3", "no_rope_layer_interval": "4"}, "hf_config.no_rope_layer_interval"),
    ({"model_type": "gpt_neox", "hidden_act": ["gelu"]}, "hf_config.hidden_act"),  # was unhashable
])
def test_hf_config_values_are_refused_by_key(tmp_path, config, field):
    kind, err = outcome(lambda: ModelSpec.from_hf_config(config), seconds=2)
    assert kind == "error" and err.field == field, err
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    _refused(["estimate", "--hf-config", str(path), "--seq-len", "16"], field)


def test_layer_types_that_match_are_still_read():
    types = ["sliding_attention", "full_attention"]
    assert ModelSpec.from_hf_config({**GEMMA2, "layer_types": types}).sliding_window == 16


# ---- TrainingArguments JSON -------------------------------------------------------------------
@pytest.mark.parametrize("fields,field", [
    ({"weight_decay": "x"}, "trainer_args.weight_decay"),  # was ValueError (float('x'))
    ({"weight_decay": [1]}, "trainer_args.weight_decay"),  # was TypeError
    ({"max_grad_norm": "false"}, "trainer_args.max_grad_norm"),
    ({"max_grad_norm": {"a": 1}}, "trainer_args.max_grad_norm"),
    ({"optim": "sgd", "optim_args": "momentum=abc"}, "trainer_args.optim_args"),
    ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": [1, 2]},
     "trainer_args.gradient_checkpointing_kwargs"),  # was TypeError (dict([1, 2]))
    ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": True},
     "trainer_args.gradient_checkpointing_kwargs"),
    # read as true before (bool("false")): bf16 on, the step on the CPU
    ({"bf16": "false"}, "trainer_args.bf16"), ({"use_cpu": "false"}, "trainer_args.use_cpu"),
    ({"gradient_checkpointing": "no"}, "trainer_args.gradient_checkpointing"),
    ({"use_cache": 1}, "trainer_args.use_cache"),
    ({"accelerator_config": '{"split_batches": true}'}, "trainer_args.accelerator_config"),
    ({"per_device_train_batch_size": "8"}, "trainer_args.per_device_train_batch_size"),  # was 'micro_batch'
    ({"gradient_accumulation_steps": 0}, "trainer_args.gradient_accumulation_steps"),
])
def test_trainer_args_values_are_refused_by_name(tmp_path, fields, field):
    kind, err = outcome(lambda: TrainingConfig.from_trainer_args(fields, seq_len=16))
    assert kind == "error" and err.field == field, err
    path = tmp_path / "args.json"
    path.write_text(json.dumps(fields))
    _refused([*CHECK, "--trainer-args", str(path)], field)


def test_trainer_args_null_and_json_booleans_keep_their_meaning():
    t = TrainingConfig.from_trainer_args({"bf16": True, "use_cpu": None, "max_grad_norm": None,
                                          "weight_decay": None}, seq_len=16)
    assert (t.precision, t.device, t.max_grad_norm, t.weight_decay) == ("bf16-amp", "cuda", None, 0.0)
    assert TrainingConfig.from_trainer_args({}, seq_len=16).max_grad_norm == 1.0


# ---- DeepSpeed JSON ---------------------------------------------------------------------------
@pytest.mark.parametrize("ds,field", [
    ({"zero_optimization": {"stage": [1]}}, "deepspeed.zero_optimization.stage"),  # was TypeError
    ({"zero_optimization": {"stage": True}}, "deepspeed.zero_optimization.stage"),  # was ZeRO-1
    ({"zero_optimization": 3}, "deepspeed.zero_optimization"),  # was TypeError (iterating 3)
    ({"zero_optimization": [["stage", 1]]}, "deepspeed.zero_optimization"),
    ({"zero_optimization": {"offload_optimizer": "cpu"}}, "deepspeed.zero_optimization.offload_optimizer"),
    ({"optimizer": "AdamW"}, "deepspeed.optimizer"),  # was AttributeError
    ({"bf16": True}, "deepspeed.bf16"),  # a non-object block was ignored
])
def test_deepspeed_blocks_are_refused_by_name(tmp_path, ds, field):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    _refused([*CHECK, "--deepspeed", str(path)], field)
    args = tmp_path / "args.json"  # the same block inside TrainingArguments.deepspeed
    args.write_text(json.dumps({"deepspeed": ds}))
    _refused([*CHECK, "--trainer-args", str(args)], field)


# ---- axolotl YAML -----------------------------------------------------------------------------
@pytest.mark.parametrize("text,field", [
    ("datasets: " + "[" * 5000 + "]" * 5000 + "\nsequence_len: 16\n", "axolotl"),  # was RecursionError
    ("sequence_len: abc\n", "axolotl.sequence_len"),  # was ignored under --seq-len
    ("sequence_len: 16\nmicro_batch_size: [1]\n", "axolotl.micro_batch_size"),
    ("sequence_len: 16\nbf16: maybe\n", "axolotl.bf16"),
    ("sequence_len: 16\npad_to_sequence_len: 'no'\n", "axolotl.pad_to_sequence_len"),
    ("sequence_len: 16\nweight_decay: abc\n", "trainer_args.weight_decay"),  # was ValueError
])
def test_axolotl_values_are_refused_by_name(tmp_path, text, field):
    pytest.importorskip("yaml")
    path = tmp_path / "a.yml"
    path.write_text(text)
    _refused(["check", "--model", "gpt2", "--num-layers", "1", "--gpu", "H100-80GB", "--axolotl", str(path),
              "--seq-len", "8"], field)


def test_yaml_tags_are_not_executed(tmp_path):
    """The real entry point, as a subprocess: safe_load refuses the tag; nothing runs."""
    pytest.importorskip("yaml")
    marker = tmp_path / "PWNED"
    path = tmp_path / "a.yml"
    path.write_text(f"micro_batch_size: !!python/object/apply:os.system ['touch {marker}']\n")
    run = subprocess.run([sys.executable, "-m", "memcalc.cli", "check", "--model", "gpt2", "--gpu", "H100-80GB",
                          "--axolotl", str(path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.returncode == 2 and not marker.exists()
    assert run.stderr.startswith("memcalc: error: axolotl:") and len(run.stderr.splitlines()) == 1


# ---- peft adapter_config.json and LoRA --------------------------------------------------------
@pytest.mark.parametrize("config,field", [
    ({"r": True}, "lora.rank"),  # was LoRA rank 1 (lax pydantic)
    ({"r": "16"}, "lora.rank"), ({"r": 4, "lora_alpha": "8"}, "lora.alpha"),
    ({"r": 4, "use_rslora": "false"}, "adapter_config.use_rslora"),  # was bool("false")
    ({"r": 4, "layers_to_transform": [True]}, "lora.layers"),
    ({"r": 10 ** 30}, "lora.rank"),  # was a 3e27 GiB answer
    ({"r": 4, "layers_to_transform": []}, "lora.layers"),  # was ValueError (max of nothing)
    ({"r": 4, "target_modules": [[]]}, "lora.targets"),  # was TypeError (a set of lists)
])
def test_adapter_config_values_are_refused_by_name(tmp_path, config, field):
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({"target_modules": ["q_proj"], **config}))
    _refused(["estimate", "--model", "llama-2-7b", "--num-layers", "1", "--seq-len", "16",
              "--lora-config", str(path)], field)


@pytest.mark.parametrize("source", [0, 1.5, ["a"], "/dev/zero", "a\0b", ""])
def test_adapter_config_source_is_read_bounded(source):
    """A path of another type was a raw TypeError; /dev/zero was read without end."""
    kind, err = outcome(lambda: LoRA.from_peft_config(source), seconds=2)
    assert kind == "error" and err.field == "adapter_config", err


def test_fifo_adapter_config_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "adapter_config.json")
    kind, err = outcome(lambda: LoRA.from_peft_config(tmp_path), seconds=2)
    assert kind == "error" and err.field == "adapter_config"


# ---- the Python API ---------------------------------------------------------------------------
SMALL = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                       max_position_embeddings=128)


class _SelfDict:
    def to_dict(self):  # not a TrainingArguments: its to_dict() is no dict
        return self


@pytest.mark.parametrize("call,field", [
    (lambda: TrainingConfig.from_trainer_args({0: 1}, seq_len=16), "trainer_args.0"),  # was TypeError
    (lambda: memcalc.estimate(SMALL, TrainingConfig(micro_batch=1, seq_len=8)).formula([]), "category"),
    (lambda: memcalc.estimate(SMALL, TrainingConfig(micro_batch=1, seq_len=8)).formula("x"), "category"),
    (lambda: axolotl.axolotl_fields(5), "axolotl"),
    (lambda: deepspeed.read_deepspeed({5: 1}), "deepspeed.5"),
    (lambda: deepspeed.read_deepspeed("a\0b"), "deepspeed"),
    (lambda: SMALL.with_(**{"": 1}), "''"),  # was an error line starting ': '
    (lambda: TrainingConfig(micro_batch=1, seq_len=4, attention_mask="padded", pad_tokens=5), "pad_tokens"),
    (lambda: TrainingConfig(micro_batch=1, seq_len=8, lora={"rank": 4, "targets": []}), "lora.targets"),
    (lambda: TrainingConfig.from_trainer_args(_SelfDict(), seq_len=8), "trainer_args"),  # was RecursionError
])
def test_api_raises_our_error_naming_the_field(call, field):
    kind, err = outcome(call)
    assert kind == "error" and err.field == field, err


def test_nested_errors_name_the_field_once():
    moe = ModelSpec.preset("mixtral-8x7b")
    with pytest.raises(MemcalcError) as info:
        ModelSpec.make(**{**moe.model_dump(), "moe": {**moe.moe.model_dump(), "top_k": 99}})
    assert str(info.value).startswith("moe: top_k=99 exceeds")  # was 'moe: moe: top_k=99 ...'


def test_formula_of_a_known_category_still_works():
    r = memcalc.estimate(SMALL, TrainingConfig(micro_batch=1, seq_len=8))
    assert {str(x) for x in r.formula("activations").free_symbols} <= {"b", "s", "L"}


@pytest.mark.parametrize("flag,value", [("--moe-routing", "balanced"), ("--experts-implementation", "eager")])
def test_moe_flags_on_a_dense_model_are_refused(flag, value):
    field = flag[2:].replace("-", "_")
    _refused(["estimate", "--model", "gpt2", "--num-layers", "1", "--seq-len", "16", flag, value], field)
    code, _, _ = run_cli(["estimate", "--model", "mixtral-8x7b", "--num-layers", "1", "--seq-len", "16",
                          flag, value, "--experts-implementation", "eager"])
    assert code == 0


def test_pad_tokens_beyond_the_sequence_are_refused():
    _refused(["estimate", "--model", "gpt2", "--num-layers", "1", "--seq-len", "16", "--attention-mask", "padded",
              "--pad-tokens", "99"], "pad_tokens")


@pytest.mark.parametrize("ds,ok", [
    ({"train_micro_batch_size_per_gpu": 4}, False), ({"train_micro_batch_size_per_gpu": 8}, True),
    ({"gradient_accumulation_steps": 2}, False), ({"train_batch_size": 16}, True),
    ({"train_batch_size": 10 ** 30}, False), ({"train_micro_batch_size_per_gpu": "auto"}, True),
    ({"train_micro_batch_size_per_gpu": True}, False)])
def test_deepspeed_batch_must_match_the_trainers(ds, ok):
    """transformers' trainer_config_process refuses a DeepSpeed batch that is neither "auto" nor
    the Trainer's (it was read as inert: a prediction for a run that never starts)."""
    args = {"per_device_train_batch_size": 8, "deepspeed": {**ds, "zero_optimization": {"stage": 2}}}
    kind, err = outcome(lambda: TrainingConfig.from_trainer_args(args, seq_len=16, world_size=2))
    assert (kind == "ok") == ok, err
    if not ok:
        assert err.field == f"deepspeed.{next(iter(ds))}"


def test_tables_names_an_unknown_preset_under_presets(tmp_path):
    _refused(["tables", "--check", "--out", str(tmp_path), "--presets", "gpt2", "bogus", "--no-plots"], "presets")


# ---- property: every key each reader knows, with any JSON value --------------------------------
SMALL_VALUES = st.one_of(JSON_TREES, st.sampled_from([0, 1, 2, -1, True, False, None, "auto", "true", 0.5,
                                                      10 ** 30, float("nan"), [], {}]))


def _keyed(keys: list[str]):
    return st.dictionaries(st.sampled_from(sorted(keys)), SMALL_VALUES, max_size=4)


TRAINER_KEYS = [*trainer_args.READ, *trainer_args.REFUSED_UNLESS_DEFAULT, *list(trainer_args.INERT)[:10]]
DS_KEYS = [*deepspeed.INERT, "zero_optimization", "bf16", "fp16", "optimizer", "gradient_clipping",
           "activation_checkpointing", "amp"]
AXOLOTL_KEYS = [*axolotl.TO_TRAINER, *axolotl.READ_HERE, *axolotl.REFUSED, *list(axolotl.INERT)[:10]]
ADAPTER_KEYS = [*lora._MODELLED_KEYS, *lora._INERT_WHY, *list(lora._REFUSED_UNLESS_EMPTY)[:6], "peft_type"]


@given(_keyed(TRAINER_KEYS), st.one_of(st.none(), _keyed(DS_KEYS),
                                       _keyed(list(deepspeed.ZERO_INERT)).map(lambda z: {"zero_optimization": z})))
def test_trainer_args_and_deepspeed_values(fields, ds):
    if ds is not None:
        fields = {**fields, "deepspeed": ds}
    outcome(lambda: TrainingConfig.from_trainer_args(fields, seq_len=16))


@given(_keyed(AXOLOTL_KEYS))
def test_axolotl_values(cfg):
    outcome(lambda: axolotl.axolotl_fields(cfg))


@given(_keyed(ADAPTER_KEYS))
def test_adapter_config_values(cfg):
    kind, adapters = outcome(lambda: LoRA.from_peft_config({"target_modules": ["q_proj"], **cfg}))
    if kind == "ok":
        outcome(lambda: memcalc.estimate(ModelSpec.preset("llama-2-7b").with_(num_layers=1),
                                         TrainingConfig(micro_batch=1, seq_len=8, lora=adapters)))


HF_BASES = {"llama": LLAMA, "qwen2_moe": QWEN2_MOE, "gemma2": GEMMA2, "mistral": MISTRAL, "gpt_oss": GPT_OSS,
            "smollm3": {**LLAMA, "model_type": "smollm3"}, "phi3": {**LLAMA, "model_type": "phi3"}}


@given(st.sampled_from(sorted(HF_BASES)), st.data())
def test_hf_config_values(name, data):
    base = HF_BASES[name]
    keys = sorted((hf_type(base["model_type"])[1].modelled - {"model_type"})
                  | set(hf_keys.REFUSED_UNLESS))
    cfg = {**base, **data.draw(_keyed(keys))}
    outcome(lambda: ModelSpec.from_hf_config(cfg), seconds=3)


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in --json output")
    return json.loads(text, parse_constant=refuse)


def test_plan_utilisation_that_overflows_the_step_time_is_refused():
    base = ["plan", "--model", "gpt2", "--num-layers", "1", "--gpu", "H100-80GB", "--global-batch", "1",
            "--seq-len", "8", "--json", "--top", "1"]
    _refused([*base, "--utilisation", "1e-320"], "utilisation")  # was "step_seconds": Infinity
    code, out, _ = run_cli([*base, "--utilisation", "1e-6"])
    assert code == 0 and _strict_json(out)["plans"][0]["step_seconds"] > 0
