"""`memcalc plan --gpus 64xH100-80GB`: the cluster layout planner (memcalc.queries.cluster) on the
command line, its flags and its table.

    >>> import argparse
    >>> p = argparse.ArgumentParser(); add_arguments(p)
    >>> p.parse_args(["--gpus", "8xH100-80GB"]).gpus
    '8xH100-80GB'
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memcalc.core.units import GIB

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from memcalc.queries.cluster import Layout

_FLAGS = ("intra_node_gbps", "inter_node_gbps", "gpus_per_node")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--gpus and the stated cluster constants of the step-time model (memcalc.queries.step_time)."""
    from memcalc.queries.step_time import GPUS_PER_NODE, INTER_NODE_GBPS, INTRA_NODE_GBPS

    g = p.add_argument_group("cluster (with --gpus)")
    g.add_argument("--gpus", default=None, help="a cluster, COUNTxGPU, e.g. 64xH100-80GB: search "
                   "data x tensor x sharding x checkpointing x micro-batch layouts")
    g.add_argument("--intra-node-gbps", type=float, default=None,
                   help=f"GB/s per GPU inside a node (default {INTRA_NODE_GBPS}, NVLink 4)")
    g.add_argument("--inter-node-gbps", type=float, default=None,
                   help=f"GB/s per GPU across nodes (default {INTER_NODE_GBPS}, 400 Gb/s InfiniBand)")
    g.add_argument("--gpus-per-node", type=int, default=None, help=f"default {GPUS_PER_NODE}")


def refuse_cluster_flags(args: argparse.Namespace) -> None:
    """The cluster flags mean nothing with --gpu (one GPU): refuse them by name."""
    from memcalc.cli.args import fail

    for name in _FLAGS:
        value = getattr(args, name)
        if value is not None:
            flag = "--" + name.replace("_", "-")
            fail(name, f"{flag} applies to a cluster (--gpus), not to one GPU (--gpu)", f"drop {flag} or use --gpus")


def links_from_args(args: argparse.Namespace):
    """The Links of the flags (defaults where not given), each checked."""
    import math

    from memcalc.core.arguments import check_int
    from memcalc.core.errors import MemcalcError
    from memcalc.queries.step_time import Links

    d = Links()
    for name in ("intra_node_gbps", "inter_node_gbps"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise MemcalcError(name, f"must be a positive number of GB/s, got {v}", "pass e.g. 450")
    nodes = d.gpus_per_node if args.gpus_per_node is None else check_int("gpus_per_node", args.gpus_per_node, 1, 1024)
    return Links(args.intra_node_gbps or d.intra_node_gbps, args.inter_node_gbps or d.inter_node_gbps, nodes)


def run(args: argparse.Namespace, model: ModelSpec, training: TrainingConfig) -> dict:
    """`memcalc plan --gpus ...`: the JSON payload, printed as a table unless --json."""
    from memcalc.queries.cluster import plan_cluster

    links = links_from_args(args)
    layouts = plan_cluster(model, training.with_(micro_batch=1), args.gpus, args.global_batch,
                           basis=args.basis, utilisation=args.utilisation, links=links, top=args.top)
    out = {"gpus": args.gpus, "global_batch": args.global_batch, "seq_len": args.seq_len,
           "basis": args.basis, "mfu": args.utilisation, "links": links.__dict__,
           "fitting": len(layouts) if args.basis == "allocated" else None,
           "layouts": [x.as_dict() for x in layouts[:args.top]]}
    if not args.json:
        print_layouts(layouts[:args.top], out["fitting"], args)
    return out


_SCHEDULE_SHORT = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved-1f1b": "i1f1b"}


def print_layouts(layouts: list[Layout], total: int | None, args: argparse.Namespace) -> None:
    """The table of `memcalc plan --gpus`."""
    where = f"{args.gpus} (global batch {args.global_batch}, seq_len {args.seq_len}, basis {args.basis})"
    if not layouts:
        print(f"no layout fits {where}")
        return
    counted = f"{total} layouts fit {where}; fastest {len(layouts)}" if total is not None else \
        f"the fastest {len(layouts)} layouts that fit {where}"
    print(f"{counted} (MFU {args.utilisation}; "
          "step = compute + bubble + TP comm + DP comm, no overlap):")
    print(f"{'#':>3} {'dp':>4} {'tp':>3} {'pp':>3} {'sharding':<8} {'ckpt':<10} {'micro':>5} {'accum':>5} "
          f"{'peak GiB':>9} {'headroom':>9} {'step s':>8} {'compute':>8} {'bubble':>7} {'tp comm':>8} {'dp comm':>8}")
    for i, x in enumerate(layouts, 1):
        st = x.step
        # a pipeline layout's column: its schedule and micro-batches (memcalc.queries.cluster_pipeline)
        shard = x.sharding if x.pipeline_parallel == 1 else \
            f"{_SCHEDULE_SHORT.get(x.pipeline_schedule, x.pipeline_schedule)} m{x.num_microbatches}"
        print(f"{i:>3} {x.data_parallel:>4} {x.tensor_parallel:>3} {x.pipeline_parallel:>3} {shard:<8} "
              f"{x.checkpointing:<10} {x.micro_batch:>5} {x.grad_accum:>5} {x.peak_bytes / GIB:>9.2f} "
              f"{x.headroom_bytes / GIB:>9.2f} {st.total_s:>8.2f} {st.compute_s:>8.2f} {st.bubble_s:>7.2f} "
              f"{st.tp_comm_s:>8.2f} {st.dp_comm_s:>8.2f}")


__all__ = ["add_arguments", "run", "print_layouts", "links_from_args", "refuse_cluster_flags"]
