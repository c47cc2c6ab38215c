"""Pieces shared by the model programs: attention cores and the causal-LM loss."""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.tape.graph import Alias, Grad, Value
from memcalc.tape.ops import Ops


def sdpa(ops: Ops, spec, q: Value, k: Value, v: Value) -> Value:
    """F.scaled_dot_product_attention on (b, heads, s, d) views laid out as (b, s, heads, d);
    returns the (b, s, heads*d) input of the output projection. Which kernel runs decides what
    is saved (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp): on CPU, attention dropout
    rules out the flash kernel and the math composite runs."""
    if ops.device == "cpu" and spec.attn_dropout > 0:
        return sdpa_math(ops, spec, q, k, v)
    return sdpa_flash(ops, q, k, v, spec.num_heads, spec.head_size)


def sdpa_flash(ops: Ops, q: Value, k: Value, v: Value, heads: int, head_dim: int) -> Value:
    """Flash kernel (CPU: _scaled_dot_product_flash_attention_for_cpu; CUDA: flash, or
    memory-efficient for fp32): outputs (b,s,heads*d) and an fp32 logsumexp (b,heads,s); saves
    q, k, v, output, logsumexp; backward allocates grad q, k, v. No s^2 term. The output is laid
    out (b, s, heads, d), so transpose(1, 2).contiguous() copies nothing."""
    elt = q.elt
    out, _ = ops.g.op_multi("sdpa", [q, k, v], [Poly.bs(heads * head_dim * elt), Poly.bs(heads * 4)],
                            saves=[q, k, v], backward=[Grad(0), Grad(1), Grad(2)], elts=[elt, 4],
                            save_outputs=(0, 1))
    return out


def sdpa_math(ops: Ops, spec, q: Value, k: Value, v: Value) -> Value:
    """_scaled_dot_product_attention_math (aten/src/ATen/native/transformers/attention.cpp), a
    composite: q and k each scaled by sqrt(scale); a causal float mask built from tril(ones(s, s));
    q and k^T copied by bmm's reshape and saved; scores + mask; _safe_softmax (saves its result);
    dropout; v copied (repeat_interleave'd to all heads with enable_gqa) and saved; the output is
    laid out (b, heads, s, d), so the caller's transpose(1, 2).contiguous() is a real copy.
    Backward: q, k, v gradients come out (b, heads, s, d) and the transposed views copy them."""
    g, a, kv, d = ops.g, spec.num_heads, spec.kv_heads, spec.head_size
    origin = q.elt
    q = g.view("q view", q, backward=[Grad(0)])  # reshape of the incoming grad: a copy
    k = g.view("k view", k, backward=[Grad(0)])
    # half/bf16 inputs are computed in fp32 (`query_acc = query.to(kFloat)`), their copies held
    # by C++ locals until the function returns
    q, k, v = (ops.to(t, 4, "math upcast") for t in (q, k, v))
    elt = q.elt
    qs = ops.scale(q, "q * sqrt(scale)")
    mask = g.op("causal float mask", [], Poly.mono(elt, 0, 2), requires_grad=False, elt=elt)
    ks = ops.scale(k, "k * sqrt(scale)")
    full = Poly.bs(a * d * elt)
    if kv < a:
        ks = g.op("repeat_interleave k", [ks], full, backward=[Grad(0)], elt=elt)
        v = g.op("repeat_interleave v", [v], full, backward=[Grad(0)], elt=elt)
    qc = g.op("q reshape copy", [qs], qs.size, backward=[Alias(0)], elt=elt)
    kc = g.op("k^T reshape copy", [ks], ks.size, backward=[Alias(0)], elt=elt)
    raw = g.op("q@k^T", [qc, kc], Poly.mono(a * elt, 1, 2), saves=[qc, kc],
               backward=[Grad(0), Grad(1)], elt=elt)
    scores = g.op("+ mask", [raw, mask], raw.size, backward=[Alias(0)], elt=elt)
    p = ops.dropout(ops.unary_saving_output("_safe_softmax", scores), spec.attn_dropout)
    if origin != elt:  # the returned attention weights, cast back and dropped by the caller
        g.op("attn weights .to(origin)", [p], Poly.mono(a * origin, 1, 2), requires_grad=False, elt=origin)
    vc = g.op("v reshape copy", [v], full, backward=[Alias(0)], elt=elt) if kv == a else v
    y = g.op("p@v", [p, vc], full, saves=[p, vc], backward=[Grad(1), Grad(0)], elt=elt)
    out = ops.to(y, origin, "math output .to(origin)")
    ops.scope_end([mask] + ([q, k, v, y] if origin != elt else []))
    return g.op("transpose(1,2).contiguous()", [out], out.size, backward=[Grad(0)], elt=origin)


def run_layers(ops: Ops, num_layers: int, segments: set[int], block, x: Value) -> Value:
    """The decoder stack: `block(x, layer)` for each layer, each a wrapped module (FSDP hooks at
    its boundaries), grouped into checkpoint regions starting at the layers in `segments`."""
    g = ops.g
    for layer in range(num_layers):
        if layer in segments:
            g.begin_region()
        g.module_boundary("begin", str(layer))
        x = block(x, layer)
        g.module_boundary("end", str(layer))
        if layer + 1 in segments or layer == num_layers - 1:
            g.end_region()
    return x


def swiglu_mlp(ops: Ops, spec, x: Value, N: Poly, p) -> Value:
    """down_proj(F.silu(gate_proj(x)) * up_proj(x)) (LlamaMLP; validate.models.LlamaMLP)."""
    h, f, bias = spec.hidden_size, spec.ffn_size, spec.mlp_bias
    gate = ops.col_linear(x, p("gate_proj.weight", h * f, f), p("gate_proj.bias", f) if bias else None, N, f, "gate_proj")
    act = ops.unary_saving_input("silu", gate)
    up = ops.col_linear(x, p("up_proj.weight", h * f, f), p("up_proj.bias", f) if bias else None, N, f, "up_proj")
    return ops.row_linear(ops.mul(act, up, "silu*up"), p("down_proj.weight", f * h, h),
                      p("down_proj.bias", h) if bias else None, N, h, "down_proj")


def causal_lm_loss(ops: Ops, logits: Value, vocab: int, labels_in_forward: bool) -> Value:
    """transformers ForCausalLMLoss (loss/loss_utils.py): logits.float(); labels padded by one
    and shifted (a contiguous copy); cross_entropy = log_softmax (saves its fp32 result) +
    nll_loss (saves log-probs, target, total_weight). Returns the loss scalar."""
    g = ops.g
    logits32 = ops.to(logits, 4, "logits.float()")
    if labels_in_forward:
        padded = g.op("pad labels", [], Poly.mono(8, 1, 1) + Poly.mono(8, 1, 0), requires_grad=False, elt=8)
        target = g.op("shift labels", [padded], Poly.bs(8), requires_grad=False, elt=8)
    else:
        target = g.inputs[-1]
    return cross_entropy_fp32(ops, logits32, target)


def cross_entropy_fp32(ops: Ops, logits32: Value, target: Value) -> Value:
    """F.cross_entropy on fp32 logits = log_softmax (saves its result) + nll_loss (saves the
    log-probs, the target and total_weight); the loss is kept for backward. Returns it."""
    g = ops.g
    logp = g.op("log_softmax", [logits32], logits32.size, backward=[Grad(0)], elt=4, save_output=True)
    loss, _ = g.op_multi("nll_loss", [logp, target], [Poly.const(4), Poly.const(4)],
                         saves=[logp, target], backward=[Grad(0)], elts=[4, 4], save_outputs=(1,))
    g.keep.append(loss)
    return loss
