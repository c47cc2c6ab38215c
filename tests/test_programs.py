"""Every program of the registry against the torch module it models: the same parameters, with
the same names, sizes and order as `model.named_parameters()` (the order a for-loop optimizer
visits and ZeRO-1 partitions), built by the validator from the same spec."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memcalc.engine.simulation import build_graph
from memcalc.families import PROGRAMS, program_for
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.strategies import PROGRAMS as DRAWN_PROGRAMS, small_models

_MOE = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
            max_position_embeddings=64, qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu")
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
    ("hf", "mixtral"): dict(_MOE, family="mixtral", moe=dict(num_experts=4, top_k=2, expert_ffn_size=40)),
    ("hf", "qwen2_moe"): dict(_MOE, family="qwen2_moe", num_layers=3, qkv_bias=True,
                              moe=dict(num_experts=3, top_k=1, expert_ffn_size=24, norm_topk_prob=False,
                                       shared_expert_ffn_size=56, dense_layers=(1,))),
    ("hf", "qwen3_moe"): dict(_MOE, family="qwen3_moe", qkv_bias=True, out_bias=True,
                              moe=dict(num_experts=5, top_k=3, expert_ffn_size=24, dense_layers=(0,))),
    ("hf", "olmoe"): dict(_MOE, family="olmoe", moe=dict(num_experts=4, top_k=2, expert_ffn_size=24,
                                                         norm_topk_prob=False)),
    ("hf", "gpt_oss"): dict(_MOE, family="gpt_oss", qkv_bias=True, out_bias=True, mlp_bias=True, head_dim=16,
                            sliding_window=8, sliding_window_pattern=2,
                            moe=dict(num_experts=4, top_k=2, expert_ffn_size=24)),
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
    ("hf", "stablelm"): dict(_LLAMA_LIKE, family="stablelm", num_kv_heads=2, qkv_bias=True, out_bias=False,
                             rotary_fraction=0.5, parallel_residual=True),
})
_GEMMA = dict(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
              intermediate_size=48, qkv_bias=True, out_bias=True, mlp_bias=False, activation="gelu_tanh")
SPECS.update({
    ("hf", "gemma"): dict(_GEMMA, family="gemma"),
    ("hf", "gemma2"): dict(_GEMMA, family="gemma2", sliding_window=8, sliding_window_pattern=2,
                           attn_softcap=True, logit_softcap=True),
    ("hf", "gemma3"): dict(_GEMMA, family="gemma3", qk_norm=True, sliding_window=8, sliding_window_pattern=3),
})
# the HF llama program's variants: Qwen3 (q/k norms, biases on q/k/v/o), Qwen2's sliding rule
VARIANTS = {"qwen3": dict(SPECS["hf", "llama"], qk_norm=True, out_bias=True),
            "qwen2-window": dict(SPECS["hf", "llama"], sliding_window=8, max_window_layers=1)}


def test_registry_covers_every_implementation_and_family():
    assert set(SPECS) == set(PROGRAMS)


CASES = {**{"-".join(k): (k[0], v) for k, v in SPECS.items()}, **{k: ("hf", v) for k, v in VARIANTS.items()}}


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("tie", [True, False])
def test_parameters_are_the_torch_modules_parameters(key, tie):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    implementation, fields = CASES[key]
    spec = ModelSpec.make(implementation=implementation, **{**fields, "tie_embeddings": tie})
    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu",
                              attention="eager" if spec.family in ("gemma2", "gpt_oss") else "sdpa")  # no SDPA path
    if implementation == "hf":
        from validate.models.hf import build_hf

        model, _ = build_hf(spec, training)
    else:
        from validate.models.reference import build_reference

        model = build_reference(spec, training)
    regime = Regime.of(training)
    graph = build_graph(spec, regime)
    engine = [(v.label, v.size.eval(1, 1) // regime.param_elt) for v in graph.params]
    torch_params = [(name, p.numel()) for name, p in model.named_parameters()]
    assert engine == torch_params


def _torch_buffers(spec: ModelSpec, training: TrainingConfig) -> list[tuple[str, int]]:
    """(name, bytes) of every buffer storage of the module the validator builds, as
    validate.measure.step.build_trainee leaves it (`model.to(torch.bfloat16)` under pure bf16)."""
    import torch

    if spec.implementation == "hf":
        from validate.models.hf import build_hf

        model, _ = build_hf(spec, training)
    else:
        from validate.models.reference import build_reference

        model = build_reference(spec, training)
    if training.precision == "bf16":
        model.to(torch.bfloat16)
    storages = {}  # one entry per storage: a buffer sharing another's storage costs nothing
    for name, b in model.named_buffers():
        storages.setdefault(b.untyped_storage().data_ptr(), (name, b.untyped_storage().nbytes()))
    return sorted(storages.values())


def _engine_buffers(spec: ModelSpec, training: TrainingConfig) -> list[tuple[str, int]]:
    """(label, bytes) of the engine's constant buffers (Graph.buffers, category buffers)."""
    graph = build_graph(spec, Regime.of(training))
    return sorted((v.label, v.size.eval(1, 1)) for v in graph.buffers if v.storage.category == "buffers")


@pytest.mark.parametrize("key", sorted(k for k in CASES if CASES[k][0] == "hf"))
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-amp"])
def test_buffers_are_the_torch_modules_buffers(key, precision):
    """Every HF program holds the buffers transformers registers (rotary inv_freq and its clone
    original_inv_freq, Gemma's embed_scale), by name and bytes, in the dtype model.to() leaves."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = ModelSpec.make(implementation="hf", **CASES[key][1])
    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", precision=precision,
                              attention="eager" if spec.family in ("gemma2", "gpt_oss") else "sdpa")
    assert _engine_buffers(spec, training) == _torch_buffers(spec, training)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(small_models(programs=[k for k in DRAWN_PROGRAMS if k[1] == "hf"]), st.sampled_from(["fp32", "bf16"]))
def test_buffers_match_torch_drawn_over_every_hf_program(spec, precision):
    """The same over drawn models (head sizes, partial rotary, windows, NoPE, MoE)."""
    pytest.importorskip("transformers")
    training = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", precision=precision,
                              attention="eager" if spec.family in ("gemma2", "gpt_oss") else "sdpa")
    assert _engine_buffers(spec, training) == _torch_buffers(spec, training)


def test_unknown_program_is_refused_by_name():
    from memcalc.core.errors import NotModelledError

    class Odd:
        implementation, family = "hf", "mamba"

    with pytest.raises(NotModelledError, match="implementation"):
        program_for(Odd())
