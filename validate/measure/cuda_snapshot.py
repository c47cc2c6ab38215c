"""A CUDA memory snapshot with history for every row the cuda backend measures (the GPU kit,
docs/GPU_RUN.md), so that one GPU run checks allocated, reserved and device bytes together.

`configure(folder)` (python -m validate run --cuda-snapshots FOLDER) turns it on; `recording(...)`
wraps a row's run: torch.cuda.memory._record_memory_history(enabled="all", context=None,
stacks="python", max_entries=MAX_ENTRIES) before the model is built, torch.cuda.memory._snapshot()
after the last step, written as a gzipped pickle (memcalc.load_snapshot reads it) named by the
configuration's digest, then history recording off. No stack frames are kept (context=None), so a
row's file is small: the trace's alloc/free/segment events with sizes, addresses and streams, and the
final segments. The row's `extra` gets `snapshot` (the file name), `snapshot_events` and
`snapshot_bytes`, or `snapshot_error` when torch refuses (the measurement goes on).

scripts/gpu_summary.py --snapshots FOLDER replays each file through the caching-allocator replica
(memcalc.replay_snapshot) beside the measured max_memory_reserved.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import pickle
from pathlib import Path

MAX_ENTRIES = 200_000
"""Trace entries kept per row (a ring buffer: a longer row keeps its last ones, and
memcalc.replay_snapshot rebuilds the state where the kept trace begins)."""

_FOLDER: list[Path | None] = [None]


def configure(folder: str | Path | None) -> None:
    """Write a snapshot per measured cuda row into `folder` (None: stop).

    >>> configure(None); folder() is None
    True
    """
    _FOLDER[0] = None if folder is None else Path(folder)


def folder() -> Path | None:
    """Where snapshots go (None: not recorded)."""
    return _FOLDER[0]


def snapshot_name(spec, training, hf_config: dict | None = None) -> str:
    """File name of a configuration's snapshot: a digest of its model, training and HF config.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> n = snapshot_name(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
    >>> n.endswith(".pickle.gz"), len(n)
    (True, 26)
    """
    key = json.dumps([spec.model_dump(mode="json"), training.model_dump(mode="json"), hf_config],
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16] + ".pickle.gz"


@contextlib.contextmanager
def recording(spec, training, hf_config: dict | None, extra: dict, memory=None):
    """Record the allocator's history while the block runs; dump it after (see the module doc).
    `memory`: torch.cuda.memory (a stand-in in tests). Does nothing unless `configure`d."""
    out = folder()
    if out is None:
        yield
        return
    if memory is None:
        import torch.cuda.memory as memory
    try:
        memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
    except Exception as err:  # private API: report it in the row, measure anyway
        extra["snapshot_error"] = f"_record_memory_history: {type(err).__name__}: {err}"[:300]
        yield
        return
    try:
        yield  # an out-of-memory error too: its trace ends with the request that failed
    finally:
        _dump(memory, out, snapshot_name(spec, training, hf_config), extra)
        with contextlib.suppress(Exception):
            memory._record_memory_history(enabled=None)


def _dump(memory, out: Path, name: str, extra: dict) -> None:
    try:
        snap = memory._snapshot()
        out.mkdir(parents=True, exist_ok=True)
        with gzip.open(out / name, "wb", compresslevel=6) as f:
            pickle.dump(snap, f, protocol=4)
    except Exception as err:
        extra["snapshot_error"] = f"_snapshot: {type(err).__name__}: {err}"[:300]
        return
    extra["snapshot"] = name
    extra["snapshot_events"] = sum(len(t) for t in snap.get("device_traces") or [])
    extra["snapshot_bytes"] = (out / name).stat().st_size


__all__ = ["configure", "folder", "recording", "snapshot_name", "MAX_ENTRIES"]
