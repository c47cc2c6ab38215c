"""A trl.DPOTrainer step (trl 1.16, CPU: no Triton), op by op, on top of any decoder program.

DPOTrainer._compute_loss (trainer/dpo_trainer.py) on a batch of 2p rows (p chosen, then p
rejected; here b = 2p):

    labels = input_ids.masked_fill(completion_mask == 0, -100)          # (b, s) int64
    outputs = model(..., labels=labels, fused_lm_head=True)            # the policy, with grad
    logps = outputs.log_probs[:, -seq_len:].sum(dim=1)                  # (b,) fp32
    with no_grad: ref = ref_model(..., fused_lm_head=True)             # unless precomputed
    loss = -logsigmoid(beta * ((c - ref_c) - (r - ref_r))).mean()      # (p,) tensors

`fused_lm_head=True` (trainer/utils.py add_fused_lm_head) runs the backbone, then
ChunkedLogProbFunction (kernels/chunked_logprob.py) on hidden[:, :-1].reshape(-1, h): never the
(b, s, V) logits, but a (min(N, 4096), 32768) tile buffer in the compute dtype and, on CPU,
torch temporaries of the tile's (n, vc) shape (vc = min(V, 32768)) while each tile is folded
(`_forward_tile`) and, in backward, turned into the logits' gradient (`_backward_tile`).

The reference forward is the same program built again with a second Ops whose parameters are
the reference model's own frozen copies (full fine-tuning) or the policy's base weights with
LoRA off (peft's disable_adapter); with nothing requiring grad, its ops save nothing, which is
what torch.no_grad does to memory.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from memcalc.core.poly import Poly
from memcalc.families.sizes import size
from memcalc.tape.graph import Alias, FreeTemps, Grad, Temp, Value
from memcalc.tape.ops import Ops

if TYPE_CHECKING:
    from memcalc.engine.regime import Regime
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from memcalc.tape.graph import Graph

TOKEN_CHUNK = 4096
"""chunked_logprob.TOKEN_CHUNK_SIZE: rows of one tile."""
VOCAB_CHUNK = 32768
"""trainer/utils._CHUNKED_LOGPROB_CHUNK_SIZE: the tile buffer's columns, whatever the vocabulary."""
POLICY_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")
"""What DPOTrainer asks the policy's fused head for (dpo_trainer.py __init__, use_weighting off);
a separate reference model's head computes log_probs only (add_fused_lm_head's default)."""


def rows_capped(micro_batch: int, seq_len: int) -> bool:
    """Whether the fused head's N = b*(s-1) rows exceed one token chunk (the tile is then
    4096 rows, whatever the shape): a shape condition, cached per value like a sliding window.

    >>> rows_capped(8, 512), rows_capped(8, 513), rows_capped(9, 513)
    (False, False, True)
    """
    return micro_batch * (seq_len - 1) > TOKEN_CHUNK


def _rows(elt: int) -> Poly:
    """Bytes of an (N,) = (b*(s-1),) tensor of `elt` bytes per element."""
    return size("b s", elt) - size("b", elt)


def _tile_rows(regime: Regime) -> Poly:
    """n: rows of a tile, N or one token chunk (rows_capped)."""
    return Poly.const(TOKEN_CHUNK) if regime.fused_rows_capped else _rows(1)


def dpo_batch(ops: Ops, regime: Regime) -> Value:
    """The batch tensors DataCollatorForPreference adds (completion_mask; with precomputed
    reference log-probs ref_chosen_logps and ref_rejected_logps, p fp32 values each), then
    _compute_loss's `labels`, made before the policy's forward. Returns labels."""
    g = ops.g
    cm = g.input("completion_mask", size("b s", 8))
    if regime.dpo_reference == "precomputed":
        g.input("ref_chosen_logps", size("b", 2), elt=4)  # p = b/2 fp32 values
        g.input("ref_rejected_logps", size("b", 2), elt=4)
    zero = g.op("completion_mask == 0", [cm], size("b s", 1), requires_grad=False, elt=1)
    return g.op("labels masked_fill", [zero], size("b s", 8), requires_grad=False, elt=8)


def dpo_batch_tensors(regime: Regime) -> list[tuple[str, Poly, int]]:
    """What one held batch of the DPO collator holds besides input_ids and attention_mask
    (memcalc.families.call_path.trainer_inputs).

    >>> from memcalc.engine.regime import Regime; from memcalc.inputs.training import TrainingConfig
    >>> r = Regime.of(TrainingConfig(micro_batch=2, seq_len=8, hf_trainer=True, trl="dpo"))
    >>> [name for name, _, _ in dpo_batch_tensors(r)]
    ['completion_mask']
    """
    if regime.trl != "dpo":
        return []  # SFT's collator: input_ids, attention_mask, labels (the Trainer's own count)
    out = [("completion_mask", size("b s", 8), 8)]
    if regime.dpo_reference == "precomputed":
        out += [("ref_chosen_logps", size("b", 2), 4), ("ref_rejected_logps", size("b", 2), 4)]
    return out


def fused_log_probs(ops: Ops, spec: ModelSpec, x: Value, head: Value, labels: Value,
                    outputs: tuple[str, ...], no_grad_kept: list | None = None) -> list[Value]:
    """add_fused_lm_head's _fused_forward after the backbone (CPU: compact=False, every row
    scored): mask, the reshaped hidden rows and clamped targets, ChunkedLogProbFunction, then
    each output viewed to (b, s-1) and masked_fill'ed. Returns [mask, log_probs, *others].
    With `no_grad_kept` (GRPO: no gradient ever reaches the entropy), the entropy's masked_fill
    is built without a gradient and its saved `~mask` is appended there, for the caller to hold
    as long as the entropy's graph lives (autograd frees it with the output)."""
    g, regime = ops.g, ops.regime
    h, V = spec.hidden_size, spec.vocab_size
    vc = min(V, VOCAB_CHUNK)
    n = _tile_rows(regime)
    c = regime.compute_elt if regime.autocast else x.elt  # torch.get_autocast_dtype, else hidden's
    mask = g.op("labels != -100", [labels], _rows(1), requires_grad=False, elt=1)
    # a copy (the slice is not contiguous); its backward: the view back, then SliceBackward's
    # zeros of the whole (b, s, h) and the copy into them
    hidden = g.op("hidden[:, :-1].reshape", [x], _rows(x.elt) * h,
                  backward=[Grad(0, size("b s h", x.elt, h=h))], elt=x.elt)
    targets = g.op("labels.clamp(min=0)", [labels], _rows(8), requires_grad=False, elt=8)
    # forward, under the Function's no_grad: seven (N,) fp32 running statistics, the tile buffer
    stats = g.op("chunked logprob stats", [], _rows(4) * 7, requires_grad=False)
    buf = g.op("mm_buf", [], n * (VOCAB_CHUNK * c), requires_grad=False, elt=c)
    held = [stats, buf]
    if c != x.elt:  # hidden[chunk].to(compute_dtype), bound for the whole token chunk
        held.append(g.op("hidden_chunk.to", [hidden], n * (h * c), requires_grad=False, elt=c))
    # the widest moment of one tile's fold (_forward_tile): with entropy (and is_top1's bool
    # before_target) z, before_target, e and e*z, with local, new_m, rescale and (e*z).sum(-1);
    # with log_probs alone z, z - new_m and e, with local, new_m and rescale
    policy = "entropy" in outputs
    tile = n * (vc * (13 if policy else 12)) + n * (20 if policy else 16)
    g.op("forward tile temporaries", [buf], tile, requires_grad=False)
    log_z = g.op("log_z", [stats], _rows(4), requires_grad=False)
    sizes = [_rows(4) if name != "is_top1" else _rows(1) for name in outputs]
    elts = [4 if name != "is_top1" else 1 for name in outputs]
    grad_weight = head.requires_grad
    backward = _backward_steps(h, V, vc, n, c, x.elt, head.elt, grad_weight)
    raw = g.op_multi("ChunkedLogProbFunction", [hidden, head, targets, log_z], sizes,
                     saves=[hidden, head, targets, log_z], backward=backward, elts=elts,
                     save_outputs=(1,) if policy else ())
    ops.scope_end(held)
    result = [mask]
    for name, value in zip(outputs, raw):
        shaped = g.view(f"{name}.view", value)
        inverted = g.op("~mask", [mask], _rows(1), requires_grad=False, elt=1)
        grads = ("log_probs",) if no_grad_kept is not None else ("log_probs", "entropy")
        result.append(g.op(f"{name}.masked_fill", [shaped, inverted], value.size,
                           saves=[inverted], backward=[Grad(0)], elt=value.elt,
                           requires_grad=value.requires_grad and name in grads))
        if no_grad_kept is not None and name not in grads:
            no_grad_kept.append(inverted)
    return result


def _backward_steps(h: int, V: int, vc: int, n: Poly, c: int, hidden_elt: int,
                    weight_elt: int, grad_weight: bool) -> list:
    """ChunkedLogProbFunction.backward: fp32 zeros for the hidden (and weight) gradients, the
    tile buffer, the bf16 copies of the chunk and weight slice, and the widest moment of
    _backward_tile: y, z, log_p, p, grad (locals), is_target (bool) and the two temporaries of
    `grad += g * (is_target.float() - p)`; then .to(dtype) of each gradient when it is not fp32."""
    N = _rows(1)
    steps: list = []
    late: list = []
    for index, rows, elt in ((0, N * h, hidden_elt), (1, Poly.const(V * h), weight_elt)):
        if index == 1 and not grad_weight:
            continue
        if elt == 4:
            steps.append(Grad(index, rows * 4))
        else:  # fp32 accumulator, cast at return
            steps.append(Temp(rows * 4))
            late.append(Grad(index, rows * elt))
    steps.append(Temp(n * (VOCAB_CHUNK * c)))
    if c != 4:
        steps += [Temp(n * (h * c)), Temp(Poly.const(vc * h * c))]
    steps += [Temp(n * (vc * 29)), FreeTemps()]
    return steps + late


def reference_pass(program: Any, ops: Ops, spec: ModelSpec, regime: Regime,
                   labels: Value, run_layers: Callable) -> list[Value]:
    """The reference model's no-grad forward with its fused head (log_probs; with LoRA the
    policy's own head, all four outputs), its stack run by `run_layers` (the trunk's,
    memcalc.families.base). Returns what _compute_loss keeps of it."""
    g = ops.g
    shared = {v.label: v for v in g.params} if regime.lora is not None else None
    ref_regime = replace(regime, lora=None, checkpointing="none", checkpoint_every=None)
    ref_ops = ReferenceOps(g, ref_regime, shared)
    starts = list(g.layer_starts)
    g.shared_inputs, g.shared_buffers = True, shared is not None
    try:
        emb = program.embed(ref_ops, spec, ref_regime)
        trunk = run_layers(ref_ops, spec.num_layers, set(),
                           lambda x, layer: program.block(ref_ops, spec, ref_regime, x, layer, emb.context),
                           emb.x, emb.context.get("position_ids"))
        x = program.final_norm(ref_ops, spec, trunk)
        ref_ops.scope_end(emb.held_until_norm)
        if not spec.tie_embeddings:
            head = ref_ops.param(program.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
        else:  # the embedding the head shares: the policy's (LoRA off), or the copy's own
            head = program.tied_head(ops) if shared is not None else ref_ops.created[0]
        outputs = POLICY_OUTPUTS if shared is not None else ("log_probs",)
        out = fused_log_probs(ref_ops, spec, x, head, labels, outputs)
        ref_ops.scope_end([x] + emb.held_until_return)
    finally:
        g.shared_inputs = g.shared_buffers = False
        g.layer_starts[:] = starts
    ref_logps = g.op("ref logps sum", [out[1]], size("b", 4), requires_grad=False)
    return out + [ref_logps]


class ReferenceOps(Ops):
    """Ops of the reference forward: each parameter the reference model's own frozen copy
    (`ref_model.` + its name), or with `shared` the policy's parameter of that name (peft's
    disable_adapter runs the base layers of the same model)."""

    def __init__(self, graph: Graph, regime: Regime, shared: dict | None):
        super().__init__(graph, regime)
        self.shared = shared
        self.created: list[Value] = []

    def param(self, label: str, count: int, rows: int | None = None,
              last2: tuple[int, int] | None = None) -> Value:
        """The reference's parameter of that name (see the class)."""
        if self.shared is not None:
            return self.shared[label]
        v = self.g.param(f"ref_model.{label}", Poly.const(count * self.param_elt), self.param_elt,
                         trainable=False)
        v.rows, v.last2 = rows or count, last2
        self.created.append(v)
        return v


def dpo_loss_step(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, x: Value,
                  head: Value, labels: Value, run_layers: Callable) -> list[Value]:
    """From the policy's last hidden state to the DPO loss (sigmoid): the fused head, the
    summed log-probs, the reference's (forward or batch), the loss on (p,) tensors. Returns
    what stays alive until _compute_loss returns (before backward)."""
    g = ops.g
    out = fused_log_probs(ops, spec, x, head, labels, POLICY_OUTPUTS)
    ops.scope_end([x])  # backbone_outputs.last_hidden_state, until the fused forward returns
    # log_probs[:, -seq_len:] (SliceBackward: zeros of (b, s-1), then the copy) summed over s
    sliced = g.view("log_probs[:, -seq_len:]", out[1], backward=[Grad(0, _rows(4))])
    logps = g.op("logps sum", [sliced], size("b", 4), backward=[Alias(0)])
    ref = reference_pass(program, ops, spec, regime, labels, run_layers) \
        if regime.dpo_reference == "model" else []
    ref_logps = ref[-1] if ref else next(v for v in g.inputs if v.label == "ref_chosen_logps")
    # (p,) tensors: two log-ratios, their difference, beta * it, logsigmoid (output and buffer)
    half = size("b", 2)
    ratios = g.op("log-ratios", [logps, ref_logps], half * 2, backward=[Grad(0, size("b", 4))])
    delta = g.op("delta_score", [ratios], half, backward=[Grad(0, half * 2)])
    scaled = g.op("beta * delta", [delta], half, backward=[Grad(0)])
    sig, buffer = g.op_multi("logsigmoid", [scaled], [half, half], saves=[scaled],
                             backward=[Grad(0)], save_outputs=(1,))
    loss = g.op("-mean", [sig, buffer], Poly.const(4), backward=[Grad(0)])
    g.keep.append(loss)
    return [labels, *out, *ref]


def check_dpo(_model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse, by field, the DPO steps not modelled (trl.DPOTrainer as measured on CPU).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> check_dpo(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=8, hf_trainer=True,
    ...     trl="dpo", attention_mask="ones"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: device: 'cuda': TRL's fused LM head runs Triton ...
    """
    from memcalc.core.errors import NotModelledError

    if training.trl == "none":
        return
    if training.device != "cpu":
        raise NotModelledError("device", f"{training.device!r}: TRL's fused LM head runs Triton "
                               "kernels on the valid rows only there (measured: CPU's torch path)",
                               "predict with device='cpu', or not at all on a GPU yet")
    for name, bad in (("world_size", training.world_size > 1), ("quantization", training.quantization != "none"),
                      ("lora.modules_to_save", bool(training.lora and training.lora.modules_to_save)),
                      ("use_cache", training.use_cache),
                      ("attention_mask", training.attention_mask != "ones"
                       and not (training.attention_mask == "packed" and training.trl == "sft"))):
        if bad:
            raise NotModelledError(name, f"{getattr(training, name.split('.')[0])!r} with trl='dpo' is not "
                                   "modelled (measured: one process, full or LoRA, unpadded batches)",
                                   f"drop {name}")


def without_dropout(model: ModelSpec) -> ModelSpec:
    """The model as DPOTrainer trains it: disable_dropout=True (its default; False is refused,
    memcalc.inputs.trainers.dpo_args) sets every nn.Dropout's p to 0 in the policy and the
    reference (trl models/utils.py disable_dropout_in_model).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> without_dropout(ModelSpec.preset("gpt2")).attn_dropout
    0.0
    """
    if not (model.embd_dropout or model.attn_dropout or model.resid_dropout):
        return model
    return model.with_(embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)


SFT_OUTPUTS = ("log_probs", "entropy", "is_top1")
"""What SFTTrainer asks its fused head for (sft_trainer.py __init__: add_fused_lm_head)."""


def sft_loss_step(ops: Ops, spec: ModelSpec, x: Value, head: Value) -> list[Value]:
    """SFTTrainer.compute_loss (loss_type 'nll', no packing): the fused head on the batch's
    labels (-100 on the prompt under completion_only_loss: no size changes), per_token_loss =
    -log_probs, summed and divided by num_items_in_batch. Returns what compute_loss holds."""
    g = ops.g
    labels = next(v for v in g.inputs if v.label == "labels")
    out = fused_log_probs(ops, spec, x, head, labels, SFT_OUTPUTS)
    ops.scope_end([x])  # backbone_outputs.last_hidden_state, until the fused forward returns
    per_token = g.op("-log_probs", [out[1]], _rows(4), backward=[Grad(0)])
    loss = g.op("per_token_loss.sum() / num_tokens", [per_token], Poly.const(4), backward=[Alias(0)])
    g.keep.append(loss)
    return [*out, per_token]
