"""FSDP2 (`fully_shard` per decoder layer and on the root) in the step simulation.

Buffers and lifetimes as measured on gloo CPU processes and read in
torch/distributed/fsdp/_fully_shard/ (validate/DISTRIBUTED_MEMORY.md sections 5-6):
- parameters are sharded on dim 0 in chunks of ceil(d0 / W) rows; every rank stores its padded
  chunk (_fsdp_param.py _init_sharded_param);
- unshard of group g: a flat all-gather output of the padded unsharded size U_g, then per-parameter
  unsharded storages (U_g in total, copy-out); in forward the flat output lives until the next
  group's copy-out (comm_ctx.all_gather_state), in backward it is freed after the group's own
  copy-out; backward prefetches the next group's all-gather (one group ahead);
- reshard frees the unsharded storages: after each layer's forward under zero3 (not zero2), after
  each group's backward in both;
- post-backward of group g: the reduce-scatter input (U_g) replaces the unsharded gradients, the
  output (S_g) becomes the sharded gradient; the input is retained until the next group's
  post-backward, the root's until the end of backward.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memcalc.core.poly import Poly
from memcalc.tape.graph import Storage

if TYPE_CHECKING:
    from memcalc.engine.regime import Regime
    from memcalc.tape.graph import Graph
    from memcalc.tape.ledger import Memory

__all__ = ["group_of", "shard_rows", "rank_elements", "Fsdp"]
LAYER = re.compile(r"(?:^|\.)(?:h|layers|blocks)\.(\d+)\.")


def group_of(label: str) -> str:
    """FSDP group of a parameter: its decoder layer, or the root.

    >>> group_of("model.layers.3.self_attn.q_proj.weight"), group_of("transformer.wte.weight")
    ('3', 'root')
    """
    m = LAYER.search(label)
    return m.group(1) if m else "root"


def shard_rows(rows: int, world: int) -> int:
    """Rows of every rank's padded chunk: ceil(rows / world) (torch.chunk)."""
    return -(-rows // world)


def padded_shard_bytes(nbytes: int, rows: int, world: int) -> int:
    """Bytes of one rank's padded shard of a parameter of `nbytes` and `rows` rows (dim 0).

    >>> padded_shard_bytes(4 * 1001 * 2, 1001, 4)  # ceil(1001 / 4) = 251 rows of 8 bytes
    2008
    """
    return shard_rows(rows, world) * (nbytes // rows)


def rank_elements(numel: int, rows: int, world: int, rank: int) -> int:
    """Real (unpadded) elements of a parameter on one rank.

    >>> [rank_elements(1001 * 2, 1001, 4, r) for r in range(4)]
    [502, 502, 502, 496]
    """
    c = shard_rows(rows, world)
    return max(0, min(c, rows - rank * c)) * (numel // rows)


class Fsdp:
    """Event handlers of FSDP2 for one rank (all ranks allocate the same padded sizes)."""

    def __init__(self, graph: Graph, world: int, reshard_after_forward: bool, device: str,
                 mixed_precision: bool = False):
        self.world, self.reshard = world, reshard_after_forward
        # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the graph's parameters are
        # bf16 (what is all-gathered); sharded parameters, reduce-scatter buffers and sharded
        # gradients are fp32, twice the bytes; each all-gather first casts the shard to a bf16
        # input buffer (_fsdp_param.py all_gather_inputs: `sharded_param_data.to(param_dtype)`)
        self.mixed = mixed_precision
        self.master = 2 if mixed_precision else 1
        self.groups: dict[str, list] = {}
        for v in graph.params:
            self.groups.setdefault(group_of(v.label), []).append(v)
        self.shard = {g: sum(padded_shard_bytes(v.size.eval(1, 1), v.rows, world) for v in vs)
                      for g, vs in self.groups.items()}  # bytes of the padded shard S_g
        # frozen parameters (freeze, LoRA's base weights) are sharded and all-gathered like the
        # others, but get no gradient: post_backward reduce-scatters only the group's parameters
        # with a .grad (_fsdp_param_group.py FSDPParamGroup.post_backward: fsdp_params_with_grad;
        # none: it returns before foreach_reduce), so the reduce-scatter buffers and the sharded
        # gradients follow the trainable parameters' padded shards
        self.grad_shard = {g: sum(padded_shard_bytes(v.size.eval(1, 1), v.rows, world)
                                  for v in vs if v.requires_grad) for g, vs in self.groups.items()}
        self.whole = True
        """False: the sharded parameters are held as 0 bytes (memcalc.engine.depth adds them per depth)."""
        self.layers = sorted((g for g in self.groups if g != "root"), key=int)
        self.mesh_bytes = 4 * world if device == "cpu" else 0  # DeviceMesh rank table (CPU)
        self.unsharded: dict[str, Storage] = {}
        self.flat: dict[str, Storage] = {}
        self.rs_input: Storage | None = None
        self.sharded_grads: dict[str, Storage] = {}  # group -> its sharded .grad

    @classmethod
    def of(cls, graph: Graph, regime: Regime) -> "Fsdp":
        """FSDP2 as the regime runs it: zero3 reshards after forward, zero2 does not; the
        sharded copies are fp32 under MixedPrecisionPolicy (regime.master_elt)."""
        return cls(graph, regime.data_parallel, regime.sharding == "zero3", regime.device,
                   mixed_precision=regime.master_elt != regime.param_elt)

    def _new(self, mem: Memory, size: int, category: str, label: str) -> Storage:
        st = Storage(Poly.const(size), category, label)
        mem.hold(st)
        return st

    # ---- setup ---------------------------------------------------------------------------
    def setup(self, mem: Memory) -> None:
        """Sharded parameters (padded) and the mesh table; parameter storages themselves are
        zero-sized in the graph, the unsharded copies are allocated here."""
        self._new(mem, self.master * sum(self.shard.values()) if self.whole else 0, "weights",
                  "sharded parameters")
        if self.mesh_bytes:
            self._new(mem, self.mesh_bytes, "fsdp", "device mesh")

    # ---- unshard / reshard -----------------------------------------------------------------
    def _gather(self, mem: Memory, g: str) -> None:
        cast = self._new(mem, self.shard[g], "fsdp", f"all-gather input {g}") if self.mixed else None
        self.flat[g] = self._new(mem, self.world * self.shard[g], "fsdp", f"all-gather output {g}")
        mem.mark(f"fsdp all-gather {g}")
        if cast is not None:
            mem.release(cast)

    def _copy_out(self, mem: Memory, g: str) -> None:
        if g not in self.unsharded:
            self.unsharded[g] = self._new(mem, self.world * self.shard[g], "weights", f"unsharded {g}")
            mem.mark(f"fsdp copy-out {g}")

    def _free_flat(self, mem: Memory, g: str) -> None:
        st = self.flat.pop(g, None)
        if st is not None:
            mem.release(st)

    def _reshard(self, mem: Memory, g: str) -> None:
        st = self.unsharded.pop(g, None)
        if st is not None:
            mem.release(st)

    # ---- forward ---------------------------------------------------------------------------
    def pre_forward(self, mem: Memory, g: str, previous: str | None) -> None:
        """Unshard g; the previous group's flat output is freed after g's copy-out."""
        if g in self.unsharded:
            return
        self._gather(mem, g)
        self._copy_out(mem, g)
        if previous is not None:
            self._free_flat(mem, previous)

    def post_forward(self, mem: Memory, g: str) -> None:
        """zero3 reshards each layer after its forward."""
        if self.reshard and g != "root":
            self._reshard(mem, g)

    def root_post_forward(self, mem: Memory) -> None:
        """After the loss: the last layer's flat output goes; zero3 reshards the root."""
        self._free_flat(mem, self.layers[-1] if self.layers else "root")
        if self.reshard:
            self._reshard(mem, "root")

    # ---- backward --------------------------------------------------------------------------
    def pre_backward(self, mem: Memory, g: str) -> None:
        """Unshard g (its flat output freed right after copy-out), prefetch the next group."""
        if g not in self.unsharded:
            if g not in self.flat:
                self._gather(mem, g)
            self._copy_out(mem, g)
            self._free_flat(mem, g)
        nxt = self._next_backward(g)
        if nxt is not None and nxt not in self.unsharded and nxt not in self.flat:
            self._gather(mem, nxt)

    def _next_backward(self, g: str) -> str | None:
        order = ["root"] + self.layers[::-1]
        i = order.index(g)
        return order[i + 1] if i + 1 < len(order) and order[i + 1] != "root" else None

    def post_backward(self, mem: Memory, g: str, param_grads: dict) -> None:
        """Reshard, swap the unsharded gradients for the reduce-scatter input and output."""
        self._reshard(mem, g)
        if self.rs_input is not None:
            mem.release(self.rs_input)
            self.rs_input = None
        if not self.grad_shard[g]:  # a wholly frozen group: nothing to reduce
            return
        self.rs_input = self._new(mem, self.master * self.world * self.grad_shard[g], "fsdp",
                                  f"reduce-scatter input {g}")
        mem.mark(f"fsdp reduce-scatter {g}")
        for v in self.groups[g]:
            st = param_grads.pop(id(v), None)
            if st is not None:
                mem.release(st)
        if g in self.sharded_grads:  # a later micro-step: the reduce-scatter output is added
            out = self._new(mem, self.master * self.grad_shard[g], "fsdp", f"reduce-scatter output {g}")
            mem.mark(f"fsdp reduce-scatter output {g}")  # into .grad in place, then freed
            mem.release(out)  # (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
            return  # foreach_reduce: sharded_param.grad += new_sharded_grad)
        self.sharded_grads[g] = self._new(mem, self.master * self.grad_shard[g], "gradients",
                                          f"sharded grads {g}")
        mem.mark(f"fsdp sharded grads {g}")

    def end_of_backward(self, mem: Memory, param_grads: dict) -> None:
        """The root's post-backward runs in the final callback; then its input is freed."""
        self.post_backward(mem, "root", param_grads)
        if self.rs_input is not None:
            mem.release(self.rs_input)
            self.rs_input = None
