"""Qwen3, Gemma, Gemma-2, Gemma-3 and sliding windows: presets against transformers' own parameter
count, the sliding-window rules against what masking_utils does, invariants of the programs."""
import pytest

from memcalc import ModelSpec, TrainingConfig
from memcalc.engine.run import window_reached
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.queries.estimate import estimate
from tests.configs import meta_num_parameters

# model cards: Qwen3-0.6B "0.6B", Qwen3-8B "8.2B", gemma-2b "2.5B", gemma-7b "8.5B", gemma-2-2b
# "2.6B", gemma-2-9b "9.2B", gemma-3-1b "1B", gemma-3-4b "4B" (text part: without the vision
# tower); the exact figures are transformers' num_parameters() on the config (below)
NEW_PRESETS = {"qwen3-0.6b": 596_049_920, "qwen3-8b": 8_190_735_360, "gemma-2b": 2_506_172_416,
               "gemma-7b": 8_537_680_896, "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984,
               "gemma-3-1b": 999_885_952, "gemma-3-4b": 3_880_263_168}


@pytest.mark.parametrize("name", sorted(NEW_PRESETS))
def test_presets_match_transformers_num_parameters_on_a_meta_model(name):
    pytest.importorskip("torch")
    from validate.models.hf import hf_config_dict

    spec = ModelSpec.preset(name)
    assert spec.param_count == meta_num_parameters(hf_config_dict(spec)) == NEW_PRESETS[name]


def _tc(**fields):
    return TrainingConfig(**{"micro_batch": 2, "seq_len": 64, "device": "cpu", **fields})


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_window_longer_than_the_sequence_costs_nothing(attention):
    """masking_utils skips the sliding mask for SDPA while seq_len < window, and builds the same
    (b, 1, s, s) mask for eager either way: Mistral's rule then predicts full attention's peak."""
    llama = ModelSpec.preset("mistral-7b").with_(num_layers=2, hidden_size=256, num_heads=4,
                                                  num_kv_heads=2, intermediate_size=512, vocab_size=1000)
    def backward_peak(spec):
        return estimate(spec, _tc(attention=attention)).phases["backward"]

    full = backward_peak(llama)
    assert backward_peak(llama.with_(sliding_window=65)) == full
    reached = backward_peak(llama.with_(sliding_window=64))  # a window equal to s is materialised
    assert (reached > full) if attention == "sdpa" else (reached == full)


def test_window_reached_is_seq_len_at_least_the_window():
    spec = ModelSpec.preset("gemma-3-1b")
    assert [window_reached(spec, s) for s in (511, 512, 513)] == [False, True, True]


def test_the_grid_splits_at_the_window():
    np = pytest.importorskip("numpy")
    from memcalc.queries.grid import estimate_grid

    spec = ModelSpec.preset("qwen3-0.6b").with_(num_layers=2, sliding_window=48, max_window_layers=1)
    seq = np.array([16, 47, 48, 96])
    grid = estimate_grid(spec, _tc(attention="sdpa"), seq_len=seq)
    assert grid.tolist() == [estimate(spec, _tc(attention="sdpa", seq_len=int(s))).peak_bytes for s in seq]


@pytest.mark.parametrize("fields,field", [
    (dict(family="gemma2", qk_norm=True), "qk_norm"),
    (dict(family="gemma", sliding_window=16), "sliding_window"),
    (dict(family="llama", attn_softcap=True), "attn_softcap"),
    (dict(family="llama", max_window_layers=2), "max_window_layers"),
    (dict(family="gemma", implementation="reference"), "gemma"),
    (dict(family="gemma", activation="silu"), "gelu_tanh"),
])
def test_fields_a_family_lacks_are_refused(fields, field):
    base = dict(vocab_size=100, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                activation="silu")
    if fields["family"].startswith("gemma"):
        base.update(activation="gelu_tanh")
    if fields["family"] == "gemma2":
        base.update(sliding_window=16, sliding_window_pattern=2)
    with pytest.raises(MemcalcError, match=field):
        ModelSpec.make(**{**base, **fields})


def test_gemma2_sdpa_and_tensor_parallel_on_new_families_are_refused():
    with pytest.raises(NotModelledError, match="attention"):
        estimate(ModelSpec.preset("gemma-2-2b"), _tc(attention="sdpa"))
    with pytest.raises(NotModelledError, match="tensor_parallel: OLMo-2's self_attn.q_norm"):
        estimate(ModelSpec.preset("olmo-2-7b"), _tc(world_size=2, tensor_parallel=2))
    estimate(ModelSpec.preset("qwen3-8b"), _tc(world_size=2, tensor_parallel=2))  # per-head q/k norms: planned


@pytest.mark.parametrize("name", ["qwen3-8b", "gemma-2-9b", "gemma-3-4b"])
def test_estimate_from_the_cli_on_a_published_config(name, tmp_path, capsys):
    import json

    from memcalc.cli import main
    from validate.models.hf import hf_config_dict

    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf_config_dict(ModelSpec.preset(name))))
    main(["estimate", "--hf-config", str(path), "--micro-batch", "1", "--seq-len", "4096",
          "--attention", "eager", "--precision", "bf16-amp"])
    assert "GiB" in capsys.readouterr().out


def test_config_defaults_and_inconsistent_sizes():
    qwen3 = {"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128}
    assert ModelSpec.from_hf_config(qwen3).head_size == 128  # Qwen3Config's head_dim default
    gemma2 = {"model_type": "gemma2", "vocab_size": 100, "hidden_size": 66, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128}
    with pytest.raises(MemcalcError, match="hf_config.num_attention_heads"):
        ModelSpec.from_hf_config(gemma2)
    with pytest.raises(MemcalcError, match="text_config"):
        ModelSpec.from_hf_config({"model_type": "gemma3", "text_config": {}})
