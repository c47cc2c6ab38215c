"""Every program of the registry against the torch module it models: the same parameters, with
the same names, sizes and order as `model.named_parameters()` (the order a for-loop optimizer
visits and ZeRO-1 partitions), built by the validator from the same spec."""
import pytest

from memcalc.engine import build_graph
from memcalc.programs import PROGRAMS, program_for
from memcalc.regime import Regime
from memcalc.specs import ModelSpec
from memcalc.training import TrainingConfig

SPECS = {
    ("hf", "gpt2"): dict(family="gpt2", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                         max_position_embeddings=64),
    ("hf", "llama"): dict(family="llama", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                          num_kv_heads=2, intermediate_size=48, max_position_embeddings=64,
                          tie_embeddings=False, qkv_bias=True, out_bias=False, mlp_bias=False,
                          activation="silu"),
    ("reference", "gpt2"): dict(family="gpt2", vocab_size=97, hidden_size=32, num_layers=2,
                                num_heads=4, max_position_embeddings=64, activation="gelu_tanh"),
    ("reference", "llama"): dict(family="llama", vocab_size=97, hidden_size=32, num_layers=2,
                                 num_heads=4, num_kv_heads=1, intermediate_size=48,
                                 max_position_embeddings=64, tie_embeddings=True, qkv_bias=False,
                                 out_bias=False, mlp_bias=False, activation="silu"),
}
_LLAMA_LIKE = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                   max_position_embeddings=64, activation="silu", mlp_bias=False)
SPECS.update({  # issue 12, part b
    ("hf", "phi3"): dict(_LLAMA_LIKE, family="phi3", qkv_bias=False, out_bias=False, rotary_fraction=0.5),
    ("hf", "olmo2"): dict(_LLAMA_LIKE, family="olmo2", qkv_bias=True, out_bias=True),
    ("hf", "granite"): dict(_LLAMA_LIKE, family="granite", qkv_bias=True, out_bias=True, mlp_bias=True),
    ("hf", "gpt_neox"): dict(family="gpt_neox", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                             intermediate_size=48, max_position_embeddings=64, activation="gelu",
                             rotary_fraction=0.25, parallel_residual=True),
})


def test_registry_covers_every_implementation_and_family():
    assert set(SPECS) == set(PROGRAMS)


@pytest.mark.parametrize("key", sorted(SPECS), ids=lambda k: "-".join(k))
@pytest.mark.parametrize("tie", [True, False])
def test_parameters_are_the_torch_modules_parameters(key, tie):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    implementation, _ = key
    spec = ModelSpec.make(implementation=implementation, **{**SPECS[key], "tie_embeddings": tie})
    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu")
    if implementation == "hf":
        from validate.hf import build_hf

        model, _ = build_hf(spec, training)
    else:
        from validate.models import build_reference

        model = build_reference(spec, training)
    regime = Regime.of(training)
    graph = build_graph(spec, regime)
    engine = [(v.label, v.size.eval(1, 1) // regime.param_elt) for v in graph.params]
    torch_params = [(name, p.numel()) for name, p in model.named_parameters()]
    assert engine == torch_params


def test_unknown_program_is_refused_by_name():
    from memcalc.errors import NotModelledError

    class Odd:
        implementation, family = "hf", "mamba"

    with pytest.raises(NotModelledError, match="implementation"):
        program_for(Odd())
