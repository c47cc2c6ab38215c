"""The MoE auxiliary load-balancing loss (output_router_logits) and Mixtral's router jitter:
config keys read or refused by name; what each adds against measured peaks; 'worst' routing still
never below any routing with them on."""
import pytest
from hypothesis import given, settings

from memcalc import estimate
from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from tests.strategies import moe_steps, random_routing
from validate.matrices import topic_cases

MOE_CONFIGS = {c.hf_config["model_type"]: c.hf_config for c in topic_cases("moe", "cpu") if c.hf_config}
"""The MoE rows' config.json per model type (validate/matrices/rows/moe.json)."""

MIXTRAL = MOE_CONFIGS["mixtral"]


def _spec(changes: dict, kind: str = "mixtral") -> ModelSpec:
    return ModelSpec.from_hf_config({**MOE_CONFIGS[kind], **changes})


def test_output_router_logits_and_jitter_are_read_from_the_config():
    spec = _spec({"output_router_logits": True, "router_jitter_noise": 0.01, "router_aux_loss_coef": 0.5})
    assert spec.moe.output_router_logits and spec.moe.router_jitter_noise == 0.01
    for kind in ("qwen2_moe", "qwen3_moe", "olmoe"):
        assert _spec({"output_router_logits": True}, kind).moe.output_router_logits


@pytest.mark.parametrize("cfg,key", [
    ({**MIXTRAL, "router_jitter_noise": "0.1"}, "hf_config.router_jitter_noise"),
    ({**MIXTRAL, "output_router_logits": "true"}, "hf_config.output_router_logits"),
    ({**MOE_CONFIGS["olmoe"], "router_jitter_noise": 0.1}, "hf_config.router_jitter_noise"),
    ({"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 16, "output_router_logits": True},
     "hf_config.output_router_logits: True is not modelled .this model type has no MoE router"),
])
def test_jitter_and_router_logits_are_refused_where_they_do_not_apply(cfg, key):
    with pytest.raises(MemcalcError, match=key):
        ModelSpec.from_hf_config(cfg)


def test_jitter_on_a_family_without_it_is_refused_by_name():
    spec = _spec({}, "qwen3_moe")
    with pytest.raises(MemcalcError, match="moe.router_jitter_noise is Mixtral's"):
        spec.with_(moe=spec.moe.model_copy(update={"router_jitter_noise": 0.1}))


# (config changes, precision, measured steady peak without and with them) for Mixtral of
# the moe rows' models at b2 s40 (N = 80 tokens, E = 4 experts, L = 2, h = 64), SGD, grouped_mm, SDPA,
# fp32 / bf16 / bf16-amp: validate.measure.backends (torch 2.13 CPU, transformers 5.24), 2026-12-01
MEASURED = [({"output_router_logits": True}, "fp32", 2014568, 2017128),
            ({"output_router_logits": True}, "bf16", 1111112, 1112392),
            ({"output_router_logits": True}, "bf16-amp", 2003304, 2004584),
            ({"output_router_logits": True, "router_jitter_noise": 0.01}, "fp32", 2014568, 2058088)]


@pytest.mark.parametrize("changes,precision,without,with_", MEASURED)
def test_what_the_aux_loss_and_jitter_add_is_what_was_measured(changes, precision, without, with_):
    """The backward peak gains the L (N, E) gradients of the router logits the aux loss sent back
    first (2*80*4*4 B in fp32, half in bf16), and with jitter the L (N, h) saved noise tensors."""
    training = TrainingConfig(micro_batch=2, seq_len=40, precision=precision, optimizer="sgd",
                              optimizer_impl="for-loop", device="cpu")
    base = estimate(_spec({}), training).peak_bytes
    assert estimate(_spec(changes), training).peak_bytes - base == with_ - without


@settings(deadline=None, max_examples=30)
@given(moe_steps(aux=True))
def test_worst_routing_stays_an_upper_bound_with_the_aux_loss(step):
    """The aux loss's tensors are sized by N, E and top_k only, so 'worst' (memcalc.inputs.moe.
    worst_routings) still bounds every routing, on cpu and, with the allocator's rounding, on
    cuda. (Found before the bound was re-derived: Qwen3-MoE E3 top-2, b1 s2 bf16-amp, counts
    (2, 1, 1), +193 B above 'worst'.)"""
    spec, training, rng = step
    for device in ("cpu", "cuda"):
        t = training.with_(device=device)
        worst = estimate(spec, t).peak_bytes
        for skewed in (False, False, False, True, True, True):
            routed = t.with_(moe_routing=random_routing(rng, spec, t.micro_batch * t.seq_len, skewed))
            assert estimate(spec, routed).peak_bytes <= worst


def test_worst_routing_bounds_the_measured_eager_rows():
    """On every eager-experts moeaux row, 'worst' predicts at least the peak measured with the
    routing of that run (validate/results/cpu-ci-moe-aux.jsonl)."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "validate/results/cpu-ci-moe-aux.jsonl"
    measured = {r["name"]: r["measured_peak_bytes"] for r in map(json.loads, path.read_text().splitlines())}
    eager = [c for c in topic_cases("moe-aux-loss", "cpu") if c.training.experts_implementation == "eager"]
    assert len(eager) >= 4
    for case in eager:
        assert estimate(case.spec, case.training).peak_bytes >= measured[case.name], case.name


@settings(deadline=None, max_examples=30)
@given(moe_steps(aux=True))
def test_the_aux_loss_never_lowers_a_peak(step):
    spec, training, _ = step
    off = spec.with_(moe=spec.moe.model_copy(update={"output_router_logits": False, "router_jitter_noise": 0.0}))
    for device in ("cpu", "cuda"):
        t = training.with_(device=device)
        assert estimate(spec, t).peak_bytes >= estimate(off, t).peak_bytes


def test_the_hf_builder_writes_the_flags_back():
    pytest.importorskip("torch")
    from validate.models.hf import hf_config_dict

    spec = _spec({"output_router_logits": True, "router_jitter_noise": 0.01})
    cfg = hf_config_dict(spec)
    assert cfg["output_router_logits"] is True and cfg["router_jitter_noise"] == 0.01
    assert ModelSpec.from_hf_config(cfg).moe == spec.moe


def test_the_call_path_with_an_attention_mask_stays_refused_for_moe():
    """load_balancing_loss_func's attention_mask branch (scatter_add_ weighted counts) is not
    modelled: MoE models take the default call path only (memcalc.families.call_path)."""
    training = TrainingConfig(micro_batch=1, seq_len=8, attention_mask="ones")
    with pytest.raises(NotModelledError, match="attention_mask"):
        estimate(_spec({"output_router_logits": True}), training)
