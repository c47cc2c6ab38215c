"""The memory of one pipeline stage, as torch.distributed.pipelining's PipelineStage runs it
(torch 2.13, torch/distributed/pipelining/stage.py and schedules.py):

- the stage's program is its decoder layers, with the embedding on the first stage and the final
  norm, LM head and the schedule's loss_fn (F.cross_entropy on the logits) on the last, as
  torchtitan splits its decoder (memcalc.parallel.pipeline.stage_layers);
- a later stage's input is its receive buffer for that micro-batch (PipelineStage.
  _prepare_forward_infra makes one per micro-batch, kept across steps), a leaf made to require
  grad (_retrieve_recv_activations): backward accumulates the input gradient into its .grad,
  which stage_backward returns and get_bwd_send_ops sends; clear_runtime_states sets it to None
  only at the start of the next step;
- an earlier stage's backward starts from its gradient receive buffer for that micro-batch
  (_create_grad_recv_info, one per micro-batch, kept across steps) instead of a loss;
- forward_one_chunk keeps the stage's output in fwd_cache until its backward; the last stage also
  appends it to output_chunks (kept, detached after backward, until the next step's
  clear_runtime_states), and the schedule keeps each micro-batch's loss (_internal_losses, then
  the caller's `losses` list).

`stage_profile` walks one micro-batch's forward and backward through the stage's graph twice (no
.grad yet, then accumulating into it, as memcalc.tape.step walks micro-steps) and returns what a
schedule's walk of many micro-batches needs (memcalc.parallel.pipeline_peaks).

>>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
>>> spec = ModelSpec.make(family="gpt2", vocab_size=96, hidden_size=32, num_layers=4, num_heads=2,
...                       implementation="reference", tie_embeddings=False)
>>> t = TrainingConfig(micro_batch=1, seq_len=16, device="cpu")
>>> last = stage_profile(spec, t, range(2, 4), False, True, (16 * 32 * 4, 4))
>>> last.kept == 16 * 96 * 4 + 4  # the logits in output_chunks and the loss
True
"""
from __future__ import annotations

from dataclasses import dataclass

from memcalc.core.errors import NotModelledError
from memcalc.allocator.rules import device_constants
from memcalc.core.poly import Poly
from memcalc.engine.codegen import MomentSet
from memcalc.engine.regime import Regime
from memcalc.families import program_for
from memcalc.families.base import TOKENS, run_layers, size
from memcalc.families.loss import reference_cross_entropy
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.tape.graph import Graph, Storage, Value
from memcalc.tape.ops import Ops
from memcalc.tape.simulate import StepSimulator
from memcalc.tape.step import _optimizer_storages


@dataclass(frozen=True)
class StageProfile:
    """Bytes of one stage at one micro-batch's shape (allocator-rounded), from stage_profile."""

    base: int
    """Before any micro-batch: parameters, buffers, one receive buffer (a later stage), one
    gradient receive buffer (an earlier stage), one micro-batch's ids (first) or targets (last)."""
    forward: int
    """The most a forward adds over what was live when it began."""
    saved: int
    """What a forward leaves until its backward: saved tensors and the output fwd_cache keeps."""
    first_backward: int
    """The most the step's first backward of the stage adds (no .grad yet) over base + saved."""
    grads: int
    """The parameters' .grad the first backward leaves."""
    backward: int
    """The most a later backward (accumulating into .grad) adds over base + grads + saved."""
    input_grad: int
    """The .grad of the receive buffer each backward leaves until the next step (a later stage)."""
    kept: int
    """What each micro-batch leaves after its backward on the last stage: its logits in
    output_chunks and its loss."""
    per_microbatch: int
    """What each micro-batch adds for the whole step: its receive buffer and gradient receive
    buffer (kept across steps), its ids (first stage) or targets (last); the graph walks one."""
    states: int
    """The optimizer states of the stage's parameters."""
    param_sizes: tuple[int, ...]
    """Bytes of each trainable parameter, in module order (optimizer.step's temporaries)."""
    logits: int
    """One micro-batch's logits (the last stage), what step()'s merge of output_chunks copies."""
    output: Poly
    """The stage's output size in b, s (the next stage's receive buffer)."""
    output_elt: int
    """Its element size."""
    shared: tuple[tuple[str, int], ...] = ()
    """(label, bytes) of what `base` holds that the stages of one rank share: the buffers of
    DecoderProgram.shared_stage_buffers (the harness takes every stage of a rank from one model)
    and the device's library allocations (the cuBLAS workspace, one per process)."""


def stage_graph(spec: ModelSpec, regime: Regime, layers: range, first: bool, last: bool,
                recv: tuple[Poly, int] | None) -> tuple[Graph, Value]:
    """The stage's forward program and its output (validate.distributed.pipeline._Stage):
    embed (first) or a receive buffer that requires grad; the layers; final norm, LM head and
    F.cross_entropy (last); a later stage's output is kept (fwd_cache) until its backward."""
    program = program_for(spec)
    ops = Ops(Graph(), regime)
    g = ops.g
    if first:
        emb = program.embed(ops, spec, regime)
    else:
        x = g.input("receive buffer", recv[0], elt=recv[1])
        x.requires_grad, x.leaf = True, True  # a leaf whose .grad the caller keeps
        emb = program.stage_embedded(ops, spec, regime, x)
    x, context = emb.x, emb.context
    per_layer = regime.checkpointing == "per-layer"  # selective: inside the blocks (attention_core)
    if spec.implementation == "hf":  # the base model's forward over the stage's layers (_hf_stage)
        x = run_layers(ops, len(layers), set(range(len(layers))) if per_layer else set(),
                       lambda y, i: program.block(ops, spec, regime, y, layers[i], context), x,
                       context.get("position_ids"))
        if not last:  # the norm is nn.Identity: LlamaModel.forward returns, its locals go
            ops.scope_end(emb.held_until_norm)
    else:
        _stage_causal_mask(g, spec, regime, len(layers))
        for layer in layers:
            g.layer_starts.append(len(g.nodes))
            if per_layer:  # torch.utils.checkpoint around each block, non-reentrant
                g.begin_region()
            x = program.block(ops, spec, regime, x, layer, context)
            if per_layer:
                g.end_region()
        g.layer_starts.append(len(g.nodes))
    if not last:
        g.keep.append(x)
        g.order_params(program.registration_rank)
        return g, x
    h = program.final_norm(ops, spec, x)
    ops.scope_end(emb.held_until_norm)  # LlamaModel.forward returns (HF); nothing held (reference)
    head = ops.param(program.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
    logits = ops.linear(h, head, None, TOKENS, spec.vocab_size, "lm_head")
    target = g.input("target", size("b s", 8))
    reference_cross_entropy(ops, logits, target)
    g.keep.append(logits)  # fwd_cache and output_chunks
    ops.scope_end(ops.weight_casts)
    g.order_params(program.registration_rank)
    return g, logits


def _stage_causal_mask(g: Graph, spec: ModelSpec, regime: Regime, layers: int) -> None:
    """Eager attention: each layer's AttentionCore registers a (P, P) bool causal mask
    (validate.models.reference); a stage holds its own layers' (the embed hook's is the model's)."""
    g.buffers[:] = [v for v in g.buffers if v.label != "causal_mask"]
    if regime.attention == "eager":
        P = spec.max_position_embeddings
        g.buffer("causal_mask", size("L P P", 1, L=layers, P=P), elt=1)


def stage_profile(spec: ModelSpec, training: TrainingConfig, layers: range, first: bool, last: bool,
                  recv: tuple[int, int] | None) -> StageProfile:
    """Walk one micro-batch of `training.micro_batch` sequences through a stage twice (module
    docstring) and read its bytes at that shape; `recv` is the previous stage's output (bytes,
    element size), None on the first stage."""
    from memcalc.engine.run import regime_for  # the shape conditions (a reached sliding window, ...)

    regime = regime_for(spec, training)
    if regime.checkpointing not in ("none", "per-layer", "selective"):
        raise NotModelledError("checkpointing", f"{regime.checkpointing} checkpointing inside pipeline stages "
                               "(segments of several layers) is not modelled",
                               "use none, per-layer or selective with pipeline_parallel > 1")
    recv_bytes = None if recv is None else recv[0]
    g, out = stage_graph(spec, regime, layers, first, last, None if recv is None else (Poly.const(recv[0]), recv[1]))
    b, s = training.micro_batch, training.seq_len
    seed = None if last else Storage(out.size, "pipeline", "gradient receive buffer")
    sim = StepSimulator(g, seed=seed)
    sim.setup()
    mem = sim.mem
    for name, nbytes in device_constants(regime.device).items():  # the cuBLAS workspace, once per stage
        mem.hold(Storage(Poly.const(nbytes), name, name))
    if seed is not None:
        mem.hold(seed)
    sim.hold_inputs()

    def point(name: str) -> None:
        mem.phase = name
        mem.mark(name)

    walk = (("t0", None), ("f0", sim.forward), ("t1", None), ("b0", sim.backward), ("t2", None),
            ("f1", sim.forward), ("t3", None), ("b1", sim.backward), ("t4", None))
    for name, step in walk:
        if step is None:
            point(name)
            continue
        mem.micro = int(name[1])
        step()
        phase = "forward" if name[0] == "f" else "backward"
        mem.frontiers[name] = mem.frontiers.pop(phase)
    moments = mem.moments
    totals = MomentSet(moments, regime.granularity).rounded_totals(b, s)
    top: dict[str, int] = {}
    for m, t in zip(moments, totals):
        top[m.phase] = max(top.get(m.phase, t), t)
    t0, t1, t2, t3 = top["t0"], top["t1"], top["t2"], top["t3"]
    grads = t2 - t0
    each = out.size.eval(b, s)
    logits = each if last else 0
    return StageProfile(
        base=t0, forward=top["f0"] - t0, saved=t1 - t0, first_backward=top["b0"] - t1, grads=grads,
        backward=top["b1"] - t3, input_grad=0 if first else recv_bytes, kept=logits + 4 if last else 0,
        per_microbatch=(0 if first else recv_bytes) + (0 if last else each)
        + (size("b s", 8).eval(b, s) if first or last else 0), logits=logits,
        states=sum(st.size.eval(1, 1) for st in _optimizer_storages(g, regime)),
        param_sizes=tuple(v.size.eval(1, 1) for v in g.trainable_params),
        output=out.size, output_elt=out.elt,
        shared=tuple((v.label, v.size.eval(b, s)) for v in g.buffers
                     if v.label in program_for(spec).shared_stage_buffers)
        + tuple(device_constants(regime.device).items()))


__all__ = ["StageProfile", "stage_graph", "stage_profile"]
