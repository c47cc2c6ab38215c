"""Shared hypothesis strategies: small random ModelSpecs and TrainingConfigs (fast to simulate).

Profiles: 'quick' (default, 25 examples) and 'long' (500); pick one with
MEMCALC_HYPOTHESIS_PROFILE=long pytest.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from memcalc.specs import ModelSpec
from memcalc.training import TrainingConfig

settings.register_profile("quick", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("MEMCALC_HYPOTHESIS_PROFILE", "quick"))

PRECISIONS = ["fp32", "fp16-amp", "bf16-amp", "bf16"]
OPTIMIZERS = ["sgd", "sgd-momentum", "adam", "adamw"]
CHECKPOINTING = ["none", "per-layer", "sqrt", "selective"]


@st.composite
def small_models(draw, max_layers: int = 4) -> ModelSpec:
    """A GPT-2 family, HF implementation model of at most a few hundred thousand parameters."""
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([8, 16]))
    return ModelSpec.make(
        family="gpt2", implementation="hf", vocab_size=draw(st.integers(16, 256)),
        hidden_size=heads * head_dim, num_heads=heads, num_layers=draw(st.integers(1, max_layers)),
        max_position_embeddings=256,
        embd_dropout=draw(st.sampled_from([0.0, 0.1])), attn_dropout=draw(st.sampled_from([0.0, 0.1])),
        resid_dropout=draw(st.sampled_from([0.0, 0.1])))


@st.composite
def trainings(draw, checkpointing=CHECKPOINTING) -> TrainingConfig:
    """A training step with small shapes and any precision, optimizer and checkpointing."""
    return TrainingConfig(
        micro_batch=draw(st.integers(1, 8)), seq_len=draw(st.integers(1, 128)),
        grad_accum=draw(st.integers(1, 3)), precision=draw(st.sampled_from(PRECISIONS)),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        optimizer_impl=draw(st.sampled_from([None, "foreach", "for-loop", "fused"])),
        checkpointing=draw(st.sampled_from(list(checkpointing))),
        attention=draw(st.sampled_from(["eager", "sdpa"])),
        device=draw(st.sampled_from(["cpu", "cuda"])))


@st.composite
def cases(draw, max_layers: int = 4, checkpointing=CHECKPOINTING) -> tuple[ModelSpec, TrainingConfig]:
    """A (model, training) pair."""
    return draw(small_models(max_layers)), draw(trainings(checkpointing))
