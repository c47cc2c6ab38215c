"""Walk a forward program through forward, backward and the optimizer step, tracking every
storage's lifetime, and keep the moments that can set the peak.

Rules, each from PyTorch's own machinery (and each checked against validate.measure.tracker timelines):
- forward: an op's outputs are allocated, then tensors whose last forward use has passed are
  freed unless an autograd node saved them (Python references end at last use);
- backward (torch/csrc/autograd/engine.cpp): nodes run in reverse creation order; a node
  allocates its input gradients, then frees what it saved and its incoming gradient;
  a gradient arriving where one is already buffered is summed out of place (input_buffer.cpp);
  a parameter's first gradient is stolen into .grad, later ones are added in place
  (accumulate_grad.h);
- checkpoint regions (torch/utils/checkpoint.py, non-reentrant, early stop): nothing inside is
  saved in forward, the region's inputs are; backward recomputes the region up to its last
  saving op, then runs the region's backward.
The storages' bookkeeping is the ledger's (memcalc.tape.ledger, record mode memcalc.tape.record).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.poly import Poly
from memcalc.tape.graph import Alias, FreeTemps, Grad, Graph, Node, Returns, Storage, Temp, Value, per_token
from memcalc.tape.ledger import Memory
from memcalc.tape.record import RecordingMemory

if TYPE_CHECKING:
    from memcalc.parallel.fsdp import Fsdp


def grad_category(param: Value) -> str:
    """The report's component of a parameter's gradient: adapter_gradients for LoRA adapters
    (category adapter_weights), else gradients."""
    return "adapter_gradients" if param.storage.category == "adapter_weights" else "gradients"



def _grad_count(count: Poly | None, size: Poly) -> Poly | None:
    """A gradient of one expert's tensor in a 'worst' bound is that expert's too (Storage.count)."""
    return count if count is not None and per_token(size, count) is not None else None


class StepSimulator:
    """Simulate micro-steps of forward and backward over one Graph.

    >>> from memcalc.tape.graph import Graph, Grad
    >>> g = Graph(); w = g.param("w", Poly.const(64)); x = g.input("x", Poly.bs(4))
    >>> y = g.op("mul", [x, w], Poly.bs(4), saves=[x, w], backward=[Grad(1)])
    >>> g.keep.append(y); sim = StepSimulator(g); sim.setup(); sim.hold_inputs(); sim.micro_step()
    >>> max(m.total.eval(1, 1) for m in sim.mem.moments)
    140
    """

    def __init__(self, graph: Graph, fsdp: "Fsdp | None" = None, record: bool | dict = False,
                 memory: "Memory | None" = None, seed: Storage | None = None) -> None:
        self.g = graph
        self.fsdp = fsdp
        self.seed = seed
        """The gradient backward starts from, when it outlives the step's backward: a pipeline
        stage's gradient receive buffer (memcalc.parallel.stages), held by its caller; None: a
        fresh gradient of the loss, freed once its node has run."""
        # `memory`: another Memory to walk the step through (memcalc.engine.allocations records events)
        self.mem = memory if memory is not None else (
            Memory(graph.granularity) if record is False else RecordingMemory(record, graph.granularity))
        self.param_grads: dict[int, Storage] = {}
        self._param_buffers: dict[int, Storage] = {}
        self._consumers = self._param_consumers()
        self._pending: dict[int, int] = {}
        self._leaf_grads: list[Storage] = []
        self._last_use = self._forward_last_use()

    # ---- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Parameters and buffers are allocated before the step."""
        for v in self.g.params + self.g.buffers:
            self.mem.hold(v.storage)
        if self.fsdp is not None:
            self.fsdp.setup(self.mem)

    def _param_consumers(self) -> dict[int, int]:
        """How many nodes deliver a gradient to each trainable parameter (by id)."""
        counts: dict[int, int] = {}
        for node in self.g.nodes:
            if not node.backward:
                continue
            inputs, params = node.inputs, set()
            for step in node.backward:
                if type(step) is Grad:
                    v = inputs[step.index]
                    if v.is_param and v.requires_grad:
                        params.add(id(v))
            for key in params:
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _forward_last_use(self) -> dict[int, int]:
        last: dict[int, int] = {}
        for i, node in enumerate(self.g.nodes):
            for v in node.inputs:
                last[id(v.storage)] = i
        return last

    # ---- forward --------------------------------------------------------------------------
    def forward(self) -> None:
        """Run the forward program, holding saved tensors (or region inputs)."""
        mem, nodes = self.mem, self.g.nodes
        holds, hold, release, mark = mem.holds, mem.hold, mem.release, mem.mark
        last_use = self._last_use
        mem.phase = "forward"
        expiring: dict[int, list[Storage]] = {}
        kept = {id(v.storage) for v in self.g.keep + self.g.leaves}
        self._region_inputs: dict[int, list[Storage]] = {}
        self._region_held: dict[int, set[int]] = {}  # the ids of each region's list
        produced_in: dict[int, int | None] = {}
        fsdp, previous = self.fsdp, "root"
        mem.where = "forward start"
        if fsdp is not None:
            fsdp.pre_forward(mem, "root", None)
        for i, node in enumerate(nodes):
            mem.where = i
            if node.hook is not None and fsdp is not None:
                kind, group = node.hook
                if kind == "begin":
                    fsdp.pre_forward(mem, group, previous)
                    previous = group
                else:
                    fsdp.post_forward(mem, group)
            new = [v.storage for v in node.outputs if id(v.storage) not in holds]  # not mem.alive
            region = node.region
            for st in new:
                hold(st)
                produced_in[id(st)] = region
            mark(node.name)
            if region is None:
                for st in node.saved:
                    hold(st)
            else:
                self._hold_region_inputs(node, produced_in)
            for st in new:
                key = id(st)
                if key in kept:
                    continue
                end = last_use.get(key, i)
                end = i if end < i else end
                found = expiring.get(end)
                if found is None:
                    expiring[end] = [st]
                else:
                    found.append(st)
            for st in expiring.pop(i, ()):
                release(st)
        mem.where = "forward end"
        if fsdp is not None:
            fsdp.root_post_forward(mem)
        mark("end of forward")

    def _hold_region_inputs(self, node: Node, produced_in: dict) -> None:
        region = node.region
        held = self._region_inputs.get(region)
        if held is None:
            held = self._region_inputs[region] = []
            self._region_held[region] = set()
        ids, holds = self._region_held[region], self.mem.holds
        for v in node.inputs:
            st = v.storage
            key = id(st)
            if v.is_param or produced_in.get(key, "outside") == region:
                continue
            if key in ids or key not in holds:  # already held for the region, or not mem.alive
                continue
            held.append(st)
            ids.add(key)
            self.mem.hold(st)

    # ---- backward -------------------------------------------------------------------------
    def backward(self) -> None:
        """Run backward from the kept loss; parameter grads accumulate into .grad."""
        mem, nodes = self.mem, self.g.nodes
        mem.phase = "backward"
        mem.where = "backward start"
        grads: dict[int, Storage] = {}
        self._pending = dict(self._consumers)
        loss = self.g.keep[0]
        seed = self.seed if self.seed is not None else Storage(loss.size, "activation_grads", "grad of loss")
        mem.hold(seed)
        grads[id(loss)] = seed
        mem.mark("loss grad")
        if self.fsdp is not None:
            self.fsdp.pre_backward(mem, "root")
        recomputed: dict[int, Storage] = {}
        started_regions: set[int] = set()
        for i in range(len(nodes) - 1, -1, -1):
            node = nodes[i]
            mem.where = i
            region = node.region
            if node.hook is not None:
                kind, group = node.hook
                if self.fsdp is not None and kind == "end":
                    self.fsdp.pre_backward(mem, group)
                elif self.fsdp is not None:
                    self.fsdp.post_backward(mem, group, self.param_grads)
                if region is not None and self._first_of_region(i):
                    self._release_region_inputs(region)
                continue
            outputs = node.outputs
            if len(outputs) == 1:  # (most nodes)
                found = grads.pop(id(outputs[0]), None)
                incoming = [] if found is None else [found]
            else:
                incoming = [g for g in [grads.pop(id(v), None) for v in outputs] if g is not None]
            if not incoming:
                # a region whose first op gets no gradient (a frozen q and k under LoRA, at one
                # sequence with no reshape copy before q @ k^T) still ends here: checkpoint's
                # frame drops its inputs once the region's saved tensors are released
                if region is not None and self._first_of_region(i):
                    self._release_region_inputs(region)
                continue
            # checkpoint's unpack hook recomputes at the first saved tensor backward needs:
            # region nodes that saved nothing (adds, casts, scalar muls) run before it (measured)
            if region is not None and region not in started_regions and node.saved:
                started_regions.add(region)
                recomputed = self._recompute(region, i)
                mem.where = i
            self._run_node(node, incoming, grads, None if region is None else recomputed)
            if region is not None and self._first_of_region(i):
                self._release_region_inputs(region)
        mem.where = "backward end"
        for v in self.g.keep + self.g.leaves:
            mem.release(v.storage)
        for st in list(grads.values()) + self._leaf_grads:
            mem.release(st)
        self._leaf_grads = []
        if self.fsdp is not None:
            self.fsdp.end_of_backward(mem, self.param_grads)
        mem.mark("end of backward")

    def _first_of_region(self, i: int) -> bool:
        nodes = self.g.nodes
        return i == 0 or nodes[i - 1].region != nodes[i].region

    def _release_region_inputs(self, region: int) -> None:
        for st in self._region_inputs.get(region, ()):
            self.mem.release(st)

    def _recompute(self, region: int, last: int) -> dict[int, Storage]:
        """Re-run the region's forward up to its last saving op (early stop); return
        original -> recomputed storage. The generated autograd code saves an op's inputs before
        it calls the kernel and its outputs after, so when the last saving op saves only
        inputs the recompute stops before that op allocates anything (measured: a checkpointed
        Llama layer's recompute ends at down_proj's weight cast, with no mm). A recomputed
        tensor is freed after its last use in the region, or, if Python still refers to it past
        the stopping point, when the recompute stops (checkpoint.py raises
        _StopRecomputationError, unwinding the frames). A weight cast autocast caches
        (Graph.cached_casts) lives until the recompute stops: checkpoint re-enters autocast for
        the recompute, the outermost autocast then, whose cache is cleared only when it exits
        (torch/utils/checkpoint.py, torch/amp/autocast_mode.py __exit__; measured: a
        checkpointed GPT-NeoX layer's bias casts, saved by no op, freed together at the stop)."""
        mem, nodes, cached_casts = self.mem, self.g.nodes, self.g.cached_casts
        hold, release, mark = mem.hold, mem.release, mem.mark
        first = trigger = last
        while first > 0 and nodes[first - 1].region == region:
            first -= 1
        while last + 1 < len(nodes) and nodes[last + 1].region == region:
            last += 1  # trailing nodes without gradients (scope ends) still hold references
        stop = max((j for j in range(first, last + 1) if nodes[j].saved), default=first - 1)
        last_use: dict[int, int] = {}
        for j in range(first, last + 1):
            for v in nodes[j].inputs:
                last_use[id(v.storage)] = j
        copies: dict[int, Storage] = {}
        held: dict[int, int] = {}  # copy key -> index after which Python drops it
        dropped: dict[int, list[int]] = {}  # index -> the keys of `held` dropped after it, in order
        for j in range(first, stop + 1):
            node = nodes[j]
            mem.where = (trigger, j)
            for v in node.outputs:
                st = v.storage
                key = id(st)
                if key in copies or st in [u.storage for u in node.inputs]:  # (Storage: eq is identity)
                    continue  # already made, or a view of an input
                if j == stop and st not in node.saved:
                    continue  # the last pack is of an input: the stop comes before the kernel
                copy = copies[key] = Storage(st.size, "activations", "recomputed", st.count)
                hold(copy)
                end = held[key] = last + 1 if key in cached_casts else last_use.get(key, j)
                end = j if end < j else end  # dropped at the first index >= end from here
                if end in dropped:  # (after `stop` when Python holds it: freed at the stop)
                    dropped[end].append(key)
                else:
                    dropped[end] = [key]
            mark(f"recompute {node.name}")
            for st in node.saved:
                hold(copies.get(id(st), st))
            for key in dropped.pop(j, ()):
                release(copies[key])
                del held[key]
        for key in held:
            release(copies[key])
        return copies

    def _run_node(self, node: Node, incoming: list[Storage], grads: dict,
                  recomputed: dict[int, Storage] | None) -> None:
        """engine.cpp call_function: compute all input grads, free the incoming grads and the
        node's saved tensors (their `recomputed` copies in a checkpoint region, at the node's
        Returns step when it has one), then deliver the grads (where sums happen)."""
        mem = self.mem
        hold, mark = mem.hold, mem.mark
        temps: list[Storage] = []
        deliveries: list[tuple[Value, Storage]] = []
        label = None
        released = False
        for step in node.backward:
            kind = type(step)
            if kind is Grad:
                target = node.inputs[step.index]
                if not target.requires_grad:
                    continue
                size = step.size or target.grad_size or target.size
                count = target.storage.count
                st = Storage(size, grad_category(target) if target.is_param else "activation_grads",
                             f"grad {target.label}", None if count is None else _grad_count(count, size))
                hold(st)
                if label is None:
                    label = f"{node.name} backward"
                mark(label)
                deliveries.append((target, st))
            elif kind is Alias:
                target = node.inputs[step.index]
                if target.requires_grad and incoming:
                    hold(incoming[0])
                    deliveries.append((target, incoming[0]))
            elif kind is Temp:
                st = Storage(step.size, "activation_grads", f"{node.name} temp")
                hold(st)
                temps.append(st)
                if label is None:
                    label = f"{node.name} backward"
                mark(label)
            elif kind is FreeTemps:
                k = len(temps) if step.first is None else step.first
                for st in temps[:k]:
                    mem.release(st)
                temps = temps[k:]
            elif kind is Returns and recomputed is not None and not released:
                released = True  # apply's unpacked recomputed tensors die before validate_outputs
                for st in node.saved:
                    mem.release(recomputed.get(id(st), st))
        release = mem.release
        for st in temps:
            release(st)
        for st in incoming:
            release(st)
        if recomputed is None:
            for st in node.saved:
                release(st)
        elif not released:
            for st in node.saved:
                release(recomputed.get(id(st), st))
        for target, st in deliveries:
            self._deliver(target, st, grads)

    def _deliver(self, target: Value, st: Storage, grads: dict) -> None:
        """Hand a gradient to its input: an activation's input buffer, or a parameter's
        AccumulateGrad node, which runs once every consumer of the parameter has delivered
        (a tied weight's two gradients are first summed in its input buffer)."""
        if target.leaf:  # AccumulateGrad of a leaf activation: .grad lives with the graph
            self._leaf_grads.append(st)
            return
        if not target.is_param:
            self._buffer(grads, id(target), st, target.size)
            return
        key = id(target)
        self._buffer(self._param_buffers, key, st, target.grad_size or target.size)
        self._pending[key] -= 1
        if self._pending[key] == 0:
            self._accumulate(key, self._param_buffers.pop(key), grad_category(target))

    def _buffer(self, buffers: dict, key: int, st: Storage, size: Poly) -> None:
        """input_buffer.cpp: the first gradient is stored, a later one summed out of place."""
        old = buffers.get(key)
        if old is None:
            buffers[key] = st
            return
        total = Storage(size, "activation_grads", "grad sum", _grad_count(st.count, size))
        self.mem.hold(total)
        self.mem.mark("sum of gradients")
        self.mem.release(st)
        self.mem.release(old)
        buffers[key] = total

    def _accumulate(self, key: int, st: Storage, category: str = "gradients") -> None:
        """accumulate_grad.h: steal the gradient into an empty .grad (copy an aliased one);
        add in place into an existing .grad (gradient accumulation)."""
        mem = self.mem
        old = self.param_grads.get(key)
        if old is not None:
            mem.release(st)
            return
        own = Storage(st.size, category, "grad")  # same bytes, now owned by .grad
        mem.hold(own)
        mem.release(st)
        self.param_grads[key] = own

    # ---- a micro-step ---------------------------------------------------------------------
    def micro_step(self) -> None:
        """Forward, backward; parameter grads survive (gradient accumulation)."""
        self.forward()
        self.backward()

    def hold_inputs(self) -> None:
        """The batch is made before the first micro-step and dropped after optimizer.step()."""
        for v in self.g.inputs:
            self.mem.hold(v.storage)
