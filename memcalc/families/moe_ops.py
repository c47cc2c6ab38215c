"""INDEX (int64 index bytes) and `inplace` (an in-place op joining the graph): the pieces
memcalc.families.moe and moe_aux share, below both so that neither imports the other
(memcalc.families.moe re-exports them).
"""
from __future__ import annotations

from memcalc.tape.graph import Node, Value
from memcalc.tape.ops import Ops

INDEX = 8  # int64 indices (sort, topk, where, arange)


def inplace(ops: Ops, name: str, target: Value, others: list[Value], saves: list[Value],
            backward: list) -> Value:
    """An in-place op on `target` (div_, index_add_): no allocation; the result shares the
    target's storage and joins the graph."""
    g = ops.g
    rg = any(v.requires_grad for v in [target, *others])
    out = Value(target.storage, target.size, rg, label=name, elt=target.elt)
    g.nodes.append(Node(name, [target, *others], [out], [v.storage for v in saves] if rg else [],
                        backward if rg else [], g.region))
    return out
