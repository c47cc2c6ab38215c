"""The small tensors transformers 5.24 makes while it builds position ids and attention masks, once per
forward, before the first layer (masking_utils.py): none is alive at a peak, but the caching allocator
places every one of them (small-pool blocks, memcalc.engine.allocations), so they decide which 2 MiB
segments the step's first tensors land in. Measured with validate's allocation recorder (torch 2.13
CPU, HF Llama / Qwen2 / Mistral / Gemma-2, eager and sdpa, no 2-D attention_mask): the ops and sizes
below, in this order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.families.sizes import size

if TYPE_CHECKING:
    from memcalc.engine.regime import Regime
    from memcalc.tape.graph import Value
    from memcalc.tape.ops import Ops


def position_ids(ops: Ops) -> Value:
    """`torch.arange(s) + past_seen_tokens` (modeling_llama.py LlamaModel.forward): the arange, the
    (s,) int64 sum, the arange freed."""
    g = ops.g
    arange = g.op("arange(s)", [], size("s", 8), requires_grad=False, elt=8)
    return g.op("position_ids", [arange], size("s", 8), requires_grad=False, elt=8)


def packed_sequence_check(ops: Ops, regime: Regime) -> None:
    """What each create_*_mask call runs first without a 2-D attention_mask and without a cache
    (masking_utils.py:866-870 _preprocess_mask_arguments: position_ids expanded to the batch, then
    find_packed_sequence_indices, :735-764): `position_ids[:, :1] - 1` (b, 1), torch.diff with that
    prepended (the (b, s+1) cat, then the (b, s) difference), `(diff != 1)` bool and its int64
    cumsum, `(mask[:, -1] == 0).all()`; all freed when it returns None (one sequence per row).

    >>> from memcalc.tape.graph import Graph; from memcalc.tape.ops import Ops
    >>> from memcalc.engine.regime import Regime; from memcalc.inputs.training import TrainingConfig
    >>> ops = Ops(Graph(), Regime.of(TrainingConfig(micro_batch=2, seq_len=64)))
    >>> packed_sequence_check(ops, ops.regime)
    >>> [(n.name, n.outputs[0].size.eval(2, 64)) for n in ops.g.nodes if n.outputs][:3]
    [('position_ids[:, :1] - 1', 16), ('diff prepend cat', 1040), ('position_diff', 1024)]
    """
    if regime.attention_mask != "none" or regime.kv_cache:
        return
    g = ops.g
    first = g.op("position_ids[:, :1] - 1", [], size("b", 8), requires_grad=False, elt=8)
    cat = g.op("diff prepend cat", [first], size("b s", 8) + size("b", 8), requires_grad=False, elt=8)
    diff = g.op("position_diff", [cat], size("b s", 8), requires_grad=False, elt=8)
    ne = g.op("position_diff != 1", [diff], size("b s", 1), requires_grad=False, elt=1)
    cumsum = g.op("packed cumsum", [ne], size("b s", 8), requires_grad=False, elt=8)
    last = g.op("[:, -1] == 0", [cumsum], size("b", 1), requires_grad=False, elt=1)
    g.op("all()", [last], size("", 1), requires_grad=False, elt=1)
    ops.scope_end([first, diff, cumsum])


def bool_mask(ops: Ops, sliding: bool, name: str) -> Value:
    """sdpa_mask without a 2-D mask (masking_utils.py:528-541): batch_arange (b,), head_arange (1,),
    q_arange and kv_arange (`torch.arange(n) + offset`: the arange, the sum, the arange freed), then
    the mask function broadcast to a (1, 1, s, s) bool: causal_mask_function `kv_idx <= q_idx`
    (:74-78); sliding, and_masks (:46-57) of sliding_window_overlay `kv_idx > q_idx - window`
    (:90-99) and the causal one: new_ones(()), the (s,) difference, `>`, `&`, `<=`, `&`, each
    operand freed when the next `result` is bound. The aranges are freed when sdpa_mask returns."""
    g = ops.g
    kw = {"requires_grad": False, "elt": 8}
    aranges = [g.op("batch_arange", [], size("b", 8), **kw), g.op("head_arange", [], size("1", 8), **kw)]
    for which in ("q", "kv"):
        arange = g.op(f"arange({which}_length)", [], size("s", 8), **kw)
        aranges.append(g.op(f"{which}_arange", [arange], size("s", 8), **kw))
    flags = {"requires_grad": False, "elt": 1}
    if not sliding:
        mask = g.op(name, aranges[2:], size("s s", 1), **flags)
    else:
        ones = g.op("new_ones(())", [aranges[2]], size("", 1), **flags)
        shifted = g.op("q_idx - window", [aranges[2]], size("s", 8), **kw)
        window = g.op("kv_idx > q_idx - window", [aranges[3], shifted], size("s s", 1), **flags)
        first = g.op("result & window", [ones, window], size("s s", 1), **flags)
        causal = g.op("kv_idx <= q_idx", aranges[2:], size("s s", 1), **flags)
        mask = g.op(name, [first, causal], size("s s", 1), **flags)
    ops.scope_end(aranges)
    return mask


def eager_mask(ops: Ops, mask: Value, elt: int, name: str) -> Value:
    """eager_mask (masking_utils.py:614-617): `torch.where(mask, torch.zeros((), dtype=dtype),
    min_dtype)`: the 0-dim zero and the wrapped scalar (both of the mask's dtype), the (b, 1, s, s)
    additive mask, the operands and the bool mask freed."""
    g = ops.g
    zero = g.op("zeros(())", [], size("", elt), requires_grad=False, elt=elt)
    low = g.op("min_dtype scalar", [], size("", elt), requires_grad=False, elt=elt)
    return g.op(name, [mask, zero, low], size("b s s", elt), requires_grad=False, elt=elt)
