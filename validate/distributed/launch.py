"""Start `world_size` fresh Python processes joined by one gloo process group, run one function on
each, and collect what each returns: the process side of distributed measurement, knowing
nothing of models.

The parent holds the TCPStore on 127.0.0.1, on a port the OS picks (bound to port 0), so ranks
never race for a port. Each rank imports `Launch.target` ("module:function") by name and calls
it as `function(payload, rank) -> dict`, after init_process_group.

Failures never hang: every collective has `collective_timeout_s`, each launch has an overall
`timeout_s`, and when a rank fails the others get `grace_s` to fail too before they are killed.
RankFailure names each rank's error.

>>> RankFailure("world_size=2", {1: "ValueError: x"}).errors
{1: 'ValueError: x'}
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 180.0  # one configuration, all ranks, start to end
COLLECTIVE_TIMEOUT_S = 60.0  # init_process_group(timeout=...): each gloo collective
GRACE_S = 10.0  # after one rank fails, how long the others get to finish failing


class RankFailure(RuntimeError):
    """One or more ranks failed; `errors` maps rank -> one-line error, `details` the first
    failing rank's traceback, `pids` the rank processes (all ended and reaped when raised)."""

    def __init__(self, what: str, errors: dict[int, str], details: str = "", pids=()):
        self.errors, self.details, self.pids = errors, details, list(pids)
        parts = "; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        super().__init__(f"{what}: {parts}")


@dataclass(frozen=True)
class Launch:
    """One launch: `world_size` ranks, each calling `target(payload, rank)`."""

    target: str  # "module:function", imported by each rank
    payload: dict  # pickled to each rank
    world_size: int
    what: str = ""  # names the configuration in a RankFailure
    threads: int = 1  # torch threads per rank
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S
    fail_rank: int | None = None  # tests: this rank raises after init (checks error reporting)
    hang_rank: int | None = None  # tests: this rank sleeps forever (checks the timeout)


def launch(job: Launch, timeout_s: float = TIMEOUT_S, grace_s: float = GRACE_S) -> list[dict]:
    """Start the ranks, wait for them (never past timeout_s), kill what is left, read results;
    one dict per rank, in rank order.

    Ranks are fresh interpreters (`python -c`), never forks of the caller: the caller may hold
    threads, a dispatch mode or CUDA state, and its __main__ is never re-imported.
    """
    import pickle

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=job.collective_timeout_s))
    with tempfile.TemporaryDirectory(prefix="memcalc-dist-") as tmp:
        # a plain dict: the ranks import validate.distributed.launch by that name, whatever ours is
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
        Path(tmp, "job.pkl").write_bytes(pickle.dumps(fields))
        procs = []
        try:
            for rank in range(job.world_size):
                procs.append(_start_rank(rank, store.port, tmp))
            timed_out, first_failed = _wait(procs, tmp, timeout_s, grace_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(10)
        results = _collect(procs, tmp, job, timed_out, first_failed, timeout_s)
    del store
    return results


def _start_rank(rank: int, port: int, tmp: str) -> subprocess.Popen:
    root = str(Path(__file__).resolve().parent.parent)  # the folder holding validate/, memcalc/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    code = f"from validate.distributed.launch import rank_main; rank_main({rank}, {port}, {tmp!r})"
    log = open(Path(tmp, f"rank{rank}.log"), "wb")
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=root)
    finally:
        log.close()  # the child has its own descriptor


def _wait(procs: list, tmp: str, timeout_s: float, grace_s: float) -> tuple[bool, int | None]:
    """Poll until all ranks exit, one fails (+grace), or the deadline; (timed_out, first_failed)."""
    deadline = time.monotonic() + timeout_s
    failed_at, first_failed = None, None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False, first_failed
        for rank, code in enumerate(codes):
            if first_failed is None and (code not in (None, 0)
                                         or Path(tmp, f"rank{rank}.error.json").exists()):
                first_failed, failed_at = rank, time.monotonic()
        now = time.monotonic()
        if failed_at is not None and now - failed_at > grace_s:
            return False, first_failed
        if now > deadline:
            return True, first_failed
        time.sleep(0.05)


def _collect(procs: list, tmp: str, job: Launch, timed_out: bool, first_failed: int | None,
             timeout_s: float) -> list[dict]:
    """Each rank's result, or RankFailure naming why each missing one is missing."""
    results, errors, details = [], {}, ""
    for rank, p in enumerate(procs):
        ok, err = Path(tmp, f"rank{rank}.json"), Path(tmp, f"rank{rank}.error.json")
        if ok.exists():
            results.append(json.loads(ok.read_text()))
        elif err.exists():
            info = json.loads(err.read_text())
            errors[rank] = info["error"]
            if rank == first_failed or not details:
                details = info["traceback"]
        elif timed_out and p.returncode in (None, -9):
            errors[rank] = f"killed: no result after {timeout_s:.0f} s (timeout_s)"
        elif first_failed is not None and first_failed != rank and p.returncode in (None, -9):
            errors[rank] = f"killed after rank {first_failed} failed"
        else:
            log = Path(tmp, f"rank{rank}.log")
            tail = log.read_text(errors="replace")[-600:].strip() if log.exists() else ""
            errors[rank] = f"exited with code {p.returncode} and no result: {tail}"
    if errors:
        what = job.what + (f" timed out after {timeout_s:.0f} s" if timed_out else "")
        raise RankFailure(what, errors, details, [p.pid for p in procs])
    return sorted(results, key=lambda r: r["rank"])


# ---- in the rank process -----------------------------------------------------------------------
def rank_main(rank: int, port: int, out_dir: str) -> None:
    """Process entry point: init gloo, run the target, write rank{r}.json (or
    rank{r}.error.json), exit."""
    import pickle

    import torch
    import torch.distributed as dist

    job = Launch(**pickle.loads(Path(out_dir, "job.pkl").read_bytes()))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(job.threads)
    code = 0
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=job.collective_timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=job.collective_timeout_s))
        if job.fail_rank == rank:
            raise ValueError(f"injected failure on rank {rank}")
        if job.hang_rank == rank:
            time.sleep(10**6)
        module, _, function = job.target.partition(":")
        result = getattr(importlib.import_module(module), function)(job.payload, rank)
        _write(Path(out_dir, f"rank{rank}.json"), result)
    except BaseException as err:  # report everything, then exit non-zero
        _write(Path(out_dir, f"rank{rank}.error.json"),
               {"error": f"{type(err).__name__}: {err}"[:1000],
                "traceback": traceback.format_exc()})
        code = 1
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # a broken group cannot always be destroyed; the process exits anyway
            pass
    os._exit(code)  # skip interpreter teardown: a dead peer can make gloo threads block it


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)  # atomic: the parent never reads half a file


__all__ = ["Launch", "RankFailure", "launch", "rank_main", "TIMEOUT_S", "COLLECTIVE_TIMEOUT_S",
           "GRACE_S"]
