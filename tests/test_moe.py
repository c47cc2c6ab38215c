"""Mixture-of-experts: presets against their published total and active parameter counts and
against transformers' own num_parameters(); published config.json files read back to the presets;
routing refused where it cannot hold; 'worst' routing never below any routing; grouped_mm memory
independent of routing."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc import estimate
from memcalc.core.errors import MemcalcError, NotModelledError, SpecError
from memcalc.formulas.parameters import active_parameter_count
from memcalc.inputs.moe import MoESpec
from memcalc.inputs.moe_routing import moe_layers
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.configs import meta_num_parameters
from tests.strategies import MOE_FAMILIES, cases, grouped_mm_peaks, moe_steps
from validate.run.routed_steps import predict_steps

# (preset, published total, published active) in billions: Mixtral (arXiv 2401.04088), Qwen3
# (arXiv 2505.09388), OLMoE (arXiv 2409.02060), Qwen1.5-MoE-A2.7B (model card)
PUBLISHED = [("mixtral-8x7b", 46.7, 12.9), ("qwen3-30b-a3b", 30.5, 3.3), ("olmoe-1b-7b", 6.9, 1.3),
             ("qwen1.5-moe-a2.7b", 14.3, 2.7)]

# config.json of mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B, allenai/OLMoE-1B-7B-0924,
# Qwen/Qwen1.5-MoE-A2.7B (huggingface.co, trimmed of nothing memory-relevant)
CONFIGS = {
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000},
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936},
    "olmoe-1b-7b": {
        "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
        "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
        "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
        "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": True,
        "vocab_size": 50304},
    "qwen1.5-moe-a2.7b": {
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
        "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
        "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001},
}


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_presets_have_their_published_total_and_active_parameters(name, total, active):
    spec = ModelSpec.preset(name)  # published to 0.1B, rounded or truncated (Qwen3: 3.35B -> "3.3B")
    assert abs(spec.param_count / 1e9 - total) < 0.06
    assert abs(active_parameter_count(spec) / 1e9 - active) < 0.06


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_published_configs_read_back_to_the_presets(name):
    spec = ModelSpec.from_hf_config(CONFIGS[name])
    assert spec.with_(name=name, max_position_embeddings=ModelSpec.preset(name).max_position_embeddings) \
        == ModelSpec.preset(name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_counts_agree_with_transformers_on_a_meta_device(name):
    pytest.importorskip("torch")
    from validate.models.hf import hf_config_dict

    spec = ModelSpec.preset(name)
    assert meta_num_parameters(hf_config_dict(spec)) == spec.param_count


def test_dense_layers_of_qwen2_moe_are_counted_as_dense():
    cfg = {**CONFIGS["qwen1.5-moe-a2.7b"], "num_hidden_layers": 4, "mlp_only_layers": [1],
           "decoder_sparse_step": 2}
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.moe.dense_layers == (0, 1, 2) and moe_layers(spec) == [3]
    assert meta_num_parameters(cfg) == spec.param_count


# ---- refusals ----------------------------------------------------------------------------------
SMALL = ModelSpec.preset("mixtral-8x7b").with_(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                                               intermediate_size=96, vocab_size=128,
                                               moe=MoESpec(num_experts=4, top_k=2, expert_ffn_size=96))


@pytest.mark.parametrize("routing,match", [
    (((64, 64, 0, 0), (64, 64, 0, 1)), "layer 1's counts sum to 129"),
    (((64, 64, 0, 0),), "expected 2 rows"),
    (((128, 0, 0, 0), (64, 64, 0, 0)), "layer 0 gives an expert 128 tokens, more than the 64"),
])
def test_bad_routing_counts_are_refused_by_name(routing, match):
    training = TrainingConfig(micro_batch=2, seq_len=32, moe_routing=routing, experts_implementation="eager")
    with pytest.raises(SpecError, match=f"moe_routing: {match}"):
        estimate(SMALL, training)


def test_routing_counts_for_a_dense_model_and_capacity_searches_are_refused():
    counts = TrainingConfig(micro_batch=1, seq_len=2, moe_routing=((2, 2, 0, 0),) * 2)
    with pytest.raises(SpecError, match="moe_routing: explicit routing counts given for a dense model"):
        estimate(ModelSpec.preset("gpt2"), counts)
    from memcalc.queries.capacity import max_micro_batch

    with pytest.raises(NotModelledError, match="moe_routing: explicit routing counts fix"):
        max_micro_batch(SMALL, counts, "80GB")


@pytest.mark.parametrize("changes,key", [
    ({"num_experts_per_tok": 9}, "moe"), ({"router_jitter_noise": -0.1}, "hf_config.router_jitter_noise"),
    ({"sliding_window": 4096}, "hf_config.sliding_window")])
def test_unmodelled_router_and_attention_options_are_refused(changes, key):
    with pytest.raises(MemcalcError, match=key):
        ModelSpec.from_hf_config({**CONFIGS["mixtral-8x7b"], **changes})


def test_olmoe_clip_qkv_is_refused_by_name():  # GPT-OSS, once refused here: tests/test_gpt_oss.py
    with pytest.raises(NotModelledError, match="hf_config.clip_qkv"):
        ModelSpec.from_hf_config({**CONFIGS["olmoe-1b-7b"], "clip_qkv": 8.0})


def test_tensor_parallel_experts_are_refused():
    with pytest.raises(NotModelledError, match="tensor_parallel"):
        estimate(SMALL, TrainingConfig(micro_batch=1, seq_len=8, world_size=2, tensor_parallel=2))


def test_the_cli_refuses_bad_routing_with_exit_2(capsys):
    from memcalc.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--model", "mixtral-8x7b", "--num-layers", "1", "--moe-routing", "uneven"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "moe_routing" in err


# ---- routing properties ------------------------------------------------------------------------
@st.composite
def compositions(draw, spec: ModelSpec, tokens: int) -> tuple:
    """One routing per MoE layer: counts of tokens*top_k (token, expert) pairs, each at most
    `tokens`, drawn as targets then filled or trimmed in a drawn order of the experts (so that
    extreme routings, experts full or empty, come up as often as mixed ones)."""
    E, k = spec.moe.num_experts, spec.moe.top_k
    rows = []
    for _ in moe_layers(spec):
        counts = draw(st.lists(st.integers(0, tokens), min_size=E, max_size=E))
        order = draw(st.permutations(range(E)))
        excess = sum(counts) - tokens * k
        for e in (order if excess < 0 else reversed(order)):
            step = max(-counts[e], min(tokens - counts[e], -excess))
            counts[e] += step
            excess += step
        rows.append(tuple(counts))
    return tuple(rows)


@st.composite
def routed_steps(draw):
    """Every MoE program, precision, optimizer, checkpointing mode, experts path and device, with
    a routing drawn for it."""
    model, training = draw(cases(max_layers=3, programs=[(f, "hf") for f in MOE_FAMILIES]))
    training = training.with_(moe_routing="worst")
    return model, training, draw(compositions(model, training.micro_batch * training.seq_len))


@settings(deadline=None)
@given(routed_steps())
def test_worst_routing_is_never_below_any_routing(step):
    """'worst' is an upper bound of the step's peak over every routing, after the allocator's
    rounding (memcalc.inputs.moe_routing.worst_routings), on both experts paths and devices."""
    spec, training, counts = step
    worst = estimate(spec, training)
    routed = estimate(spec, training.with_(moe_routing=counts))
    assert routed.peak_bytes <= worst.peak_bytes
    assert routed.first_step_peak_bytes <= worst.first_step_peak_bytes


def test_worst_routing_bounds_the_rounded_counterexample():
    """OLMoE 4 experts top-1, s 14, bf16 on cuda: counts such as (9, 2, 2, 1) are 1,024 B above the
    largest of a few extreme routings without rounding, so "worst" must count the rounding each
    per-expert storage can add; none of these routings is above it."""
    spec = ModelSpec.make(family="olmoe", vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                          intermediate_size=64, qkv_bias=False, out_bias=False, mlp_bias=False,
                          tie_embeddings=False, activation="silu",
                          moe=MoESpec(num_experts=4, top_k=1, expert_ffn_size=32))
    t = TrainingConfig(micro_batch=1, seq_len=14, precision="bf16", device="cuda", experts_implementation="eager")
    worst = estimate(spec, t).peak_bytes
    for counts in [(9, 2, 2, 1), (14, 0, 0, 0), (1, 1, 1, 11), (4, 3, 4, 3), (5, 5, 3, 1)]:
        assert estimate(spec, t.with_(moe_routing=(counts,))).peak_bytes <= worst


@settings(deadline=None)
@given(moe_steps())
def test_grouped_mm_memory_does_not_depend_on_routing(step):
    assert len(grouped_mm_peaks(*step)) == 1


# ---- the measured rows -------------------------------------------------------------------------
MOE_RESULTS = Path(__file__).resolve().parent.parent / "validate" / "results" / "cpu-ci-moe.jsonl"


def _moe_rows() -> list[dict]:
    return [json.loads(line) for line in MOE_RESULTS.read_text().splitlines() if line.strip()]


def test_worst_routing_is_never_below_a_measured_peak():
    """Every MoE ci row (validate/results/cpu-ci-moe.jsonl), predicted again under 'worst' from
    its recorded model and training: at least the prediction with the routing each step
    measured (re-predicted from the recorded routing); on the eager rows never below the
    measured steady-state peak (docs/moe.md's "worst" row); on the grouped_mm rows the routed
    prediction itself (routing changes nothing)."""
    over = []
    for row in _moe_rows():
        spec, training = ModelSpec.model_validate(row["model"]), TrainingConfig(**row["training"])
        worst = estimate(spec, training.with_(moe_routing="worst")).peak_bytes
        # the routed prediction with this engine from the routing each step recorded (the row's
        # own routed_peaks were predicted by the engine of its day)
        routed = max(r.peak_bytes for r in predict_steps(estimate, spec, training,
                                                          row["extra"]["moe"]["routing_counts"]))
        if training.experts_implementation == "grouped_mm":
            assert worst == routed, row["name"]
            continue
        assert worst >= routed and worst >= row["measured_peak_bytes"], row["name"]
        over.append((worst - row["measured_peak_bytes"]) / row["measured_peak_bytes"])
    assert len(over) == 12
    assert (round(100 * min(over), 2), round(100 * max(over), 2)) == (0.61, 4.98)
