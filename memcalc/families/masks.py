"""The attention masks a transformers model builds once per forward (masking_utils.py, 5.24), one
per layer kind it has ('full' causal, 'sliding' window), held by the base model's forward until
it returns.

- eager: eager_mask turns sdpa_mask's boolean mask into an additive (b, 1, s, s) mask of the
  embeddings' dtype for every kind, window or not (allow_is_causal_skip=False);
- sdpa: the full causal mask is skipped (None: SDPA's is_causal); a sliding mask is skipped only
  while seq_len < sliding_window (_ignore_causal_mask_sdpa: `kv_length >= local_attention_size`
  keeps it), else it is a (1, 1, s, s) bool tensor expanded (a view) to (b, 1, s, s), or with a
  2-D attention_mask a (b, 1, s, s) one (sdpa_mask: and_masks with padding_mask_function).
"""
from __future__ import annotations

from memcalc.families.base import size
from memcalc.families.registry import declaration
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Value
from memcalc.tape.ops import Ops


def mask_kinds(spec: ModelSpec) -> list[str]:
    """The masks the model's forward creates, in order.

    >>> mask_kinds(ModelSpec.preset("llama-2-7b")), mask_kinds(ModelSpec.preset("gemma-2-2b"))
    (['full'], ['full', 'sliding'])
    """
    if spec.sliding_window is None:
        return ["full"]
    if declaration(spec.family).supports.sliding == "patterned":  # Gemma2Model / Gemma3TextModel: both, always
        return ["full", "sliding"]
    if spec.max_window_layers is None:  # MistralModel: create_sliding_window_causal_mask only
        return ["sliding"]
    # Qwen2Model / Qwen3Model: the full mask, and the sliding one when a layer slides
    sliding = any(spec.layer_is_sliding(i) for i in range(spec.num_layers))
    return ["full", "sliding"] if sliding else ["full"]


def build_masks(ops: Ops, spec: ModelSpec, regime: Regime, elt: int) -> dict[str, Value | None]:
    """The masks of `mask_kinds`, as the attention implementation gets them (None: no tensor)."""
    from memcalc.families import mask_build

    g, masks = ops.g, {}
    built = regime.attention_mask == "none" and not regime.kv_cache  # mask_build's small tensors
    for kind in mask_kinds(spec):
        if built:
            mask_build.packed_sequence_check(ops, regime)
        if regime.attention == "eager":
            name = "causal mask" if kind == "full" else "sliding causal mask"
            if built:
                masks[kind] = mask_build.eager_mask(
                    ops, mask_build.bool_mask(ops, kind == "sliding", f"{name} bool"), elt, name)
                continue
            masks[kind] = g.op(name, [], size("b s s", elt), requires_grad=False, elt=elt)
        elif built and kind == "sliding" and regime.sliding_window_reached:
            masks[kind] = mask_build.bool_mask(ops, True, "sliding bool mask")
        elif regime.attention_mask == "padded" or (kind == "sliding" and regime.sliding_window_reached):
            # with a 2-D attention_mask, sdpa_mask ands padding_mask_function (padding_mask[batch_idx,
            # kv_idx]) into the mask function, so the broadcast result has the batch dimension
            # (measured: Gemma-3 SDPA, mask of ones, b3 s40 window 16: +2*s*s B); else (1, 1, s, s).
            # A padded batch's mask is never skipped, full or sliding, window reached or not
            # (_ignore_causal_mask_sdpa: padding_mask not all true; measured: Qwen2 window 16 with
            # two full layers, b2 s64, 5 pad tokens)
            shape = "s s" if regime.attention_mask == "none" else "b s s"
            name = "sliding bool mask" if kind == "sliding" else "sdpa bool mask"
            masks[kind] = g.op(name, [], size(shape, 1), requires_grad=False, elt=1)
        else:
            masks[kind] = None
    return masks


def layer_mask(context: dict, spec: ModelSpec, layer: int) -> Value | None:
    """The mask decoder layer `layer` gets: its kind's (ModelSpec.layer_is_sliding)."""
    return context["masks"]["sliding" if spec.layer_is_sliding(layer) else "full"]
