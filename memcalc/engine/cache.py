"""The engine's caches, bounded: the candidates of each (model, regime) (memcalc.engine.run) and the
derivation of each stack layout (memcalc.engine.depth), both in CACHE, filled with the cyclic garbage
collector held off (memcalc.core.gc_pause).
"""
from __future__ import annotations

from dataclasses import replace

from memcalc.core.gc_pause import gc_paused
from memcalc.engine.depth import derive
from memcalc.engine.derivation import Derivation
from memcalc.engine.layout import N1, Layout, small_model
from memcalc.inputs.specs import ModelSpec

CACHE: dict = {}
"""Candidates by (model, regime key, window reached, single sequence) (memcalc.engine.run.cache_key),
derivations by ("depth", model at N1 units, layout) (derivation_key)."""


def cached_derivation(model: ModelSpec, lay: Layout) -> Derivation | None:
    key = derivation_key(model, lay)
    if key is None:  # a spec tied to its depth (no_rope_layers): memcalc.engine.depth.derive
        return None
    if key not in CACHE:
        with gc_paused():  # (also when depth_form derives it outside candidates)
            CACHE[key] = derive(model, key[2])
    return CACHE[key]


def derivation_key(model: ModelSpec, lay: Layout) -> tuple | None:
    """The cache key of the derivation serving `lay` (one for every depth of the layout: keyed by
    the model at N1 units and the shared layout), or None for a spec tied to its depth."""
    shared = shared_layout(lay)
    try:
        return ("depth", small_model(model, shared, N1), shared)
    except ValueError:  # memcalc.core.errors.SpecError, pydantic's ValidationError
        return None


def shared_layout(lay: Layout) -> Layout:
    """The layout a derivation is made and cached for: of N1 units (memcalc.engine.depth.derive reads
    the unit and the rest, not the count: every depth of a layout shares one); under DDP or ZeRO-1 over any number of
    ranks, that of 2 ranks. There the simulated step reads the rank count only as
    regime.replicated (DDP's gradient buckets, one copy of every gradient whatever the count)
    and data_parallel == 1 (the optimizer, left to memcalc.parallel.data per rank), both the
    same for every count past one (memcalc.engine.simulation._prepared, run_step), and so does
    Derivation._outside; FSDP's shards (zero2, zero3) are sized by the count and keep it.

    >>> from memcalc.engine.layout import layout; from memcalc.engine.regime import Regime
    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=8, world_size=64, sharding="zero1")
    >>> m = ModelSpec.preset("gpt2")
    >>> shared_layout(layout(m, Regime.of(t))).regime.data_parallel
    2
    >>> shared_layout(layout(m, Regime.of(t.with_(sharding="zero3")))).regime.data_parallel
    64
    """
    if lay.regime.replicated and lay.regime.data_parallel != 2:
        lay = replace(lay, regime=replace(lay.regime, data_parallel=2))
    return lay if lay.units == N1 else replace(lay, units=N1)  # derive reads unit and rest only



def has_derivation(model: ModelSpec, lay: Layout) -> bool:
    """Whether the derivation serving `lay` is cached already (cached_derivation makes it).

    >>> from memcalc.engine.layout import layout; from memcalc.engine.regime import Regime
    >>> from memcalc.inputs.training import TrainingConfig
    >>> m = ModelSpec.preset("gpt2"); lay = layout(m, Regime.of(TrainingConfig(micro_batch=1, seq_len=8)))
    >>> cached_derivation(m, lay) is not None, has_derivation(m, lay)
    (True, True)
    """
    return derivation_key(model, lay) in CACHE
