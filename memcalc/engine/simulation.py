"""One simulation of a training step at one depth: the rank's forward program (memcalc.families)
built into a Graph and walked through the step (memcalc.tape.step). memcalc.engine.run runs it at the
model's own depth or, through memcalc.engine.depth, at a few small depths from which any depth follows.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from memcalc.allocator.rules import device_constants
from memcalc.core.errors import SpecError
from memcalc.refusals.finetune import check_freeze, check_saved_modules
from memcalc.parallel.fsdp import Fsdp
from memcalc.parallel.tensor import local_spec
from memcalc.core.poly import Poly
from memcalc.families import program_for
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Graph
from memcalc.tape.ops import Ops
from memcalc.tape.step import simulate_both, simulate_step


def build_graph(model: ModelSpec, regime: Regime) -> Graph:
    """The forward program one rank runs (a tensor-parallel rank runs a narrower model).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> g = build_graph(ModelSpec.preset("gpt2"), Regime.of(TrainingConfig(micro_batch=1, seq_len=8)))
    >>> len(g.params)  # wte, wpe, 12 x 12 per block, ln_f weight and bias (lm_head tied)
    148
    """
    ops = Ops(Graph(), regime)
    spec = local_spec(model, regime.tensor_parallel)
    program_for(spec).build(ops, spec, regime)
    if regime.freeze:
        check_freeze([v.label for v in ops.g.params], regime.freeze)
    check_saved_modules([v.label for v in ops.g.params], regime.lora)
    if not ops.g.trainable_params:
        raise SpecError("freeze", "every parameter is frozen: nothing to train",
                        "leave some parameters trainable (or add LoRA adapters)")
    return ops.g


@dataclass(frozen=True)
class ParamView:
    """What the optimizer, clipping and the HF Trainer's groups see of a parameter (memcalc.
    tape.step reads these fields of a graph's Values), its decoder layer's index replaced by
    '#' so that every unit's parameters compare equal."""

    nbytes: int
    elt: int
    rows: int
    label: str
    requires_grad: bool
    last2: tuple[int, int] | None = None  # memcalc.tape.graph.Value.last2

    @property
    def size(self) -> Poly:
        """Its bytes, as a Value's size."""
        return Poly.const(self.nbytes)


def param_view(v: object) -> ParamView:
    """The ParamView of a graph parameter (a memcalc.tape.graph.Value).

    >>> from memcalc.tape.graph import Graph
    >>> param_view(Graph().param("model.layers.12.mlp.up_proj.weight", Poly.const(8))).label
    'model.layers.#.mlp.up_proj.weight'
    """
    return ParamView(v.size.eval(1, 1), v.elt, v.rows, re.sub(r"\.\d+\.", ".#.", v.label, count=1),
                     v.requires_grad, v.last2)


@dataclass
class StepRun:
    """What one simulation of a step gives."""

    moments: list
    """The kept Moments, or with record=True every instant (memcalc.tape.record.RecordingMemory.log)."""
    param_shapes: list[tuple[int, int]]
    """(elements, dim 0) of each trainable parameter in module order (what each rank's optimizer
    steps; elements of the parameter dtype)."""
    param_sizes: list[int]
    """Bytes of each parameter in module order (what the optimizer's temporaries follow)."""
    layer_starts: list[int]
    """The graph's first node of each layer, then the node past the last layer."""
    sizes: dict
    """With record=True: each storage size's Poly by its terms."""
    params: list = field(default_factory=list)
    """With record=True: what the optimizer and clipping see of each parameter, in module order
    (ParamView)."""
    states: dict = field(default_factory=dict)
    """With record=True: the optimizer states the steady state holds from the start, as live
    storages {(category, size terms): how many} (the first step creates them at optimizer.step)."""
    live: Callable[[int, int], dict] | None = None
    """With record=True: a mark's live storages {(category, size terms): how many} from its
    stamp and packed counts (memcalc.tape.record.RecordedLive)."""


def run_steps(model: ModelSpec, regime: Regime) -> tuple[StepRun, StepRun]:
    """The steady step and the first step of `model` under `regime`, as run_step(first_step=
    False) and (True) give them, from one walk through forward and backward where
    memcalc.tape.step.simulate_both applies (else two).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8))
    >>> gpt2 = ModelSpec.preset("gpt2")
    >>> steady, first = run_steps(gpt2, regime)
    >>> [m.total.terms for m in first.moments] == [m.total.terms for m in run_step(gpt2, regime, True).moments]
    True
    """
    graph, constants, shapes, sizes, fsdp = _prepared(model, regime, True)
    both = simulate_both(graph, regime, constants, with_optimizer=regime.data_parallel == 1, fsdp=fsdp)
    if both is None:
        return run_step(model, regime, False), run_step(model, regime, True)
    return tuple(StepRun(moments, shapes, sizes, graph.layer_starts, {}) for moments in both)


def trainable_sizes(graph: Graph) -> list[int]:
    """Bytes of each parameter that requires grad: what DDP's Reducer buckets (torch/nn/parallel/
    distributed.py _build_params_for_reducer keeps `param.requires_grad` only; frozen base
    weights and LoRA's frozen linears get no bucket space) and what each rank's optimizer steps.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, freeze=("transformer.h.*",)))
    >>> len(trainable_sizes(build_graph(ModelSpec.preset("gpt2").with_(num_layers=1), r)))
    4
    """
    return [v.size.eval(1, 1) for v in graph.trainable_params]


def _prepared(model: ModelSpec, regime: Regime, whole: bool) -> tuple:
    """(graph, constant storages, parameter shapes, parameter bytes, Fsdp or None) of a step."""
    graph = build_graph(model, regime)
    constants = device_constants(regime.device)
    sizes = [v.size.eval(1, 1) for v in graph.params]
    if regime.replicated:  # DDP's gradient buckets: one more copy of every trainable gradient
        constants["ddp_buckets"] = sum(trainable_sizes(graph)) if whole else 0
    shapes = [(v.size.eval(1, 1) // regime.param_elt, v.rows) for v in graph.trainable_params]
    fsdp = None
    if regime.fsdp:
        fsdp = Fsdp.of(graph, regime)
        fsdp.whole = whole
        for v in graph.params:
            v.storage.size = Poly()  # counted by Fsdp: padded shards, unsharded copies
    return graph, constants, shapes, sizes, fsdp


def run_step(model: ModelSpec, regime: Regime, first_step: bool, record: bool | dict = False,
             whole: bool = True) -> StepRun:
    """Simulate one step (the first, or a steady-state one) of `model` under `regime`. Without
    `whole`, the storages that hold every parameter at once (DDP's gradient buckets, FSDP's
    sharded parameters) are held as 0 bytes; recorded, the optimizer's temporaries are left
    out (memcalc.engine.depth adds these at each depth: rounded to the allocator's blocks, or of a
    largest parameter, they are not affine in depth).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> run = run_step(ModelSpec.preset("gpt2"), Regime.of(TrainingConfig(micro_batch=1, seq_len=8)), False)
    >>> len(run.param_shapes), run.layer_starts[0] < run.layer_starts[-1]
    (148, True)
    """
    graph, constants, shapes, sizes, fsdp = _prepared(model, regime, whole)
    out = simulate_step(graph, regime, first_step, constants,
                        with_optimizer=regime.data_parallel == 1, fsdp=fsdp, record=record)
    if record is not False:
        states: dict = {}
        for st in getattr(out, "state_storages", ()):
            key = (st.category, tuple(sorted(st.size.terms.items())))  # a live key (memcalc.tape.record.RecordedLive)
            states[key] = states.get(key, 0) + 1
        return StepRun(out.log, shapes, sizes, graph.layer_starts,
                       {k: p for k, (p, _) in out.size_counts.items()},
                       [param_view(v) for v in graph.params], states, out.recorded_live())
    return StepRun(out, shapes, sizes, graph.layer_starts, {})
