"""Attention cores: F.scaled_dot_product_attention (flash / math kernels) and the eager
softmax(q k^T * scale + mask) v of each implementation, which materialises (b, heads, s, s)
scores.

torch.matmul on 4-D operands reshapes them to 3-D for bmm; q, k, v that are transposed views of
a projection cannot be flattened without a copy (aten/src/ATen/native/LinearAlgebra.cpp
_matmul_impl), and bmm saves those copies. Each eager function returns (output before the
output projection, the attention weights the module returns to its caller, which holds them
until it returns).
"""
from __future__ import annotations

from typing import Any, Callable

from memcalc.families.base import size
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, Grad, Value, product_saves
from memcalc.tape.ops import Ops, numel


def copy(ops: Ops, x: Value, name: str) -> Value:
    """A contiguous copy made by reshape/contiguous; its backward passes the gradient through."""
    return ops.g.op(name, [x], x.size, backward=[Alias(0)], elt=x.elt)


def head_copy(ops: Ops, spec: ModelSpec, x: Value, name: str) -> Value:
    """`copy`, or `x` itself (a view, saved by whoever takes it) with one attention head: every
    copy here is a reshape or contiguous() of a (b, heads, s, d)-shaped transpose, and a size-1
    heads dimension merges or transposes as a view whatever the strides (is_contiguous skips
    size-1 dims; measured at num_heads 1, torch 2.13: no clone, and bmm saves the view of a fused
    projection, keeping the whole projection alive)."""
    return x if spec.num_heads == 1 else copy(ops, x, name)


def scores_matmul(ops: Ops, q: Value, k: Value, heads: int) -> Value:
    """q @ k^T: (b, heads, s, s) scores; bmm saves both operands."""
    return ops.g.op("q@k^T", [q, k], size("b a s s", q.elt, a=heads), saves=product_saves(q, k),
                    backward=[Grad(0), Grad(1)], elt=q.elt)


def add_float_mask(ops: Ops, scores: Value, mask: Value) -> Value:
    """scores + float mask: a low-precision score tensor is promoted to the mask's dtype (fp32
    under autocast), so the sum is a new fp32 tensor whose gradient is cast back."""
    elt = max(scores.elt, mask.elt)
    back = [Alias(0)] if elt == scores.elt else [Grad(0)]
    return ops.g.op("+ mask", [scores, mask], numel(scores) * elt, backward=back, elt=elt)


def sdpa(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, contiguous: bool = False,
         contiguous_q: bool = False) -> Value:
    """F.scaled_dot_product_attention(is_causal=True) on (b, heads, s, d) views laid out as
    (b, s, heads, d), with no materialised mask (a mask: sdpa_masked); returns the (b, s,
    heads*d) input of the output projection. Which kernel runs decides what is saved
    (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp): on CPU, attention dropout rules out
    the flash kernel and the math composite runs. `contiguous`: k and v are the DynamicCache's
    contiguous copies; `contiguous_q`: q arrives contiguous (b, heads, s, d) (Phi-3's and
    GPT-NeoX's rotary cat); the CPU flash kernel lays its output out like q (measured, torch
    2.13), so the caller's transpose(1, 2).contiguous() copies it."""
    if ops.device == "cpu" and spec.attn_dropout > 0:
        return sdpa_math(ops, spec, q, k, v, contiguous=contiguous, contiguous_q=contiguous_q)
    out = sdpa_flash(ops, q, k, v, spec.num_heads, spec.head_size)
    if contiguous_q and ops.device == "cpu":
        out = head_copy(ops, spec, out, "transpose(1,2).contiguous()")
    return out


def sdpa_attention(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value | None,
                   contiguous: bool = False) -> Value:
    """transformers' sdpa_attention_forward (integrations/sdpa_attention.py) on the projections:
    with no mask, is_causal and enable_gqa on autocast's operands (`sdpa`); with a materialised
    mask, `sdpa_masked`. `contiguous`: k and v are the DynamicCache's copies (use_cache)."""
    if mask is None:
        return sdpa(ops, spec, *(ops.matmul_operand(t) for t in (q, k, v)), contiguous=contiguous)
    return sdpa_masked(ops, spec, q, k, v, mask, contiguous)


def sdpa_flash(ops: Ops, q: Value, k: Value, v: Value, heads: int, head_dim: int,
               mask: Value | None = None) -> Value:
    """Flash kernel (CPU: _scaled_dot_product_flash_attention_for_cpu; CUDA: flash, or
    memory-efficient for fp32 or with a mask): outputs (b,s,heads*d) and an fp32 logsumexp
    (b,heads,s); saves q, k, v, the float mask if any (derivatives.yaml
    _scaled_dot_product_flash_attention_for_cpu: attn_mask), output, logsumexp; backward
    allocates grad q, k, v. No s^2 term but the mask's. The output is laid out (b, s, heads, d),
    so transpose(1, 2).contiguous() copies nothing."""
    masks = [mask] if mask is not None else []
    out, _ = ops.g.op_multi("sdpa", [q, k, v] + masks, [size("b s a d", q.elt, a=heads, d=head_dim),
                                                          size("b a s", 4, a=heads)],
                            saves=[q, k, v] + masks, backward=[Grad(0), Grad(1), Grad(2)],
                            elts=[q.elt, 4], save_outputs=(0, 1))
    return out


def sdpa_masked(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value,
                contiguous: bool = False) -> Value:
    """transformers' sdpa_attention_forward with a materialised mask (integrations/
    sdpa_attention.py), the one model of it: a padded batch's (b, 1, s, s) bool mask
    (memcalc.families.call_path.causal_mask, HF GPT-2 and Llama) or a sliding-window layer's
    (1, 1, s, s) bool mask expanded to (b, 1, s, s) (memcalc.families.masks, the window reached).
    use_gqa_in_sdpa is false with a mask, so repeat_kv copies k and v to all heads in their own
    dtype (`repeat_kv`: kv < heads; none for GPT-2, whose module has no num_key_value_groups and
    kv == heads), held until the function returns; autocast casts q, k, v;
    scaled_dot_product_attention turns the bool mask into an additive one of q's dtype
    (`sdpa_float_mask`), which the kernel saves. `contiguous`: k and v are the DynamicCache's
    copies (use_cache). Measured: +2 (b,1,s,s) masks and the repeated k, v per layer against the
    unmasked run (sliding ci rows fam*; padded: cp*, tr*)."""
    a, d = spec.num_heads, spec.head_size
    k, v, layout = repeat_kv(ops, spec, k, v)
    held = [k, v]  # sdpa_attention_forward's key / value locals until it returns
    q = ops.matmul_operand(q)
    k_cast, v_cast = ops.matmul_operand(k), ops.matmul_operand(v)
    # autocast's cast of an expanded view is a full contiguous copy (empty_like falls back to
    # contiguous strides for overlapping memory)
    layouts = tuple("contiguous" if cast is not t and layout == "expanded" else layout
                    for t, cast in ((k, k_cast), (v, v_cast)))
    k, v = k_cast, v_cast
    additive = sdpa_float_mask(ops, mask, q.elt)
    if ops.device == "cpu" and spec.attn_dropout > 0:
        out = sdpa_math(ops, spec, q, k, v, additive, layouts=layouts, contiguous=contiguous)
        # the converted mask is scaled_dot_product_attention's local until the math composite
        # returns (no op of it saves the mask: measured, fam11/fam18 forward at the dropout
        # multiply, one (b, 1, s, s) fp32 mask more than the add's last use left alive)
        if additive is not mask:
            held.append(additive)
    else:
        out = sdpa_flash(ops, q, k, v, a, d, additive)
    ops.scope_end(held)
    return out


def repeat_kv(ops: Ops, spec: ModelSpec, k: Value, v: Value) -> tuple[Value, Value, str]:
    """transformers' repeat_kv (integrations/sdpa_attention.py, with a mask): k and v expanded
    to every head and reshaped, in their own dtype (before autocast casts them for SDPA);
    backward sums each back to kv heads. Returns (k, v, their layout as sdpa_math reads it):
    'projection' with kv == heads (nothing repeated); 'contiguous' copies made by the reshape;
    'expanded' with one kv head (MQA), where (b, 1, n, s, d) -> (b, n, s, d) merges a size-1 dim,
    a view of stride 0 that SDPA saves, keeping the kv-sized original (measured)."""
    a, d, g = spec.num_heads, spec.head_size, ops.g
    if spec.kv_heads == a:
        return k, v, "projection"
    if spec.kv_heads == 1:  # its gradient comes back (b, heads, s, d), summed to the head
        k, v = (g.view(f"repeat_kv {n} (expanded view)", t, size("b s a d", t.elt, a=a, d=d),
                       backward=[Grad(0)]) for n, t in (("k", k), ("v", v)))
        return k, v, "expanded"
    k = g.op("repeat_kv k", [k], size("b s a d", k.elt, a=a, d=d), backward=[Grad(0)], elt=k.elt)
    v = g.op("repeat_kv v", [v], size("b s a d", v.elt, a=a, d=d), backward=[Grad(0)], elt=v.elt)
    return k, v, "contiguous"


def sdpa_float_mask(ops: Ops, mask: Value, elt: int) -> Value:
    """F.scaled_dot_product_attention's convert_boolean_attn_mask (aten attention.cpp):
    where(mask, 0, -inf) against two 0-d scalar tensors, a (b, 1, s, s) float mask in the query's
    dtype (full size even from an expanded mask), made in every layer (measured, torch 2.13:
    scalar_tensor x2, where.self; no other temporary). A float mask is used as it is."""
    if mask.elt != 1:
        return mask
    g = ops.g
    scalars = [g.op(f"scalar_tensor({x})", [], size("", elt), requires_grad=False, elt=elt) for x in ("0", "-inf")]
    out = g.op("sdpa float mask", [mask, *scalars], size("b s s", elt), requires_grad=False, elt=elt)
    ops.scope_end(scalars)
    return out


def sdpa_math(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value | None = None,
              layouts: tuple[str, str] = ("projection", "projection"), contiguous: bool = False,
              contiguous_q: bool = False) -> Value:
    """_scaled_dot_product_attention_math (aten/src/ATen/native/transformers/attention.cpp), a
    composite: q and k each scaled by sqrt(scale); a causal float mask built from tril(ones(s, s));
    q and k^T copied by bmm's reshape and saved; scores + mask; _safe_softmax (saves its result);
    dropout; v copied (repeat_interleave'd to all heads with enable_gqa) and saved; the output is
    laid out (b, heads, s, d), so the caller's transpose(1, 2).contiguous() is a real copy.
    Backward: q, k, v gradients come out (b, heads, s, d) and the transposed views copy them.
    With a given additive `mask` (sdpa_masked) no causal mask is built, and `layouts` says how k
    and v are laid out: 'projection' (transposed views of the projections, kv heads), or all
    heads as repeat_kv made them, 'contiguous' copies (bmm takes them as they are) or
    'expanded' stride-0 views (an elementwise op or an upcast lays them out contiguously; bmm
    copies an expanded v). With the DynamicCache's contiguous k and v (`contiguous`), k^T and v
    need no copy; with q and k contiguous (b, heads, s, d) (`contiguous_q`: Phi-3's and
    GPT-NeoX's rotary cat), neither q nor k^T (measured: no clone before the first bmm, torch
    2.13); with one sequence (Regime.single_sequence) none of q, k^T, v from the projection
    (measured: no clone before either bmm at b=1, reference GPT-2 ci65). Held until the function
    returns (measured, GPT-NeoX under per-layer checkpointing and fp16/bf16 autocast, where
    nothing is saved in forward): its arguments (under autocast, the autocast wrapper's casts of
    q, k, v), the C++ locals `query` (q scaled), `attn` (the dropped probabilities) and, from
    half inputs, the upcasts, the output before its cast, and the attention weights cast back to
    the input dtype (the second output, dropped by scaled_dot_product_attention when the math
    function returns). With enable_gqa (kv < heads), pre_process_group_query_attention_input
    repeats k and v before k is scaled; `key_expanded`, `value_expanded` and, from half inputs,
    `value_acc` live until the function returns, and the scaled transpose of the contiguous
    repeated k reaches bmm uncopied (measured: pure bf16 Llama GQA and bf16/fp16-amp Gemma MQA
    under checkpointing, validate/matrices/rows/sdpa-math.json)."""
    g, a, d = ops.g, spec.num_heads, spec.head_size
    k_layout, v_layout = layouts
    kv = spec.kv_heads if k_layout == "projection" else a
    origin = q.elt
    args = [q, k, v]  # the caller's tensors, alive until the call returns
    # the reshape of the incoming grad: a copy, a view with one head (head_copy; measured)
    back = [Alias(0) if a == 1 else Grad(0)]
    q = g.view("q view", q, backward=back)
    k = g.view("k view", k, backward=back)
    # half/bf16 inputs are computed in fp32 (`query_acc = query.to(kFloat)`), their copies held
    # by C++ locals until the function returns
    upcast = [ops.to(t, 4, "math upcast") for t in (q, k, v)]
    if upcast[2] is not v and v_layout == "expanded":
        v_layout = "contiguous"  # .to() of a stride-0 view is a contiguous copy
    q, k, v = upcast
    elt = q.elt
    qs = ops.scale(q, "q * sqrt(scale)")
    built = mask is None
    if built:
        mask = g.op("causal float mask", [], size("s s", elt), requires_grad=False, elt=elt)
    full = size("b s a d", elt, a=a, d=d)
    repeated = []
    if kv < a:  # pre_process_group_query_attention_input: `key_expanded` / `value_expanded`,
        # repeated before k is scaled and held until the function returns (measured, pure bf16
        # Llama GQA under per-layer checkpointing: both live at the dropout, as do the upcasts)
        k = g.op("repeat_interleave k", [k], full, backward=[Grad(0)], elt=elt)
        v = g.op("repeat_interleave v", [v], full, backward=[Grad(0)], elt=elt)
        repeated = [k, v]
    ks = ops.scale(k, "k * sqrt(scale)")  # key_expanded.transpose(-2, -1) * scaling_factor
    views = ops.regime.single_sequence  # (1, heads, ...) merges a size-1 dimension: no copy
    qc = qs if contiguous_q or views else head_copy(ops, spec, qs, "q reshape copy")
    # the repeated k is contiguous (b, heads, s, d): its scaled transpose needs no copy for bmm
    k_copy = (k_layout == "projection" and kv == a and not contiguous and not contiguous_q
              and not views)
    kc = head_copy(ops, spec, ks, "k^T reshape copy") if k_copy else ks
    raw = scores_matmul(ops, qc, kc, a)
    scores = g.op("+ mask", [raw, mask], raw.size, backward=[Alias(0)], elt=elt)
    p = ops.dropout(ops.unary_saving_output("_safe_softmax", scores), spec.attn_dropout)
    weights = []
    if origin != elt:  # the returned attention weights, cast back and dropped by the caller
        weights = [g.op("attn weights .to(origin)", [p], size("b a s s", origin, a=a), requires_grad=False,
                        elt=origin)]
    needs_copy = v_layout == "expanded" or (v_layout == "projection" and kv == a and not contiguous and not views)
    vc = head_copy(ops, spec, v, "v reshape copy") if needs_copy else v
    y = g.op("p@v", [p, vc], full, saves=product_saves(p, vc), backward=[Grad(1), Grad(0)], elt=elt)
    out = ops.to(y, origin, "math output .to(origin)")
    # the C++ locals query_acc, key_acc, value_acc (the upcasts, repeated or not) and the output
    ops.scope_end(([mask] if built else []) + ([*upcast, y] if origin != elt else []) + repeated + [qs, p]
                  + weights + args)
    if a == 1:  # head_copy: the transpose of one head is contiguous
        return out
    return g.op("transpose(1,2).contiguous()", [out], out.size, backward=[Grad(0)], elt=origin)


def gpt2_eager(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value,
               contiguous: bool = False) -> tuple[Value, Value]:
    """transformers' GPT-2 eager_attention_forward: bmm copies of the q, k, v views of the fused
    projection (not of k and v when they are the DynamicCache's contiguous copies); scores *
    scale + float mask; softmax (saves its result) cast to v's dtype; dropout; @ v;
    transpose(1, 2).contiguous()."""
    g, a, d = ops.g, spec.num_heads, spec.head_size
    qc = head_copy(ops, spec, q, "q reshape copy")
    s = scores_matmul(ops, qc, k if contiguous else head_copy(ops, spec, k, "k reshape copy"), a)
    s = add_float_mask(ops, ops.scale(s, "* scale"), mask)
    p = ops.unary_saving_output("softmax", s)
    p = ops.dropout(ops.to(p, v.elt, "attn_weights.type(value.dtype)"), spec.attn_dropout)
    vc = v if contiguous else head_copy(ops, spec, v, "v reshape copy")
    y = g.op("p@v", [p, vc], size("b s a d", q.elt, a=a, d=d), saves=product_saves(p, vc),
             backward=[Grad(0), Grad(1)], elt=q.elt)
    return head_copy(ops, spec, y, "transpose contiguous"), p


def llama_eager(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value,
                softcap: bool = False, contiguous_qk: bool = False, contiguous: bool = False
                ) -> tuple[Value, Value]:
    """Llama-family eager attention (modeling_llama.eager_attention_forward): repeat_kv copies
    k and v (in their own dtype) to all heads when kv < heads, their backward summing back to a
    kv-sized gradient; autocast then casts the matmul operands; bmm's reshape copies q (laid out
    (b, s, heads, d) by the projection view) and k when it was not repeated; softmax runs in fp32
    and is cast to the query's dtype (fp32 under CPU autocast, where rotary promoted q), dropout
    acts in that dtype, and autocast casts the probabilities for the second matmul.
    bmm's reshape copies v inside the second matmul, after the probabilities (measured: the clone
    of v follows softmax and its cast, GPT-NeoX cifb05 under every-k checkpointing).
    `contiguous_qk`: q and k arrive contiguous (b, heads, s, d) (Phi-3's and GPT-NeoX's rotary
    cat), so bmm's reshape copies neither. With `softcap` (Gemma-2's eager_attention_forward):
    scores / cap (a new tensor), tanh (saves its result), * cap, before the mask. The
    DynamicCache's contiguous k and v (`contiguous`) need no reshape copy. With one kv head
    repeat_kv is a view at any batch size (KV_EXPAND_VIEW). With one sequence
    (Regime.single_sequence) no reshape copies: merging the size-1 batch dimension with the heads
    is a view whatever the layout (measured: no clone before either bmm at b=1, torch 2.13)."""
    g, a, kv, d = ops.g, spec.num_heads, spec.kv_heads, spec.head_size
    query_elt = q.elt
    repeated = []
    reshape_copies = not ops.regime.single_sequence and a > 1  # head_copy: views at one head
    expanded = kv == 1 < a  # one kv head: repeat_kv is a view (KV_EXPAND_VIEW), at any batch size
    if expanded:
        k = g.view("repeat_kv k (expand view)", k, size("b s a d", k.elt, a=a, d=d), backward=[Grad(0)])
        v = g.view("repeat_kv v (expand view)", v, size("b s a d", v.elt, a=a, d=d), backward=[Grad(0)])
        repeated = [k, v]
    elif kv < a:
        k = g.op("repeat_kv k", [k], size("b s a d", k.elt, a=a, d=d), backward=[Grad(0)], elt=k.elt)
        v = g.op("repeat_kv v", [v], size("b s a d", v.elt, a=a, d=d), backward=[Grad(0)], elt=v.elt)
        repeated = [k, v]  # key_states / value_states: locals until the function returns
    # v, a transposed view (kv == heads) or the expanded one, is copied by p @ v's reshape, after
    # the softmax (measured: aten.clone of v after _softmax, Llama bf16 eager every-k)
    v_copy = reshape_copies and (expanded or (kv == a and not contiguous))
    k_view = k
    q, k = ops.matmul_operand(q), ops.matmul_operand(k)
    if not contiguous_qk and reshape_copies:
        q = copy(ops, q, "q reshape copy")
    if kv == a and not contiguous_qk and not contiguous and reshape_copies:
        k = copy(ops, k, "k^T reshape copy")
    if expanded and k is k_view and reshape_copies:  # not cast by autocast: bmm's reshape copies it
        k = copy(ops, k, "k^T reshape copy (expanded)")
    scores = ops.scale(scores_matmul(ops, q, k, a), "* scale")
    if softcap:
        scores = ops.scale(ops.unary_saving_output("tanh", ops.scale(scores, "/ softcap")), "* softcap")
    masked = add_float_mask(ops, scores, mask)
    p = ops.unary_saving_output("softmax", ops.to(masked, 4, "softmax dtype=float32"))
    # `attn_weights = softmax(attn_weights, dtype=float32).to(query.dtype)`: the caller's
    # `attn_weights` (the masked scores, low precision without autocast) is rebound only when the
    # whole line returns, so it lives through softmax (measured: pure bf16 Llama eager,
    # b*heads*s*s*2 B alive at _softmax) and through the cast back when that copies (measured:
    # OLMo-2 bf16-amp eager under per-layer checkpointing, whose rotary casts q back to bf16: the
    # fp32 masked scores, the fp32 softmax and its bf16 cast alive together at _to_copy, cpg07)
    p = ops.to(p, query_elt, "softmax .to(query dtype)")
    ops.scope_end([masked])
    p = ops.dropout(p, spec.attn_dropout)
    pm, vm = ops.matmul_operand(p), ops.matmul_operand(v)
    if v_copy and (vm is v or not expanded):  # a cast of the expanded view is contiguous
        vm = copy(ops, vm, "v reshape copy")
    y = g.op("p@v", [pm, vm], size("b s a d", pm.elt, a=a, d=d), saves=product_saves(pm, vm),
             backward=[Grad(0), Grad(1)], elt=pm.elt)
    out = head_copy(ops, spec, y, "transpose contiguous")
    ops.scope_end(repeated)
    return out, p


KV_EXPAND_VIEW = """modeling_llama.repeat_kv: `x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep,
s, d)`. With one kv head the merged dimensions are (1, n_rep), and a size-1 dimension merges with
any stride, so reshape returns a view (stride 0 over the heads) and allocates nothing; the
expansion is materialised later, once: by autocast's cast of k (a contiguous (b, heads, d, s)
copy; torch _to_copy of an overlapping tensor) or else by bmm's reshape of k^T, and by p @ v's
reshape of v (after the softmax and dropout). Its backward (expand's sum) allocates the kv-sized
gradient, as the copy's did. Measured (validate tracker, Llama/Gemma-3 fp16-amp and fp32 eager,
b=2-3): no tensor at repeat_kv, no (b, heads, s, d) copy of k or v until those casts and
reshapes. With one sequence (b=1) nothing copies the
expansion but autocast's cast: bmm's reshapes merge the size-1 batch dimension too, so q @ k^T and
p @ v save the stride-0 views, which keep the kv-sized rotated k and the fused projection (Phi-3's
qkv, v a view of it) alive until their backward (measured, Phi-3 two heads one kv head, pure bf16,
eager, sqrt checkpointing, b=1: the forward and backward phases need these views; rows in
validate/matrices/rows/attention-views.json)."""


def reference_eager(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, copies: tuple[bool, bool, bool]) -> Value:
    """validate.models.reference._eager_attention: (q @ k^T) * scale; masked_fill with a bool mask slice
    (`mask == 0` allocates an (s, s) bool tensor, saved by masked_fill); softmax; dropout; @ v;
    transpose(1, 2).contiguous(). `copies` says which of q, k, v bmm must copy."""
    g, a, d, kv = ops.g, spec.num_heads, spec.head_size, spec.kv_heads
    q, k, v = (ops.matmul_operand(t) for t in (q, k, v))
    if kv < a:
        full = size("b s a d", k.elt, a=a, d=d)
        k = g.op("repeat_interleave k", [k], full, backward=[Grad(0)], elt=k.elt)
        v = g.op("repeat_interleave v", [v], full, backward=[Grad(0)], elt=v.elt)
    qc = head_copy(ops, spec, q, "q reshape copy") if copies[0] else q
    kc = head_copy(ops, spec, k, "k reshape copy") if copies[1] else k
    s = ops.scale(scores_matmul(ops, qc, kc, a), "* scale")
    cond = g.op("mask == 0", [], size("s s", 1), requires_grad=False, elt=1)
    s = g.op("masked_fill", [s, cond], s.size, saves=[cond], backward=[Grad(0)], elt=s.elt)
    p = ops.dropout(ops.unary_saving_output("softmax", s), spec.attn_dropout)
    vc = head_copy(ops, spec, v, "v reshape copy") if copies[2] else v
    y = g.op("p@v", [p, vc], size("b s a d", q.elt, a=a, d=d), saves=product_saves(p, vc),
             backward=[Grad(0), Grad(1)], elt=q.elt)
    return head_copy(ops, spec, y, "transpose contiguous")


def attention_core(ops: Ops, regime: Regime, core: Callable[[], Any], position_ids: Value | None = None) -> Any:
    """Run `core()` (the attention core) in its own checkpoint region under selective
    checkpointing (Korthikanti et al. 2022: only the core is recomputed). The checkpointed
    function (validate.models.hf.register_selective) closes over the attention interface's keyword
    arguments, among them the `position_ids` the decoder layer passes through the attention
    module's **kwargs (modeling_llama.py LlamaDecoderLayer, LlamaAttention): checkpoint's frame
    keeps it, like the region's inputs, until the region's backward (measured: 8*s bytes)."""
    if regime.selective:
        ops.g.begin_region()
        if position_ids is not None:
            ops.g.view("checkpointed closure's position_ids", position_ids)
    out = core()
    if regime.selective:
        ops.g.end_region()
    return out
