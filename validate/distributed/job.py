"""What one rank of a distributed measurement needs: the configuration and how to wrap it. No
torch here (matrices and the runner read SHARDINGS and BACKEND).

Handed from validate.distributed.measure to each rank as a plain dict of its fields (`as_fields`), since
the rank process imports this module by its own name, whatever the parent's is.

>>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
>>> job = DistJob(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8), 2, "zero3")
>>> DistJob(**job.as_fields()) == job
True
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import SHARDINGS, TrainingConfig  # noqa: F401 (SHARDINGS: re-exported)

BACKEND = "cpu-gloo"  # the backend named in results: gloo processes on CPU
# None = torch's default: 25 MiB buckets, but (torch 2.13, find_unused_parameters=False) all
# parameters in one bucket until the first backward, then rebuilt in gradient-ready order with a
# 1 MiB first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES). Passing 25 explicitly is *not* the same:
# the first bucket then is 25 MiB too (torch/nn/parallel/distributed.py _BucketConfig).
DDP_BUCKET_CAP_MB = None
DDP_GRADIENT_AS_BUCKET_VIEW = False  # torch default


@dataclass(frozen=True)
class DistJob:
    """One configuration as every rank runs it."""

    spec: ModelSpec
    training: TrainingConfig
    world_size: int
    sharding: str
    steps: int = 3
    hf_config: dict | None = None
    seed: int = 0
    bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB
    gradient_as_bucket_view: bool = DDP_GRADIENT_AS_BUCKET_VIEW
    events: bool = False  # record the allocation timeline and per-site peak breakdowns
    fsdp_root_reshard: str = "same"  # 'same' as the layers, or 'torch-default' (None: False)

    def as_fields(self) -> dict:
        """The fields as a plain dict (shallow: spec and training stay objects)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


__all__ = ["DistJob", "SHARDINGS", "BACKEND", "DDP_BUCKET_CAP_MB", "DDP_GRADIENT_AS_BUCKET_VIEW"]
