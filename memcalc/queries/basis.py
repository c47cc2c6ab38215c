"""What a budget is compared with: allocated, reserved or device bytes (memcalc.queries.estimate.BASES).

- allocated: MemoryReport.peak_bytes <= budget (max_memory_allocated).
- reserved: the engine's allocation sequence replayed through the caching-allocator replica with the
  budget as the device limit (the bytes cudaMalloc can get) runs without an out-of-memory error: near
  the limit the allocator releases its cached blocks and retries as torch's does
  (memcalc.engine.reserved), so a step whose unlimited reserved peak is above the budget may still fit.
- device: the same with the limit lowered by what the process holds outside the allocator (the CUDA
  context, memcalc.allocator.outside); a GPU name as the budget then means its whole memory
  (GPU.total_bytes), not the usable bytes the allocated basis takes (total less CONTEXT_MIB).
On device="cpu" every basis is the allocated one (no caching allocator, no device context).
"""
from __future__ import annotations

from memcalc.inputs.gpus import GPU, gpu, parse_budget


def _gpu_named(budget: object) -> GPU | None:
    if isinstance(budget, GPU):
        return budget
    if isinstance(budget, str):
        try:
            return gpu(budget)
        except ValueError:
            return None
    return None


def budget_bytes(budget: int | float | str, basis: str) -> int:
    """The budget in bytes on `basis`: a GPU name is its whole memory on the device basis.

    >>> from memcalc.inputs.gpus import GPUS
    >>> budget_bytes("H100-80GB", "device") == GPUS["H100-80GB"].total_bytes
    True
    >>> budget_bytes("H100-80GB", "reserved") == GPUS["H100-80GB"].usable_bytes
    True
    """
    named = _gpu_named(budget)
    if basis == "device" and named is not None:
        return named.total_bytes
    return parse_budget(budget)


def fits_on(model: object, training: object, nbytes: int, basis: str,
            budget: object = None, decide_only: bool = False) -> tuple[bool, int]:
    """(fits, peak on the basis) of the step within `nbytes` on `basis` (reserved or device): the
    replay under a device limit of nbytes (less the outside-allocator bytes on the device basis)
    serves every request. With `decide_only` (the cluster planner, which drops what does not
    fit) one replay under the limit decides: a limit never reached leaves the run unchanged, so
    its peak is the unlimited run's, and the unlimited replay (needed only to say by how much a
    step that does not fit is over) is skipped; a step that does not fit then reports the
    allocated peak plus the outside bytes, a lower bound of its peak on the basis.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> ok, peak = fits_on(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=128), 80 << 30, "device")
    >>> ok, peak < 80 << 30
    (True, True)
    """
    from memcalc.allocator.outside import outside_for
    from memcalc.engine.reserved import reserved_for
    from memcalc.queries.estimate import estimate

    named = _gpu_named(budget)
    outside = outside_for(named.name if named else None).context_bytes if basis == "device" else 0
    report = estimate(model, training)
    limit = nbytes - outside
    if report.peak_bytes > limit:
        return False, report.peak_bytes + outside
    if decide_only:
        replay = reserved_for(model, training, device_limit=limit)
        if replay.oom is None:
            return True, max(replay.peak_reserved_bytes, report.peak_bytes) + outside
        return False, report.peak_bytes + outside
    unlimited = report.reserved_peak_bytes
    if unlimited <= limit:  # the limit is never reached: the same run
        return True, unlimited + outside
    # an out-of-memory error under the limit means the unlimited run reserves more than the limit
    replay = reserved_for(model, training, device_limit=limit)
    if replay.oom is None:
        return True, max(replay.peak_reserved_bytes, report.peak_bytes) + outside
    return False, unlimited + outside


def peak_on(model: object, training: object, budget: int | float | str, basis: str,
            decide_only: bool = False) -> tuple[bool, int, int]:
    """(fits, peak on the basis, budget bytes on the basis) of one step; on device="cpu" the
    allocated basis whatever `basis` says (no caching allocator, no device context);
    `decide_only`: fits_on's.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=128)
    >>> gpt2 = ModelSpec.preset("gpt2")
    >>> a, r = peak_on(gpt2, t, "H100-80GB", "allocated"), peak_on(gpt2, t, "H100-80GB", "device")
    >>> a[0] and r[0], a[1] < r[1]
    (True, True)
    """
    from memcalc.queries.estimate import check_basis, estimate

    check_basis(basis)
    if basis == "allocated" or training.device == "cpu":
        nbytes = parse_budget(budget)
        peak = estimate(model, training).peak_bytes
        return peak <= nbytes, peak, nbytes
    nbytes = budget_bytes(budget, basis)
    ok, peak = fits_on(model, training, nbytes, basis, budget, decide_only)
    return ok, peak, nbytes
