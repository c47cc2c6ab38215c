"""transformers GptOssForCausalLM (models/gpt_oss/modeling_gpt_oss.py, transformers 5.24),
use_cache (memcalc.families.call_path), eager attention (GptOssPreTrainedModel._supports_sdpa is False: SDPA has no
attention sinks; memcalc.refusals.step.check_attention refuses it).

What differs from the MoE programs (memcalc.families.hf_moe, memcalc.families.moe), op by op:
- GptOssRMSNorm multiplies by the weight in fp32 and casts afterwards (layers.rms_norm_weight_first);
- GptOssRotaryEmbedding: (s, d/2) tables, no cat (`emb = freqs`), `* attention_scaling` (YaRN's
  attention factor; 1.0 for the default type, still a multiply), `.to(x.dtype)`;
  _apply_rotary_emb chunks q and k into halves and builds
  cat(x1*cos - x2*sin, x2*cos + x1*sin): a contiguous (b, heads, s, d) result;
- eager_attention_forward with sinks: scores * scale + mask, cat with the per-head sink logit
  (b, heads, s, s+1), minus its row max, softmax, the sink column dropped (a view);
- both masks (full and sliding, layer_types alternating) built once per forward;
- GptOssTopKRouter: linear with bias, topk of the logits, softmax over the k values;
- GptOssExperts: biases on both projections, interleaved gate/up (gate_up[..., ::2] and
  [..., 1::2]), the clamped SwiGLU `(up.clamp(-l, l) + 1) * gate.clamp(max=l) *
  sigmoid(alpha * gate.clamp(max=l))`; the eager loop is GptOssExperts.forward itself
  (`x @ W[e] + b[e]`), grouped_mm is integrations/moe.py with has_bias and is_transposed.
"""
from __future__ import annotations

from typing import Callable

from memcalc.inputs.moe_routing import is_worst, token_counts
from memcalc.core.poly import Poly
from memcalc.families.attention import add_float_mask, attention_core, copy, head_copy, scores_matmul
from memcalc.families.base import TOKENS, Embedded, param_maker, size
from memcalc.families.call_path import cache_kv
from memcalc.families.hf_llama import HFLlama, token_embedding
from memcalc.families.layers import qkv_projections, rms_norm_weight_first, rotary_buffers
from memcalc.families.moe import INDEX, grouped_combine, grouped_dispatch, inplace
from memcalc.families.moe_aux import add_aux_loss
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, FreeTemps, Grad, Temp, Value, product_saves
from memcalc.tape.ops import Ops


def rotary_tables(ops: Ops, d: int, elt: int) -> list[Value]:
    """GptOssRotaryEmbedding.forward: position_ids[..., None].float() (s), freqs (s, d/2) fp32
    (`emb = freqs`, no cat), cos/sin then `* attention_scaling` (a new tensor each), `.to(x.dtype)`.

    >>> from memcalc.tape.graph import Graph; from memcalc.inputs.training import TrainingConfig
    >>> ops = Ops(Graph(), Regime.of(TrainingConfig(micro_batch=1, seq_len=8, precision="bf16")))
    >>> [t.size.eval(1, 8) for t in rotary_tables(ops, 64, 2)]  # (s, d/2) bf16
    [512, 512]
    """
    g = ops.g
    rows = "b s" if ops.regime.positions_batched else "s"  # generate's (b, s) position_ids
    pos = g.op("position_ids.float()", [], size(rows, 4), requires_grad=False)
    freqs = g.op("freqs", [pos], size(rows + " d", 4, d=d // 2), requires_grad=False)
    tables = []
    for name in ("cos", "sin"):
        t = g.op(name, [freqs], size(rows + " d", 4, d=d // 2), requires_grad=False)
        tables.append(g.op(f"{name}*attention_scaling", [t], size(rows + " d", 4, d=d // 2),
                           requires_grad=False))
    out = [ops.to(t, elt, f"{name}.to(dtype)") for t, name in zip(tables, ("cos", "sin"))]
    ops.scope_end([freqs] + tables)  # the fp32 locals until the function returns
    return out


def rotary(ops: Ops, x: Value, cos: Value, sin: Value, heads: int, d: int) -> Value:
    """_apply_rotary_emb: chunk (two views), x1*cos - x2*sin, x2*cos + x1*sin (each product a
    temporary saving only the table: the tables need no gradient), cat: a contiguous
    (b, heads, s, d) tensor in the promoted dtype (fp32 under autocast: the tables are fp32)."""
    g = ops.g
    elt = max(x.elt, cos.elt)
    half = size("b s a d", elt, a=heads, d=d // 2)
    x1, x2 = g.views("chunk", x, [size("b s a d", x.elt, a=heads, d=d // 2)] * 2, backward=[Grad(0)])
    halves = []
    for name, (u, v) in (("first_", (x1, x2)), ("second_", (x2, x1))):
        a = g.op(f"{name} x*cos", [u, cos], half, saves=[cos], backward=[Grad(0)], elt=elt)
        b = g.op(f"{name} x*sin", [v, sin], half, saves=[sin], backward=[Grad(0)], elt=elt)
        # first_ = a - b: sub's backward negates the gradient for b (a new tensor)
        back = [Alias(0), Grad(1)] if name == "first_" else [Alias(0), Alias(1)]
        halves.append(g.op(f"{name} {'-' if name == 'first_' else '+'}", [a, b], half, backward=back, elt=elt))
    return g.op("cat", halves, size("b s a d", elt, a=heads, d=d), backward=[Alias(0), Alias(1)], elt=elt)


def sinks_eager(ops: Ops, spec: ModelSpec, q: Value, k: Value, v: Value, mask: Value,
                sinks: Value, contiguous: bool = False) -> tuple[Value, Value]:
    """modeling_gpt_oss.eager_attention_forward. q and k arrive contiguous (the rotary cat), so
    bmm copies neither; v is the projection's transposed view (copied by bmm's reshape in the
    second matmul unless repeat_kv copied it). `attn_weights` (scores + mask) lives until it is
    rebound to the probabilities, `combined_logits` (the shifted logits) until the function
    returns; max saves its int64 indices; softmax saves its result, whose (b, heads, s, s) slice, cast to v's
    dtype (a copy under autocast), is the second matmul's operand."""
    g, a, kv, d = ops.g, spec.num_heads, spec.kv_heads, spec.head_size
    repeated = []
    expanded = kv == 1 < a  # one kv head: repeat_kv is a view (attention.KV_EXPAND_VIEW)
    reshape_copies = not ops.regime.single_sequence  # at b 1 bmm's reshapes are views
    if expanded:  # copied later by autocast's cast or bmm's reshapes, as llama_eager models it
        k = g.view("repeat_kv k (expand view)", k, size("b s a d", k.elt, a=a, d=d), backward=[Grad(0)])
        v = g.view("repeat_kv v (expand view)", v, size("b s a d", v.elt, a=a, d=d), backward=[Grad(0)])
        repeated = [k, v]
    elif kv < a:
        k = g.op("repeat_kv k", [k], size("b s a d", k.elt, a=a, d=d), backward=[Grad(0)], elt=k.elt)
        v = g.op("repeat_kv v", [v], size("b s a d", v.elt, a=a, d=d), backward=[Grad(0)], elt=v.elt)
        repeated = [k, v]
    # the DynamicCache's copy (use_cache) is contiguous already; else the transposed view is
    # copied by bmm's reshape inside the second matmul, after the probabilities and their dropout
    # (measured: aten.clone of v after dropout's mul, GPT-OSS bf16 eager, attention dropout,
    # selective checkpointing, fresh1921586647-073: the copy made first put the forward +57,856 B)
    v_copy = (kv == a and not contiguous) or (expanded and reshape_copies)
    qm, km = ops.matmul_operand(q), ops.matmul_operand(k)
    if expanded and km is k and reshape_copies:  # not cast by autocast: bmm's reshape copies k^T
        km = copy(ops, km, "k^T reshape copy (expanded)")
    scores = add_float_mask(ops, ops.scale(scores_matmul(ops, qm, km, a), "* scaling"), mask)
    elt = max(scores.elt, sinks.elt)
    wide = size("b a s s", elt, a=a) + size("b a s", elt, a=a)  # (b, heads, s, s+1)
    back = [Alias(0) if scores.elt == elt else Grad(0), Grad(1, sinks.size)]  # the sink: summed (a,)
    combined = g.op("cat([attn_weights, sinks])", [scores, sinks], wide, backward=back, elt=elt)
    rowmax, argmax = g.op_multi("max(dim=-1)", [combined], [size("b a s", elt, a=a), size("b a s", INDEX, a=a)],
                                backward=[Temp(wide), Grad(0)], elts=[elt, INDEX], save_outputs=(1,))
    # sub's backward: the gradient passes to combined; -grad (full size) summed to the max's shape
    shifted = g.op("combined - max", [combined, rowmax], wide,
                   backward=[Alias(0), Temp(wide), Grad(1), FreeTemps()], elt=elt)
    probs = ops.unary_saving_output("softmax", shifted)
    scores_view = g.view("probs[..., :-1]", probs, size("b a s s", elt, a=a), backward=[Grad(0, probs.size)])
    weights = ops.to(ops.dropout(scores_view, spec.attn_dropout), v.elt, "attn_weights.to(value dtype)")
    ops.scope_end([scores])  # `attn_weights` (scores + mask) until rebound to the cast's result
    pm, vm = ops.matmul_operand(weights), ops.matmul_operand(v)
    if v_copy and (vm is v or not expanded):  # autocast's cast of the expanded view is contiguous
        vm = head_copy(ops, spec, vm, "v reshape copy")
    y = g.op("p@v", [pm, vm], size("b s a d", pm.elt, a=a, d=d), saves=product_saves(pm, vm),
             backward=[Grad(0), Grad(1)], elt=pm.elt)
    out = head_copy(ops, spec, y, "transpose contiguous")
    ops.scope_end(repeated + [shifted, probs])  # locals until the function returns
    return out, weights


def router(ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
    """GptOssTopKRouter: F.linear with bias (N, E); topk of the logits (values, int64 indices;
    its backward scatters into a zero (N, E) tensor); softmax over the k values in their dtype
    (bf16 under CPU autocast, measured: softmax with dtype= is not cast to fp32)."""
    g, E, k = ops.g, spec.moe.num_experts, spec.moe.top_k
    logits = ops.linear(x, p("mlp.router.weight", E * spec.hidden_size, E), p("mlp.router.bias", E),
                        TOKENS, E, "router")
    values, indices = g.op_multi("topk", [logits], [TOKENS * (k * logits.elt), TOKENS * (k * INDEX)],
                                 backward=[Temp(logits.size), Grad(0)], elts=[logits.elt, INDEX],
                                 save_outputs=(1,))
    scores = ops.unary_saving_output("router softmax", values)
    return logits, scores, indices


def clamped_swiglu(ops: Ops, up: Value, rows: Poly, f: int) -> Value:
    """GptOssExperts._apply_gate on (rows, 2f): gate = gate_up[..., ::2].clamp(max=limit) and
    up = gate_up[..., 1::2].clamp(-limit, limit) (strided views; clamp saves its input, so
    gate_up lives); gate * alpha (a temporary), sigmoid (saves its result), glu = gate * sig
    (saves both), up + 1 (saves nothing), (up + 1) * glu (saves both). The clamped up is a
    local until the function returns."""
    g, e = ops.g, up.elt
    half = rows * (f * e)
    gate_v, up_v = g.views("gate_up[..., ::2], [..., 1::2]", up, [half, half], backward=[Grad(0)])
    gate = g.op("gate.clamp(max=limit)", [gate_v], half, saves=[gate_v], backward=[Grad(0)], elt=e)
    upc = g.op("up.clamp(-limit, limit)", [up_v], half, saves=[up_v], backward=[Grad(0)], elt=e)
    sig = ops.unary_saving_output("sigmoid", ops.scale(gate, "gate * alpha"))
    glu = ops.mul(gate, sig, "glu = gate * sigmoid")
    out = ops.mul(ops.shift(upc, "up + 1"), glu, "(up + 1) * glu")
    ops.scope_end([up, gate, upc, glu])  # the argument and the locals, until the function returns
    return out


def _bias_gather(ops: Ops, bias: Value, ids: Value, rows: Poly, width: int, name: str) -> Value:
    """bias[expert_ids] (rows, width): saves the index; its backward scatters into a zero
    full-size bias gradient (index_put_ accumulate)."""
    return ops.g.op(name, [bias, ids], rows * (width * bias.elt), saves=[ids],
                    backward=[Grad(0)], elt=bias.elt)


def _add_(ops: Ops, out: Value, bias: Value, name: str) -> Value:
    """`out.add_(bias)` in place: nothing allocated, nothing saved; the bias's gradient is the
    incoming one (same shape)."""
    back = [Alias(0), Alias(1)] if bias.elt == out.elt else [Alias(0), Grad(1)]
    return inplace(ops, name, out, [bias], [], back)


def grouped_mm_experts(ops: Ops, spec: ModelSpec, x: Value, weights: Value, indices: Value,
                       p: Callable[..., Value]) -> Value:
    """integrations/moe.py grouped_mm_experts_forward with has_bias and is_transposed (weights
    (E, h, 2f) and (E, f, h), no transpose view), GptOssExperts._apply_gate in between."""
    g, E, k, h, f = ops.g, spec.moe.num_experts, spec.moe.top_k, spec.hidden_size, spec.moe.expert_ffn_size
    S = TOKENS * k
    gate_up = p("mlp.experts.gate_up_proj", E * h * 2 * f, E, (h, 2 * f))
    gate_up_bias = p("mlp.experts.gate_up_proj_bias", E * 2 * f, E)
    down = p("mlp.experts.down_proj", E * f * h, E, (f, h))
    down_bias = p("mlp.experts.down_proj_bias", E * h, E)
    held = grouped_dispatch(ops, spec, x, weights, indices)
    sorted_ids, gathered, offsets = held[1], held[3], held[7]
    pe = gate_up.elt  # grouped_mm runs in the weights' dtype (input.to(weight.dtype))
    b1 = _bias_gather(ops, gate_up_bias, sorted_ids, S, 2 * f, "gate_up_proj_bias[expert_ids]")
    xin = ops.to(gathered, pe, "input.to(weight.dtype)")
    up = g.op("grouped_mm gate_up", [xin, gate_up, offsets], S * (2 * f * pe), saves=[xin, gate_up, offsets],
              backward=[Grad(1), Grad(0)], elt=pe)
    up = _add_(ops, up, b1, "out.add_(bias)")
    mul = clamped_swiglu(ops, up, S, f)  # `proj_out` holds the projection until rebound to this
    b2 = _bias_gather(ops, down_bias, sorted_ids, S, h, "down_proj_bias[expert_ids]")
    ops.scope_end([b1])  # `selected_biases` until rebound to the down projection's
    y = g.op("grouped_mm down", [mul, down, offsets], S * (h * pe), saves=[mul, down, offsets],
             backward=[Grad(1), Grad(0)], elt=pe)
    y = _add_(ops, y, b2, "out.add_(bias)")
    ops.scope_end([mul])  # _grouped_linear's `input`, and `proj_out` until rebound
    return grouped_combine(ops, spec, x, y, held + [b2])


def eager_experts(ops: Ops, spec: ModelSpec, regime: Regime, x: Value, weights: Value,
                  indices: Value, layer: int, p: Callable[..., Value]) -> Value:
    """GptOssExperts.forward: zeros_like output; one_hot (N, k, E) int64 mask; for each hit
    expert: torch.where (two int64 index vectors of its n tokens), gather (n, h), x @ W[e]
    (mm, saving both) + b[e] (a new tensor), the clamped SwiGLU, @ down[e] + b[e], times its
    routing weights (n, 1), .to(hidden dtype), index_add_. Under 'worst' routing each storage
    sized by one expert's tokens is counted with the most the allocator's rounding can add
    (memcalc.tape.graph.count_slack), as in memcalc.families.moe. The loop's locals (token_idx,
    current_state, gate_up, gated_output, out, weighted_output) live until the next iteration
    rebinds them, the last ones until forward returns."""
    g, E, k, h, f = ops.g, spec.moe.num_experts, spec.moe.top_k, spec.hidden_size, spec.moe.expert_ffn_size
    gate_up = p("mlp.experts.gate_up_proj", E * h * 2 * f, E, (h, 2 * f))
    gate_up_bias = p("mlp.experts.gate_up_proj_bias", E * 2 * f, E)
    down = p("mlp.experts.down_proj", E * f * h, E, (f, h))
    down_bias = p("mlp.experts.down_proj_bias", E * h, E)
    out = g.op("zeros_like", [], x.size, requires_grad=False, elt=x.elt)
    mask = g.op("one_hot expert mask", [indices], TOKENS * (k * E * INDEX), requires_grad=False, elt=INDEX)
    hit = g.op("expert_hit", [mask], Poly.const(E * INDEX), requires_grad=False, elt=INDEX)
    held: dict[str, Value] = {}

    def bind(name: str, value: Value) -> Value:
        """`name = value` in the loop body: the previous iteration's value lives until now."""
        ops.scope_end([held.get(name)])
        held[name] = value
        return value

    bound = is_worst(regime.moe_routing)
    g.granularity = regime.granularity
    for e, n in enumerate(token_counts(spec, regime.moe_routing, layer)):
        if n.is_zero():
            continue
        g.count = n if bound else None  # as programs.moe.eager_experts: each storage's rounding at its most
        where = bind("token_idx", g.op("torch.where", [mask, hit], n * (2 * INDEX), requires_grad=False,
                                       elt=INDEX))
        state = bind("current_state", g.op("hidden_states[token_idx]", [x, where], n * (h * x.elt),
                                           saves=[where], backward=[Temp(x.size), Grad(0), FreeTemps()],
                                           elt=x.elt))
        up = bind("gate_up", _expert_linear(ops, state, gate_up, gate_up_bias, n, h, 2 * f, e, "gate_up"))
        mul = bind("gated_output", clamped_swiglu(ops, up, n, f))
        y = bind("out", _expert_linear(ops, mul, down, down_bias, n, f, h, e, "down"))
        w = g.op("routing_weights[token_idx, top_k_pos, None]", [weights, where], n * weights.elt,
                 saves=[where], backward=[Temp(weights.size), Grad(0), FreeTemps()], elt=weights.elt)
        scaled = bind("weighted_output", ops.mul(y, w, "* routing weights") if y.elt >= w.elt else
                      g.op("* routing weights", [y, w], n * (h * w.elt), saves=[y, w],
                           backward=[Grad(0), Grad(1)], elt=w.elt))
        scaled = ops.to(scaled, out.elt, ".to(hidden dtype)")
        out = inplace(ops, "index_add_", out, [scaled], [where, scaled], [Alias(0), Grad(1)])
    g.count = None
    ops.scope_end([mask, hit, *held.values()])
    return out


def _expert_linear(ops: Ops, x: Value, w: Value, b: Value, n: Poly, n_in: int, n_out: int, e: int,
                   name: str) -> Value:
    """`x @ W[e] + b[e]`: select views of the parameters (their gradients zero-filled full-size
    tensors, select_backward), mm (autocast casts x and the slice; saves both), + bias (a new
    tensor, promoted to the bias's dtype; the mm result is freed)."""
    g = ops.g
    we = g.view(f"{name}_proj[{e}]", w, Poly.const(n_in * n_out * w.elt), backward=[Grad(0)])
    be = g.view(f"{name}_proj_bias[{e}]", b, Poly.const(n_out * b.elt), backward=[Grad(0)])
    xm, wm = ops.matmul_operand(x), ops.matmul_operand(we)
    mm = g.op(f"expert {name} mm", [xm, wm], n * (n_out * xm.elt), saves=product_saves(xm, wm),
              backward=[Grad(0), Grad(1)], elt=xm.elt)
    elt = max(mm.elt, be.elt)
    back = [Alias(0) if mm.elt == elt else Grad(0), Grad(1, Poly.const(n_out * be.elt))]
    out = g.op(f"expert {name} + bias", [mm, be], n * (n_out * elt), backward=back, elt=elt)
    if xm is not x:
        ops.scope_end([x])
    return out


class HFGptOss(HFLlama):
    """GptOssForCausalLM: model.embed_tokens, model.layers.{i}.* (self_attn with sinks, mlp
    router and experts, the two norms), model.norm, lm_head."""

    def layer_period(self, spec: ModelSpec) -> int:
        """Sliding and full layers alternate (layer_types: sliding_window_pattern 2).

        >>> PROGRAM.layer_period(ModelSpec.preset("gpt-oss-20b"))
        2
        """
        return spec.sliding_window_pattern

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_tokens(ids); position_ids; both masks (create_causal_mask and
        create_sliding_window_causal_mask: eager's additive (b, 1, s, s) masks of the
        embeddings' dtype); the (s, d/2) rotary tables."""
        g = ops.g
        ids, x = token_embedding(ops, spec)
        pos = g.op("position_ids", [], size("b s" if regime.positions_batched else "s", 8),
                   requires_grad=False, elt=8)  # generate passes (b, s) position_ids
        masks = {kind: g.op(f"{kind} causal mask", [], size("b s s", x.elt), requires_grad=False, elt=x.elt)
                 for kind in ("full", "sliding")}
        rotary_buffers(ops, spec.head_size)  # GptOssRotaryEmbedding's inv_freq tables (yarn init)
        cos, sin = rotary_tables(ops, spec.head_size, x.elt)
        context = {"masks": masks, "cos": cos, "sin": sin, "position_ids": pos}  # GptOssModel passes
        # position_ids= to every decoder layer (a checkpoint region keeps it: DecoderProgram.run_layers);
        # position_ids is the base model's local until it returns (hf_llama.POSITION_IDS_LOCAL)
        return Embedded(x, ids, context, held_until_norm=[x, *masks.values(), cos, sin, pos])

    def attention(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict,
                  p: Callable[..., Value]) -> tuple[Value, Value]:
        """GptOssAttention: q/k/v projections (attention_bias), rotary, eager attention with
        sinks and the layer kind's mask, o_proj (attention_bias)."""
        a, d, h = spec.num_heads, spec.head_size, spec.hidden_size
        q, k, v = qkv_projections(ops, spec, x, p)
        cos, sin = context["cos"], context["sin"]
        q_local, k_local = q, k
        q, k = rotary(ops, q, cos, sin, a, d), rotary(ops, k, cos, sin, spec.kv_heads, d)
        ops.scope_end([q_local, k_local])  # apply_rotary_pos_emb's arguments, until it returns
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies
        o_w = p("self_attn.o_proj.weight", a * d * h, h)
        o_b = p("self_attn.o_proj.bias", h) if spec.out_bias else None
        sinks = p("self_attn.sinks", a)
        mask = context["masks"]["sliding" if spec.layer_is_sliding(layer) else "full"]
        y, weights = attention_core(ops, regime, lambda: sinks_eager(ops, spec, q, k, v, mask, sinks, contiguous),
                                    context.get("position_ids"))
        if regime.selective:  # validate.models.hf.register_selective returns (output, None): no weights held
            weights = None
        out = ops.row_linear(y, o_w, o_b, TOKENS, h, "o_proj")
        ops.scope_end([q, k, v])
        return out, weights

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One GptOssDecoderLayer: x + attn(norm(x)), then + mlp(norm(.)); the attention weights
        (`hidden_states, _ = self.self_attn(...)`) live until `_` is rebound to the router
        scores the MLP returns, which live until the layer returns."""
        block_input = x
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = rms_norm_weight_first(ops, x, p("input_layernorm.weight", h), TOKENS)
        attn, weights = self.attention(ops, spec, regime, n1, layer, context, p)
        ops.scope_end([n1])  # hf_llama.BLOCK_REBINDING
        x = ops.add(x, attn, "residual 1")
        n2 = rms_norm_weight_first(ops, x, p("post_attention_layernorm.weight", h), TOKENS)
        logits, scores, indices = router(ops, spec, n2, p)
        if regime.experts_implementation == "eager":
            m = eager_experts(ops, spec, regime, n2, scores, indices, layer, p)
        else:
            m = grouped_mm_experts(ops, spec, n2, scores, indices, p)
        if spec.moe.output_router_logits:  # OutputRecorder(GptOssTopKRouter, index=0) keeps them
            context.setdefault("router_logits", []).append(logits)
            ops.scope_end([indices, weights])  # GptOssMLP.forward's locals
        else:
            ops.scope_end([logits, indices, weights])  # GptOssMLP.forward's locals
        ops.scope_end([n2])  # hf_llama.BLOCK_REBINDING
        out = ops.add(x, m, "residual 2")
        ops.scope_end([block_input, scores])
        return out

    def auxiliary_loss(self, ops: Ops, spec: ModelSpec, context: dict) -> None:
        """With output_router_logits: GptOssForCausalLM.forward's load_balancing_loss_func over
        every layer's captured router logits (the (N, E) F.linear output, bias included), added
        to the loss as in the other MoE types (memcalc.families.moe_aux); the logits and aux_loss
        live until the forward returns."""
        if not spec.moe.output_router_logits:
            return
        captured = context.get("router_logits", [])
        aux = add_aux_loss(ops, spec, captured)
        ops.scope_end(captured + [aux])

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm (a GptOssRMSNorm)."""
        return rms_norm_weight_first(ops, x, ops.param("model.norm.weight", spec.hidden_size), TOKENS)

    def registration_rank(self, label: str) -> tuple:
        """GptOssForCausalLM parameter order: embed_tokens, layers (self_attn's own sinks, then
        q/k/v/o with biases; mlp router weight and bias, experts gate_up_proj, its bias, down_proj,
        its bias; input_layernorm, post_attention_layernorm), norm, lm_head."""
        outer = {"model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}
        if not label.startswith("model.layers."):
            return (outer[label], 0, 0)
        i, name = label[len("model.layers."):].split(".", 1)
        return (1, int(i), LAYER_ORDER.index(name))


# a module's own parameters come before its submodules' (nn.Module.named_parameters): sinks first
LAYER_ORDER = ["self_attn.sinks"] + [f"self_attn.{n}.{w}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")
                                     for w in ("weight", "bias")] + [
    "mlp.router.weight", "mlp.router.bias", "mlp.experts.gate_up_proj",
    "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj", "mlp.experts.down_proj_bias",
    "input_layernorm.weight", "post_attention_layernorm.weight"]

PROGRAM = HFGptOss()
