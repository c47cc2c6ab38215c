"""A forward program described tensor by tensor: what each op allocates, what autograd saves,
and what its backward allocates (from PyTorch's tools/autograd/derivatives.yaml and the aten
kernels; checked op by op against the live-tensor timeline that validate.measure.tracker records).

The engine never runs these ops; `memcalc.tape.simulate` walks the program to find when each
storage is born and freed, forward, backward and in the optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from memcalc.core.poly import Poly


@dataclass(eq=False, slots=True)
class Storage:
    """A block of memory; views share one."""

    size: Poly
    category: str
    label: str
    count: Poly | None = None
    """Set on the storages of one expert in a 'worst'-routing bound (memcalc.inputs.moe_routing.worst_routings):
    its size is a whole number of bytes per token times this token count, and the simulation
    counts it with the most the allocator's rounding can add to such a size (`count_slack`)
    instead of rounding it."""


def per_token(size: Poly, count: Poly) -> int | None:
    """The whole number of bytes a per token when `size` is a * `count`, else None.

    >>> per_token(Poly.bs(96), Poly.bs(3)), per_token(Poly.const(7), Poly.bs(1))
    (32, None)
    """
    if count.is_zero() or set(size.terms) != set(count.terms):
        return None
    ratios = {c / count.terms[m] for m, c in size.terms.items()}
    a = ratios.pop()
    return int(a) if not ratios and a == int(a) and a > 0 else None


def count_slack(size: Poly, count: Poly, granularity: int) -> int:
    """The most the allocator's rounding to `granularity` adds to a storage of a * n bytes for
    any whole token count n >= 1 (a = per_token(size, count)): a * n is a multiple of
    gcd(a, granularity), so it is at most granularity - gcd(a, granularity) below the next
    multiple of granularity.

    >>> count_slack(Poly.bs(128), Poly.bs(1), 512), count_slack(Poly.bs(2), Poly.bs(1), 512)
    (384, 510)
    >>> count_slack(Poly.bs(2), Poly.bs(1), 1)
    0
    """
    from math import gcd

    return granularity - gcd(per_token(size, count), granularity)


@dataclass(eq=False, slots=True)
class Value:
    """A logical tensor (possibly a view) of `size` bytes backed by `storage`."""

    storage: Storage
    size: Poly
    requires_grad: bool
    is_param: bool = False
    label: str = ""
    grad_size: Poly | None = None  # bytes of its gradient when it differs (params under autocast)
    elt: int = 4  # bytes per element (dtype size)
    rows: int = 0  # dim 0 of a parameter (FSDP shards along it)
    leaf: bool = False  # a non-parameter leaf made to require grad (its .grad is accumulated)
    quant: int = 0  # elements of the matrix a bitsandbytes 4-bit weight packs (0: not quantised)
    last2: tuple[int, int] | None = None  # the last two dims of a parameter of >= 3 dims (MoE
    # experts; transformers' Adafactor factors over them); None: (rows, numel // rows) or 1-D


@dataclass(slots=True)
class Grad:
    """Backward step: allocate the gradient of input `index` (its own size unless `size`)."""

    index: int
    size: Poly | None = None


@dataclass(slots=True)
class Alias:
    """Backward step: input `index` receives the incoming gradient itself (no allocation)."""

    index: int


@dataclass(slots=True)
class Temp:
    """Backward step: allocate a temporary of `size` bytes, freed when the node finishes
    (or at the next FreeTemps)."""

    size: Poly


@dataclass(slots=True)
class FreeTemps:
    """Backward step: free the temporaries allocated so far in this node (only the `first`
    oldest of them when given)."""

    first: int | None = None


@dataclass(slots=True)
class Returns:
    """Backward step: the node's apply returns here; the steps after it are the engine's
    validate_outputs (torch/csrc/autograd/engine.cpp: sum_to a broadcast input's shape, a cast to
    its dtype). In a checkpoint region the saved tensors the node unpacked are freed here, before
    those: torch/utils/checkpoint.py's unpack_hook drops the frame's reference
    (`holder.handles[gid] = None`), so apply's locals held the last one. Elsewhere the SavedVariables
    keep them until release_variables, after validate_outputs. Measured (validate tracker, y * w
    with y (S, h) and w (S, 1) saved by the product only): after the two products, sum_to's (S, 1)
    sum adds its bytes with y and w alive, but under torch.utils.checkpoint with both freed."""


BackwardStep = Grad | Alias | Temp | FreeTemps | Returns  # what a backward node does, in order


def product_saves(x: "Value", y: "Value") -> list["Value"]:
    """What autograd saves for a product of x and y (mul, mm, bmm, addmm): each operand only
    when the other requires grad, since it appears only in the other's gradient formula
    (the generated autograd code guards each save with should_compute_output; measured with
    torch 2.13: F.linear with a frozen weight saves no input, mul saves `_saved_self` None).

    >>> from memcalc.core.poly import Poly
    >>> a = Value(Storage(Poly.const(4), "activations", "a"), Poly.const(4), True)
    >>> w = Value(Storage(Poly.const(4), "weights", "w"), Poly.const(4), False, True)
    >>> [v.storage.label for v in product_saves(a, w)]
    ['w']
    """
    return ([x] if y.requires_grad else []) + ([y] if x.requires_grad else [])


@dataclass(eq=False, slots=True)
class Node:
    """One forward op."""

    name: str
    inputs: list[Value]
    outputs: list[Value]
    saved: list[Storage]
    backward: list
    region: int | None = None  # checkpoint region id; saved tensors of a region are recomputed
    hook: tuple[str, str] | None = None  # FSDP module boundary: ("begin" | "end", group)


class Graph:
    """Builds a forward program.

    >>> g = Graph(); w = g.param("w", Poly.const(16)); x = g.input("x", Poly.bs(4))
    >>> y = g.op("mul", [x, w], Poly.bs(4), saves=[x, w], backward=[Grad(0), Grad(1)])
    >>> len(g.nodes)
    1
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.params: list[Value] = []
        self.inputs: list[Value] = []
        self.buffers: list[Value] = []
        self.region: int | None = None
        self._next_region = 0
        self.keep: list[Value] = []  # outputs kept alive past the forward (the loss)
        self.leaves: list[Value] = []  # activations made leaves requiring grad (require_grad_leaf)
        self.count: Poly | None = None
        """While set, new storages whose size is a whole multiple of it are one expert's in a
        'worst'-routing bound (Storage.count; memcalc.families.moe.eager_experts)."""
        self.granularity = 1
        """The allocator's rounding (memcalc.allocator.rules.granularity) that Storage.count bounds."""
        self.cached_casts: set[int] = set()
        """Storage ids of autocast's cached weight casts (Ops.matmul_operand); a checkpoint
        recompute caches its own until it stops (memcalc.tape.simulate StepSimulator._recompute)."""
        self.shared_inputs = False
        """While set, input() returns the batch tensor of that label if there is one (a second
        forward of the same batch: memcalc.families.trl_dpo's reference pass)."""
        self.shared_buffers = False
        """While set, buffer() returns the buffer of that label if there is one (the same
        module run again)."""
        self.no_grad = False
        """While set, new ops require no grad and save nothing, whatever their inputs
        (torch.no_grad(): memcalc.families.trl_grpo's scoring and generation passes)."""
        self.layer_starts: list[int] = []
        """Index of the first node of each decoder layer, and after the last layer the index
        past it (memcalc.families.base.run_layers; memcalc.engine.depth reads the repeats from it)."""

    # ---- leaves ------------------------------------------------------------------------------
    def param(self, label: str, size: Poly, elt: int = 4, trainable: bool = True,
              category: str = "weights") -> Value:
        """A parameter: trainable (a leaf that accumulates .grad) or frozen (requires_grad=False:
        no gradient, no optimizer state, and ops save nothing for its gradient)."""
        v = Value(Storage(size, category, label), size, trainable, True, label, None, elt)
        self.params.append(v)
        return v

    @property
    def trainable_params(self) -> list[Value]:
        """The parameters the optimizer updates (those that receive a .grad)."""
        return [v for v in self.params if v.requires_grad]

    def input(self, label: str, size: Poly, elt: int = 8) -> Value:
        """A batch tensor created before the step (token ids, labels)."""
        if self.shared_inputs:
            found = next((v for v in self.inputs if v.label == label), None)
            if found is not None:
                return found
        v = Value(Storage(size, "inputs", label), size, False, label=label, elt=elt)
        self.inputs.append(v)
        return v

    def buffer(self, label: str, size: Poly, elt: int = 4) -> Value:
        """A module buffer alive for the whole run (causal mask, rotary tables)."""
        if self.shared_buffers:
            found = next((v for v in self.buffers if v.label == label), None)
            if found is not None:
                return found
        v = Value(Storage(size, "buffers", label), size, False, label=label, elt=elt)
        self.buffers.append(v)
        return v

    # ---- ops ---------------------------------------------------------------------------------
    def op(self, name: str, inputs: list[Value], size: Poly, saves: Sequence[Value] = (),
           backward: Sequence[BackwardStep] = (),
           requires_grad: bool | None = None, category: str = "activations", elt: int = 4,
           save_output: bool = False) -> Value:
        """An op producing one new tensor of `size` bytes (`elt` bytes per element); with
        `save_output` autograd also saves the result (softmax, tanh, log_softmax). The same as
        op_multi with one size, written out (most ops have one output)."""
        rg = False if self.no_grad else requires_grad
        if rg is None:  # any input requires grad
            rg = False
            for v in inputs:
                if v.requires_grad:
                    rg = True
                    break
        count = None if self.count is None else self._count_of(size)
        st = Storage(size, category, f"{name}.out0", count)
        out = Value(st, size, rg, False, name, None, elt)  # (positional: is_param, label, grad_size, elt)
        if rg:
            saved = [v.storage for v in saves]
            if save_output:
                saved.append(st)
            self.nodes.append(Node(name, list(inputs), [out], saved, list(backward), self.region))
        else:
            self.nodes.append(Node(name, list(inputs), [out], [], [], self.region))
        return out

    def op_multi(self, name: str, inputs: list[Value], sizes: list[Poly], saves: Sequence[Value] = (),
                 backward: Sequence[BackwardStep] = (), requires_grad: bool | None = None,
                 category: str = "activations", elts: list[int] | None = None,
                 save_outputs: Sequence[int] = ()) -> list[Value]:
        """An op producing several new tensors; autograd saves `saves` and the outputs at the
        indices `save_outputs`, when any input requires grad."""
        rg = any(v.requires_grad for v in inputs) if requires_grad is None else requires_grad
        rg = rg and not self.no_grad
        elts = elts or [4] * len(sizes)
        outs = [Value(Storage(sz, category, f"{name}.out{i}", self._count_of(sz)), sz, rg, label=name, elt=e)
                for i, (sz, e) in enumerate(zip(sizes, elts))]
        saved = [v.storage for v in saves] + [outs[i].storage for i in save_outputs] if rg else []
        self.nodes.append(Node(name, list(inputs), outs, saved, list(backward) if rg else [],
                               self.region))
        return outs

    def _count_of(self, size: Poly) -> Poly | None:
        """The expert token count a new storage of `size` is sized by (see `count`), or None."""
        c = self.count
        return None if c is None or per_token(size, c) is None else c

    def view(self, name: str, x: Value, size: Poly | None = None,
             backward: Sequence[BackwardStep] | None = None) -> Value:
        """A view of x (no allocation); its backward passes the gradient through."""
        rg = x.requires_grad and not self.no_grad
        out = Value(x.storage, x.size if size is None else size, rg, False, name, None, x.elt)
        bwd = [Alias(0)] if backward is None else backward
        self.nodes.append(Node(name, [x], [out], [], bwd if rg else [], self.region))
        return out

    def views(self, name: str, x: Value, sizes: list[Poly],
              backward: Sequence[BackwardStep] = ()) -> list[Value]:
        """Several views of x at once (split/chunk); `backward` runs once for all of them."""
        rg = x.requires_grad and not self.no_grad
        outs = [Value(x.storage, sz, rg, label=f"{name}.{i}", elt=x.elt) for i, sz in enumerate(sizes)]
        self.nodes.append(Node(name, [x], outs, [], list(backward) if rg else [],
                               self.region))
        return outs

    def order_params(self, rank: Callable[[str], Any]) -> None:
        """Put parameters in nn.Module registration order (model.parameters(), the order the
        optimizer's for-loop visits them): a stable sort by `rank(label)`."""
        self.params.sort(key=lambda v: rank(v.label))

    def require_grad_leaf(self, x: Value) -> None:
        """`x.requires_grad_(True)` on a tensor that does not require grad (transformers'
        enable_input_require_grads hook on a frozen embedding's output): x becomes a leaf whose
        AccumulateGrad node keeps x, and the .grad it receives, alive until the graph is freed
        with the loss (after backward)."""
        if x.requires_grad:
            return  # a non-leaf that already requires grad: requires_grad_ changes nothing
        x.requires_grad, x.leaf = True, True
        self.leaves.append(x)

    def module_boundary(self, kind: str, group: str) -> None:
        """Where a wrapped module's forward begins or ends (FSDP's hooks run there)."""
        self.nodes.append(Node(f"module {kind} {group}", [], [], [], [], self.region, hook=(kind, group)))

    def scope_end(self, values: list[Value]) -> None:
        """Python locals stay alive until their function returns: keep `values` alive to here."""
        self.nodes.append(Node("scope end", list(values), [], [], [], self.region))

    # ---- checkpoint regions ------------------------------------------------------------------
    def begin_region(self) -> None:
        """Following ops run under torch.utils.checkpoint (non-reentrant): nothing saved in
        forward, the region's inputs kept, the region recomputed in backward."""
        self.region = self._next_region
        self._next_region += 1

    def end_region(self) -> None:
        """Back to normal autograd saving."""
        self.region = None
