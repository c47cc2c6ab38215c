"""What the training loop passes to an HF causal LM, op by op (TrainingConfig.use_cache,
attention_mask, labels, num_items_in_batch): the batch tensors, the masks transformers 5.x
builds (masking_utils.create_causal_mask), the DynamicCache's key/value copies
(cache_utils.DynamicLayer.update), and the loss with num_items_in_batch (loss/loss_utils.py).

Each rule was measured with validate's live-tensor tracker on HF GPT-2 and Llama (torch 2.13
CPU, transformers 5.24): a separate labels tensor with -100 positions changes no size; an
all-ones mask lets SDPA keep is_causal (masking_utils._ignore_causal_mask_sdpa) and eager
builds its float mask either way; a padded mask makes every SDPA layer save a float mask and
take repeated k and v.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError
from memcalc.families.registry import declaration, families_with
from memcalc.families.sizes import size
from memcalc.tape.graph import Alias, Grad, Value

if TYPE_CHECKING:
    from memcalc.engine.regime import Regime
    from memcalc.tape.graph import Graph
    from memcalc.inputs.specs import ModelSpec
    from memcalc.tape.ops import Ops
    from memcalc.inputs.training import TrainingConfig

CALL_PATH_DEFAULTS = {"use_cache": False, "attention_mask": "none", "pad_tokens": 0, "packed_sequences": 0,
                      "labels": "input_ids", "num_items_in_batch": False, "hf_trainer": False}
"""The call-path fields at the values memcalc's own step uses (model(input_ids=ids,
labels=ids, use_cache=False))."""


def batch_inputs(ops: Ops, regime: Regime) -> None:
    """The batch tensors besides input_ids, alive for the whole step: a (b, s) int64
    attention_mask, a (b, s) int64 labels tensor, the int64 num_items_in_batch scalar."""
    g = ops.g
    if regime.attention_mask == "packed":
        packed_inputs(ops, regime, "")
    elif regime.attention_mask != "none" and regime.trl != "grpo":  # GRPO's: _compute_loss's cat
        g.input("attention_mask", size("b s", 8))
    if regime.labels == "separate":
        g.input("labels", size("b s", 8))
    if regime.num_items_in_batch:
        g.input("num_items_in_batch", size("", 8))
    if regime.hf_trainer:
        trainer_inputs(ops, regime)


def packed_inputs(ops: Ops, regime: Regime, prefix: str) -> None:
    """A padding-free packed batch's tensors besides input_ids and labels, in place of an
    attention_mask (trl sft_trainer.py DataCollatorForLanguageModeling with padding_free): (1, s)
    int64 position_ids restarting at each sequence, cu_seq_lens_q and _k (one int32 tensor of
    packed_sequences + 1 values, both keys), seq_idx (1, s) int32 (repeat_interleave's output)."""
    g = ops.g
    g.input(prefix + "position_ids", size("b s", 8))
    g.input(prefix + "cu_seq_lens", size("", 4 * (regime.packed_sequences + 1)), elt=4)
    g.input(prefix + "seq_idx", size("b s", 4), elt=4)


def position_ids(ops: Ops, regime: Regime) -> Value:
    """The position_ids the base model uses: a packed batch's own (a view: the model makes
    none, modeling_llama.py / modeling_gpt2.py use the position_ids passed), else the forward's
    new `torch.arange(s)` ((b, s) when generate passes them: Regime.positions_batched)."""
    batch = graph_input(ops, "position_ids") if regime.attention_mask == "packed" else None
    if batch is not None:
        return ops.g.view("position_ids", batch)
    return ops.g.op("position_ids", [], size("b s" if regime.positions_batched else "s", 8),
                    requires_grad=False, elt=8)


def held_batches(regime: Regime) -> int:
    """Batches the HF Trainer holds on the device besides the one in use: the step's other
    grad_accum - 1 micro-batches (get_batch_samples), and on CPU the DataLoaderShard's look-ahead
    batch (accelerate data_loader.py: the next batch is fetched before the current is yielded;
    send_to_device moves only the yielded one, so on CUDA the look-ahead stays on the host).

    >>> from memcalc.engine.regime import Regime; from memcalc.inputs.training import TrainingConfig
    >>> held_batches(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, grad_accum=4, device="cpu")))
    4
    """
    return regime.grad_accum - 1 + (regime.device == "cpu")


def trainer_inputs(ops: Ops, regime: Regime) -> None:
    """The HF Trainer's tensors besides the batch in use (TrainingConfig.hf_trainer): the held
    batches (input_ids, attention_mask, labels as the collator makes them) and the two fp32
    loss scalars (trainer.py _tr_loss, tr_loss_step)."""
    g = ops.g
    per_batch = 1 + (regime.attention_mask != "none") + (regime.labels == "separate")
    if regime.trl == "grpo":  # GRPOTrainer's identity collator: the batches are lists of strings
        per_batch = 0
    for i in range(held_batches(regime) * per_batch):
        g.input(f"held batch tensor {i}", size("b s", 8))
    if regime.attention_mask == "packed":  # position_ids counted above, for attention_mask
        for i in range(held_batches(regime)):
            g.input(f"held batch {i} cu_seq_lens", size("", 4 * (regime.packed_sequences + 1)), elt=4)
            g.input(f"held batch {i} seq_idx", size("b s", 4), elt=4)
    if regime.trl != "none":  # the preference collator's other tensors, in each held batch
        from memcalc.families.trl_dpo import dpo_batch_tensors

        for i in range(held_batches(regime)):
            for name, nbytes, elt in dpo_batch_tensors(regime):
                g.input(f"held batch {i} {name}", nbytes, elt)
    g.input("trainer _tr_loss", size("", 4), elt=4)
    g.input("trainer tr_loss_step", size("", 4), elt=4)


def graph_input(ops: Ops, label: str) -> Value | None:
    """The batch tensor of that label, if the step has one."""
    return next((v for v in ops.g.inputs if v.label == label), None)


def causal_mask(ops: Ops, regime: Regime, elt: int) -> Value | None:
    """create_causal_mask's result, held by the base model's forward until it returns.

    - eager: torch.where(bool mask, 0, min) -> a (b, 1, s, s) float mask in the embeddings'
      dtype (`elt`), whatever the 2-D mask holds (masking_utils.eager_mask);
    - sdpa, no mask or all ones: None, SDPA runs is_causal (_ignore_causal_mask_sdpa);
    - sdpa, padded: causal (1,1,s,s) & padding (b,1,1,s) -> a (b, 1, s, s) bool mask;
    - sdpa, packed: find_packed_sequence_indices finds the sequences from position_ids, and
      allow_is_causal_skip is turned off (create_causal_mask), so the causal-by-position and
      same-sequence mask is a (b, 1, s, s) bool mask too (measured: trl SFT packing, GPT-2 and
      Llama, b1 s192 and s120).
    The 2-D mask's `.to(torch.bool)` copy (b, s) lives while the mask is built. Without a 2-D mask,
    a cache or a packed batch, the small tensors made on the way (memcalc.families.mask_build)."""
    from memcalc.families import mask_build

    g = ops.g
    mask2d = graph_input(ops, "attention_mask")
    if mask2d is None and not regime.kv_cache and regime.attention_mask != "packed":  # (mask_build)
        mask_build.packed_sequence_check(ops, regime)
        if regime.attention != "eager":
            return None
        return mask_build.eager_mask(ops, mask_build.bool_mask(ops, False, "causal bool mask"), elt, "causal mask")
    as_bool = None
    if mask2d is not None:
        as_bool = g.op("attention_mask.to(bool)", [mask2d], size("b s", 1), requires_grad=False, elt=1)
    mask = None
    if regime.attention == "eager":
        mask = g.op("causal mask", [], size("b s s", elt), requires_grad=False, elt=elt)
    elif regime.attention_mask in ("padded", "packed"):
        mask = g.op("sdpa bool mask", [as_bool] if as_bool else [], size("b s s", 1), requires_grad=False, elt=1)
    ops.scope_end([as_bool])
    return mask


def zero_window_mask(ops: Ops, regime: Regime, elt: int) -> Value:
    """Qwen2MoeModel.forward builds create_sliding_window_causal_mask whatever the config
    (modeling_qwen2_moe.py: causal_mask_mapping has both kinds, no has_sliding_layers test), and
    Qwen2MoeConfig sets sliding_window = 0 without use_sliding_window; no layer reads it (every
    layer_type is full_attention), but the base model's forward holds it until it returns.
    A window of 0 is never below kv_length, so SDPA cannot skip it (_ignore_causal_mask_sdpa:
    `kv_length >= local_attention_size` returns False):
    - eager: an additive (b, 1, s, s) mask of the embeddings' dtype (eager_mask's torch.where);
    - sdpa: a (1, 1, s, s) bool mask expanded (a view) to the batch; padded, a (b, 1, s, s) one,
      its own `.to(torch.bool)` copy of the 2-D mask alive while it is built.
    Measured (validate tracker, qwen2_moe eager every-k, fp32, b=3, s=101): a second where.self
    of b*s*s*4 B after the full mask, alive through every layer (it sets the forward phase);
    sdpa with attention dropout: s*s B (+10,201)."""
    g = ops.g
    if regime.attention == "eager":
        return g.op("zero-window sliding mask", [], size("b s s", elt), requires_grad=False, elt=elt)
    mask2d = graph_input(ops, "attention_mask")
    if mask2d is None or regime.attention_mask != "padded":
        return g.op("zero-window sliding bool mask", [], size("s s", 1), requires_grad=False, elt=1)
    as_bool = g.op("attention_mask.to(bool)", [mask2d], size("b s", 1), requires_grad=False, elt=1)
    mask = g.op("zero-window sliding bool mask", [as_bool], size("b s s", 1), requires_grad=False, elt=1)
    ops.scope_end([as_bool])
    return mask


def cache_layers(ops: Ops, spec: ModelSpec, regime: Regime, context: dict) -> None:
    """DynamicCache(config=...) (cache_utils.py, made by the base model's forward after the
    embeddings): one DynamicSlidingWindowLayer per sliding layer of the config's layer types,
    each holding `_sliding_window_tensor`, a 0-d int64 tensor (torch.tensor(sliding_window)),
    alive with the cache until the model's forward returns (context['cache']). Measured
    (validate tracker, GPT-OSS L4 window 16 pattern 2, b2 s64): 16 B, 8 per sliding layer."""
    if not regime.kv_cache:
        return
    sliding = sum(spec.layer_is_sliding(i) for i in range(spec.num_layers))
    context.setdefault("cache", []).extend(
        ops.g.op("DynamicSlidingWindowLayer._sliding_window_tensor", [], size("", 8), requires_grad=False,
                 elt=8) for _ in range(sliding))


def cache_kv(ops: Ops, regime: Regime, k: Value, v: Value, context: dict) -> tuple[Value, Value, bool]:
    """DynamicLayer.update: torch.cat([empty, k]) and torch.cat([empty, v]) copy the layer's
    keys and values (contiguous (b, heads, s, d)); the cache holds them until the model's forward
    returns (context['cache'], freed with the top-level locals) and the attention then uses the
    copies. Returns (k, v, whether they are contiguous copies); with no cache, (k, v, False)."""
    if not regime.kv_cache:
        return k, v, False
    g = ops.g
    kc = g.op("cache cat k", [k], k.size, backward=[Alias(0)], elt=k.elt)  # cat backward: views
    vc = g.op("cache cat v", [v], v.size, backward=[Alias(0)], elt=v.elt)
    context.setdefault("cache", []).extend([kc, vc])
    return kc, vc, True


# Trainer.get_decay_parameter_names (trainer.py): no weight decay for nn.LayerNorm modules
# (GPT-2's ln_1, ln_2, ln_f) and names matching these patterns
NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)|(?:^|\.)ln_(?:1|2|f)\.")


def trainer_param_groups(graph: Graph, weight_decay: float) -> list[tuple[list[int], float]]:
    """The HF Trainer's optimizer groups: (parameter byte sizes in model.parameters() order,
    weight decay) for the decayed parameters, then the rest with weight decay 0. torch.optim
    steps one group after the other, so a for-loop's bound `denom` and a foreach group's
    copies do not outlive their group (measured: Llama's lm_head follows the last down_proj).

    >>> from memcalc.tape.graph import Graph; from memcalc.core.poly import Poly
    >>> g = Graph(); _ = [g.param(n, Poly.const(4)) for n in ("h.0.ln_1.weight", "h.0.mlp.c_fc.weight",
    ...                                                     "model.norm.weight", "h.0.attn.c_attn.bias")]
    >>> trainer_param_groups(g, 0.1)
    [([4], 0.1), ([4, 4, 4], 0.0)]
    """
    sizes = [(v.size.eval(1, 1), bool(NO_DECAY.search(v.label))) for v in graph.params]
    return [([n for n, no in sizes if not no], weight_decay), ([n for n, no in sizes if no], 0.0)]


EMBEDDINGS = ("model.embed_tokens.weight", "transformer.wte.weight", "transformer.wpe.weight")


def is_embedding(label: str) -> bool:
    """Whether a parameter is an nn.Embedding weight of the HF programs.

    >>> is_embedding("transformer.wpe.weight"), is_embedding("lm_head.weight")
    (True, False)
    """
    return label in EMBEDDINGS


def divide_by_num_items(ops: Ops, loss: Value) -> Value:
    """fixed_cross_entropy with num_items_in_batch: the summed loss / the int64 scalar -> a new
    fp32 scalar (div saves its divisor, already a batch tensor); the sum is freed."""
    num = graph_input(ops, "num_items_in_batch")
    if num is None:
        return loss
    g = ops.g
    out = g.op("loss / num_items_in_batch", [loss, num], size("", 4), saves=[num],
               backward=[Grad(0)], elt=4)
    g.keep.remove(loss)
    g.keep.append(out)
    return out


def _unsupported(model: ModelSpec, training: TrainingConfig, field: str) -> str | None:
    """Why the family's declaration (Supports.use_cache, attention_masks, trainer_inputs,
    windowed_call_path) does not cover this call-path field's value; None if it does."""
    can = declaration(model.family).supports
    if field == "use_cache":
        covered = families_with(use_cache=True)
    elif field in ("attention_mask", "pad_tokens", "packed_sequences"):
        covered = tuple(f for f in families_with()
                        if training.attention_mask in declaration(f).supports.attention_masks)
    else:
        covered = families_with(trainer_inputs=True)
    names = ", ".join(covered)
    if model.family not in covered:
        return f"is modelled and measured for the HF {names} programs"
    if model.sliding_window is not None and not can.windowed_call_path:
        return f"is modelled and measured for the HF {names} programs without sliding windows"
    if model.reorder_and_upcast_attn:
        return "is modelled and measured without GPT-2's reorder_and_upcast_attn"
    if field in ("attention_mask", "pad_tokens") and model.moe is not None and model.moe.output_router_logits:
        return ("is not modelled with the MoE auxiliary loss (load_balancing_loss_func's attention_mask "
                "branch: its scatter_add_ weighted counts)")
    return None


def check_call_path(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse, by field, the call paths not modelled.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> check_call_path(ModelSpec.preset("gpt2").with_(implementation="reference"),
    ...                 TrainingConfig(micro_batch=1, seq_len=8, use_cache=True))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: use_cache: the reference models have no HF call path; ...
    """
    changed = [f for f, default in CALL_PATH_DEFAULTS.items() if getattr(training, f) != default]
    if changed and model.implementation != "hf":
        raise NotModelledError(changed[0], "the reference models have no HF call path; "
                               f"{changed[0]}={getattr(training, changed[0])!r} is not modelled there",
                               f"use implementation='hf' or drop {changed[0]}")
    for field in changed:
        why = _unsupported(model, training, field)
        if why is not None:
            raise NotModelledError(field, f"{field}={getattr(training, field)!r} {why}, not for this "
                                   f"{model.family} model", f"drop {field} (the default call path is modelled)")
    if changed and training.tensor_parallel > 1:
        raise NotModelledError(changed[0], "the HF call path is not modelled under tensor parallelism",
                               f"drop {changed[0]} or use tensor_parallel=1")
    if training.use_cache and training.checkpointing not in ("none", "per-layer"):
        raise NotModelledError("use_cache", f"a DynamicCache inside {training.checkpointing} "
                               "checkpoint regions is not modelled (HF turns the cache off only "
                               "under its own per-layer checkpointing)",
                               "pass use_cache=False, or checkpointing none or per-layer")
    if training.attention_mask == "packed" and (model.sliding_window is not None or training.use_cache):
        field = "use_cache" if training.use_cache else "attention_mask"
        raise NotModelledError(field, "a packed row with " + ("a DynamicCache (transformers looks for "
                               "packed sequences only without one)" if training.use_cache else
                               "a sliding window (the packed sliding masks) is not modelled"),
                               "drop use_cache" if training.use_cache else "check a model without sliding windows")
    if (training.attention_mask in ("padded", "packed") and training.resolved_attention(model) == "sdpa"
            and training.device == "cpu" and model.attn_dropout > 0):
        raise NotModelledError("attention_mask", f"a {training.attention_mask} mask with SDPA's math kernel (CPU "
                               "with attention dropout) is not modelled",
                               "use attention='eager', attn_dropout=0, or device='cuda'")
