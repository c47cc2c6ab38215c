"""Data-parallel memory: the ZeRO paper's figures (golden), the engine's per-rank model states and
peaks (properties), and the measured gloo runs (validate/results/dist-ci.jsonl, second method)."""
import json
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

from memcalc import ModelSpec, TrainingConfig, estimate
from memcalc.parallel.data import rank_optimizer_bytes_all, zero1_partition
from memcalc.formulas.model_states import zero_model_state_bytes
from memcalc.parallel.fsdp import rank_elements, shard_rows

from tests.strategies import cases

RESULTS = Path(__file__).resolve().parent.parent / "validate" / "results" / "dist-ci.jsonl"


@pytest.mark.parametrize("stage,gb", [("none", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_zero_paper_figure_1(stage, gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 devices, K = 12
    assert round(zero_model_state_bytes(7_500_000_000, stage, 64) / 1e9, 1) == gb


def test_zero_paper_16_bytes_per_parameter_on_one_device():
    assert all(zero_model_state_bytes(10**9, s, 1) == 16 * 10**9 for s in ("none", "zero1", "zero2", "zero3"))


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=40), st.integers(1, 16))
def test_zero1_partition_covers_every_parameter_once(numels, world):
    owned = zero1_partition(numels, world)
    assert sorted(i for rank in owned for i in rank) == list(range(len(numels)))


@given(st.integers(1, 5000), st.integers(1, 64), st.integers(1, 64))
def test_fsdp_shards_cover_the_parameter(rows, cols, world):
    parts = [rank_elements(rows * cols, rows, world, r) for r in range(world)]
    assert sum(parts) == rows * cols
    assert all(p <= shard_rows(rows, world) * cols for p in parts)


def _states_per_rank(model, t):
    from memcalc.queries.estimate import candidates

    c = candidates(model, t)
    return max(s for s, _ in rank_optimizer_bytes_all(c.param_shapes, c.param_elt, c.regime))


@given(cases(), st.sampled_from(["zero1", "zero2", "zero3"]), st.sampled_from([2, 3, 4]))
def test_per_rank_memory_falls_as_world_size_grows(case, sharding, world):
    model, t = case
    # FSDP2 shards dim 0 in ceil(rows / W) chunks, padded on every rank: 3-D expert weights
    # (E, ., .) whose experts do not split evenly take more memory per rank as W grows (found:
    # E = 5, W 2 -> 4 under zero2, the reduce-scatter's padded input 8 rows against 6)
    assume(model.moe is None or model.moe.num_experts % (2 * world) == 0)
    t = t.with_(sharding=sharding, world_size=world)
    assert _states_per_rank(model, t.with_(world_size=2 * world)) <= _states_per_rank(model, t)
    assert estimate(model, t.with_(world_size=2 * world)).peak_bytes <= estimate(model, t).peak_bytes


def _small(impl, family):
    if family == "gpt2":
        return ModelSpec.make(family="gpt2", vocab_size=300, hidden_size=64, num_layers=2, num_heads=4,
                              max_position_embeddings=64, embd_dropout=0, attn_dropout=0,
                              resid_dropout=0, implementation=impl)
    return ModelSpec.make(family="llama", vocab_size=300, hidden_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, intermediate_size=160, max_position_embeddings=64,
                          qkv_bias=False, out_bias=False, mlp_bias=False, activation="silu",
                          tie_embeddings=False, implementation=impl)


def _peaks_by_sharding(model, t):
    return {s: estimate(model, t.with_(sharding=s)).peak_bytes for s in ("none", "zero1", "zero2", "zero3")}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("impl,family", [("hf", "gpt2"), ("reference", "gpt2"), ("hf", "llama"),
                                         ("reference", "llama")])
def test_sharding_orders_the_per_rank_peak(impl, family, world):
    model = _small(impl, family)
    t = TrainingConfig(micro_batch=1, seq_len=16, device="cpu", world_size=world)
    peak = _peaks_by_sharding(model, t)
    assert peak["zero3"] <= peak["zero2"] <= peak["zero1"] <= peak["none"]


@given(cases(), st.sampled_from([2, 4]))
def test_more_sharding_costs_at_most_one_gathered_layer_more(case, world):
    # ZeRO's order is about model states; the per-rank peak of a step also holds FSDP2's
    # all-gathered layers, whose transients can top the less sharded stage on tiny steps (one
    # layer, AMP, SGD without states), by less than one layer
    #
    # FSDP2 also pads each rank's dim-0 chunk to ceil(rows / W) rows (torch.chunk): a 3-D expert
    # weight (E, ., .) with fewer experts than ranks, or any dim 0 that W does not divide, takes
    # W * ceil(rows / W) rows unsharded and ceil(rows / W) per rank. That is physical (it is what
    # the ranks allocate), so the order holds up to the padding `pad` (bytes of the padded rows,
    # unsharded, summed over every parameter; computed here from the chunking rule, not from
    # memcalc.parallel.fsdp) times the copies of it a rank can hold at once: the unsharded
    # parameters of every layer (zero2 keeps them) and one layer's unsharded gradient and
    # reduce-scatter input (2 more), and per rank its 1/W of the sharded parameters, gradients
    # and optimizer states (each in the master dtype: `master` bytes per parameter byte)
    model, t = case
    t = t.with_(world_size=world)
    peak = _peaks_by_sharding(model, t)
    largest_layer = max(_unsharded_groups(model, t.with_(sharding="zero3")).values())
    states = {"sgd": 0, "sgd-momentum": 1}.get(t.optimizer, 2)
    master = 2 if t.fsdp_mixed_precision else 1
    slack = largest_layer + _padding(model, t) * (3 + (2 + states) * master / world)
    assert peak["zero1"] <= peak["none"]  # the optimizer states are all ZeRO-1 changes
    assert peak["zero2"] <= peak["zero1"] + slack
    assert peak["zero3"] <= peak["zero2"] + slack
    assert peak["zero3"] >= largest_layer  # a whole layer is unsharded while it runs


def test_more_sharding_can_cost_more_where_fsdp2_pads_the_experts():
    """The padding is real: one expert over 4 ranks is held whole by every rank (torch.chunk of
    one row in 4 gives one chunk), so zero2 holds each expert weight 4 times unsharded."""
    from memcalc.inputs.moe import MoESpec

    moe = MoESpec(num_experts=1, top_k=1, expert_ffn_size=96)
    model = ModelSpec.make(family="mixtral", vocab_size=64, hidden_size=64, num_layers=2, num_heads=4,
                           intermediate_size=64, qkv_bias=False, out_bias=False, mlp_bias=False,
                           tie_embeddings=False, activation="silu", moe=moe)
    t = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", world_size=4, optimizer="sgd")
    peak = _peaks_by_sharding(model, t)
    largest_layer = max(_unsharded_groups(model, t.with_(sharding="zero3")).values())
    pad = _padding(model, t)
    # 2 layers x 3 padded rows x fp32 of the experts' gate_up (2*96, 64) and down (64, 96) and
    # the router's (1, 64) weight
    assert pad == 2 * 3 * 4 * (2 * 96 * 64 + 64 * 96 + 64)
    assert peak["zero1"] + largest_layer < peak["zero2"] <= peak["zero1"] + largest_layer + 3 * pad


def _padding(model, t):
    """Bytes FSDP2's padding adds to the unsharded parameters: each parameter of `rows` rows is
    split by torch.chunk into chunks of ceil(rows / W) rows, each rank's padded to that."""
    from memcalc.engine.simulation import build_graph
    from memcalc.engine.regime import Regime

    world, out = t.world_size, 0
    for v in build_graph(model, Regime.of(t.with_(sharding="zero3"))).params:
        rows = v.rows or 1
        out += (world * -(-rows // world) - rows) * (v.size.eval(1, 1) // rows)
    return out


def _unsharded_groups(model, t):
    from memcalc.engine.simulation import build_graph
    from memcalc.parallel.fsdp import Fsdp
    from memcalc.engine.regime import Regime

    graph = build_graph(model, Regime.of(t))
    f = Fsdp(graph, t.world_size, True, t.device)
    return {g: t.world_size * s for g, s in f.shard.items()}


def _recorded():
    if not RESULTS.exists():
        return []
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("row", _recorded(), ids=lambda r: r["name"])
def test_recorded_gloo_runs_match_rank_by_rank(row):
    model = ModelSpec(**row["model"])
    t = TrainingConfig(**{**row["training"], "world_size": row["world_size"], "sharding": row["sharding"]})
    predicted = estimate(model, t).rank_peak_bytes
    measured = row["measured_rank_peak_bytes"]
    assert len(predicted) == len(measured)
    for p, m in zip(predicted, measured):
        assert abs(p - m) <= 0.01 * m  # the 1% CI holds the engine to (.ci/run)


@pytest.mark.parametrize("sharding", ["zero2", "zero3"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_gradient_accumulation_under_fsdp_costs_at_most_the_sharded_grads(sharding, world):
    # later micro-steps keep the sharded .grad from the first and add each reduce-scatter output
    # into it: the step's peak grows by at most every group's shard (the kept grads) plus one
    # group's shard (the output being added)
    from memcalc.engine.simulation import build_graph
    from memcalc.parallel.fsdp import Fsdp
    from memcalc.engine.regime import Regime

    model = ModelSpec.preset("gpt2-medium")
    t = TrainingConfig(micro_batch=2, seq_len=512, precision="bf16", world_size=world,
                       sharding=sharding)
    one, two = estimate(model, t).peak_bytes, estimate(model, t.with_(grad_accum=2)).peak_bytes
    graph = build_graph(model, Regime.of(t))
    shards = Fsdp(graph, world, sharding == "zero3", t.device).shard.values()
    assert one <= two <= one + sum(shards) + max(shards)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_fsdp_mixed_precision_keeps_fp32_states_and_halves_the_gathered_copies(world):
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): after backward only fp32 shards,
    # fp32 sharded grads and fp32 states remain, as under plain fp32 zero3, so the optimizer
    # phase is the same; forward (bf16 activations and all-gathered copies) is lower
    model = ModelSpec.preset("gpt2-medium")
    fp32 = TrainingConfig(micro_batch=2, seq_len=512, world_size=world, sharding="zero3")
    mixed = estimate(model, fp32.with_(fsdp_mixed_precision=True))
    plain = estimate(model, fp32)
    assert mixed.phases["optimizer"] == plain.phases["optimizer"]
    assert mixed.phases["forward"] < plain.phases["forward"]


def test_fsdp_mixed_precision_refusals_name_the_field():
    from memcalc.core.errors import NotModelledError, SpecError

    with pytest.raises(SpecError, match="fsdp_mixed_precision needs sharding"):
        TrainingConfig.make(micro_batch=1, seq_len=8, world_size=2, fsdp_mixed_precision=True)
    with pytest.raises(SpecError, match="precision fp32"):
        TrainingConfig.make(micro_batch=1, seq_len=8, world_size=2, sharding="zero3",
                            precision="bf16-amp", fsdp_mixed_precision=True)
    with pytest.raises(NotModelledError, match="^fsdp_mixed_precision:"):
        estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8, sharding="zero3",
                                                          fsdp_mixed_precision=True))
