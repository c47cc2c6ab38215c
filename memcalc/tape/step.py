"""A whole training step over a forward program: micro-steps, then the optimizer.

Steady state (steps >= 2): optimizer states alive from the start, grads None (zero_grad with
set_to_none=True), created in the first micro-step's backward and accumulated in place by later
ones. First step: no optimizer state until optimizer.step() creates it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError
from memcalc.core.poly import Poly
from memcalc.engine.regime import Regime
from memcalc.tape.graph import Graph, Storage
from memcalc.allocator.rules import round_up
from memcalc.tape import finetune_optim as ft
from memcalc.tape.optimizer import clip_bytes, step_scalar_bytes, transient_bytes
from memcalc.parallel.fsdp import rank_elements
from memcalc.tape.ledger import Memory
from memcalc.tape.moment import Moment
from memcalc.tape.simulate import StepSimulator

if TYPE_CHECKING:
    from memcalc.parallel.fsdp import Fsdp


def _param_sizes(graph: Graph) -> list[int]:
    return [v.size.eval(1, 1) for v in graph.trainable_params]


def _optimizer_storages(graph: Graph, regime: Regime) -> list[Storage]:
    """One storage per state tensor (each is its own allocation): exp_avg and exp_avg_sq, or
    momentum_buffer, per trainable parameter (torch.optim skips a parameter whose .grad is
    None), plus Adam's 4-byte `step` scalars, which live on the CPU
    unless the device is the CPU (adam.py: `torch.tensor(0.0)` without a device)."""
    polys: dict[int, Poly] = {}  # one Poly per size (Memory reads each size object once)
    out = [Storage(polys.get(size) or polys.setdefault(size, Poly.const(size)), "optimizer", "optimizer state")
           for size in _param_sizes(graph) for _ in range(regime.states_per_param)]
    if regime.step_on_device:
        step = Poly.const(4)
        out += [Storage(step, "optimizer", "step") for _ in range(
            step_scalar_bytes(regime.optimizer, len(graph.trainable_params)) // 4)]
    return out


def transient(graph: Graph, regime: Regime) -> int:
    """Peak optimizer temporaries: one parameter group, or the HF Trainer's two (decay and
    no-decay, memcalc.families.call_path.trainer_param_groups), stepped one after the other."""
    if regime.hf_trainer:
        from memcalc.families.call_path import trainer_param_groups

        return max(transient_bytes(regime.optimizer, regime.optimizer_impl, decay, sizes)
                   for sizes, decay in trainer_param_groups(graph, regime.weight_decay))
    return transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                           _param_sizes(graph))


def trainable_shapes(graph: Graph) -> list[tuple[int, int]]:
    """(elements, dim 0) of each trainable parameter (those with a .grad, which the optimizer
    and clip_grad_norm_ visit) in model.parameters() order."""
    return [(v.size.eval(1, 1) // v.elt, v.rows) for v in graph.trainable_params]


def _optimizer_shapes(graph: Graph) -> list[tuple[int, int, tuple[int, int] | None]]:
    """(elements, dim 0, last two dims at >= 3 dims else None) of each trainable parameter, in
    model.parameters() order: what memcalc.tape.finetune_optim sizes Adafactor's states by."""
    return [(n, rows, v.last2) for (n, rows), v in zip(trainable_shapes(graph), graph.trainable_params)]


def trainable_elt(graph: Graph) -> int:
    """The one element size of the trainable parameters (the parameter dtype; fp32 for LoRA
    adapters under every precision). Parameters of two dtypes (bf16 biases or modules_to_save
    copies beside fp32 adapters) form several foreach groups, which the optimizer and clipping
    temporaries here do not model."""
    elts = {v.elt for v in graph.trainable_params}
    if len(elts) > 1:
        raise NotModelledError("lora", "trainable parameters of two dtypes (fp32 adapters beside "
                               "bf16 biases or modules_to_save copies) with this optimizer or clipping",
                               "use bias='none' and no modules_to_save, or precision fp32/bf16-amp")
    return elts.pop() if elts else 4


def _param_optimizers(graph: Graph, regime: Regime) -> list[str]:
    """The optimizer each parameter is stepped with: the HF Trainer keeps nn.Embedding weights'
    bitsandbytes states in 32 bits (trainer.py create_optimizer: register_module_override(
    module, 'weight', {'optim_bits': 32}); measured with validate --trainer)."""
    if not (regime.hf_trainer and regime.optimizer in ft.THIRTY_TWO_BIT):
        return [regime.optimizer] * len(graph.trainable_params)
    from memcalc.families.call_path import is_embedding

    return [ft.THIRTY_TWO_BIT[regime.optimizer] if is_embedding(v.label) else regime.optimizer
            for v in graph.trainable_params]


def finetune_states(graph: Graph, regime: Regime) -> tuple[list[Storage], list[list[Storage]]]:
    """(shared qmaps, state storages per parameter) of a memcalc.tape.finetune_optim optimizer."""
    shapes = _optimizer_shapes(graph)
    dev = regime.device
    shared = [Storage(Poly.const(b), "optimizer", "qmap")
              for b in ft.shared_allocations(regime.optimizer, [n for n, _, _ in shapes], dev)]
    per = [[Storage(Poly.const(b), "optimizer", "optimizer state")
            for b in ft.state_allocations(opt, n, rows, dev, last2)]
           for opt, (n, rows, last2) in zip(_param_optimizers(graph, regime), shapes)]
    return shared, per


def finetune_temporaries(graph: Graph, regime: Regime) -> list[int]:
    """ft.step_temporaries, per parameter when the Trainer's 32-bit overrides apply (bitsandbytes
    carries nothing from one parameter's update to the next)."""
    args = (trainable_elt(graph), regime.device, regime.granularity)
    names, shapes = _param_optimizers(graph, regime), _optimizer_shapes(graph)
    if len(set(names)) <= 1:
        return ft.step_temporaries(regime.optimizer, shapes, *args)
    return [ft.step_temporaries(name, [shape], *args)[0] for name, shape in zip(names, shapes)]


def _finetune_optimizer(mem: Memory, graph: Graph, regime: Regime, first_step: bool,
                        per: list[list[Storage]], shared: list[Storage]) -> None:
    """The update loop, parameter by parameter: in the first step each parameter's states are
    created just before its update (Optimizer8bit.step, Adafactor.step), so the peak is at the
    parameter k maximising states(0..k) + temporaries(k); qmaps (CUDA) come with the first."""
    g = regime.granularity
    temps = finetune_temporaries(graph, regime)
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


def clip_numels(graph: Graph, regime: Regime) -> list[int]:
    """Elements of each gradient clip_grad_norm_ takes a norm of: the whole trainable parameters;
    under FSDP2 the rank's local shards (Shard(0) DTensors: torch._foreach_norm runs on the local
    tensors, each norm a Partial 0-dim DTensor; rank 0 holds the largest chunks). On CPU only their
    count matters (memcalc.tape.optimizer.clip_bytes).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> g = Graph(); _ = g.param("w", Poly.const(40), 4); g.params[0].rows = 5
    >>> clip_numels(g, Regime.of(TrainingConfig(micro_batch=1, seq_len=8, world_size=2, sharding="zero3")))
    [6]
    """
    shapes = trainable_shapes(graph)
    if regime.fsdp:
        return [rank_elements(n, rows, regime.data_parallel, 0) for n, rows in shapes]
    return [n for n, _ in shapes]


def _clip(mem: Memory, graph: Graph, regime: Regime) -> None:
    """clip_grad_norm_ between backward and optimizer.step (memcalc.tape.optimizer.clip_bytes)."""
    if regime.max_grad_norm is None:
        return
    nbytes = clip_bytes(clip_numels(graph, regime), trainable_elt(graph), regime.device, regime.granularity)
    tmp = Storage(Poly.const(nbytes), "temporaries", "clip_grad_norm_ norms")
    mem.hold(tmp)
    mem.mark("clip_grad_norm_")
    mem.release(tmp)


def simulate_step(graph: Graph, regime: Regime, first_step: bool, constants: dict[str, int],
                  with_optimizer: bool = True, fsdp: Fsdp | None = None,
                  record: bool | dict = False, memory: Memory | None = None) -> list:
    """The kept moments of one step (phases forward, backward, optimizer). Without the
    optimizer, states and temporaries are left out (memcalc.parallel.data adds each rank's own).
    With `record`, the Memory instead: its log holds every instant (for memcalc.engine.depth, which
    adds clipping's and the optimizer's temporaries at each depth, and a memcalc.tape.
    finetune_optim optimizer's first-step states up to its peak parameter), and its
    `state_storages` what the steady state holds from the start.

    >>> from memcalc.engine.simulation import build_graph
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> moments = simulate_step(build_graph(ModelSpec.preset("gpt2"), regime), regime, False, {})
    >>> sorted({m.phase for m in moments})
    ['backward', 'forward', 'optimizer']
    """
    sim = StepSimulator(graph, fsdp, record, memory)  # memory: memcalc.engine.allocations' event log
    sim.setup()
    for name, nbytes in constants.items():
        sim.mem.hold(Storage(Poly.const(nbytes), name, name))
    finetune = regime.optimizer in ft.BNB + ("adafactor",)
    shared, per = finetune_states(graph, regime) if finetune and with_optimizer else ([], [])
    for st in shared if regime.device == "cpu" else []:  # qmaps made at construction
        sim.mem.hold(st)
    states = _optimizer_storages(graph, regime) if with_optimizer and not finetune else []
    states += [st for sts in per for st in sts] + (shared if regime.device == "cuda" else [])
    if not first_step:
        for st in states:
            sim.mem.hold(st)
    if record is not False:  # what the steady state holds and the first step lacks (memcalc.engine.depth)
        sim.mem.state_storages = states
    sim.hold_inputs()
    for micro in range(min(regime.grad_accum, 2)):  # micro-steps >= 2 are alike
        sim.mem.micro = micro
        sim.micro_step()
    mem = sim.mem
    mem.phase, mem.where = "optimizer", "optimizer"
    if record is not False:  # the temporaries' bytes are not affine in depth (a largest parameter):
        if regime.max_grad_norm is not None:  # memcalc.engine.depth adds them at each depth, clipping's
            mem.mark("clip_grad_norm_")  # norms here (_clip), before the first step's states
        if first_step:
            for st in states:
                mem.hold(st)
        mem.mark("optimizer.step")
        return mem
    _clip(mem, graph, regime)
    if finetune and with_optimizer:
        _finetune_optimizer(mem, graph, regime, first_step, per, shared)
        mem.mark("optimizer.step")
        return mem.moments
    _optimizer_step(mem, graph, regime, states if first_step else [], with_optimizer)
    return mem.moments


def _optimizer_step(mem: Memory, graph: Graph, regime: Regime, created: list[Storage],
                    with_optimizer: bool) -> None:
    """optimizer.step() after clipping: the states `created` (the first step's), then the
    update's temporaries."""
    for st in created:
        mem.hold(st)
    temp = transient(graph, regime) if with_optimizer else 0
    if temp:
        tmp = Storage(Poly.const(temp), "temporaries", "optimizer temporaries")
        mem.hold(tmp)
        mem.mark("optimizer.step")
        mem.release(tmp)
    mem.mark("optimizer.step")


def simulate_both(graph: Graph, regime: Regime, constants: dict[str, int], with_optimizer: bool = True,
                  fsdp: Fsdp | None = None) -> tuple[list, list] | None:
    """(steady, first-step) kept moments, as simulate_step(first_step=False) and (True) give
    them, from one walk through the micro-steps: until optimizer.step() the two steps differ
    only by the optimizer states (held from the start in the steady state, made by the first
    optimizer.step()), the same bytes at every instant, so the same instants are kept
    (Memory.mark's tests compare differences of totals, where a common term cancels) and the
    first step's are the steady ones less the states (their totals and live sizes; the
    first step's categories are not read: memcalc.estimate). The first step's optimizer
    phase is walked on its own from the storages alive at the end of backward, less the
    states. None for a memcalc.tape.finetune_optim optimizer (its states are made parameter
    by parameter: simulate_step twice).

    >>> from memcalc.engine.simulation import build_graph
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> steady, first = simulate_both(build_graph(ModelSpec.preset("gpt2"), regime), regime, {})
    >>> graph = build_graph(ModelSpec.preset("gpt2"), regime)
    >>> [m.total.terms for m in first] == [m.total.terms for m in simulate_step(graph, regime, True, {})]
    True
    """
    if regime.optimizer in ft.BNB + ("adafactor",):
        return None
    sim = StepSimulator(graph, fsdp)
    sim.setup()
    for name, nbytes in constants.items():
        sim.mem.hold(Storage(Poly.const(nbytes), name, name))
    states = _optimizer_storages(graph, regime) if with_optimizer else []
    if states and sim.mem.frontiers:  # an instant before the states: not a common term
        return None
    for st in states:
        sim.mem.hold(st)
    sim.hold_inputs()
    for micro in range(min(regime.grad_accum, 2)):  # micro-steps >= 2 are alike
        sim.mem.micro = micro
        sim.micro_step()
    mem = sim.mem
    # the first step at the end of backward: the same storages less the states
    fork = Memory(granularity=mem.granularity)
    held = {id(st) for st in states}
    for key, (n, st, _, category, _) in mem.holds.items():
        if key not in held:
            for _ in range(n):
                fork.hold(st, category)
    for m in (mem, fork):
        m.phase, m.where, m.micro = "optimizer", "optimizer", mem.micro
        _clip(m, graph, regime)
    _optimizer_step(mem, graph, regime, [], with_optimizer)
    _optimizer_step(fork, graph, regime, states, with_optimizer)
    steady = mem.moments
    less = _less(states)
    first = [less(m) for m in steady if m.phase != "optimizer"] + fork.moments
    return steady, first


def _less(states: list[Storage]):
    """A function from a steady-state moment to the same instant without the `states`."""
    total = Poly()
    counts: dict[tuple, int] = {}
    for st in states:
        total = total + st.size
        key = tuple(sorted(st.size.terms.items()))
        counts[key] = counts.get(key, 0) + 1

    def less(m: Moment) -> Moment:
        sizes = tuple((p, n) for p, n in ((p, n - counts.get(tuple(sorted(p.terms.items())), 0))
                                          for p, n in m.sizes) if n)
        by_category = {c: p - total if c == "optimizer" else p for c, p in m.by_category.items()}
        return Moment(m.phase, m.label, m.total - total, by_category, sizes)

    return less
