"""transformers GPT2LMHeadModel (models/gpt2/modeling_gpt2.py, transformers 5.x), use_cache=False.

Python-level lifetimes that matter: GPT2Model.forward keeps inputs_embeds and position_embeds
until it returns; GPT2Block.forward keeps attn_output and feed_forward_hidden_states until the
block returns; NewGELUActivation is eight elementwise ops (activations.py).
"""
from __future__ import annotations


from memcalc.poly import Poly
from memcalc.programs.common import causal_lm_loss, run_layers, sdpa
from memcalc.programs.eager import eager_attention
from memcalc.tape.graph import Grad
from memcalc.tape.ops import Ops


def gelu_new(ops: Ops, x):
    """0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) op by op."""
    half = ops.scale(x, "0.5*x")
    cube = ops.unary_saving_input("pow 3", x, temps=2)  # pow_backward: pow, mul.Scalar, mul
    inner = ops.add(x, ops.scale(cube, "0.044715*x^3"), "x + 0.044715x^3")
    t = ops.unary_saving_output("tanh", ops.scale(inner, "sqrt(2/pi)*"))
    return ops.mul(half, ops.shift(t, "1 + tanh"), "gelu_new out")


def activation(ops: Ops, x, kind: str):
    """The MLP activation as HF runs it."""
    if kind == "gelu_new":
        return gelu_new(ops, x)
    return ops.unary_saving_input(kind, x)


def block(ops: Ops, spec, training, x, N: Poly, layer: int):
    """One GPT2Block."""
    h, a, d, f = spec.hidden_size, spec.num_heads, spec.head_size, spec.ffn_size
    p = lambda name, n, rows=None: ops.param(f"h.{layer}.{name}", n, rows)
    block_input = x  # the caller's loop variable holds it until the block returns
    ln1 = ops.layer_norm(x, p("ln_1.weight", h), p("ln_1.bias", h), N)
    qkv = ops.linear(ln1, p("attn.c_attn.weight", h * 3 * a * d, h),
                     p("attn.c_attn.bias", 3 * a * d) if spec.qkv_bias else None, N, 3 * a * d, "c_attn")
    q, k, v = ops.g.views("split qkv", qkv, [Poly.bs(a * d * qkv.elt)] * 3, backward=[Grad(0)])
    if training.checkpointing == "selective":
        ops.g.begin_region()
    if training.attention == "sdpa":
        y = sdpa(ops, spec, q, k, v)
    else:
        y = eager_attention(ops, spec, training, q, k, v, hf=True)
    if training.checkpointing == "selective":
        ops.g.end_region()
    attn = ops.linear(y, p("attn.c_proj.weight", a * d * h, a * d), p("attn.c_proj.bias", h) if spec.out_bias else None,
                      N, h, "attn c_proj")
    attn = ops.dropout(attn, spec.resid_dropout)
    ops.scope_end([q, k, v])  # GPT2Attention.forward's locals
    weights = ops.pop_attn_weights()  # `attn_output, _ = self.attn(...)`: `_` lives to return
    x = ops.add(attn, x, "residual 1")
    ops.scope_end([ln1])  # the block's `hidden_states` held ln_1's output until this rebinding
    ln2 = ops.layer_norm(x, p("ln_2.weight", h), p("ln_2.bias", h), N)
    h1 = ops.linear(ln2, p("mlp.c_fc.weight", h * f, h), p("mlp.c_fc.bias", f) if spec.mlp_bias else None, N, f, "c_fc")
    m = ops.linear(activation(ops, h1, spec.activation), p("mlp.c_proj.weight", f * h, f),
                   p("mlp.c_proj.bias", h) if spec.mlp_bias else None, N, h, "mlp c_proj")
    m = ops.dropout(m, spec.resid_dropout)
    x = ops.add(x, m, "residual 2")
    ops.scope_end([ln2])
    ops.scope_end([attn, m, block_input, weights])
    return x


def build(ops: Ops, spec, training, segments) -> None:
    """The whole forward and loss."""
    g, h, V, P = ops.g, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings
    N = Poly.bs(1)
    ids = g.input("input_ids", Poly.bs(8))
    wte, wpe = ops.param("wte", V * h, V), ops.param("wpe", P * h, P)
    pos_ids = g.op("position_ids", [], Poly.mono(8, 0, 1), requires_grad=False, elt=8)
    tok = g.op("wte embedding", [wte, ids], N * h * wte.elt, saves=[ids], backward=[Grad(0)], elt=wte.elt)
    pos = g.op("wpe embedding", [wpe, pos_ids], Poly.mono(h * wpe.elt, 0, 1), saves=[pos_ids],
               backward=[Grad(0)], elt=wpe.elt)
    x = ops.add_broadcast(tok, pos, Poly.mono(h * wpe.elt, 0, 1))
    mask = None
    if training.attention == "eager":  # create_causal_mask: a (b,1,s,s) additive float mask
        mask = g.op("causal mask", [], Poly.mono(tok.elt, 1, 2), requires_grad=False, elt=tok.elt)
        ops.mask = mask
    x = ops.dropout(x, spec.embd_dropout)
    x = run_layers(ops, spec.num_layers, segments,
                   lambda x, layer: block(ops, spec, training, x, N, layer), x)
    x = ops.layer_norm(x, ops.param("ln_f.weight", h), ops.param("ln_f.bias", h), N)
    ops.scope_end([tok, pos, mask])
    head = wte if spec.tie_embeddings else ops.param("lm_head", V * h, V)
    logits = ops.linear(x, head, None, N, V, "lm_head")
    causal_lm_loss(ops, logits, V, labels_in_forward=True)
    ops.scope_end([logits, x] + ops.weight_casts)  # outputs.last_hidden_state lives to return
