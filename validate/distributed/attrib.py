"""Who allocated each storage: a site label from the Python stack, for per-rank peak breakdowns.

`allocation_site()` walks the Python stack at the moment a storage is first seen and names the
code that asked for it, by file and function (torch 2.13 sources):

    fsdp.sharded_param       _fsdp_param.py FSDPParam._init_sharded_param (new_zeros, padded)
    fsdp.unsharded_param     _fsdp_param.py init_all_gather_outputs / alloc_storage
    fsdp.all_gather_output   _fsdp_collectives.py foreach_all_gather (flat, world x shard)
    fsdp.reduce_scatter_in   _fsdp_collectives.py foreach_reduce, first allocate (padded grads)
    fsdp.reduce_scatter_out  _fsdp_collectives.py foreach_reduce, second allocate (= sharded grads)
    ddp.bucket               nn/parallel/distributed.py: Reducer construction and _rebuild_buckets
    ddp.broadcast            distributed/utils.py _sync_module_states, DDP buffer sync
    optimizer.state          torch/optim *._init_group (exp_avg, exp_avg_sq, momentum_buffer)
    optimizer.temp           torch/optim step temporaries
    model.build              validate.measure.step.build_trainee (parameters and buffers before wrapping)
    inputs                   validate.measure.step.train_step (the token ids)
    forward / backward       the model's forward, autograd's backward (activations, gradients)

At each new peak DistTracker also asks for the live gradient storages (`gradient_keys`) and
moves their bytes to 'grads', so a breakdown separates gradients from other backward tensors.

>>> allocation_site()
'other'
"""
from __future__ import annotations

import sys

# (path fragment, function names or None for any, site); the innermost matching frame wins
_RULES = (
    ("fsdp/_fully_shard/_fsdp_param.py", {"_init_sharded_param"}, "fsdp.sharded_param"),
    ("fsdp/_fully_shard/_fsdp_param.py", {"init_all_gather_outputs", "alloc_storage",
                                          "alloc_all_gather_outputs"}, "fsdp.unsharded_param"),
    ("fsdp/_fully_shard/_fsdp_collectives.py", {"foreach_all_gather"}, "fsdp.all_gather_output"),
    ("fsdp/_fully_shard/_fsdp_collectives.py", {"foreach_reduce"}, "fsdp.reduce_scatter"),
    ("torch/optim/", {"_init_group"}, "optimizer.state"),
    ("torch/optim/", None, "optimizer.temp"),
    ("torch/distributed/utils.py", None, "ddp.broadcast"),
    ("nn/parallel/distributed.py", {"_sync_buffers", "_sync_module_buffers",
                                    "_default_broadcast_coalesced"}, "ddp.broadcast"),
    ("nn/parallel/distributed.py", {"_ddp_init_helper", "_pre_forward", "__init__"}, "ddp.bucket"),
    ("validate/measure/step.py", {"build_trainee"}, "model.build"),
    ("validate/measure/step.py", {"_backward"}, "backward"),
    ("validate/measure/step.py", {"_forward"}, "forward"),
    ("validate/measure/step.py", {"train_step"}, "inputs"),
)


def allocation_site() -> str:
    """The site label of the code now allocating (see the module docstring)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        name = frame.f_code.co_name
        for fragment, names, site in _RULES:
            if fragment in path and (names is None or name in names):
                if site == "fsdp.reduce_scatter":
                    # the output is allocated after the input exists
                    out = "reduce_scatter_input" in frame.f_locals
                    return "fsdp.reduce_scatter_out" if out else "fsdp.reduce_scatter_in"
                return site
        frame = frame.f_back
    return "other"


def gradient_keys(model) -> set[int]:
    """Storage keys (`_cdata`) of the gradients now held by the model's parameters."""
    keys = set()
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        local = g.to_local() if hasattr(g, "to_local") else g
        keys.add(local.untyped_storage()._cdata)
    return keys


__all__ = ["allocation_site", "gradient_keys"]
