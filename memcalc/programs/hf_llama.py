"""transformers LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM (models/llama/
modeling_llama.py, transformers 5.x), use_cache=False.

LlamaRMSNorm upcasts to fp32 and saves the fp32 copy, its square, the normalised tensor and the
rsqrt; rotary embedding multiplies q and k by cos/sin tables computed once per forward (fp32 under
autocast, so q and k are promoted to fp32); rotate_half slices and concatenates; eager attention
materialises repeat_kv copies of k and v; sdpa passes enable_gqa when there is no mask
(integrations/sdpa_attention.py use_gqa_in_sdpa).
"""
from __future__ import annotations

from memcalc.poly import Poly
from memcalc.programs.common import causal_lm_loss, run_layers, sdpa, swiglu_mlp
from memcalc.programs.eager import eager_scores
from memcalc.tape.graph import FreeTemps, Grad, Temp
from memcalc.tape.ops import Ops, numel


def rms_norm(ops: Ops, x, w, N: Poly):
    """LlamaRMSNorm.forward op by op."""
    g = ops.g
    x = ops.replicated_input(x, "rmsnorm")
    x32 = ops.to(x, 4, "rmsnorm .float()")
    sq = ops.unary_saving_input("pow 2", x32, temps=2)
    var = g.op("mean", [sq], N * 4, backward=[Grad(0)], elt=4)
    var = ops.shift(var, "+ eps")
    r = ops.unary_saving_output("rsqrt", var)
    normed32 = ops.mul(x32, r, "x * rsqrt")
    normed = ops.to(normed32, x.elt, "rmsnorm .to(input_dtype)")
    out_elt = max(w.elt, normed.elt)
    out = g.op("weight * x", [w, normed], numel(normed) * out_elt, saves=[w, normed],
               backward=[Temp(numel(normed) * out_elt), Grad(0), FreeTemps(), Grad(1)], elt=out_elt)
    ops.scope_end([normed32])  # the local `hidden_states` holds it until forward returns
    return out


def rotary(ops: Ops, x, cos, sin, heads: int, d: int):
    """(x * cos) + (rotate_half(x) * sin); rotate_half = cat(-x2, x1)."""
    g = ops.g
    elt = max(x.elt, cos.elt)
    full = Poly.bs(heads * d)
    xc = g.op("x*cos", [x, cos], full * elt, saves=[cos], backward=[Grad(0)], elt=elt)
    half = Poly.bs(heads * d // 2)
    neg = g.op("-x2", [x], half * x.elt, backward=[Grad(0, full * x.elt)], elt=x.elt)
    rh = g.op("cat", [neg, x], full * x.elt, backward=[Grad(0, half * x.elt), Grad(1, full * x.elt)],
              elt=x.elt)
    rs = g.op("rot*sin", [rh, sin], full * elt, saves=[sin], backward=[Grad(0)], elt=elt)
    return ops.add(xc, rs, "rotary add")


def attention(ops: Ops, spec, training, x, cos, sin, N: Poly, p):
    """LlamaAttention with the configured attention interface."""
    a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    bias = spec.qkv_bias
    q = ops.col_linear(x, p("q_proj.weight", h * a * d, a * d), p("q_proj.bias", a * d) if bias else None, N, a * d, "q_proj")
    k = ops.col_linear(x, p("k_proj.weight", h * kv * d, kv * d), p("k_proj.bias", kv * d) if bias else None, N, kv * d, "k_proj")
    v = ops.col_linear(x, p("v_proj.weight", h * kv * d, kv * d), p("v_proj.bias", kv * d) if bias else None, N, kv * d, "v_proj")
    q, k = rotary(ops, q, cos, sin, a, d), rotary(ops, k, cos, sin, kv, d)
    q_local, k_local, v_local = q, k, v
    if training.checkpointing == "selective":
        ops.g.begin_region()
    if training.attention == "sdpa":
        q, k, v = (ops.matmul_operand(t) for t in (q, k, v))
        y = sdpa(ops, spec, q, k, v)
    else:
        y = eager_scores(ops, spec, q, k, v, hf=True, family="llama")
    if training.checkpointing == "selective":
        ops.g.end_region()
    out = ops.row_linear(y, p("o_proj.weight", a * d * h, h), p("o_proj.bias", h) if spec.out_bias else None,
                     N, h, "o_proj")
    ops.scope_end([q_local, k_local, v_local])  # LlamaAttention's locals
    return out


def block(ops: Ops, spec, training, x, cos, sin, N: Poly, layer: int):
    """One LlamaDecoderLayer."""
    block_input = x  # the caller's loop variable holds it until the block returns
    h = spec.hidden_size
    p = lambda name, n, rows=None: ops.param(f"layers.{layer}.{name}", n, rows)
    n1 = rms_norm(ops, x, p("input_layernorm.weight", h), N)
    attn = attention(ops, spec, training, n1, cos, sin, N, p)
    weights = ops.pop_attn_weights()  # `hidden_states, _ = self.self_attn(...)`: `_` lives on
    x = ops.add(x, attn, "residual 1")
    ops.scope_end([n1])  # the layer's `hidden_states` held the norm output until rebound
    n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), N)
    m = swiglu_mlp(ops, spec, n2, N, p)
    out = ops.add(x, m, "residual 2")
    ops.scope_end([block_input, n2, weights])
    return out


def rotary_tables(ops: Ops, d: int, elt: int):
    """LlamaRotaryEmbedding.forward: freqs (1,s,d/2), emb=cat (1,s,d), cos/sin *scaling, .to(x.dtype)."""
    g = ops.g
    pos = g.op("position_ids.float()", [], Poly.mono(4, 0, 1), requires_grad=False)
    freqs = g.op("freqs", [pos], Poly.mono(4 * (d // 2), 0, 1), requires_grad=False)
    emb = g.op("emb=cat", [freqs], Poly.mono(4 * d, 0, 1), requires_grad=False)
    out = []
    for name in ("cos", "sin"):
        t = g.op(name, [emb], Poly.mono(4 * d, 0, 1), requires_grad=False)
        t = g.op(f"{name}*scaling", [t], Poly.mono(4 * d, 0, 1), requires_grad=False)
        out.append(ops.to(t, elt, f"{name}.to(dtype)"))
    return out


def build(ops: Ops, spec, training, segments) -> None:
    """The whole forward and loss."""
    g, h, V = ops.g, spec.hidden_size, spec.vocab_size
    N = Poly.bs(1)
    ids = g.input("input_ids", Poly.bs(8))
    embed = ops.param("embed_tokens", V * h, V)
    x = g.op("embedding", [embed, ids], N * h * embed.elt, saves=[ids], backward=[Grad(0)], elt=embed.elt)
    inputs_embeds = x
    g.op("position_ids", [], Poly.mono(8, 0, 1), requires_grad=False, elt=8)
    mask = None
    if training.attention == "eager":
        mask = g.op("causal mask", [], Poly.mono(x.elt, 1, 2), requires_grad=False, elt=x.elt)
        ops.mask = mask
    cos, sin = rotary_tables(ops, spec.head_size, x.elt)
    x = run_layers(ops, spec.num_layers, segments,
                   lambda x, layer: block(ops, spec, training, x, cos, sin, N, layer), x)
    x = rms_norm(ops, x, ops.param("norm.weight", h), N)
    ops.scope_end([inputs_embeds, mask, cos, sin])
    head = embed if spec.tie_embeddings else ops.param("lm_head", V * h, V)
    logits = ops.linear(x, head, None, N, V, "lm_head")
    causal_lm_loss(ops, logits, V, labels_in_forward=True)
    ops.scope_end([logits, x] + ops.weight_casts)  # outputs.last_hidden_state lives to return
    g.order_params(registration_rank)


_LAYER_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "input_layernorm", "post_attention_layernorm"]


def registration_rank(label: str) -> tuple:
    """LlamaForCausalLM registration order: embed_tokens, layers (self_attn q/k/v/o, mlp
    gate/up/down, input_layernorm, post_attention_layernorm), norm, lm_head."""
    if label.startswith("layers."):
        _, i, name = label.split(".", 2)
        return (1, int(i), _LAYER_ORDER.index(name.split(".")[0]))
    return ({"embed_tokens": 0, "norm.weight": 2, "lm_head": 3}[label], 0, 0)
