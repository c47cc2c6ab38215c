"""memcalc: predict the peak accelerator memory of a transformer training step.

>>> import memcalc
>>> r = memcalc.estimate(memcalc.ModelSpec.preset("gpt2"), memcalc.TrainingConfig(micro_batch=1, seq_len=256))
>>> r.peak_bytes > 0
True
"""
from memcalc.errors import MemcalcError, SpecError, UnknownNameError
from memcalc.estimate import MemoryReport, candidates, estimate, optimal_segment_size, sqrt_segment_size
from memcalc.lora import LoRA
from memcalc.specs import ModelSpec
from memcalc.training import TrainingConfig

# Loaded on first use (PEP 562), so that `import memcalc` stays light for the CLI.
_LAZY = {"model_state_bytes": "memcalc.formulas.model_states",
         "zero_paper_mixed_precision_bytes": "memcalc.formulas.model_states",
         "max_micro_batch": "memcalc.capacity", "max_seq_len": "memcalc.capacity",
         "max_layers": "memcalc.capacity", "fits": "memcalc.capacity", "Capacity": "memcalc.capacity",
         "estimate_grid": "memcalc.grid", "plan": "memcalc.planner", "Plan": "memcalc.planner",
         "GPUS": "memcalc.gpus", "GPU": "memcalc.gpus", "parse_budget": "memcalc.gpus",
         "local_gpus": "memcalc.gpus", "check": "memcalc.preflight", "Verdict": "memcalc.preflight"}

__all__ = ["MemcalcError", "SpecError", "UnknownNameError", "MemoryReport", "estimate",
           "candidates", "optimal_segment_size", "sqrt_segment_size", "ModelSpec", "TrainingConfig", "LoRA", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memcalc' has no attribute {name!r}")
