"""Mixture-of-experts routing as measured: forward hooks on the routers of a HF MoE model record
the tokens each expert received in each forward pass, and the prediction of a measured case uses
exactly those counts (TrainingConfig.moe_routing), step by step.

The hooks read the router's top-k indices with Tensor.tolist() (no aten op, so the live-tensor
tracker sees no allocation) and skip calls made during backward (checkpoint recomputation runs
the router again on the same input).
"""
from __future__ import annotations

import dataclasses

import torch


class RouterRecorder:
    """Counts per (forward pass, MoE layer, expert), filled by hooks on the routers."""

    def __init__(self, routers: list, num_experts: int):
        self.routers = routers
        self.num_experts = num_experts
        self.passes: list[list[tuple[int, ...]]] = []
        self._handles = [m.register_forward_hook(self._hook) for m in routers]

    def _hook(self, module, _args, output) -> None:
        if torch._C._current_graph_task_id() != -1:  # inside backward: a checkpoint recompute
            return
        indices = output[2]
        if indices.device.type == "meta" or type(indices).__name__ == "FakeTensor":
            return
        counts = [0] * self.num_experts
        for e in _flat(indices.tolist()):
            counts[e] += 1
        layer = self.routers.index(module)
        if layer == 0:
            self.passes.append([])
        self.passes[-1].append(tuple(counts))


def _flat(nested) -> list[int]:
    out = []
    for row in nested:
        out.extend(row if isinstance(row, list) else [row])
    return out


def install(model) -> RouterRecorder | None:
    """Hook every top-k router of a HF MoE model (modules named *TopKRouter, in layer order);
    None for a dense model."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    if not routers:
        return None
    recorder = RouterRecorder(routers, routers[0].num_experts)
    model._memcalc_router_recorder = recorder
    return recorder


def predict_routed(spec, training, passes: list, steps: int):
    """(prediction, extra): the largest over the steady steps (>= 2) of each step predicted with the
    routing each of its micro-steps measured (validate.run.routed_steps.predict_step), and the
    predictions under each pass's routing alone, 'worst' and 'balanced'."""
    import memcalc
    from validate.run.routed_steps import predict_steps

    micro = training.grad_accum
    steady = passes[micro:micro * steps]
    best = max(predict_steps(memcalc.estimate, spec, training, steady), key=lambda r: r.peak_bytes)
    # the first step under its own routing: the eager experts' gradients follow each step's routing
    # (fresh1202-008, Qwen3-MoE eager experts: +1.35% on the first step predicted with the steady
    # steps' routing)
    first = predict_steps(memcalc.estimate, spec, training, passes[:micro])
    if first:
        best = dataclasses.replace(best, first_step_peak_bytes=first[0].first_step_peak_bytes)
    extra = {"routing_counts": steady,
             "routed_peaks": [memcalc.estimate(spec, training.with_(moe_routing=tuple(counts))).peak_bytes
                              for counts in steady],
             **{f"{r}_peak_bytes": memcalc.estimate(spec, training.with_(moe_routing=r)).peak_bytes
                for r in ("worst", "balanced")}}
    return best, extra
