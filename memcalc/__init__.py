"""memcalc: predict the peak accelerator memory of a transformer training step.

>>> import memcalc
>>> r = memcalc.estimate(memcalc.ModelSpec.preset("gpt2"), memcalc.TrainingConfig(micro_batch=1, seq_len=256))
>>> r.peak_bytes > 0
True
"""
from memcalc.core.errors import MemcalcError, SpecError, UnknownNameError
from memcalc.queries.estimate import MemoryReport, candidates, estimate, optimal_segment_size, sqrt_segment_size
from memcalc.inputs.lora import LoRA
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

# Loaded on first use (PEP 562), so that `import memcalc` stays light for the CLI.
_LAZY = {"model_state_bytes": "memcalc.formulas.model_states",
         "zero_paper_mixed_precision_bytes": "memcalc.formulas.model_states",
         "max_micro_batch": "memcalc.queries.capacity", "max_seq_len": "memcalc.queries.capacity",
         "max_layers": "memcalc.queries.capacity", "fits": "memcalc.queries.capacity",
         "Capacity": "memcalc.queries.capacity", "estimate_grid": "memcalc.queries.grid",
         "plan": "memcalc.queries.planner", "Plan": "memcalc.queries.planner",
         "plan_cluster": "memcalc.queries.cluster", "Layout": "memcalc.queries.cluster",
         "GPUS": "memcalc.inputs.gpus", "GPU": "memcalc.inputs.gpus", "parse_budget": "memcalc.inputs.gpus",
         "local_gpus": "memcalc.inputs.gpus", "check": "memcalc.queries.preflight",
         "Verdict": "memcalc.queries.preflight", "estimate_lengths": "memcalc.queries.lengths",
         "LengthsReport": "memcalc.queries.lengths", "watch": "memcalc.integrations.watch",
         "load_snapshot": "memcalc.allocator.snapshot", "replay_snapshot": "memcalc.allocator.replay",
         "replay_events": "memcalc.allocator.replay", "AllocatorSettings": "memcalc.allocator.settings"}

__all__ = ["MemcalcError", "SpecError", "UnknownNameError", "MemoryReport", "estimate",
           "candidates", "optimal_segment_size", "sqrt_segment_size", "ModelSpec", "TrainingConfig", "LoRA", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memcalc' has no attribute {name!r}")
