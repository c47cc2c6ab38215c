"""ModelSpec / TrainingConfig / HF config reading: validation errors name the field and the fix."""
import json

import pytest

from memcalc import ModelSpec, TrainingConfig
from memcalc.core.errors import MemcalcError, SpecError, UnknownNameError


@pytest.mark.slow  # builds each transformers model
def test_hf_config_of_each_family_matches_the_transformers_parameter_count(tmp_path):
    transformers = pytest.importorskip("transformers")
    configs = [
        transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64),
        transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128, vocab_size=100),
        transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128, vocab_size=100),
        transformers.MistralConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, vocab_size=100,
                                   sliding_window=None),
    ]
    for cfg in configs:
        path = tmp_path / f"{cfg.model_type}.json"
        path.write_text(cfg.to_json_string())
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        assert ModelSpec.from_hf_config(path).param_count == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("config,field", [
    ({"model_type": "bert"}, "hf_config.model_type"),
    ({"n_layer": 2}, "hf_config.model_type"),
    ({"model_type": "llama", "hidden_size": 64}, "hf_config.vocab_size"),
])
def test_bad_hf_config_names_the_field(config, field):
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config(config)
    assert err.value.field == field and err.value.fix


def test_config_file_that_is_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        ModelSpec.from_hf_config(path)


@pytest.mark.parametrize("fields,field", [
    (dict(hidden_size=0), "hidden_size"),
    (dict(num_heads=5), "num_heads"),  # cross-field checks name the field they mention
    (dict(num_kv_heads=3), "num_kv_heads"),
])
def test_bad_model_fields(fields, field):
    base = dict(family="llama", vocab_size=10, hidden_size=64, num_layers=1, num_heads=4,
                intermediate_size=128)
    with pytest.raises(SpecError) as err:
        ModelSpec.make(**{**base, **fields})
    assert err.value.field == field


def test_unknown_preset_suggests_names():
    with pytest.raises(UnknownNameError, match="llama-2-7b"):
        ModelSpec.preset("llama-2-7")


@pytest.mark.parametrize("fields", [dict(micro_batch=0), dict(precision="fp8"),
                                    dict(checkpointing="every-k"), dict(world_size=3, tensor_parallel=2)])
def test_bad_training_fields(fields):
    with pytest.raises(MemcalcError):
        TrainingConfig.make(**{"micro_batch": 1, "seq_len": 8, **fields})


def test_specs_are_frozen_and_strict():
    spec = ModelSpec.preset("gpt2")
    with pytest.raises(Exception):
        spec.hidden_size = 1
    with pytest.raises(SpecError):
        ModelSpec.make(**{**spec.model_dump(), "unknown_field": 1})
    assert json.loads(spec.model_dump_json())["hidden_size"] == 768
