"""A trl.GRPOTrainer step (trl 1.16, CPU, transformers' generate), op by op, on top of any decoder
program, in three phases, each built as its own program (TrainingConfig.trl_phase;
memcalc.queries.grpo runs the three and says which decides):

    _prepare_inputs -> _generate_and_score_completions (grpo_trainer.py):
      generation   generate(prompt ids (b, P), attention mask) under no_grad: a prefill forward
                   of the prompts with a DynamicCache, then C - 1 one-token decode steps
      scoring      prompt + completion ids and masks (b, P + C); under no_grad the old policy's
                   (num_iterations > 1) and the reference's (beta != 0) fused-head log-probs,
                   kept as (b, C) fp32
    training_step -> _compute_loss: cat of prompt and completion, labels, the policy's forward with
                   the fused head (log_probs, entropy), the clipped-ratio loss on (b, C), backward,
                   then the optimizer step

b is per_device_train_batch_size (completions), s = P + C (seq_len), C = max_completion_length
(TrainingConfig.grpo_completion_len). The generation batch is the step's batch
(gradient_accumulation_steps 1, steps_per_generation 1). Between steps the trainer holds the last
generation's inputs (_buffered_inputs) until the next generation is scored: they are alive in the
next step's generation and scoring phases.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from memcalc.core.poly import Poly
from memcalc.families.sizes import size
from memcalc.families.trl_dpo import ReferenceOps, _rows, fused_log_probs
from memcalc.tape.graph import Alias, Grad, Value

if TYPE_CHECKING:
    from memcalc.engine.regime import Regime
    from memcalc.inputs.specs import ModelSpec
    from memcalc.tape.graph import Graph
    from memcalc.tape.ops import Ops

GRPO_OUTPUTS = ("log_probs", "entropy")
"""What GRPOTrainer asks the policy's fused head for (grpo_trainer.py __init__: add_fused_lm_head)."""


def completion(regime: Regime, elt: int) -> Poly:
    """Bytes of a (b, C) tensor: C is a constant of the config, b stays symbolic."""
    return size("b", elt * regime.grpo_completion_len)


def prompt(regime: Regime, elt: int) -> Poly:
    """Bytes of a (b, P) tensor: P = s - C, or P = s in the generation phase's program (its
    seq_len is the prompt length)."""
    if regime.trl_phase == "generation":
        return size("b s", elt)
    return size("b s", elt) - completion(regime, elt)


def buffered_inputs(ops: Ops, regime: Regime, tag: str) -> list[Value]:
    """The dict _generate_and_score_completions returns, shuffled (shuffle_sequence_dict indexes
    each tensor: new storages) and buffered: prompt_ids, prompt_mask (b, P), completion_ids,
    completion_mask (b, C) int64, advantages (b,) fp32, num_items_in_batch (int64 scalar), and
    old_per_token_logps / ref_per_token_logps (b, C) fp32 when computed."""
    g = ops.g
    out = [g.input(f"{tag}prompt_ids", prompt(regime, 8)), g.input(f"{tag}prompt_mask", prompt(regime, 8)),
           g.input(f"{tag}completion_ids", completion(regime, 8)),
           g.input(f"{tag}completion_mask", completion(regime, 8)),
           g.input(f"{tag}advantages", size("b", 4), elt=4), g.input(f"{tag}num_items_in_batch", size("", 8))]
    if regime.grpo_old_logps:
        out.append(g.input(f"{tag}old_per_token_logps", completion(regime, 4), elt=4))
    if regime.grpo_reference:
        out.append(g.input(f"{tag}ref_per_token_logps", completion(regime, 4), elt=4))
    return out


def compute_loss_inputs(ops: Ops) -> list[Value]:
    """_compute_loss's input_ids = cat([prompt_ids, completion_ids]) and attention_mask = cat of
    the masks: (b, s) int64 locals (freed when it returns; the embedding saves the ids for its
    backward), shown to the program's embedding as the batch tensors of those names until
    `hide_inputs`."""
    g = ops.g
    out = []
    for name in ("input_ids", "attention_mask"):
        v = g.op(f"{name} = torch.cat", [], size("b s", 8), requires_grad=False, elt=8)
        v.label = name
        out.append(v)
    g.inputs.extend(out)
    g.shared_inputs = True
    return out


def hide_inputs(ops: Ops, made: list[Value]) -> None:
    """End compute_loss_inputs' showing: they are ops' outputs with their own lifetimes."""
    ops.g.shared_inputs = False
    ops.g.inputs[:] = [v for v in ops.g.inputs if all(v is not m for m in made)]


def score_labels(ops: Ops, ids: Value, mask: Value) -> Value:
    """_get_per_token_logps_and_entropies: labels = input_ids.masked_fill(attention_mask == 0, -100)
    ((b, s) bool, then (b, s) int64), then labels[:, :-C] = -100 in place (no new storage)."""
    g = ops.g
    zero = g.op("attention_mask == 0", [mask], size("b s", 1), requires_grad=False, elt=1)
    labels = g.op("labels masked_fill", [ids, zero], size("b s", 8), requires_grad=False, elt=8)
    ops.scope_end([zero])
    return labels


def keep_completion(ops: Ops, regime: Regime, value: Value, name: str) -> Value:
    """`outputs.<name>[:, -C:]` appended to a list, then torch.cat of the one chunk: a (b, C) fp32
    copy (CatBackward hands its gradient through as a view; the slice's backward is
    SliceBackward's (b, s-1) zeros and the copy into them)."""
    g = ops.g
    sliced = g.view(f"{name}[:, -C:]", value, backward=[Grad(0, _rows(4))])
    return g.op(f"torch.cat({name})", [sliced], completion(regime, 4), backward=[Alias(0)])


def grpo_step(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, head: Value, labels: Value) -> list[Value]:
    """From the policy's last hidden state to the loss (_compute_loss, loss_type dapo/grpo/bnpo/
    dr_grpo, token-level ratios): the fused head, the kept (b, C) log-probs and entropies, the
    clipped-ratio loss and the metrics. Returns what stays alive until _compute_loss returns."""
    g = ops.g
    graph_kept: list[Value] = []  # the entropy's graph (no gradient reaches it): its saved ~mask
    out = fused_log_probs(ops, spec, x, head, labels, GRPO_OUTPUTS, graph_kept)
    ops.scope_end([x])  # backbone_outputs.last_hidden_state, until the fused forward returns
    logps = keep_completion(ops, regime, out[1], "log_probs")
    entropies = keep_completion(ops, regime, out[2], "entropy")
    ops.scope_end(out)  # the (b, s-1) outputs: locals of _get_per_token_logps_and_entropies
    bc = completion(regime, 4)
    adv = next(v for v in g.inputs if v.label == "advantages")
    mask = next(v for v in g.inputs if v.label == "completion_mask")
    old = logps if not regime.grpo_old_logps else next(v for v in g.inputs if v.label == "old_per_token_logps")
    ratio = g.op("per_token_logps - old", [logps, old], bc, backward=[Grad(0)])
    coef_1 = g.op("coef_1 = exp", [ratio], bc, backward=[Grad(0)], save_output=True)
    local = [ratio, coef_1, entropies, logps] + graph_kept
    kl = None
    if regime.grpo_reference:  # exp(ref - logps) - (ref - logps) - 1, then * coef_1 (bias correction)
        ref = next(v for v in g.inputs if v.label == "ref_per_token_logps")
        d = g.op("ref - per_token_logps", [ref, logps], bc, backward=[Grad(0)])
        e = g.op("exp(ref - logps)", [d], bc, backward=[Grad(0)], save_output=True)
        e_minus = g.op("exp - (ref - logps)", [e, d], bc, backward=[Grad(0), Grad(1)])
        ops.scope_end([d, e])
        kl = g.op("- 1 (per_token_kl)", [e_minus], bc, backward=[Alias(0)])
        ops.scope_end([e_minus])
        kl = g.op("per_token_kl * coef_1", [kl, coef_1], bc, saves=[kl, coef_1], backward=[Grad(0), Grad(1)])
        local.append(kl)
    coef_2 = g.op("coef_2 = clamp", [coef_1], bc, saves=[coef_1], backward=[Grad(0)])
    loss1 = g.op("coef_1 * advantages", [coef_1, adv], bc, saves=[adv], backward=[Grad(0)])
    loss2 = g.op("coef_2 * advantages", [coef_2, adv], bc, saves=[adv], backward=[Grad(0)])
    low = g.op("min(loss1, loss2)", [loss1, loss2], bc, saves=[loss1, loss2], backward=[Grad(0), Grad(1)])
    per_token = g.op("-min", [low], bc, backward=[Grad(0)])
    ops.scope_end([low])
    local += [coef_2, loss1, loss2, per_token]
    if kl is not None:  # per_token_loss + beta * per_token_kl
        scaled = g.op("beta * per_token_kl", [kl], bc, backward=[Grad(0)])
        per_token = g.op("per_token_loss + beta * kl", [per_token, scaled], bc, backward=[Alias(0), Grad(1)])
        ops.scope_end([scaled])
        local.append(per_token)
    masked = g.op("per_token_loss * mask", [per_token, mask], bc, saves=[mask], backward=[Grad(0)])
    loss = g.op("sum / normalizer", [masked], Poly.const(4), backward=[Grad(0, bc)])
    ops.scope_end([masked])
    g.keep.append(loss)
    _metrics(ops, regime, entropies, coef_1, adv, mask, kl)
    return local


def _metrics(ops: Ops, regime: Regime, entropies: Value, coef_1: Value, adv: Value, mask: Value,
             kl: Value | None) -> None:
    """The metrics _compute_loss logs (no tensor outlives them): global_masked_mean of the KL and
    the entropies ((x * mask) (b, C) fp32 each), the clip ratios: is_low_clipped, is_high_clipped
    (b, C) bool each from (coef_1 < 1 - eps) and (advantages < 0), is_region_clipped, and their
    .float() and (x * mask) for the means."""
    g = ops.g
    bc4, bc1 = completion(regime, 4), completion(regime, 1)
    for x in ([kl] if kl is not None else []) + [entropies]:
        m = g.op("x * mask (metric)", [x, mask], bc4, requires_grad=False)
        ops.scope_end([m])
    clipped = []
    for name in ("is_low_clipped", "is_high_clipped"):
        a = g.op(f"{name}: coef_1 compare", [coef_1], bc1, requires_grad=False, elt=1)
        sign = g.op(f"{name}: advantages compare", [adv], size("b", 1), requires_grad=False, elt=1)
        clipped.append(g.op(name, [a, sign], bc1, requires_grad=False, elt=1))
        ops.scope_end([a, sign])
    clipped.append(g.op("is_region_clipped", clipped, bc1, requires_grad=False, elt=1))
    for c in clipped:
        f = g.op("clipped.float()", [c], bc4, requires_grad=False)
        m = g.op("x * mask (metric)", [f, mask], bc4, requires_grad=False)
        ops.scope_end([m, f])
    ops.scope_end(clipped)


def score_pass(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, labels: Value,
               run_layers: Callable, reference: bool) -> Value:
    """One no-grad log-prob pass of _generate_and_score_completions (the policy as the old
    policy, or the reference: a frozen copy, or with LoRA the policy with adapters disabled):
    the model's forward and its fused head, then the kept (b, C) fp32 log-probs. Returns them."""
    g = ops.g
    shared = {v.label: v for v in g.params} if not (reference and regime.lora is None) else None
    pass_regime = replace(regime, checkpointing="none", checkpoint_every=None,
                          lora=regime.lora if not reference else None)
    pass_ops = ReferenceOps(g, pass_regime, shared)
    starts = list(g.layer_starts)
    g.shared_inputs, g.shared_buffers, g.no_grad = True, shared is not None, True
    try:
        emb = program.embed(pass_ops, spec, pass_regime)
        trunk = run_layers(pass_ops, spec.num_layers, set(),
                           lambda x, layer: program.block(pass_ops, spec, pass_regime, x, layer, emb.context),
                           emb.x, emb.context.get("position_ids"))
        x = program.final_norm(pass_ops, spec, trunk)
        pass_ops.scope_end(emb.held_until_norm)
        if not spec.tie_embeddings:
            head = pass_ops.param(program.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
        else:
            head = program.tied_head(ops) if shared is not None else pass_ops.created[0]
        outputs = GRPO_OUTPUTS if shared is not None else ("log_probs",)
        out = fused_log_probs(pass_ops, spec, x, head, labels, outputs)
        pass_ops.scope_end([x] + emb.held_until_return + pass_ops.weight_casts)  # autocast's cache
        kept = keep_completion(pass_ops, regime, out[1], "log_probs")
        pass_ops.scope_end(out)
    finally:
        g.shared_inputs = g.shared_buffers = g.no_grad = False
        g.layer_starts[:] = starts
    return kept


def scoring_phase(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, run_layers: Callable) -> None:
    """_generate_and_score_completions after generate, then _prepare_inputs: the last step's
    buffered inputs; the new prompt and completion tensors (pad of the token lists: (b, P) and
    (b, C) int64 ids and masks) and num_items_in_batch; their cat (b, s) ids and mask (locals,
    freed at its return), labels, the old policy's and the reference's passes; the advantages
    (b,) fp32; then shuffle_sequence_dict's permuted copy of every batch tensor beside the
    originals, the originals freed, and the last step's buffered inputs replaced."""
    g = ops.g
    held = buffered_inputs(ops, regime, "last step's ")
    new = [g.op(name, [], sz, requires_grad=False, elt=8) for name, sz in (
        ("prompt_ids", prompt(regime, 8)), ("prompt_mask", prompt(regime, 8)),
        ("completion_ids", completion(regime, 8)), ("completion_mask", completion(regime, 8)))]
    num_items = g.op("num_items_in_batch", [new[3]], size("", 8), requires_grad=False, elt=8)
    made = compute_loss_inputs(ops)  # prompt_completion_ids, attention_mask = torch.cat(...)
    kept = []
    if regime.grpo_old_logps or regime.grpo_reference:  # labels exist inside the passes only
        labels = score_labels(ops, *made)
        if regime.grpo_old_logps:
            kept.append(score_pass(program, ops, spec, regime, labels, run_layers, reference=False))
        if regime.grpo_reference:
            kept.append(score_pass(program, ops, spec, regime, labels, run_layers, reference=True))
        ops.scope_end([labels])
    hide_inputs(ops, made)
    ops.scope_end(made)
    batch = new + [g.op("advantages", [], size("b", 4), requires_grad=False)] + kept
    shuffled = [g.op(f"{v.label}[permutation]", [v], v.size, requires_grad=False, elt=v.elt) for v in batch]
    ops.scope_end(batch + held)  # the originals, then (_buffered_inputs replaced) the last step's
    g.keep.extend(shuffled + [num_items])


def declare_params(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, run_layers: Callable) -> None:
    """The parameters (and module buffers) a forward through `ops` creates, without its ops: the
    policy's in a program with no training forward (the scoring phase; the optimizer states
    follow them), the reference copy's in the step's (ReferenceOps). The forward is built under
    no_grad, then its ops and batch tensors are dropped."""
    g = ops.g
    nodes, inputs, leaves, starts = len(g.nodes), len(g.inputs), len(g.leaves), list(g.layer_starts)
    casts = set(g.cached_casts)  # autocast's weight casts of the dropped ops are not cached
    regime = replace(regime, checkpointing="none", checkpoint_every=None)  # no_grad: TRL turns it off
    g.no_grad = True
    try:
        emb = program.embed(ops, spec, regime)
        x = run_layers(ops, spec.num_layers, set(),
                       lambda x, layer: program.block(ops, spec, regime, x, layer, emb.context), emb.x)
        program.final_norm(ops, spec, x)
        if not spec.tie_embeddings:
            ops.param(program.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
    finally:
        g.no_grad = False
        g.shared_inputs = g.shared_buffers = False
    del g.nodes[nodes:], g.inputs[inputs:], g.leaves[leaves:]
    g.layer_starts[:] = starts
    g.cached_casts = casts
    ops.weight_casts.clear()


def reference_params(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, run_layers: Callable) -> None:
    """The step holds the reference copy (beta != 0, full fine-tuning: GRPOTrainer's ref_model,
    loaded beside the policy) though it runs in the scoring phase only: its frozen parameters."""
    if not regime.grpo_reference or regime.lora is not None:
        return
    ref_regime = replace(regime, checkpointing="none", checkpoint_every=None)
    declare_params(program, ReferenceOps(ops.g, ref_regime, None), spec, ref_regime, run_layers)


def generation_phase(program: Any, ops: Ops, spec: ModelSpec, regime: Regime, run_layers: Callable) -> None:
    """_generate_single_turn (grpo_trainer.py) and transformers' generate (_sample), s = P: the
    last step's buffered inputs; the b (P,) prompt tensors (torch.tensor of each token list) and
    their left-padded (b, P) ids and mask; generate's unfinished_sequences (b,) and position_ids
    (cumsum - 1, masked_fill: (b, P) int64); the prefill (prepare_inputs_for_generation's
    input_ids clone, the model's forward under no_grad with a DynamicCache, under autocast with a
    mixed precision: accelerate's prepare_model wraps model.forward in it, measured on grpo03), the
    last position's logits (logits_to_keep=1),
    their fp32 copy, softmax and the sampled token; then the last decode step's cache (last_decode_step)."""
    from memcalc.core.errors import NotModelledError

    if spec.sliding_window is not None:
        raise NotModelledError("sliding_window", f"{spec.sliding_window}: generate's sliding-window "
                               "cache layers keep the last window tokens only, not modelled in GRPO's "
                               "generation phase", "read the step and scoring phases only")
    g = ops.g
    declare_params(program, ops, spec, regime, run_layers)
    reference_params(program, ops, spec, regime, run_layers)  # a reference copy is held throughout
    buffered_inputs(ops, regime, "last step's ")
    g.keep.append(g.op("prompt_tensors (b tensors of (P,) int64)", [], size("b s", 8), requires_grad=False,
                       elt=8))  # locals of _generate_single_turn, alive through generate
    g.input("input_ids", size("b s", 8))  # pad(prompt_tensors): the padded ids and mask
    g.input("attention_mask", size("b s", 8))
    g.keep.append(g.op("unfinished_sequences", [], size("b", 8), requires_grad=False, elt=8))
    # position_ids (cumsum - 1, masked_fill: (b, P) int64): the program's own position_ids op
    # under positions_batched stands for it through the prefill; last_decode_step holds it after
    gen = replace(regime, use_cache=True, checkpointing="none", checkpoint_every=None, positions_batched=True)
    gen_ops = ReferenceOps(g, gen, {v.label: v for v in g.params})
    g.shared_inputs = g.shared_buffers = g.no_grad = True
    starts = list(g.layer_starts)
    try:
        prefill_start = len(g.nodes)
        clone = g.op("input_ids.clone (model_inputs)", [], size("b s", 8), requires_grad=False, elt=8)
        emb = program.embed(gen_ops, spec, gen)
        from memcalc.families.call_path import cache_layers

        cache_layers(gen_ops, spec, gen, emb.context)
        x = run_layers(gen_ops, spec.num_layers, set(),
                       lambda x, layer: program.block(gen_ops, spec, gen, x, layer, emb.context), emb.x)
        x = program.final_norm(gen_ops, spec, x)
        gen_ops.scope_end(emb.held_until_norm)
        head = program.tied_head(ops) if spec.tie_embeddings else \
            gen_ops.param(program.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
        last = g.view("hidden[:, -1:]", x, size("b h", x.elt, h=spec.hidden_size))
        logits = gen_ops.linear(last, head, None, size("b", 1), spec.vocab_size, "lm_head")
        gen_ops.scope_end([x, clone, emb.context.get("position_ids")] + emb.held_until_return
                          + gen_ops.weight_casts)  # position_ids: generate's, passed in; autocast's
        # cached weight casts until the forward (accelerate's autocast wrapper) returns
        cache = emb.context.get("cache", [])
        sample(ops, spec, logits)
    finally:
        g.shared_inputs = g.shared_buffers = g.no_grad = False
        g.layer_starts[:] = starts
    last_decode_step(ops, spec, regime, cache, one_token_live(g, prefill_start, cache))


def one_token_live(g: Graph, start: int, cache: list[Value]) -> Poly:
    """What a decode step (one token) holds besides the cache at its last layer's cache update,
    from the prefill's own ops: the storages the prefill holds at its last 'cache cat v' (every
    tensor made from `start` on and used at or after it, the cache copies left out), each at
    s = 1 (a decode step runs the same ops on one token: GPT-2's two embedding outputs, the
    layer's input and norm, its q/k/v projections, autocast's weight casts, the input ids' and
    position ids' clones). 0 when the program keeps no cache."""
    cats = [i for i in range(start, len(g.nodes)) if g.nodes[i].name == "cache cat v"]
    if not cats:
        return Poly.const(0)
    at = cats[-1]
    skip = {id(v.storage) for v in cache}
    last_use: dict[int, int] = {}
    for i in range(start, len(g.nodes)):
        for v in g.nodes[i].inputs:
            last_use[id(v.storage)] = i
    total, seen = Poly.const(0), set()
    for i in range(start, at + 1):
        for v in g.nodes[i].outputs:
            key = id(v.storage)
            if key in seen or key in skip or last_use.get(key, i) < at:
                continue
            seen.add(key)
            total = total + at_one_token(v.storage.size)
    return total


def at_one_token(size_: Poly) -> Poly:
    """A size in b and s at s = 1 (a polynomial in b).

    >>> at_one_token(size("b s h", 4, h=64) + size("b", 8))
    Poly(264*b)
    """
    out = Poly.const(0)
    for (b_pow, _s_pow), coeff in size_.terms.items():
        out = out + Poly.mono(coeff, b_pow, 0)
    return out


def sample(ops: Ops, spec: ModelSpec, logits: Value) -> list[Value]:
    """_sample after a forward: next_token_logits = logits[:, -1].to(float32, copy=True) (b, V),
    `del outputs` (the logits), probs = softmax (b, V) fp32, multinomial (b, 1) int64, the
    unfinished-sequence arithmetic on (b,) int64, input_ids = cat (b, P + 1) int64. Returns the
    (b, V) tensors, which stay alive into the next step (loop locals)."""
    g = ops.g
    bv = size("b", 4 * spec.vocab_size)
    scores = g.op("next_token_logits .to(float32, copy)", [logits], bv, requires_grad=False)
    ops.scope_end([logits])
    probs = g.op("softmax", [scores], bv, requires_grad=False)
    token = g.op("multinomial", [probs], size("b", 8), requires_grad=False, elt=8)
    ops.scope_end([token])
    return [scores, probs]


def last_decode_step(ops: Ops, spec: ModelSpec, regime: Regime, prefill_cache: list[Value], one_token: Poly) -> None:
    """The last decode step (T = P + C - 1 tokens in the cache) at its last layer's
    DynamicLayer.update: every layer's keys and values at T tokens (the prefill's cache copies,
    each grown by C - 1 tokens in its own dtype: under autocast the keys leave the rotary
    embedding in fp32, the values in bf16), the last layer's keys then values concatenated
    beside their old (T - 1) tensors (measured, grpo04: the fp32 keys' cat is the peak),
    input_ids and the attention mask at T (int64), the previous step's (b, V) fp32 logits and
    probabilities, and the step's own one-token tensors (one_token_live).
    Measured (grpo02, GPT-2-like, T = 79; grpo04, Llama-like, T = 175): the phase's peak."""
    g = ops.g
    C = regime.grpo_completion_len
    grown = [v for v in prefill_cache if any(s_pow for (_b, s_pow) in v.size.terms)]  # per-token
    ops.scope_end(prefill_cache)

    def at(v: Value, tokens: int) -> Poly:  # a cache copy at P + tokens tokens
        return v.size + at_one_token(v.size) * tokens

    kept = [g.op("position_ids (b, P)", [], size("b s", 8), requires_grad=False, elt=8),
            g.op("input_ids and attention_mask at T", [], (size("b s", 8) + size("b", 8 * (C - 1))) * 2,
                 requires_grad=False, elt=8),
            g.op("last step's logits and probs", [], size("b", 8 * spec.vocab_size), requires_grad=False),
            g.op("the decode step's one-token tensors", [], one_token, requires_grad=False)]
    if len(grown) >= 2:  # the last layer's keys, then values: torch.cat beside the old tensor
        *done, k_last, v_last = grown
        earlier = Poly.const(0)
        for v in done:
            earlier = earlier + at(v, C - 1)
        kept.append(g.op(f"cache at T, all but the last layer ({len(done)})", [], earlier, requires_grad=False))
        v_old = g.op("the last layer's values (T - 1)", [], at(v_last, C - 2), requires_grad=False)
        k_old = g.op("the last layer's keys (T - 1)", [], at(k_last, C - 2), requires_grad=False)
        kept.append(g.op("cat: the last layer's keys at T", [k_old], at(k_last, C - 1), requires_grad=False))
        ops.scope_end([k_old])
        kept.append(g.op("cat: the last layer's values at T", [v_old], at(v_last, C - 1), requires_grad=False))
        ops.scope_end([v_old])
    g.keep.extend(kept)
