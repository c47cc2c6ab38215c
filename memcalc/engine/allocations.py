"""The engine's own allocation sequence at a numeric shape: every storage the simulator
(memcalc.tape.simulate, memcalc.tape.step) holds, as the caching allocator sees it.

A storage is allocated when it is first held and freed when its last hold is released
(memcalc.tape.simulate.Memory); EventMemory walks the same step with the same rules and writes
those two moments down in order, sized at (b, s), at the model's full depth (no depth derivation:
the order, not only the peak, is what the allocator reads). The run, as torch makes it
(validate/measure/step.py train_step, the loop the validator measures):
- model construction: parameters then buffers, in module order (StepSimulator.setup);
- the first step: the batch, forward, backward, clipping, optimizer.step() creating the optimizer
  states (torch.optim creates them lazily), zero_grad(set_to_none=True) freeing every .grad in
  parameter order, then `del ids, batch` freeing the inputs;
- steady steps: the same, the states alive from the start.
The cuBLAS workspace goes through the caching allocator at the first matmul
(aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle -> getCUDABlasLtWorkspace /
cublasSetWorkspace with c10::cuda::CUDACachingAllocator::raw_alloc): it is allocated right after the
first linear's output (at::empty before the cuBLAS call) and kept.
Gradient accumulation: every micro-step is replayed (the simulator walks two; micro-steps >= 2
repeat the second one's events with fresh handles for what each makes).
"""
from __future__ import annotations

import math
from dataclasses import replace, dataclass, field
from typing import NamedTuple

from memcalc.core.errors import NotModelledError
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.tape.graph import Graph, Storage
from memcalc.tape.simulate import Memory
from memcalc.engine.adafactor_events import RENEW, RENEWED, adafactor_temporaries
from memcalc.engine.bnb_events import STATES, bnb_temporaries

WORKSPACE = "cublas_workspace"  # memcalc.allocator.rules.device_constants' name
TEMPORARIES = "optimizer temporaries"  # memcalc.tape.step._optimizer_step's one storage for them


class Event(NamedTuple):
    """One allocator call: kind 'alloc' or 'free', the handle naming the storage, its bytes as
    requested (before the allocator's rounding), and where in the run it happens (a named tuple:
    tens of thousands are made per shape, and a capacity search asks for many shapes)."""

    kind: str
    handle: int
    nbytes: int
    step: int
    """0: model construction; 1: the first step; 2 and on: steady steps."""
    phase: str
    """setup, forward, backward, optimizer or end (zero_grad and the batch's release)."""
    label: str
    """The storage's label (memcalc.tape.graph.Storage.label)."""

    def as_tuple(self) -> tuple:
        """The event as memcalc.allocator.replay_events reads it."""
        return ("alloc", self.handle, self.nbytes) if self.kind == "alloc" else ("free", self.handle)


class EventMemory(Memory):
    """A Memory that writes down the allocator calls instead of tracking totals: ("alloc" |
    "free", storage, phase, micro, where) in order. Holds are counted per storage as Memory counts them.

    >>> from memcalc.core.poly import Poly
    >>> mem = EventMemory(); st = Storage(Poly.const(8), "activations", "x")
    >>> mem.hold(st); mem.hold(st); mem.release(st); mem.release(st)
    >>> [(k, s.label) for k, s, *_ in mem.events]
    [('alloc', 'x'), ('free', 'x')]
    """

    def __init__(self, record: bool | dict = False, granularity: int = 1) -> None:  # noqa: ARG002
        self.granularity = granularity
        self.holds: dict = {}
        self.events: list[tuple] = []
        self.phase = "setup"
        self.where: object = None
        self.micro = 0
        self.log = None
        self.frontiers: dict = {}

    def hold(self, st: Storage, category: str | None = None) -> None:  # noqa: ARG002
        """One more reference; allocated on the first."""
        found = self.holds.get(id(st))
        if found is not None:
            found[0] += 1
            return
        self.holds[id(st)] = [1, st]
        self.events.append(("alloc", st, self.phase, self.micro, self.where))

    def release(self, st: Storage) -> None:
        """One reference less; freed on the last. A gradient stolen into .grad (StepSimulator.
        _accumulate holds the .grad storage, then releases the incoming one: accumulate_grad.h takes
        the tensor itself when nothing else holds it) is no allocation: ("steal", .grad, incoming)."""
        found = self.holds[id(st)]
        found[0] -= 1
        if not found[0]:
            del self.holds[id(st)]
            last = self.events[-1] if self.events else None
            if last is not None and last[0] == "alloc" and last[1].label == "grad" and last[1].size is st.size:
                self.events[-1] = ("steal", last[1], st, self.micro, self.where)
                return
            self.events.append(("free", st, self.phase, self.micro, self.where))

    def mark(self, label: str) -> None:
        """Nothing to keep: the events are the record."""

    @property
    def moments(self) -> list:
        """None kept (memcalc.tape.step.simulate_step returns them)."""
        return []


def _first_matmul(graph: Graph) -> int | None:
    """Index of the first forward node that multiplies by a 2-D parameter (a linear: cuBLAS),
    embedding lookups (index_select, no cuBLAS) left out."""
    for i, node in enumerate(graph.nodes):
        if "embed" in node.name or node.name.endswith((" wte", "wte embedding", "wpe embedding")):
            continue
        for v in node.inputs:
            if v.is_param and v.rows and v.size.eval(1, 1) > v.rows * v.elt:
                return i
    return None


def _walk(graph: Graph, regime: Regime, first_step: bool, constants: dict, fsdp: object) -> list[tuple]:
    from memcalc.tape.step import simulate_step

    mem = EventMemory(granularity=graph.granularity)
    simulate_step(graph, regime, first_step, constants, with_optimizer=regime.data_parallel == 1,
                  fsdp=fsdp, memory=mem)
    return mem.events, mem


class _Sizer:
    """Bytes of a storage at (b, s) (a fraction of a byte, as balanced MoE routing's shares, up)."""

    def __init__(self, b: int, s: int) -> None:
        self.b, self.s, self.cache = b, s, {}

    def __call__(self, st: Storage) -> int:
        found = self.cache.get(id(st.size))
        if found is None:
            v = st.size.eval(self.b, self.s)
            found = self.cache[id(st.size)] = (st.size, int(v) if v == int(v) else math.ceil(v))
        return found[1]


@dataclass
class EngineSequence:
    """The engine's allocation sequence: construction, the first step, one steady step (each a list
    of Event), and how steady steps repeat (`steady_step(k)` renames what each step makes)."""

    construction: list[Event]
    first: list[Event]
    steady: list[Event]
    repeats: dict = field(default_factory=dict)
    """'first' / 'steady' -> (start, end, extra): events[start:end] are a micro-step (the second)
    that micro-steps 3 and on repeat `extra` more times, with the same handles (it frees all it
    makes); memcalc.engine.reserved replays the repeats until one reserves nothing new."""

    def expanded(self, which: str) -> list[Event]:
        """The first or the steady step with every micro-step written out."""
        events = getattr(self, which)
        found = self.repeats.get(which)
        if found is None:
            return events
        start, end, extra = found
        return events[:end] + events[start:end] * extra + events[end:]

    def steady_step(self, k: int) -> list[Event]:
        """The k-th steady step (k >= 2): `steady` with fresh handles for what it allocates."""
        return _renamed(self.expanded("steady"), k, (k - 1) * _span(self))

    def events(self, steps: int = 3) -> list[Event]:
        """Construction, the first step, then steps - 1 steady steps, every micro-step written out."""
        out = self.construction + self.expanded("first")
        for k in range(2, steps + 1):
            out += self.steady_step(k)
        return out


def _span(seq: EngineSequence) -> int:
    return 1 + max((e.handle for e in seq.construction + seq.first + seq.steady), default=0)


def _renamed(events: list[Event], step: int, offset: int) -> list[Event]:
    born = {e.handle for e in events if e.kind == "alloc"}
    return [Event(e.kind, e.handle + offset if e.handle in born else e.handle, e.nbytes, step, e.phase, e.label)
            for e in events]


class _Handles:
    """Integer handles by storage (the storage kept, so its id is never reused); `alias` names a
    steady step's copy of a storage by the first step's handle."""

    def __init__(self) -> None:
        self.ids: dict[int, tuple[Storage, int]] = {}

    def __call__(self, st: Storage) -> int:
        found = self.ids.get(id(st))
        if found is None:
            found = self.ids[id(st)] = (st, len(self.ids))
        return found[1]

    def alias(self, st: Storage, to: Storage) -> None:
        self.ids[id(st)] = (st, self(to))


def engine_sequence(model: ModelSpec, training: TrainingConfig, regime: Regime | None = None) -> EngineSequence:
    """The allocation sequence of `model` under `training` at its (micro_batch, seq_len).

    >>> seq = engine_sequence(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> seq.construction[0].label, seq.first[0].label, len(seq.construction)  # 148 parameters
    ('transformer.wte.weight', 'input_ids', 148)
    >>> [e.label for e in seq.first if e.label == "cublas_workspace"]
    ['cublas_workspace']
    """
    from memcalc.engine.run import regime_for as _regime

    regime = regime or _regime(model, training)
    size = _Sizer(training.micro_batch, training.seq_len)
    graph, shapes, first_raw, first_mem, cut_first, steady_raw, steady_mem, cut_steady, matmul, temps = \
        _walks(model, regime)
    handle = _Handles()
    construction = [e for e in _events(first_raw[:cut_first], size, handle, 0, None, regime)[0]
                    if e.label != WORKSPACE]
    before = [e[1] for e in steady_raw[:cut_steady] if e[0] == "alloc" and size(e[1])]
    kept_first = _kept(first_mem, before, size, handle)
    workspace = [e for e in first_raw[:cut_first] if e[1].category == WORKSPACE]
    first, first_repeat = _events(workspace + first_raw[cut_first:], size, handle, 1, matmul, regime, temps)
    first += _end_of_step(first_mem, kept_first, size, handle, 1)
    kept_steady = {id(st) for st in before}
    steady, steady_repeat = _events(steady_raw[cut_steady:], size, handle, 2, None, regime, temps)
    steady += _end_of_step(steady_mem, kept_steady, size, handle, 2)
    if regime.data_parallel > 1:  # each rank's own optimizer states (memcalc.parallel.data)
        _rank_optimizer(first, steady, shapes, regime, len(handle.ids))
    repeats = {k: v for k, v in (("first", first_repeat), ("steady", steady_repeat)) if v is not None}
    return EngineSequence(construction, first, steady, repeats)


WALKS = 8
"""(model, regime)s whose walks _walks keeps (the capacity searches ask for one regime at many shapes)."""
_WALKS: dict = {}


def _walks(model: ModelSpec, regime: Regime) -> tuple:
    """The shape-free part of engine_sequence, kept for the last WALKS (model, regime)s: the walks
    of the first and a steady step (EventMemory's raw events, with storages sized by Polys in
    (b, s): the order does not depend on the shape, the regime holds the shape conditions a
    program branches on), where each step's batch is made, the first matmul, the optimizer's
    temporaries. engine_sequence sizes them at its (micro_batch, seq_len)."""
    from memcalc.engine.simulation import _prepared

    key = (model, _walk_regime(regime))
    found = _WALKS.get(key)
    if found is not None:
        return found
    graph, constants, shapes, _, fsdp = _prepared(model, regime, True)
    first_raw, first_mem = _walk(graph, regime, True, constants, fsdp)
    cut_first = _batch_at(first_raw, {id(v.storage) for v in graph.inputs})
    if fsdp is not None:  # a fresh Fsdp (it keeps what it gathered)
        graph, constants, _, _, fsdp = _prepared(model, regime, True)
    steady_raw, steady_mem = _walk(graph, regime, False, constants, fsdp)
    matmul = _first_matmul(graph) if constants.get(WORKSPACE) else None
    cut_steady = _batch_at(steady_raw, {id(v.storage) for v in graph.inputs})
    found = (graph, shapes, first_raw, first_mem, cut_first, steady_raw, steady_mem, cut_steady, matmul,
             optimizer_temporaries(graph, regime))
    _WALKS[key] = found
    while len(_WALKS) > WALKS:
        del _WALKS[next(iter(_WALKS))]
    return found


def _walk_regime(regime: Regime) -> Regime:
    """The regime a walk is kept under: micro-steps >= 2 are alike (memcalc.tape.step walks two
    and _events repeats the second), so every count past 2 shares one walk, except under the HF
    Trainer, whose held batches read the count (memcalc.families.call_path.held_batches).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> r = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, grad_accum=64))
    >>> _walk_regime(r) == _walk_regime(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, grad_accum=3)))
    True
    """
    if regime.grad_accum <= 2 or regime.hf_trainer:
        return regime
    return replace(regime, grad_accum=2)


def _rank_optimizer(first: list[Event], steady: list[Event], shapes: list, regime: Regime, handle: int) -> None:
    """The largest rank's optimizer states (made by its first optimizer.step(), one block: the
    states of a data-parallel rank are not split per parameter here) and step temporaries, before
    the end of each step; what memcalc.queries.estimate adds per rank."""
    from memcalc.parallel.data import rank_optimizer_bytes_all

    states, temps = max(rank_optimizer_bytes_all(shapes, regime.master_elt, regime), key=sum)
    for events, step in ((first, 1), (steady, 2)):
        at = next((i for i, e in enumerate(events) if e.phase == "end"), len(events))
        add = []
        if states and step == 1:
            add.append(Event("alloc", handle, states, step, "optimizer", "rank optimizer states"))
        if temps:
            add += [Event("alloc", handle + 1, temps, step, "optimizer", "rank optimizer temporaries"),
                    Event("free", handle + 1, temps, step, "optimizer", "rank optimizer temporaries")]
        events[at:at] = add


def _batch_at(raw: list[tuple], inputs: set[int]) -> int:
    """Where the batch is made: the first input's allocation (the end when there is none)."""
    return next((i for i, e in enumerate(raw) if id(e[1]) in inputs), len(raw))


def _kept(first_mem: EventMemory, before: list[Storage], size: _Sizer, handle: _Handles) -> set[int]:
    """The storages the first step leaves for the next: those a steady step holds before its batch
    (parameters, buffers, workspace, optimizer states), matched by (category, label, bytes) in order;
    each steady copy is named by the first step's handle."""
    left: dict[tuple, list[Storage]] = {}
    for _, st in first_mem.holds.values():
        left.setdefault((st.category, st.label, size(st)), []).append(st)
    kept = set()
    for st in before:
        same = left.get((st.category, st.label, size(st)))
        if not same:
            raise NotModelledError("allocations", f"a steady step holds {st.label!r} before its batch, which "
                                   "the first step does not leave alive", "report this model and step")
        mine = same.pop(0)
        kept.add(id(mine))
        if mine is not st:
            handle.alias(st, mine)
    return kept


def _events(raw: list[tuple], size: _Sizer, handle: _Handles, step: int, matmul: int | None,
            regime: Regime, temporaries: list | None = None) -> tuple[list[Event], tuple | None]:
    """Raw EventMemory events as Events: zero-byte storages left out (the caching allocator returns
    a null pointer for them without a block), the cuBLAS workspace moved to the first matmul; and
    how micro-steps 3 and on repeat the second (EngineSequence.repeats), or None where they are
    written out (something the second makes outlives it) or there are none."""
    out, workspace, second = [], None, []
    states = _placed_states(raw, temporaries)
    placed = {id(st) for st in states}
    sizes, ids = size.cache, handle.ids  # (the lookups of size() and handle(), inlined)
    for kind, st, phase, micro, where in raw:
        if id(st) in placed and kind == "alloc":  # made where the update's temporaries say
            continue
        if kind == "steal":  # .grad is the incoming gradient's block: its handle goes on
            handle.alias(st, phase)
            continue
        found = sizes.get(id(st.size))
        n = found[1] if found is not None else size(st)
        if not n:
            continue
        if st.label == TEMPORARIES and temporaries is not None:  # the update's own allocations
            if kind == "alloc":
                out += _temporaries(temporaries, handle, step, states, size)
            continue
        if st.category == WORKSPACE and matmul is not None:
            workspace = Event("alloc", handle(st), n, step, "forward", st.label)
            continue
        found = ids.get(id(st))
        out.append(Event(kind, found[1] if found is not None else handle(st), n, step, phase, st.label))
        if micro == 1 and phase in ("forward", "backward"):
            second.append(len(out) - 1)  # (the same storages recur in every micro-step: by position)
        if workspace is not None and phase == "forward" and isinstance(where, int) and where >= matmul:
            out.append(workspace)
            workspace = None
    if workspace is not None:  # no matmul reached: at the start of the step
        out.insert(0, workspace)
        second = [i + 1 for i in second]
    extra = regime.grad_accum - 2
    if extra > 0 and second:
        start, end = second[0], second[-1] + 1
        if not _survivors(out[start:end]):  # the micro-step frees all it makes: replayed as it is
            return out, (start, end, extra)
        span = 1 + max(len(handle.ids), max(e.handle for e in out))
        out[end:end] = [e for k in range(extra) for e in _renamed(out[start:end], step, (k + 1) * span)]
    return out, None


def _placed_states(raw: list[tuple], temporaries: list | None) -> list[Storage]:
    """The optimizer states that bnb_temporaries' ("states", ...) entries place (those the first
    step makes, in parameter order), when the step has the update's temporaries; else none."""
    if not temporaries or not any(t[0] == STATES for t in temporaries):
        return []
    if not any(e[0] == "alloc" and e[1].label == TEMPORARIES for e in raw):
        return []
    return [e[1] for e in raw if e[0] == "alloc" and e[2] == "optimizer" and e[1].label == "optimizer state"]


def _survivors(events: list[Event]) -> set[int]:
    """Handles allocated in `events` and not freed there."""
    live: set[int] = set()
    for e in events:
        (live.add if e.kind == "alloc" else live.discard)(e.handle)
    return live


def optimizer_temporaries(graph: Graph, regime: Regime) -> list[tuple] | None:
    """The allocations optimizer.step() makes in steady state, one per tensor, as ("alloc" |
    "free", key, bytes) in order: the engine's one block of their peak (memcalc.tape.optimizer.
    transient_bytes, whose module says what each implementation makes) split as torch makes it.
    Per parameter group (the HF Trainer's two, stepped one after the other):
    - foreach Adam(W): `_foreach_add(grads, params)` with coupled weight decay (deleted before the
      sqrt), then `_foreach_sqrt(exp_avg_sqs)`: one tensor per parameter, freed at the end;
    - for-loop Adam(W): per parameter `grad.add(param)` (coupled weight decay), `exp_avg_sq.sqrt()`
      and its quotient `denom`, the sqrt freed at once and the previous parameter's denom when the
      loop variable is rebound;
    - SGD with coupled weight decay: the grads' copies (foreach: all, for-loop: one at a time).
    - bitsandbytes: `bnb_temporaries` (each parameter's update, its states before it in the first step);
    - transformers' Adafactor: memcalc.engine.adafactor_events (the same, one parameter at a time).

    >>> from memcalc.engine.simulation import build_graph
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, optimizer="adamw"))
    >>> temps = optimizer_temporaries(build_graph(ModelSpec.preset("gpt2"), regime), regime)
    >>> len(temps), temps[0]  # 148 sqrt copies made, then freed
    (296, ('alloc', (0, 'sqrt', 0), 154389504))
    """
    from memcalc.tape.bnb_states import BNB
    from memcalc.tape.step import _param_sizes

    if regime.optimizer in BNB:
        return bnb_temporaries(graph, regime)
    if regime.optimizer == "adafactor":
        return adafactor_temporaries(graph, regime)
    if regime.optimizer not in ("adam", "adamw", "sgd", "sgd-momentum"):
        return None
    if regime.hf_trainer:
        from memcalc.families.call_path import trainer_param_groups

        groups = trainer_param_groups(graph, regime.weight_decay)
    else:
        groups = [(_param_sizes(graph), regime.weight_decay)]
    impl = regime.optimizer_impl
    out: list[tuple] = []
    for g, (sizes, decay) in enumerate(groups):
        coupled = decay > 0 and regime.optimizer in ("adam", "sgd", "sgd-momentum")
        if impl == "fused":
            continue
        if regime.optimizer.startswith("sgd"):
            if coupled:
                out += _copies(g, "wd", sizes, impl == "foreach")
            continue
        if impl == "foreach":
            if coupled:
                out += _copies(g, "wd", sizes, True)
            out += _copies(g, "sqrt", sizes, True)
            continue
        for i, n in enumerate(sizes):  # the for-loop
            if coupled:
                out.append(("alloc", (g, "wd", i), n))
            out += [("alloc", (g, "sqrt", i), n), ("alloc", (g, "denom", i), n), ("free", (g, "sqrt", i), n)]
            if i:
                out.append(("free", (g, "denom", i - 1), sizes[i - 1]))
            if coupled:
                out.append(("free", (g, "wd", i), n))
        if sizes:
            out.append(("free", (g, "denom", len(sizes) - 1), sizes[-1]))
    return out


def _copies(group: int, what: str, sizes: list[int], together: bool) -> list[tuple]:
    """One tensor per parameter: all made then all freed (foreach), or each freed before the next."""
    made = [("alloc", (group, what, i), n) for i, n in enumerate(sizes)]
    freed = [("free", (group, what, i), n) for i, n in enumerate(sizes)]
    if together:
        return made + freed
    return [e for pair in zip(made, freed) for e in pair]


def _temporaries(temps: list[tuple], handle: _Handles, step: int, states: list | None = None,
                 size: _Sizer | None = None) -> list[Event]:
    """optimizer_temporaries as Events, each key under a handle of its own; a ("states", i, count)
    entry takes the next `count` of `states` (the first step's state storages, in parameter order);
    ("renew" | "renewed", key, n), a state replaced (memcalc.engine.adafactor_events.RENEW), is an
    alloc | free in a steady step (no `states` to place) and nothing in the first."""
    keys: dict = {}
    out = []
    left = list(states or [])
    for kind, key, n in temps:
        if kind == STATES:
            out += [Event("alloc", handle(st), size(st), step, "optimizer", st.label) for st in left[:n]]
            del left[:n]
            continue
        if kind in (RENEW, RENEWED):
            if states:
                continue
            kind = "alloc" if kind == RENEW else "free"
        if key not in keys:
            keys[key] = handle(Storage(None, "temporaries", str(key)))  # kept by `handle`: a fresh id
        out.append(Event(kind, keys[key], n, step, "optimizer", f"optimizer temporary {key[1]}"))
    return out


def _end_of_step(mem: EventMemory, keep: set[int], size: _Sizer, handle: _Handles, step: int) -> list[Event]:
    """zero_grad(set_to_none=True) frees every .grad in parameter order, then `del ids, batch` the
    inputs; anything else still held goes last. Storages in `keep` stay for the next step."""
    grads, inputs, rest = [], [], []
    for key, (_, st) in mem.holds.items():
        if key in keep or not size(st):
            continue
        (grads if st.category in ("gradients", "adapter_gradients") else
         inputs if st.category == "inputs" else rest).append(st)
    return [Event("free", handle(st), size(st), step, "end", st.label) for st in grads + inputs + rest]


def allocation_events(model: ModelSpec, training: TrainingConfig, steps: int = 3) -> list[tuple]:
    """The engine's allocation sequence over model construction, the first step and steps - 1
    steady steps (validate/measure/step.py run_steps' 3 by default), as memcalc.allocator.
    replay_events reads it: ("alloc", handle, nbytes) and ("free", handle); bytes as requested
    (before the allocator's rounding), at (micro_batch, seq_len). engine_sequence has each event's
    step, phase and storage label.

    >>> ev = allocation_events(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> ev[0], sum(e[0] == "alloc" for e in ev) - sum(e[0] == "free" for e in ev)  # parameters, states, step counters
    (('alloc', 0, 154389504), 592)
    """
    if steps < 1:
        raise NotModelledError("steps", f"need >= 1 step, got {steps}", "pass steps=3")
    return [e.as_tuple() for e in engine_sequence(model, training).events(steps)]
