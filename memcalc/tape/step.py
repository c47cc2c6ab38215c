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
from memcalc.tape.optimizer import step_scalar_bytes, transient_bytes
from memcalc.tape.simulate import StepSimulator

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


def simulate_step(graph: Graph, regime: Regime, first_step: bool, constants: dict[str, int],
                  with_optimizer: bool = True, fsdp: Fsdp | None = None,
                  record: bool | dict = False) -> list:
    """The kept moments of one step (phases forward, backward, optimizer). Without the
    optimizer, states and temporaries are left out (memcalc.parallel.data adds each rank's own).
    With `record`, the Memory instead: its log holds every instant (for memcalc.depth).

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
    states = _optimizer_storages(graph, regime) if with_optimizer else []
    if not first_step:
        for st in states:
            sim.mem.hold(st)
    sim.hold_inputs()
    for micro in range(min(regime.grad_accum, 2)):  # micro-steps >= 2 are alike
        sim.mem.micro = micro
        sim.micro_step()
    mem = sim.mem
    mem.phase, mem.where = "optimizer", "optimizer"
    if first_step:
        for st in states:
            mem.hold(st)
    if record is not False:  # the temporaries' bytes are not affine in depth (a largest parameter):
        mem.mark("optimizer.step")  # memcalc.depth adds them at each depth
        return mem
    temp = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                           _param_sizes(graph)) if with_optimizer else 0
    if temp:
        tmp = Storage(Poly.const(temp), "temporaries", "optimizer temporaries")
        mem.hold(tmp)
        mem.mark("optimizer.step")
        mem.release(tmp)
    mem.mark("optimizer.step")
    return mem.moments
