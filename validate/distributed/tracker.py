"""The live-tensor tracker, made exact for torch.distributed training on CPU.

validate.measure.tracker.LiveTensorTracker counts the storages returned by ATen ops. Five things that
distributed training does slip past it, and `DistTracker` closes each gap:

1. DTensor (FSDP2's sharded parameters, gradients and optimizer states) is a wrapper subclass:
   `dtensor.untyped_storage()` reports the *global* size, and the ops DTensor runs on its local
   shard happen inside DTensor's own dispatch, below the tracker. DistTracker counts the inner
   tensors of every traceable wrapper subclass (`__tensor_flatten__`), never the wrapper.
2. FSDP2 frees and re-allocates unsharded parameters with `UntypedStorage.resize_(0)` /
   `resize_(n)` (torch/distributed/fsdp/_fully_shard/_fsdp_param.py free_storage, alloc_storage),
   which is no ATen op. DistTracker wraps `torch.UntypedStorage.resize_` while it is active and
   updates the storage's size the moment it changes.
3. A storage made where the dispatch mode is not active (inside a C++ collective kernel, a
   tensor built under no_dispatch) would never be counted. DistTracker also tracks every tensor
   that enters an op as an input and was never seen before:
   - first seen right after a c10d collective op (before any other op allocated): the
     collective backend's own scratch memory, e.g. gloo's reduce-scatter, which clones its whole
     input and all-reduces the clone (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced:
     `buffers.push_back(inputTensors[i].clone())`); the clone is first seen when the work's
     wait() splits it. Counted in `scratch_live`, kept out of `live`/`peak` (on GPUs NCCL
     needs no such copy and its buffers live outside the caching allocator), and in
     `full_peak` = peak of live + scratch_live. Bytes per collective op in `scratch_ops`.
   - otherwise (e.g. `torch.tensor(...)` constants: aten.lift_fresh): counted in `live` like
     any tensor, the bytes also summed in `late_bytes` / `late_ops`.
   Not seen at all: memory a backend allocates on its own threads and frees before returning,
   e.g. gloo's all-gather, which gathers into a flat temporary of the whole output
   (`newLikeFlat(outputs[0])`) on its worker thread, then copies out.

4. Gloo runs each collective on a worker thread that keeps its own reference to the work (and
   so to the tensors it was given) until the thread gets the CPU again, a moment after wait()
   returned in the training thread. FSDP2's all-gather output was therefore freed at a random
   later op, and peaks varied from run to run. DistTracker holds each collective's Work until
   it completes, then drops it and waits (up to `settle_s`) until every storage the collective
   used is back to the use count it had before the collective: frees then happen where the
   training thread dropped its last reference, as they would without the worker thread.

5. DTensor (tensor parallelism) runs functional collectives (`_c10d_functional.*`), whose Work
   sits in a registry until `wait_tensor` and is then still held by gloo's worker thread, so
   their inputs and outputs were freed at random later ops too. DistTracker waits for each one
   right after it returns, then (up to `settle_s`) until its inputs are back to their use counts
   and its outputs are held by their Python object only (`_settle_functional`).

`events=True` records every allocation and free with its phase label, for the op-by-op
timelines in validate/DISTRIBUTED_MEMORY.md.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._pytree import tree_flatten

from validate.measure.tracker import LiveTensorTracker

try:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
except ImportError:  # very old torch: no wrapper subclasses to unwrap
    def is_traceable_wrapper_subclass(_t) -> bool:  # type: ignore[misc]
        return False


def _as_work(obj):
    """The c10d Work inside a c10d op's output (a TorchScript object there), or None."""
    if hasattr(obj, "is_completed"):
        return obj
    if isinstance(obj, torch.ScriptObject):
        try:
            from torch._C._distributed_c10d import Work

            return Work.unbox(obj)
        except (ImportError, RuntimeError, AttributeError, TypeError):
            return None
    return None


class DistTracker(LiveTensorTracker):
    """LiveTensorTracker that counts DTensor local shards, storage resizes and late storages.

    >>> with DistTracker() as tr:
    ...     t = torch.empty(100)
    ...     _ = t.untyped_storage().resize_(0)
    ...     freed = tr.live
    ...     _ = t.untyped_storage().resize_(400)
    >>> freed, tr.live, tr.peak
    (0, 400, 400)
    """

    def __init__(self, record_timeline: bool = False, granularity: int = 1, events: bool = False,
                 site_fn=None, grads_fn=None):
        super().__init__(record_timeline=record_timeline, granularity=granularity)
        # attribution (validate.distributed.attrib): site of each storage, live bytes per site, and the
        # per-site split at the latest peak ('grads' taken out through grads_fn)
        self.site_fn, self.grads_fn = site_fn, grads_fn
        self.site_of: dict[int, str] = {}
        self.site_live: dict[str, int] = {}
        self.peak_sites: dict[str, int] = {}
        self.late_bytes = 0
        self.late_ops: dict[str, int] = {}
        self.scratch_live = 0
        self.scratch_ops: dict[str, int] = {}
        self.full_peak = 0
        self._scratch_refs: dict[int, tuple] = {}
        self._collective: str | None = None  # the last c10d op, until an op allocates
        self._pending: list = []  # (Work, [(storage weakref, references it holds)]) in flight
        self.settle_s = 0.05
        self.unsettled = 0  # collectives whose tensors stayed referenced past settle_s
        self.record_events = events
        # (label, op, +bytes allocated, -bytes freed, live, ((shape, dtype, site), ...))
        self.events: list[tuple] = []
        # events: `live` only (scratch is reported through scratch_ops and full_peak)
        self._op = ""
        self._alloc = 0
        self._freed = 0
        self._shapes: list = []
        self._orig_resize = None
        self._resize_was_own = False

    # ---- counting ----------------------------------------------------------------------------
    def track_tensor(self, t) -> None:
        if isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            for name in names:
                self.track_tensor(getattr(t, name))
            return
        if isinstance(t, torch.Tensor) and self._scratch_refs:
            try:
                if t.untyped_storage()._cdata in self._scratch_refs:
                    return
            except (RuntimeError, NotImplementedError):
                pass
        before = len(self._refs)
        super().track_tensor(t)
        if len(self._refs) > before:
            key, site = t.untyped_storage()._cdata, ""
            if self.site_fn is not None:
                site = self.site_fn()
                self.site_of[key] = site
                self.site_live[site] = self.site_live.get(site, 0) + self._refs[key][1]
            if self.record_events:
                self._alloc += self._refs[key][1]
                self._shapes.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), site))

    def _on_free(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is not None:
            if self.record_events:
                self._freed += entry[1]
            site = self.site_of.pop(key, None)
            if site is not None:
                self.site_live[site] -= entry[1]
        super()._on_free(key)

    def _maybe_resized(self, key: int, entry, st) -> None:
        delta = self._size(st) - entry[1]
        if self.record_events:
            self._alloc += max(delta, 0)
            self._freed += max(-delta, 0)
        site = self.site_of.get(key)
        if site is not None:
            self.site_live[site] += delta
        super()._maybe_resized(key, entry, st)

    def _late(self, t, op: str) -> None:
        if (self._collective is not None and op != "aten.lift_fresh.default"
                and not is_traceable_wrapper_subclass(t)):
            self._scratch(t, self._collective)
            return
        before = self.live
        self.track_tensor(t)
        if self.live > before:
            self.late_bytes += self.live - before
            self.late_ops[op] = self.late_ops.get(op, 0) + self.live - before

    def _scratch(self, t, collective: str) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st._cdata
        if key in self._refs or key in self._scratch_refs:
            return
        nbytes = self._size(st)

        def freed(_ref, k=key):
            entry = self._scratch_refs.pop(k, None)
            if entry is not None:
                self.scratch_live -= entry[1]

        self._scratch_refs[key] = (weakref.ref(st, freed), nbytes)
        self.scratch_live += nbytes
        self.scratch_ops[collective] = max(self.scratch_ops.get(collective, 0), nbytes)

    def reset_peak(self) -> None:
        super().reset_peak()
        self.full_peak = self.live + self.scratch_live
        self._snapshot_sites()

    def _update(self, what: str) -> None:
        new_peak = self.live > self.peak
        super()._update(what)
        self.full_peak = max(self.full_peak, self.live + self.scratch_live)
        if new_peak:
            self._snapshot_sites()

    def _snapshot_sites(self) -> None:
        if self.site_fn is None:
            return
        sites = {k: v for k, v in self.site_live.items() if v}
        if self.grads_fn is not None:
            for key in self.grads_fn():
                site, entry = self.site_of.get(key), self._refs.get(key)
                if site is not None and entry is not None:
                    sites[site] -= entry[1]
                    sites["grads"] = sites.get("grads", 0) + entry[1]
        self.peak_sites = {k: v for k, v in sites.items() if v}

    # ---- dispatch ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = str(func)
        if self._pending:
            self._settle()
        flat_args = tree_flatten((args, kwargs))[0]
        if op.startswith("c10d."):
            before = self._use_counts(flat_args)  # read before the backend takes its references
        elif op.startswith("_c10d_functional."):
            before = [(t, t._use_count()) for t in flat_args
                      if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t)]
        for t in flat_args:
            if isinstance(t, torch.Tensor):
                self._late(t, op)
        self._flush_event("<between ops>")  # frees that happened since the last op
        out = func(*args, **(kwargs or {}))
        if op.startswith("c10d."):
            held = [(ref, torch._C._storage_Use_Count(ref()._cdata) - n) for ref, n in before
                    if ref() is not None]
        stored = len(self._refs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track_tensor(t)
        if op.startswith("_c10d_functional."):
            self._settle_functional(op, before, out)
        if op.startswith("c10d."):
            self._collective = op
            works = [w for w in map(_as_work, tree_flatten(out)[0]) if w is not None]
            # gloo's reduce-scatter returns a LambdaWork that never reports completion; the
            # training thread releases it (and the output it holds) itself
            if works and "reduce_scatter" not in op:
                self._pending.append((works[0], held))
        elif len(self._refs) > stored:
            self._collective = None
        self._update(op)
        self._flush_event(op)
        return out

    def _flush_event(self, op: str) -> None:
        if self.record_events and (self._alloc or self._freed or op.startswith("c10d.")):
            self.events.append((self.label, op, self._alloc, self._freed, self.live,
                                tuple(self._shapes)))
        self._alloc = self._freed = 0
        self._shapes = []

    # ---- collectives: release what the backend's worker thread still holds ------------------
    @staticmethod
    def _use_counts(tensors) -> list:
        counts = []
        for t in tensors:
            if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t):
                st = t.untyped_storage()
                counts.append((weakref.ref(st), torch._C._storage_Use_Count(st._cdata)))
        return counts

    def _settle(self) -> None:
        import time

        waiting = []
        while self._pending:
            work, counts = self._pending.pop()
            if not work.is_completed():
                waiting.append((work, counts))
                continue
            # the work is alive (we hold it), so it still holds its references: the target
            # use count of each storage is today's minus those
            targets = [(ref, torch._C._storage_Use_Count(ref()._cdata) - held)
                       for ref, held in counts if ref() is not None and held > 0]
            del work  # ours may be the last reference to the finished work
            deadline = time.monotonic() + self.settle_s
            while not self._released(targets):
                if time.monotonic() > deadline:
                    self.unsettled += 1
                    break
                time.sleep(0.0002)
        self._pending = waiting
        self._flush_event("<collective released>")

    def _settle_functional(self, op: str, before, out) -> None:
        """Functional collectives (torch.distributed._functional_collectives, what DTensor
        runs) hand their tensors to the gloo work: the work registry holds the work until
        `wait_tensor`, and gloo's worker thread drops its own reference a moment after the
        collective completes, so the last reference to an input or output could go at a
        random later op. Right after the collective returns nothing else holds its tensors:
        wait for it here (a second wait_tensor later finds no work and returns), then wait
        (up to settle_s) until each input is back to its use count before the op and each
        output is held by its Python object only."""
        import time

        if "wait_tensor" in op:
            return
        outs = [t for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t)]
        for t in outs:
            torch.ops._c10d_functional.wait_tensor.default(t)
        targets = list(before) + [(t, 1) for t in outs]
        deadline = time.monotonic() + self.settle_s
        while any(t._use_count() > n for t, n in targets):
            if time.monotonic() > deadline:
                self.unsettled += 1
                return
            time.sleep(0.0002)

    @staticmethod
    def _released(targets) -> bool:
        for ref, target in targets:
            st = ref()
            if st is not None and torch._C._storage_Use_Count(st._cdata) > target:
                return False
        return True

    def mark(self, label: str) -> None:
        if self._pending:
            self._settle()
        self._flush_event("<between ops>")
        super().mark(label)

    # ---- storage resizes (FSDP2 free_storage / alloc_storage) -------------------------------
    def _resize_hook(self):
        tracker, orig = self, torch.UntypedStorage.resize_

        def resize_(storage, size):
            out = orig(storage, size)
            entry = tracker._refs.get(storage._cdata)
            if entry is not None:
                tracker._maybe_resized(storage._cdata, entry, storage)
                tracker._update("UntypedStorage.resize_")
                tracker._flush_event(f"UntypedStorage.resize_({size})")
            return out

        return orig, resize_

    def __enter__(self):
        self._resize_was_own = "resize_" in torch.UntypedStorage.__dict__
        self._orig_resize, hook = self._resize_hook()
        torch.UntypedStorage.resize_ = hook
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._resize_was_own:
                torch.UntypedStorage.resize_ = self._orig_resize
            else:  # inherited from torch._C.StorageBase: drop our override
                del torch.UntypedStorage.resize_
            self._orig_resize = None


__all__ = ["DistTracker"]
