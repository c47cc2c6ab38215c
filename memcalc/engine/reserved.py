"""Reserved memory of a training step: the engine's own allocation sequence
(memcalc.engine.allocations) replayed through the caching-allocator replica (memcalc.allocator).

The run is replayed as torch makes it: model construction, the first step, then steady steps until
a steady step reserves nothing new (no segment allocated or mapped during it; from then on every
step is the same, docs/ALLOCATOR.md: a second pass can reserve more than the first, so two passes
are not enough). Reserved memory is what max_memory_reserved reports: its peak over the whole run
(segments are only released under a device limit or by empty_cache, so without a limit it is the
reserved total after the last step). On device="cpu" there is no caching allocator: reserved is the
allocated figure (validate.measure.tracker counts what the CPU allocator holds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memcalc.engine.allocations import EngineSequence, Event

PHASES = ("forward", "backward", "optimizer")
MAX_STEPS = 32
"""Steady steps replayed at most before the replay stops looking for a step that reserves nothing
new (it says so: `steady` False)."""


@dataclass
class ReservedReplay:
    """What the replica reserves over the run."""

    peak_reserved_bytes: int
    """max_memory_reserved over construction, the first step and the steady steps."""
    first_step_reserved_bytes: int
    """Reserved at the end of the first step (its peak: nothing is released without a limit)."""
    phases: dict[str, int]
    """Reserved peak of each phase (forward, backward, optimizer) in the last, steady step."""
    peak_allocated_bytes: int
    """max_memory_allocated as the replica counts it (whole blocks: a large block's unsplit
    remainder of at most 1 MiB counts, should_split)."""
    steps: int
    """Steps replayed, the first included."""
    steady: bool
    """Whether a steady step reserved nothing new within MAX_STEPS."""
    oom: Event | None = None
    """The allocation the replica could not serve under the device limit (None: none)."""
    trace: list[tuple[int, int]] = field(default_factory=list)
    """With trace=True: (reserved, allocated) after every event, in order."""


def replay_sequence(seq: EngineSequence, settings: object = None, device_limit: int | None = None,
                    trace: bool = False) -> ReservedReplay:
    """Replay construction, the first step, then steady steps until one reserves nothing new.

    >>> from memcalc.engine.allocations import engine_sequence
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> r = replay_sequence(engine_sequence(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=64)))
    >>> r.steady, r.peak_reserved_bytes >= r.peak_allocated_bytes
    (True, True)
    """
    from memcalc.core.gc_pause import gc_paused as _gc_paused
    from memcalc.allocator.replica import CachingAllocator
    from memcalc.allocator.settings import AllocatorSettings

    if isinstance(settings, str):
        settings = AllocatorSettings.parse(settings)
    a = CachingAllocator(settings, device_limit)
    live: dict[int, object] = {}
    out = ReservedReplay(0, 0, {}, 0, 1, False)
    record = out.trace if trace else None
    with _gc_paused():
        try:
            _run(a, seq.construction, live, {}, record)
            _run_step(a, seq.first, seq.repeats.get("first"), live, {}, record)
            out.first_step_reserved_bytes = a.reserved_bytes
            for k in range(2, MAX_STEPS + 2):
                before = _reserving(a)
                phases: dict[str, int] = {}
                _run_step(a, seq.steady, seq.repeats.get("steady"), live, phases, record)
                out.steps = k
                out.phases = {p: phases.get(p, 0) for p in PHASES}
                if _reserving(a) == before:
                    out.steady = True
                    break
        except _OutOfMemory as err:
            out.oom = err.event
    out.peak_reserved_bytes = a.peak_reserved_bytes
    out.peak_allocated_bytes = a.peak_allocated_bytes
    return out


class _OutOfMemory(Exception):  # noqa: N818
    """The replica's AllocatorOutOfMemory, with the engine's event that caused it."""

    def __init__(self, event: Event) -> None:
        super().__init__(event.label)
        self.event = event


def _reserving(a: object) -> int:
    """Segment allocations and mappings so far (what 'reserved something new' counts)."""
    return sum(1 for kind, _ in a.segment_events if kind in ("segment_alloc", "segment_map"))


def _run_step(a: object, events: list[Event], repeat: tuple | None, live: dict, phases: dict,
              record: list | None) -> None:
    """One step; a micro-step that micro-steps 3 and on repeat (EngineSequence.repeats) is replayed
    again until a repeat reserves nothing new: from then on every repeat is the same (the rule that
    stops the steps, one level down), so the rest change nothing and are skipped."""
    if repeat is None:
        _run(a, events, live, phases, record)
        return
    start, end, extra = repeat
    _run(a, events[:end], live, phases, record)
    for _ in range(extra):
        before = _reserving(a)
        _run(a, events[start:end], live, phases, record)
        if _reserving(a) == before:
            break
    _run(a, events[end:], live, phases, record)


def _run(a: object, events: list[Event], live: dict, phases: dict, record: list | None) -> None:
    """Each event through the replica; `phases` keeps each phase's highest reserved total (the
    batch, made in 'setup' before the forward, counts in the forward)."""
    from memcalc.allocator.replica import AllocatorOutOfMemory

    malloc, free, pop = a.malloc, a.free, live.pop
    last, name, top = None, None, -1
    for e in events:
        kind, handle, nbytes, _, phase, _ = e
        if kind == "alloc":
            try:
                live[handle] = malloc(nbytes)
            except AllocatorOutOfMemory:
                raise _OutOfMemory(e) from None
        else:
            free(pop(handle))
        if phase is not last:
            last, name = phase, "forward" if phase == "setup" else phase
            top = phases.get(name, -1)
        reserved = a.reserved_bytes
        if reserved > top:
            top = phases[name] = reserved
        if record is not None:
            record.append((reserved, a.allocated_bytes))


def reserved_for(model: object, training: object, device_limit: int | None = None) -> ReservedReplay:
    """The replay of `model` under `training` (settings from TrainingConfig.allocator); a MoE model's
    'worst' routing on the eager experts path: the routing that reserves the most
    (memcalc.engine.run.routings, the routings whose union the allocated peak bounds). The last
    SEQUENCES sequences and the last REPLAYS replays are kept (capacity asks for the same step under
    several limits, the tables for the same shapes on several GPUs).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=64)
    >>> r = reserved_for(ModelSpec.preset("gpt2"), t)
    >>> e = reserved_for(ModelSpec.preset("gpt2"), t.with_(allocator="expandable_segments:True"))
    >>> r.steady and e.steady, e.peak_reserved_bytes < r.peak_reserved_bytes
    (True, True)
    """
    if getattr(model, "traced_candidates", None) is not None:  # memcalc.traced: no tape of the step here
        from memcalc.core.errors import NotModelledError

        raise NotModelledError("reserved", "a program traced from an nn.Module has no allocation sequence the "
                               "caching-allocator replica can replay", "use peak_bytes, or basis='allocated'")
    key = (model, training, device_limit)
    found = _REPLAYS.get(key)
    if found is None:
        replays = [replay_sequence(seq, training.allocator, device_limit) for seq in _sequences(model, training)]
        found = max(replays, key=lambda r: (r.oom is not None, r.peak_reserved_bytes))
        _keep(_REPLAYS, key, found, REPLAYS)
    return found


SEQUENCES = 16
REPLAYS = 512
"""Replays kept (small: the trace is not kept unless asked for); sequences hold every event."""
_SEQUENCES: dict = {}
_REPLAYS: dict = {}


def _keep(cache: dict, key: object, value: object, most: int = SEQUENCES) -> None:
    cache[key] = value
    while len(cache) > most:
        del cache[next(iter(cache))]


def _sequences(model: object, training: object) -> list[EngineSequence]:
    """engine_sequence under each routing regime of the step (one for most steps)."""
    from memcalc.engine.allocations import engine_sequence
    from memcalc.engine.run import regime_for as _regime, routings as _routings

    key = (model, training.with_(allocator=""))  # the settings do not change the sequence
    found = _SEQUENCES.get(key)
    if found is None:
        found = [engine_sequence(model, training, r) for r in _routings(model, _regime(model, training))]
        _keep(_SEQUENCES, key, found)
    return found
