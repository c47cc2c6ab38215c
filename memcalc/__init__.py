"""memcalc: predict the peak accelerator memory of a transformer training step.

>>> import memcalc
>>> r = memcalc.estimate(memcalc.ModelSpec.preset("gpt2"), memcalc.TrainingConfig(micro_batch=1, seq_len=256))
>>> r.peak_bytes > 0
True
"""
from memcalc.errors import MemcalcError, SpecError, UnknownNameError
from memcalc.estimate import MemoryReport, estimate, sqrt_segment_size
from memcalc.specs import ModelSpec
from memcalc.training import TrainingConfig

__all__ = ["MemcalcError", "SpecError", "UnknownNameError", "MemoryReport", "estimate",
           "sqrt_segment_size", "ModelSpec", "TrainingConfig"]
