"""Shared hypothesis strategies: small random ModelSpecs and TrainingConfigs (fast to simulate).

Every program the registry declares is drawn (memcalc.families.registry: each family in each
implementation it has), with every option its declaration supports (q/k norms, sliding windows,
soft-capping, partial rotary, parallel residual, NoPE layers, experts), multi-head, grouped-query
and multi-query attention, tied or untied embeddings, the biases its class builds, dropouts,
every precision, optimizer and checkpointing mode, and, where asked for, data parallelism (DDP,
zero1, zero2, zero3), tensor parallelism and FSDP2 mixed precision.
Sizes stay small (1-4 layers, hidden 32-128) so that one example simulates in milliseconds;
1024 positions hold every seq_len the tests draw (at most 512: GPT-2 accepts no more tokens
than its position table has rows).

Profiles: 'quick' (default, 25 examples) and 'long' (500); pick one with
MEMCALC_HYPOTHESIS_PROFILE=long pytest.
"""
from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from memcalc.families.registry import FAMILIES, declaration, families_with
from memcalc.inputs.moe import MoESpec
from memcalc.inputs.moe_routing import moe_layers
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

settings.register_profile("quick", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("MEMCALC_HYPOTHESIS_PROFILE", "quick"))

PROGRAMS = [(d.name, impl) for d in FAMILIES.values() for impl in d.programs]
"""Every (family, implementation) the registry declares (memcalc.families.registry): a new
family is drawn by every property test without a line here."""
MOE_FAMILIES = list(families_with(moe=True))
TP_PROGRAMS = [(f, i) for f, i in PROGRAMS if declaration(f).supports.tensor_parallel == "all"
               or (declaration(f).supports.tensor_parallel == "reference" and i == "reference")]
"""The programs the engine splits by tensor parallelism."""
PRECISIONS = ["fp32", "fp16-amp", "bf16-amp", "bf16"]
OPTIMIZERS = ["sgd", "sgd-momentum", "adam", "adamw"]
CHECKPOINTING = ["none", "per-layer", "sqrt", "every-k", "selective"]
SHARDINGS = ["none", "zero1", "zero2", "zero3"]
# the reference models' MLPs (validate.models.reference: nn.GELU(approximate='tanh'), SwiGLU) and
# biases (any combination); the HF classes' are their declarations' activations and biases
REFERENCE_ACTIVATIONS = {"gpt2": ["gelu_tanh"], "llama": ["silu"]}
DROPOUTS = [0.0, 0.1]
ANY_BIASES = [(q, o, m) for q in (False, True) for o in (False, True) for m in (False, True)]


def activations(family: str, impl: str) -> list[str]:
    """The MLP activations a program runs."""
    return REFERENCE_ACTIVATIONS[family] if impl == "reference" else list(declaration(family).activations)


def biases(family: str, impl: str) -> list[tuple[bool, bool, bool]]:
    """The (qkv_bias, out_bias, mlp_bias) a program's class can build."""
    return ANY_BIASES if impl == "reference" else list(declaration(family).biases)


WINDOWS = [None, 8, 32, 200]  # shorter than, around and longer than the drawn seq_len


@st.composite
def small_models(draw, max_layers: int = 4, programs=PROGRAMS) -> ModelSpec:
    """Any program (family x implementation) at hidden 32-128 and 1..max_layers layers, with
    multi-head, grouped-query or multi-query attention where the family has it, tied or untied
    embeddings, each bias the class builds, and every option its declaration supports
    (dropouts, partial rotary, parallel residual, NoPE layers, q/k norms, sliding windows,
    soft-capping, experts)."""
    family, impl = draw(st.sampled_from(list(programs)))
    decl = declaration(family)
    can = decl.supports
    head_dim = draw(st.sampled_from([8, 16, 32]))
    heads = draw(st.sampled_from([h for h in (1, 2, 4, 8) if 32 <= h * head_dim <= 128]))
    fields = dict(family=family, implementation=impl, vocab_size=draw(st.integers(16, 256)),
                  hidden_size=heads * head_dim, num_heads=heads, num_layers=draw(st.integers(1, max_layers)),
                  max_position_embeddings=1024, tie_embeddings=draw(st.booleans()),
                  **dict(zip(("qkv_bias", "out_bias", "mlp_bias"), draw(st.sampled_from(biases(family, impl))))),
                  activation=draw(st.sampled_from(activations(family, impl))),
                  attn_dropout=draw(st.sampled_from(DROPOUTS)))
    # drawn in the order the strategy has drawn since the sweeps were recorded (scripts/fresh_sweep.py
    # re-draws them: tests/test_sweep4_rows.py)
    tied = decl.config_keys.get("embd_dropout", "embd") == decl.config_keys.get("resid_dropout")
    if "embd" in can.dropouts and not tied:  # GPT-2: embedding and residual dropout
        fields.update(embd_dropout=draw(st.sampled_from(DROPOUTS)), resid_dropout=draw(st.sampled_from(DROPOUTS)))
        if can.upcast_attention:
            fields["reorder_and_upcast_attn"] = impl == "hf" and draw(st.booleans())
    elif tied:  # GPT-NeoX's hidden_dropout on embeddings and residuals, partial rotary
        p = draw(st.sampled_from(DROPOUTS))
        fields.update(embd_dropout=p, resid_dropout=p, rotary_fraction=draw(st.sampled_from([0.25, 0.5, 1.0])),
                      parallel_residual=draw(st.booleans()), intermediate_size=draw(st.sampled_from([64, 128])))
    else:  # GQA: any divisor of the heads, 1 (MQA) and `heads` (MHA) included
        if can.grouped_query:
            fields["num_kv_heads"] = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
        fields["intermediate_size"] = draw(st.sampled_from([64, 96, 128, 192, 256]))
    if can.moe:
        fields["moe"] = draw(moe_specs(family, fields["num_layers"]))
    if "resid" in can.dropouts and "embd" not in can.dropouts:  # Phi-3, StableLM: residual dropout only
        fields["resid_dropout"] = draw(st.sampled_from(DROPOUTS))
        if can.partial_rotary:
            fields["rotary_fraction"] = draw(st.sampled_from([0.25, 0.5, 1.0]))
        if can.parallel_residual:
            fields["parallel_residual"] = draw(st.booleans())
    # SmolLM3's NoPE layers (its attention_bias sets q/k/v and o_proj biases together)
    if can.no_rope_layers and impl == "hf" and draw(st.booleans()) and fields["qkv_bias"] == fields["out_bias"]:
        fields.update(no_rope_layers=tuple(range(fields["num_layers"] - 1, -1, -2)))
    elif impl == "hf":  # HF SmolLM3 (NoPE) has no q/k norms or windows
        fields.update(draw(_hf_variant(family, fields)))
    return ModelSpec.make(**fields)


@st.composite
def _hf_variant(draw, family: str, fields: dict) -> dict:
    """What transformers' classes add, as the family declares it: q/k norms, sliding windows
    (Mistral's rule, Qwen2/Qwen3's max_window_layers, Gemma-2/3's and GPT-OSS's alternation) and
    soft-capping, within what each class builds (validate.models.hf)."""
    can, out = declaration(family).supports, {}
    plain = (fields["qkv_bias"], fields["out_bias"], fields["mlp_bias"]) in ((False, False, False), (True, True, False))
    if can.qk_norm != "never":
        out["qk_norm"] = can.qk_norm == "always" or (plain and draw(st.booleans()))
    if can.sliding == "optional":
        window = draw(st.sampled_from(WINDOWS))
        rule = draw(st.sampled_from(["mistral", "qwen2"]))
        biases = (fields["qkv_bias"], fields["out_bias"], fields["mlp_bias"])
        # HF Qwen2 always has q/k/v biases and no other; Qwen3 (q/k norms) takes attention_bias;
        # Mistral has none (validate.models.hf._llama_model_type)
        qwen2_ok = out.get("qk_norm") or biases == (True, False, False)
        if window is not None and (qwen2_ok if rule == "qwen2" else not any(biases)):
            # HF Qwen3 (q/k norms) slides by Qwen2's rule only: every layer sliding is max_window_layers 0
            every = 0 if out.get("qk_norm") else None
            out.update(sliding_window=window,
                       max_window_layers=draw(st.integers(0, fields["num_layers"])) if rule == "qwen2" else every)
    elif can.sliding == "patterned":
        out.update(sliding_window=draw(st.sampled_from([w for w in WINDOWS if w is not None])),
                   sliding_window_pattern=draw(st.integers(1, 3)))
    if can.attn_softcap:
        out["attn_softcap"] = draw(st.booleans())
    if can.logit_softcap:
        out["logit_softcap"] = draw(st.booleans())
    return out


@st.composite
def moe_specs(draw, family: str, layers: int) -> MoESpec:
    """Experts of a MoE family: 1-8 experts, any top_k, Qwen2-MoE's shared expert, Qwen-MoE's
    dense layers, the auxiliary loss (output_router_logits), Mixtral's router jitter."""
    experts = draw(st.integers(1, 8))
    dense = draw(st.sets(st.integers(0, layers - 1), max_size=layers - 1)) if family.startswith("qwen") else set()
    return MoESpec(num_experts=experts, top_k=draw(st.integers(1, experts)),
                   expert_ffn_size=draw(st.sampled_from([32, 64, 96])),
                   norm_topk_prob=draw(st.booleans()) if family not in ("mixtral", "gpt_oss") else True,
                   shared_expert_ffn_size=draw(st.sampled_from([32, 64])) if family == "qwen2_moe" else None,
                   dense_layers=tuple(sorted(dense)),
                   output_router_logits=family != "gpt_oss" and draw(st.booleans()),  # GPT-OSS's: refused
                   router_jitter_noise=draw(st.sampled_from([0.0, 0.01])) if family == "mixtral" else 0.0)


def tensor_parallel_degrees(model: ModelSpec | None) -> list[int]:
    """Degrees the engine splits `model` by: dividing the heads, kv heads and MLP width, and
    none for HF GPT-2 (Conv1D is not split by torch's parallel styles) or a family whose
    declaration has no plan (tensor_parallel 'none')."""
    if model is None or (model.family, model.implementation) not in TP_PROGRAMS or model.moe is not None:
        return [1]  # HF GPT-2's Conv1D, families without tensor parallelism, 3-D expert weights
    return [t for t in (1, 2, 4) if not (model.num_heads % t or model.kv_heads % t or model.ffn_size % t)]


@st.composite
def trainings(draw, checkpointing=CHECKPOINTING, parallel: bool = False,
              model: ModelSpec | None = None) -> TrainingConfig:
    """A training step with small shapes and any precision, optimizer and checkpointing; with
    `parallel`, also a world size up to 8 with any sharding, a tensor-parallel degree `model`
    can be split by, sequence parallelism and FSDP2 mixed precision, within what the engine
    models (memcalc.estimate._check_parallelism and tensor_parallel.check_tensor_parallel
    refuse the rest with a MemcalcError; the properties would fail on a refusal)."""
    mode = draw(st.sampled_from(list(checkpointing)))
    fields = dict(
        micro_batch=draw(st.integers(1, 8)), seq_len=draw(st.integers(1, 128)),
        grad_accum=draw(st.integers(1, 3)), precision=draw(st.sampled_from(PRECISIONS)),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        optimizer_impl=draw(st.sampled_from([None, "foreach", "for-loop", "fused"])),
        checkpointing=mode, checkpoint_every=draw(st.integers(1, 3)) if mode == "every-k" else None,
        attention=draw(st.sampled_from(["eager"] if model is not None
                                       and declaration(model.family).supports.sdpa_refusal is not None
                                       else ["eager", "sdpa"])),  # Gemma-2 and GPT-OSS have no SDPA path
        device=draw(st.sampled_from(["cpu", "cuda"])))
    if model is None or model.moe is not None:  # a dense model refuses them (check_moe_options)
        fields.update(experts_implementation=draw(st.sampled_from(["grouped_mm", "eager"])),
                      moe_routing=draw(st.sampled_from(["worst", "balanced"])))
    if parallel:
        tp = draw(st.sampled_from(tensor_parallel_degrees(model)))
        dp = draw(st.sampled_from([1, 2, 3, 4] if tp == 1 else [1, 2]))
        # data parallelism across tensor-parallel groups is modelled with FSDP2 only
        sharding = draw(st.sampled_from(SHARDINGS if tp == 1 or dp == 1 else ["zero2", "zero3"]))
        fields.update(tensor_parallel=tp, world_size=tp * dp, sharding=sharding)
        if tp > 1 and model.implementation == "reference" and draw(st.booleans()):
            fields.update(sequence_parallel=True, seq_len=tp * draw(st.integers(1, 32)))  # whole tokens a rank
        if sharding in ("zero2", "zero3") and dp > 1 and draw(st.booleans()):
            fields.update(fsdp_mixed_precision=True, precision="fp32")
    return TrainingConfig(**fields)


@st.composite
def cases(draw, max_layers: int = 4, checkpointing=CHECKPOINTING, parallel: bool = False,
          programs=PROGRAMS) -> tuple[ModelSpec, TrainingConfig]:
    """A (model, training) pair over every program; with `parallel`, a per-rank one."""
    model = draw(small_models(max_layers, programs))
    return model, draw(trainings(checkpointing, parallel, model))


# ---- fine-tuning, clipping and the HF call paths, drawn over any (model, training) ----------
FINETUNE_OPTIMIZERS = ["adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor"]
LORA_TARGETS = {"llama": [("q_proj", "v_proj"), ("gate_proj", "down_proj"), ("o_proj",)],
                "gpt2": [("c_attn",), ("c_fc", "c_proj"), ("c_attn", "c_proj")]}
FREEZE = {"llama": [("*embed*",), ("*norm*",), ("*mlp*",), ("*self_attn.q_proj*", "*lm_head*")],
          "gpt2": [("*wte*",), ("*ln_*",), ("*.attn.*",), ("*wpe*", "*mlp*")]}  # reference ones: a
# pattern that names nothing there is refused by build_graph and the group dropped
"""fnmatch patterns that treat every layer alike ('*ln_*' names no layer by index; memcalc.engine.depth.
supported refuses a pattern with a digit, '?' or '[', and the index-tied ones below are drawn too)."""
INDEX_TIED_FREEZE = [("*.0.*",), ("*.?.*",)]  # layer 0 (each pattern must match a parameter)


@st.composite
def finetune_steps(draw, model: ModelSpec, training: TrainingConfig, index_tied: bool = True) -> TrainingConfig:
    """`training` with what a fine-tuning or HF-Trainer step adds, each group kept where the
    engine models it for `model` (memcalc.refusals.step.check_estimate; a refusal drops the group):
    gradient clipping, a bitsandbytes/Adafactor optimizer, LoRA (any targets, bias, lora_bias,
    dropout, rank, layers_to_transform over every layer or, with `index_tied`, some), frozen
    parameters, a 4-bit base, and the call-path fields (use_cache, attention_mask with padding,
    separate labels, num_items_in_batch, hf_trainer with weight decay)."""
    from memcalc.core.errors import MemcalcError
    from memcalc.inputs.lora import LoRA
    from memcalc.engine.regime import Regime
    from memcalc.engine.simulation import build_graph
    from memcalc.refusals.step import check_estimate

    groups = []
    if draw(st.booleans()):
        groups.append({"max_grad_norm": 1.0})
    if draw(st.booleans()):  # (optimizer_impl names a torch.optim implementation only)
        groups.append({"optimizer": draw(st.sampled_from(FINETUNE_OPTIMIZERS)), "optimizer_impl": None})
    family = "llama" if model.family == "llama" else "gpt2"
    kind = draw(st.sampled_from(["none", "lora", "lora", "freeze", "qlora"]))
    if kind in ("lora", "qlora"):
        layers = draw(st.sampled_from([None, "all"] + (["some"] if index_tied else [])))
        layers = {None: None, "all": tuple(range(model.num_layers)),
                  "some": tuple(range(0, model.num_layers, 2))}[layers]
        targets = draw(st.sampled_from(["all-linear"] + LORA_TARGETS[family]))
        layers = None if targets == "all-linear" else layers  # peft: no layers_to_transform with a str
        lora = LoRA(rank=draw(st.integers(1, 8)), alpha=draw(st.sampled_from([8, 16])),
                    dropout=draw(st.sampled_from([0.0, 0.1])),
                    targets=targets,
                    bias=draw(st.sampled_from(["none", "all", "lora_only"])), lora_bias=draw(st.booleans()),
                    layers=layers)
        groups.append({"lora": lora, **({"quantization": draw(st.sampled_from(["nf4", "nf4-double", "fp4"]))}
                                        if kind == "qlora" else {})})
    elif kind == "freeze":
        groups.append({"freeze": draw(st.sampled_from(FREEZE[family] + (INDEX_TIED_FREEZE if index_tied else [])))})
    mask = draw(st.sampled_from(["none", "ones", "padded"]))  # each call-path field on its own
    groups += [{"use_cache": True}] if draw(st.booleans()) else []
    groups += [{"attention_mask": mask, "pad_tokens": draw(st.integers(1, 3)) if mask == "padded" else 0}]
    groups += [{"labels": "separate"}] if draw(st.booleans()) else []
    groups += [{"num_items_in_batch": True}] if draw(st.booleans()) else []
    if draw(st.booleans()):
        groups.append({"hf_trainer": True, "weight_decay": draw(st.sampled_from([0.0, 0.1]))})
    out = training
    for group in groups:
        try:
            t = out.with_(**group)
            check_estimate(model, t)
            build_graph(model, Regime.of(t, model))  # freeze patterns that match, something trainable
        except (MemcalcError, ValueError):
            continue
        out = t
    return out


@st.composite
def moe_steps(draw, aux: bool = False) -> tuple[ModelSpec, TrainingConfig, random.Random]:
    """A small model of a transformers MoE family (Mixtral, Qwen2-MoE with its shared expert,
    Qwen3-MoE, OLMoE): 2-8 experts, any top_k, 1-2 layers, eager experts, any precision,
    checkpointing mode and device; with `aux`, the auxiliary loss on (output_router_logits) and,
    for Mixtral, router jitter or none. With a seeded random.Random for `random_routing`."""
    family = draw(st.sampled_from([f for f in MOE_FAMILIES if declaration(f).programs["hf"].startswith("hf_moe:")]))
    E = draw(st.integers(2, 8))
    moe = MoESpec(num_experts=E, top_k=draw(st.integers(1, E)), expert_ffn_size=draw(st.sampled_from([32, 64, 128])),
                  shared_expert_ffn_size=64 if family == "qwen2_moe" else None, output_router_logits=aux,
                  router_jitter_noise=draw(st.sampled_from([0.0, 0.01])) if aux and family == "mixtral" else 0.0)
    spec = ModelSpec.make(family=family, vocab_size=draw(st.sampled_from([16, 64, 256])), hidden_size=32,
                          num_layers=draw(st.integers(1, 2)), num_heads=2, intermediate_size=64,
                          qkv_bias=family == "qwen2_moe", out_bias=False, mlp_bias=False,
                          tie_embeddings=False, activation="silu", moe=moe)
    training = TrainingConfig(micro_batch=draw(st.integers(1, 3)), seq_len=draw(st.integers(1, 24)),
                              precision=draw(st.sampled_from(["fp32", "bf16-amp", "bf16"])),
                              checkpointing=draw(st.sampled_from(["none", "per-layer", "selective"])),
                              device=draw(st.sampled_from(["cpu", "cuda"])), experts_implementation="eager")
    return spec, training, draw(st.randoms(use_true_random=False))


def random_routing(rng: random.Random, spec: ModelSpec, tokens: int, skewed: bool = True) -> tuple:
    """Per-MoE-layer expert token counts of `tokens` tokens, each to top_k distinct experts drawn
    with a random skew, or uniformly where not `skewed` (tests of routing bounds over every MoE
    program)."""
    E, k = spec.moe.num_experts, spec.moe.top_k
    skew = [rng.random() ** 3 if skewed else 1.0 for _ in range(E)]
    rows = []
    for _ in moe_layers(spec):
        counts = [0] * E
        for _ in range(tokens):  # k distinct experts per token, weighted by a random skew
            chosen = set()
            while len(chosen) < k:
                chosen.add(rng.choices(range(E), weights=skew)[0])
            for e in chosen:
                counts[e] += 1
        rows.append(tuple(counts))
    return tuple(rows)


def grouped_mm_peaks(spec: ModelSpec, training: TrainingConfig, rng: random.Random) -> set[int]:
    """The peaks of `training` on the grouped_mm experts path under 'worst', 'balanced' and one
    `random_routing`: a single value where memory does not depend on routing (transformers'
    grouped_mm_experts_forward sizes every tensor by tokens * top_k: memcalc.inputs.moe)."""
    from memcalc import estimate

    grouped = training.with_(experts_implementation="grouped_mm")
    counts = random_routing(rng, spec, training.micro_batch * training.seq_len)
    return {estimate(spec, grouped.with_(moe_routing=r)).peak_bytes for r in ("worst", "balanced", counts)}
