"""The real allocation and free sequence of a measured run, as a CUDA caching allocator would see it.

`AllocationRecorder` is the live-tensor tracker (validate.measure.tracker) that also writes down, in
order, every storage it sees appear and disappear: ("alloc", handle, nbytes) when an op returns a
storage it has not seen, ("free", handle) when the storage's last reference goes (the weakref
callback fires at that moment, as the storage's deleter would hand the block back to the caching
allocator). The events are those `memcalc.allocator.replay.replay_events` reads, with the storage's
real byte size (the replica rounds it as torch's allocator does).

How each storage event maps to the CUDA allocator's requests:
- a storage of 0 bytes asks for nothing: NativeCachingAllocator::allocate calls malloc only
  `if (size != 0)` (c10/cuda/CUDACachingAllocator.cpp), so no event;
- a storage resized in place (ops with out= arguments, Tensor.resize_) gets a new block and frees the
  old one: resize_bytes_cuda (aten/src/ATen/native/cuda/Resize.cpp) allocates the new size, copies,
  and sets the new data pointer, which releases the old block: ("alloc", new) then ("free", old);
- nothing is recorded once the recorder has exited (the run's model and optimizer die afterwards).

`measure_recorded` is validate.measure.backends' 'cpu' backend with this recorder in place of the
plain tracker: one run gives the Measurement and the sequence. validate.measure.sequence (no torch)
has the canonical form, digest and packing of a sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from validate.measure.tracker import LiveTensorTracker


class AllocationRecorder(LiveTensorTracker):
    """A LiveTensorTracker (exact bytes) that records the storage allocation and free sequence.

    `events`: ("alloc", handle, nbytes) and ("free", handle), handles numbered from 0 in allocation
    order. `ops`: for each event, the ATen op whose output the allocated storage is ('' for a free).
    `marks`: (number of events before the mark, label) for every `mark` (the step runner marks
    "inputs" at the start of each step, then "forward", "backward", "optimizer").

    >>> import torch
    >>> with AllocationRecorder() as rec:
    ...     x = torch.ones(1000)
    ...     y = x * 2
    ...     del x
    ...     z = torch.empty(0)
    >>> rec.events, rec.ops
    ([('alloc', 0, 4000), ('alloc', 1, 4000), ('free', 0)], ['aten.ones.default', 'aten.mul.Tensor', ''])
    >>> del y; len(rec.events)  # the recorder has exited: later frees are not the run's
    3
    """

    def __init__(self) -> None:
        super().__init__(record_timeline=False, granularity=1)
        self.events: list[tuple] = []
        self.ops: list[str] = []
        self.op = ""
        self.marks: list[tuple[int, str]] = []
        self._handles: dict[int, int] = {}
        self._next = 0
        self.recording = True
        self._depth = 0

    def _new_handle(self, key: int, nbytes: int) -> None:
        if nbytes == 0 or not self.recording:
            return
        handle = self._next
        self._next += 1
        self._handles[key] = handle
        self.events.append(("alloc", handle, nbytes))
        self.ops.append(self.op)

    def _drop_handle(self, key: int) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None and self.recording:
            self.events.append(("free", handle))
            self.ops.append("")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.op = str(func)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def track_tensor(self, t) -> None:
        """LiveTensorTracker.track_tensor, recording the storage's allocation when it is new.

        >>> import torch
        >>> rec = AllocationRecorder(); t = torch.zeros(4); rec.track_tensor(t); rec.track_tensor(t[1:])
        >>> rec.events
        [('alloc', 0, 16)]
        """
        try:
            key = t.untyped_storage()._cdata
        except (AttributeError, RuntimeError, NotImplementedError):  # not a tensor, or no storage
            key = None
        new = key is not None and key not in self._refs
        super().track_tensor(t)
        if new and key in self._refs:
            self._new_handle(key, self._refs[key][1])

    def _maybe_resized(self, key: int, entry, st) -> None:
        old = entry[1]
        super()._maybe_resized(key, entry, st)
        new = self._refs[key][1]
        if new != old:  # resize_bytes_cuda: a new block, then the old one released
            handle = self._handles.pop(key, None)
            self._new_handle(key, new)
            if handle is not None and self.recording:
                self.events.append(("free", handle))
                self.ops.append("")

    def _on_free(self, key: int) -> None:
        super()._on_free(key)
        self._drop_handle(key)

    def mark(self, label: str) -> None:
        """LiveTensorTracker.mark, remembering where in the sequence the label begins."""
        if self.recording:
            self.marks.append((len(self.events), label))
        super().mark(label)

    def __enter__(self):
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        """Recording ends when the outermost `with` ends: the tracker enters itself again around
        the kernels it looks inside (validate.measure.tracker.SEE_INSIDE), and their end is not
        the run's."""
        self._depth -= 1
        if not self._depth:
            self.recording = False
        return super().__exit__(*exc)


@dataclass
class RecordedRun:
    """A run's measurement and its allocation sequence."""

    measurement: object
    """validate.measure.backends.Measurement (the same peaks the plain 'cpu' backend gives)."""
    events: list = field(default_factory=list)
    marks: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    """The ATen op that made each allocated storage (AllocationRecorder.ops)."""


def measure_recorded(spec, training, hf_config: dict | None = None, steps: int = 3,
                     seed: int = 0) -> RecordedRun:
    """validate.measure.backends.measure(..., 'cpu') with the allocation sequence recorded.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> run = measure_recorded(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> from validate.measure.sequence import replayed_live_peak
    >>> run.measurement.peak_bytes == replayed_live_peak(run.events, run.marks, after_step=1)
    True
    """
    import time

    from memcalc.core.errors import MemcalcError
    from validate.measure import backends as b

    if training.device != "cpu":
        raise MemcalcError("device", f"the allocation sequence is recorded on CPU, not {training.device!r}",
                           "use --device cpu with --reserved")
    b.optimizer_class(training.optimizer)  # as backends.measure: import-time tensors are not the step's
    if training.lora is not None:
        import peft  # noqa: F401
    start = time.perf_counter()
    with AllocationRecorder() as rec:
        trainee, run = b._run_under(b.TrackerMeter(rec), spec, training, hf_config, steps, seed)
    result = b.Measurement(status="ok", backend="cpu", device="cpu", device_name=b.cpu_name(),
                           sdpa_backend=b.sdpa_backend(spec, training))
    result.extra["untracked_tensors"] = rec.untracked
    b._fill(result, trainee, run)
    result.wall_s = round(time.perf_counter() - start, 3)
    return RecordedRun(result, rec.events, rec.marks, rec.ops)


__all__ = ["AllocationRecorder", "RecordedRun", "measure_recorded"]
