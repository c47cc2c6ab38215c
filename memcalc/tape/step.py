"""A whole training step over a forward program: micro-steps, then the optimizer.

Steady state (steps >= 2): optimizer states alive from the start, grads None (zero_grad with
set_to_none=True), created in the first micro-step's backward and accumulated in place by later
ones. First step: no optimizer state until optimizer.step() creates it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.poly import Poly
from memcalc.regime import Regime
from memcalc.tape.graph import Graph, Storage
from memcalc.allocator import round_up
from memcalc.tape import finetune_optim as ft
from memcalc.tape.optimizer import clip_bytes, step_scalar_bytes, transient_bytes
from memcalc.tape.simulate import Memory, StepSimulator

if TYPE_CHECKING:
    from memcalc.parallel.fsdp import Fsdp


def _param_sizes(graph: Graph) -> list[int]:
    return [v.size.eval(1, 1) for v in graph.params]


def _optimizer_storages(graph: Graph, regime: Regime) -> list[Storage]:
    """One storage per state tensor (each is its own allocation): exp_avg and exp_avg_sq, or
    momentum_buffer, per parameter, plus Adam's 4-byte `step` scalars, which live on the CPU
    unless the device is the CPU (adam.py: `torch.tensor(0.0)` without a device)."""
    out = [Storage(Poly.const(size), "optimizer", "optimizer state")
           for size in _param_sizes(graph) for _ in range(regime.states_per_param)]
    if regime.step_on_device:
        out += [Storage(Poly.const(4), "optimizer", "step") for _ in range(
            step_scalar_bytes(regime.optimizer, len(graph.params)) // 4)]
    return out


def _shapes(graph: Graph, regime: Regime) -> list[tuple[int, int]]:
    """(elements, dim 0) of each parameter in model.parameters() order."""
    return [(v.size.eval(1, 1) // regime.param_elt, v.rows) for v in graph.params]


def _finetune_states(graph: Graph, regime: Regime) -> tuple[list[Storage], list[list[Storage]]]:
    """(shared qmaps, state storages per parameter) of a memcalc.tape.finetune_optim optimizer."""
    shapes = _shapes(graph, regime)
    dev = regime.device
    shared = [Storage(Poly.const(b), "optimizer", "qmap")
              for b in ft.shared_allocations(regime.optimizer, [n for n, _ in shapes], dev)]
    per = [[Storage(Poly.const(b), "optimizer", "optimizer state")
            for b in ft.state_allocations(regime.optimizer, n, rows, dev)] for n, rows in shapes]
    return shared, per


def _finetune_optimizer(mem: Memory, graph: Graph, regime: Regime, first_step: bool,
                        per: list[list[Storage]], shared: list[Storage]) -> None:
    """The update loop, parameter by parameter: in the first step each parameter's states are
    created just before its update (Optimizer8bit.step, Adafactor.step), so the peak is at the
    parameter k maximising states(0..k) + temporaries(k); qmaps (CUDA) come with the first."""
    g = regime.granularity
    temps = ft.step_temporaries(regime.optimizer, _shapes(graph, regime), regime.param_elt,
                                regime.device, g)
    if not temps:
        return
    k = max(range(len(temps)), key=temps.__getitem__)
    if first_step:
        cum, best = 0, None
        for i, sts in enumerate(per):
            cum += sum(round_up(st.size.eval(1, 1), g) for st in sts)
            if best is None or cum + temps[i] > best[0]:
                best = (cum + temps[i], i)
        k = best[1]
        for st in (shared if regime.device == "cuda" else []) + [st for sts in per[:k + 1] for st in sts]:
            mem.hold(st)
    if temps[k]:
        tmp = Storage(Poly.const(temps[k]), "temporaries", "optimizer temporaries")
        mem.hold(tmp)
        mem.mark("optimizer.step")
        mem.release(tmp)
    if first_step:
        for st in [st for sts in per[k + 1:] for st in sts]:
            mem.hold(st)


def _clip(mem: Memory, graph: Graph, regime: Regime) -> None:
    """clip_grad_norm_ between backward and optimizer.step (memcalc.tape.optimizer.clip_bytes)."""
    if regime.max_grad_norm is None:
        return
    numels = [n for n, _ in _shapes(graph, regime)]
    nbytes = clip_bytes(numels, regime.param_elt, regime.device, regime.granularity)
    tmp = Storage(Poly.const(nbytes), "temporaries", "clip_grad_norm_ norms")
    mem.hold(tmp)
    mem.mark("clip_grad_norm_")
    mem.release(tmp)


def simulate_step(graph: Graph, regime: Regime, first_step: bool, constants: dict[str, int],
                  with_optimizer: bool = True, fsdp: Fsdp | None = None,
                  record: bool | dict = False) -> list:
    """The kept moments of one step (phases forward, backward, optimizer). Without the
    optimizer, states and temporaries are left out (memcalc.parallel.data adds each rank's own).
    With `record`, the Memory instead: its log holds every instant (for memcalc.depth, which
    adds the optimizer's temporaries at each depth and derives no clipping nor memcalc.tape.
    finetune_optim optimizer: memcalc.depth.supported).

    >>> from memcalc.engine import build_graph
    >>> from memcalc.specs import ModelSpec; from memcalc.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> moments = simulate_step(build_graph(ModelSpec.preset("gpt2"), regime), regime, False, {})
    >>> sorted({m.phase for m in moments})
    ['backward', 'forward', 'optimizer']
    """
    sim = StepSimulator(graph, fsdp, record)
    sim.setup()
    for name, nbytes in constants.items():
        sim.mem.hold(Storage(Poly.const(nbytes), name, name))
    finetune = regime.optimizer in ft.BNB + ("adafactor",)
    shared, per = _finetune_states(graph, regime) if finetune and with_optimizer else ([], [])
    for st in shared if regime.device == "cpu" else []:  # qmaps made at construction
        sim.mem.hold(st)
    states = _optimizer_storages(graph, regime) if with_optimizer and not finetune else []
    states += [st for sts in per for st in sts] + (shared if regime.device == "cuda" else [])
    if not first_step:
        for st in states:
            sim.mem.hold(st)
    sim.hold_inputs()
    for micro in range(min(regime.grad_accum, 2)):  # micro-steps >= 2 are alike
        sim.mem.micro = micro
        sim.micro_step()
    mem = sim.mem
    mem.phase, mem.where = "optimizer", "optimizer"
    if record is not False:  # the temporaries' bytes are not affine in depth (a largest parameter):
        if first_step:  # memcalc.depth adds them at each depth
            for st in states:
                mem.hold(st)
        mem.mark("optimizer.step")
        return mem
    _clip(mem, graph, regime)
    if finetune and with_optimizer:
        _finetune_optimizer(mem, graph, regime, first_step, per, shared)
        mem.mark("optimizer.step")
        return mem.moments
    if first_step:
        for st in states:
            mem.hold(st)
    temp = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                           _param_sizes(graph)) if with_optimizer else 0
    if temp:
        tmp = Storage(Poly.const(temp), "temporaries", "optimizer temporaries")
        mem.hold(tmp)
        mem.mark("optimizer.step")
        mem.release(tmp)
    mem.mark("optimizer.step")
    return mem.moments
