"""Fine-tuning across ranks (LoRA, frozen parameters, gradient clipping under DDP and FSDP2) and
tensor parallelism by family declaration: DDP's rank against the single process plus the
Reducer's buckets of the trainable gradients (counted from peft's adapter shapes), FSDP2's frozen
groups, and the refusals by name. The measured figures are the dist-ci rows of
validate/matrices/rows/finetune-ranks.json and tensor-parallel-families.json (re-predicted by
tests/test_recorded_rows.py)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.families.registry import FAMILIES
from memcalc.inputs.lora import LoRA
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.estimate import estimate

LLAMA = ModelSpec.make(family="llama", vocab_size=1000, hidden_size=128, num_layers=3, num_heads=4,
                       num_kv_heads=2, intermediate_size=344)


def _adapter_elements(spec: ModelSpec, rank: int, targets: list[str]) -> int:
    """peft's lora_A (rank x in) and lora_B (out x rank) of each targeted linear, every layer."""
    h, a, kv, d, f = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_size, spec.ffn_size
    shapes = {"q_proj": (h, a * d), "k_proj": (h, kv * d), "v_proj": (h, kv * d), "o_proj": (a * d, h),
              "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return spec.num_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([["q_proj", "v_proj"], ["k_proj", "o_proj", "down_proj"], ["up_proj"]]),
       st.sampled_from([2, 8]), st.sampled_from(["fp32", "bf16-amp", "bf16"]),
       st.sampled_from([None, 1.0]), st.sampled_from(["for-loop", "foreach", "fused"]))
def test_ddp_rank_is_the_single_process_plus_adapter_buckets(targets, rank, precision, clip, impl):
    """Under DDP every rank runs the single-process step and holds the Reducer's buckets, one
    copy of each trainable gradient: with LoRA, peft's fp32 adapters only (every phase)."""
    t = TrainingConfig(micro_batch=2, seq_len=16, device="cpu", precision=precision, max_grad_norm=clip,
                       optimizer_impl=impl, lora=LoRA(targets=targets, rank=rank))
    one, two = estimate(LLAMA, t), estimate(LLAMA, t.with_(world_size=2))
    buckets = 4 * _adapter_elements(LLAMA, rank, targets)
    assert {p: v - one.phases[p] for p, v in two.phases.items()} == {p: buckets for p in one.phases}
    assert two.components["ddp_buckets"] == buckets


def test_frozen_embedding_leaves_ddp_buckets():
    t = TrainingConfig(micro_batch=1, seq_len=8, device="cpu", world_size=2)
    full = estimate(LLAMA, t).components["ddp_buckets"]
    frozen = estimate(LLAMA, t.with_(freeze=("model.embed_tokens.*",))).components["ddp_buckets"]
    assert full - frozen == 4 * LLAMA.vocab_size * LLAMA.hidden_size


@pytest.mark.parametrize("sharding", ["zero2", "zero3"])
def test_fsdp_lora_ranks_hold_less_than_full_training(sharding):
    """Frozen base weights are still sharded and gathered, but get no gradients, reduce-scatter
    buffers or optimizer states: every rank's peak falls."""
    t = TrainingConfig(micro_batch=2, seq_len=16, device="cpu", world_size=4, sharding=sharding)
    full = estimate(LLAMA, t).rank_peak_bytes
    lora = estimate(LLAMA, t.with_(lora=LoRA(targets=["q_proj", "v_proj"]))).rank_peak_bytes
    assert all(x < y for x, y in zip(lora, full))


@pytest.mark.parametrize("fields, field", [
    (dict(world_size=2, sharding="zero1", lora=LoRA()), "sharding"),
    (dict(world_size=2, tensor_parallel=2, lora=LoRA()), "lora"),
    (dict(world_size=2, sharding="zero3", fsdp_mixed_precision=True, freeze=("lm_head.*",)), "freeze"),
    (dict(world_size=2, sharding="zero3", precision="bf16", lora=LoRA()), "precision"),
    (dict(world_size=2, quantization="nf4", lora=LoRA()), "quantization"),
    (dict(world_size=2, tensor_parallel=2, max_grad_norm=1.0), "max_grad_norm"),
])
def test_finetuning_across_ranks_refusals_name_the_field(fields, field):
    with pytest.raises(MemcalcError) as err:
        estimate(LLAMA, TrainingConfig(micro_batch=1, seq_len=8, device="cpu", **fields))
    assert err.value.field == field


def _spec_of(decl) -> ModelSpec:
    fields = dict(family=decl.name, vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=4 if not decl.supports.grouped_query else 2, head_dim=16,
                  intermediate_size=128, activation=decl.activations[0])
    q, o, m = decl.biases[0]
    return ModelSpec.make(**fields, qkv_bias=q, out_bias=o, mlp_bias=m)


@pytest.mark.parametrize("name", [n for n, d in FAMILIES.items()
                                  if d.supports.tensor_parallel == "none" and not d.supports.moe])
def test_families_without_a_plan_name_the_layer(name):
    """A family whose decoder layer has no tensor-parallel plan is refused with its declared
    reason, which names the layer (a module path)."""
    decl = FAMILIES[name]
    why, fix = decl.supports.tensor_parallel_refusal
    assert "." in why.split(" have")[0] or "self_attn" in why  # a module path such as self_attn.q_norm
    with pytest.raises(NotModelledError) as err:
        estimate(_spec_of(decl), TrainingConfig(micro_batch=1, seq_len=8, device="cpu", world_size=2,
                                                tensor_parallel=2))
    assert err.value.field == "tensor_parallel" and why in str(err.value)
