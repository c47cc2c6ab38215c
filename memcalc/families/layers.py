"""Layers the programs share: RMSNorm (transformers' and torch's), rotary embeddings, the
SwiGLU MLP, GPT-2's gelu_new. (LayerNorm is one aten op: memcalc.tape.ops.Ops.layer_norm.)"""
from __future__ import annotations

from typing import Callable

from memcalc.families.base import TOKENS, size
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Alias, FreeTemps, Grad, Temp, Value, product_saves
from memcalc.tape.ops import Ops, numel

from memcalc.core.poly import ZERO, Poly


NORM_ARGUMENT = """A norm module's argument stays alive until the module returns: the caller's frame
(`hidden_states = self.post_feedforward_layernorm(hidden_states)`, `self.q_norm(query_states)`)
and Module._call_impl hold it, so when the norm upcasts a low-precision input (`x.float()`,
`.to(torch.float32)`: a copy) the input is freed only after the norm's output exists, not after the
upcast. Measured: Gemma-3 fp16-amp with attention dropout, the (b, s, h) fp16 MLP output alive at
post_feedforward_layernorm's type_as (validate tracker: 39936 B at b=3, s=104, h=64)."""


def rms_normalise(ops: Ops, x: Value, tokens: Poly, upcast: str) -> Value:
    """The fp32 core every RMSNorm shares (LlamaRMSNorm, Olmo2RMSNorm, GemmaRMSNorm, F.rms_norm):
    x.float() (a copy named `upcast` unless x is fp32), pow 2 (saves its input; backward makes
    two temporaries), mean over the features (one fp32 value per row of `tokens`), + eps, rsqrt
    (saves its result), x * rsqrt; returns the fp32 normalised tensor."""
    return rms_normalise_with_variance(ops, x, tokens, upcast)[0]


def rms_normalise_with_variance(ops: Ops, x: Value, tokens: Poly, upcast: str) -> tuple[Value, Value]:
    """rms_normalise, also returning the mean of squares: LlamaRMSNorm and Olmo2RMSNorm bind it to
    the local `variance` (`variance = hidden_states.pow(2).mean(-1, keepdim=True)`, then
    `rsqrt(variance + eps)`), which holds it until forward returns; GemmaRMSNorm's `_norm` leaves
    it a temporary. Measured: Llama fp32 eager, the (b, s, 1) fp32 mean alive at the final norm's
    `weight * x` (validate tracker: 1248 B at b=3, s=104)."""
    x32 = ops.to(x, 4, upcast)
    sq = ops.unary_saving_input("pow 2", x32, temps=2)
    mean = ops.g.op("mean", [sq], tokens * 4, backward=[Grad(0)], elt=4)
    var = ops.shift(mean, "+ eps")
    return ops.mul(x32, ops.unary_saving_output("rsqrt", var), "x * rsqrt"), mean


def rms_norm(ops: Ops, x: Value, w: Value, tokens: Poly, weight_in_fp32: bool) -> Value:
    """RMSNorm op by op: the fp32 core (rms_normalise), then the weight.
    - transformers' LlamaRMSNorm (`weight_in_fp32=False`): casts back to the input dtype first,
      then `weight * x` (promoting to the weight's dtype); the fp32 local `hidden_states` lives
      until forward returns;
    - torch's F.rms_norm composite on CPU (aten/src/ATen/native/layer_norm.cpp rms_norm_symint,
      `weight_in_fp32=True`): multiplies by the weight in fp32, then casts back.
    `tokens` is b*s (b*s/t in sequence-parallel regions)."""
    g, arg = ops.g, x
    x = ops.replicated_input(x, "rms_norm" if weight_in_fp32 else "rmsnorm")
    if weight_in_fp32:
        normed32 = rms_normalise(ops, x, tokens, "rms_norm upcast")
        out = g.op("* weight", [normed32, w], normed32.size, saves=product_saves(normed32, w),  # promotes, no copy
                   backward=[Grad(0), Temp(normed32.size), Grad(1), FreeTemps()], elt=4)
        out = ops.to(out, x.elt, "rms_norm downcast")
        ops.scope_end([arg])  # NORM_ARGUMENT
        return out
    normed32, variance = rms_normalise_with_variance(ops, x, tokens, "rmsnorm .float()")
    normed = ops.to(normed32, x.elt, "rmsnorm .to(input_dtype)")
    out_elt = max(w.elt, normed.elt)
    out = g.op("weight * x", [w, normed], numel(normed) * out_elt, saves=product_saves(w, normed),
               backward=[Temp(numel(normed) * out_elt), Grad(0), FreeTemps(), Grad(1)], elt=out_elt)
    ops.scope_end([normed32, variance, arg])  # locals `hidden_states`, `variance`; the argument
    return out


def rotary(ops: Ops, x: Value, cos: Value, sin: Value, heads: int, d: int) -> Value:
    """(x * cos) + (rotate_half(x) * sin); rotate_half = cat(-x2, x1)."""
    g = ops.g
    elt = max(x.elt, cos.elt)
    xc = g.op("x*cos", [x, cos], size("b s a d", elt, a=heads, d=d), saves=[cos], backward=[Grad(0)], elt=elt)
    full, half = size("b s a d", x.elt, a=heads, d=d), size("b s a d", x.elt, a=heads, d=d // 2)
    neg = g.op("-x2", [x], half, backward=[Grad(0, full)], elt=x.elt)
    rh = g.op("cat", [neg, x], full, backward=[Grad(0, half), Grad(1, full)], elt=x.elt)
    rs = g.op("rot*sin", [rh, sin], size("b s a d", elt, a=heads, d=d), saves=[sin], backward=[Grad(0)], elt=elt)
    return ops.add(xc, rs, "rotary add")


def apply_rotary_pos_emb(ops: Ops, q: Value, k: Value,
                         rotate: Callable[[Value, Value], tuple[Value, Value]]) -> tuple[Value, Value]:
    """`query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)` in an
    attention module: rotate(q, k), with both arguments held by the caller's locals until the call
    returns and rebinds them (measured, Mixtral and Qwen3-MoE per-layer fp32, b 2, s 32: the
    forward phase peaks at k's rotary with the q and k projections alive, 2 * 8192 B past their
    last use; a per-layer Llama forward phase peaks there too).

    >>> from memcalc.tape.graph import Graph; from memcalc.engine.regime import Regime
    >>> from memcalc.inputs.training import TrainingConfig
    >>> ops = Ops(Graph(), Regime.of(TrainingConfig(micro_batch=1, seq_len=8)))
    >>> q, k = (ops.g.input(n, size("b s", 4)) for n in ("q", "k"))
    >>> apply_rotary_pos_emb(ops, q, k, lambda q, k: (k, q)) == (k, q), ops.g.nodes[-1].name
    (True, 'scope end')
    """
    rotated = rotate(q, k)
    ops.scope_end([q, k])
    return rotated


def rotary_buffers(ops: Ops, d: int, prefix: str = "model.rotary_emb.") -> list[Value]:
    """The rotary module's two constant buffers, held all run long: `inv_freq` and its clone
    `original_inv_freq` (`nn.Buffer(inv_freq.clone(), persistent=False)`: a second storage),
    each `torch.arange(0, d, 2)` long, so ceil(d/2) elements for every rope_type
    (modeling_rope_utils: the default, linear, dynamic, yarn, longrope and llama3 init functions
    all scale that arange). transformers 5.24 builds one rotary module per model
    (LlamaRotaryEmbedding, modeling_llama.py:87-88; the same code in Mistral, Qwen2/3, Phi-3,
    OLMo-2, Granite, SmolLM3, GPT-NeoX, Mixtral, Qwen2/3-MoE, OLMoE, GPT-OSS and Gemma 1-2;
    Gemma3RotaryEmbedding one pair per layer type, modeling_gemma3.py:157-158). fp32 buffers
    follow `model.to(dtype)` (Regime.buffer_elt: bf16 under pure bf16). Measured with the live
    tensor tracker at model build: 2 storages of d/2 elements (Gemma-3: 4), nothing else beside
    the parameters (Gemma: + embed_scale).

    >>> from memcalc.tape.graph import Graph; from memcalc.engine.regime import Regime
    >>> from memcalc.inputs.training import TrainingConfig
    >>> ops = Ops(Graph(), Regime.of(TrainingConfig(micro_batch=1, seq_len=8, precision="bf16")))
    >>> [(b.label, b.size.eval(1, 1)) for b in rotary_buffers(ops, 64)]  # 32 bf16 each
    [('model.rotary_emb.inv_freq', 64), ('model.rotary_emb.original_inv_freq', 64)]
    """
    be, n = ops.buffer_elt, (d + 1) // 2
    return [ops.g.buffer(f"{prefix}{name}", Poly.const(n * be), elt=be)
            for name in ("inv_freq", "original_inv_freq")]


def rotary_tables(ops: Ops, d: int, elt: int) -> list[Value]:
    """LlamaRotaryEmbedding.forward: freqs (1,s,d/2), emb=cat (1,s,d), cos/sin *scaling, .to(x.dtype);
    per row, (b, s, ...), when the caller passes (b, s) position_ids (Regime.positions_batched)."""
    g = ops.g
    rows = "b s" if ops.regime.positions_batched else "s"
    pos = g.op("position_ids.float()", [], size(rows, 4), requires_grad=False)
    freqs = g.op("freqs", [pos], size(rows + " d", 4, d=d // 2), requires_grad=False)
    emb = g.op("emb=cat", [freqs], size(rows + " d", 4, d=d), requires_grad=False)
    out = []
    for name in ("cos", "sin"):
        t = g.op(name, [emb], size(rows + " d", 4, d=d), requires_grad=False)
        t = g.op(f"{name}*scaling", [t], size(rows + " d", 4, d=d), requires_grad=False)
        out.append(ops.to(t, elt, f"{name}.to(dtype)"))
    ops.scope_end([freqs, emb])  # locals of forward until it returns (measured: freed after sin*scaling)
    return out


def qkv_projections(ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
    """self_attn.q_proj, k_proj, v_proj (column-parallel under tensor parallelism): a*d query and
    kv*d key and value features per token, biases when the spec has them."""
    a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    out = []
    for name, width in (("q_proj", a * d), ("k_proj", kv * d), ("v_proj", kv * d)):
        weight = p(f"self_attn.{name}.weight", h * width, width)  # created before the bias,
        bias = p(f"self_attn.{name}.bias", width) if spec.qkv_bias else None  # as torch registers
        out.append(ops.col_linear(x, weight, bias, TOKENS, width, name))
    return out[0], out[1], out[2]


def swiglu_mlp(ops: Ops, spec: ModelSpec, x: Value, tokens: Poly, p: Callable[..., Value],
               act_name: str = "silu") -> Value:
    """down_proj(act(gate_proj(x)) * up_proj(x)) (LlamaMLP; validate.models.reference.LlamaMLP; GemmaMLP's
    GeGLU with act_name='gelu_tanh'): F.silu or F.gelu(approximate='tanh'), one op saving its input."""
    h, f, bias = spec.hidden_size, spec.ffn_size, spec.mlp_bias
    gate = ops.col_linear(x, p("mlp.gate_proj.weight", h * f, f), p("mlp.gate_proj.bias", f) if bias else None,
                          tokens, f, "gate_proj")
    act = ops.unary_saving_input(act_name, gate)
    up = ops.col_linear(x, p("mlp.up_proj.weight", h * f, f), p("mlp.up_proj.bias", f) if bias else None,
                        tokens, f, "up_proj")
    return ops.row_linear(ops.mul(act, up, "silu*up"), p("mlp.down_proj.weight", f * h, h),
                          p("mlp.down_proj.bias", h) if bias else None, tokens, h, "down_proj")


def gelu_new(ops: Ops, x: Value) -> Value:
    """transformers' NewGELUActivation, 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), eight
    elementwise ops (activations.py)."""
    half = ops.scale(x, "0.5*x")
    cube = ops.unary_saving_input("pow 3", x, temps=2)  # pow_backward: pow, mul.Scalar, mul
    inner = ops.add(x, ops.scale(cube, "0.044715*x^3"), "x + 0.044715x^3")
    t = ops.unary_saving_output("tanh", ops.scale(inner, "sqrt(2/pi)*"))
    return ops.mul(half, ops.shift(t, "1 + tanh"), "gelu_new out")


def rms_norm_weight_first(ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
    """Olmo2RMSNorm (modeling_olmo2.py): like LlamaRMSNorm but `(weight * hidden_states)` in fp32
    (the weight promotes to the fp32 normalised tensor) and only then `.to(input_dtype)`; the
    product is a temporary when the cast copies."""
    g = ops.g
    normed32, variance = rms_normalise_with_variance(ops, x, tokens, "rmsnorm .float()")
    out = g.op("weight * x", [w, normed32], normed32.size, saves=[w, normed32],
               backward=[Temp(normed32.size), Grad(0), FreeTemps(), Grad(1)], elt=4)
    y = ops.to(out, x.elt, "rmsnorm .to(input_dtype)")
    ops.scope_end([x, variance])  # NORM_ARGUMENT; the local `variance`
    return y


def partial_rotary(ops: Ops, x: Value, cos: Value, sin: Value, heads: int, d: int, rotary_dim: int) -> Value:
    """Phi-3's and GPT-NeoX's apply_rotary_pos_emb on one of q, k (modeling_phi3.py,
    modeling_gpt_neox.py): x_rot = x[..., :rotary_dim], x_pass = x[..., rotary_dim:] (two slices,
    each SliceBackward allocating a zero-filled gradient of x's whole size, the second added in
    place into the first: input_buffer.cpp accumulate), the rotation on x_rot, then
    cat([x_rot_embed, x_pass]): a new tensor, even when x_pass is empty (rotary_dim == d), in the
    promoted dtype (fp32 rotation under CPU autocast); its backward narrows the gradient (views),
    converting the slice whose dtype differs."""
    g, full = ops.g, size("b s a d", x.elt, a=heads, d=d)
    x_rot = g.view("x[..., :rotary_dim]", x, size("b s a d", x.elt, a=heads, d=rotary_dim),
                   backward=[Temp(full)])  # runs second: its gradient is added in place
    x_pass = g.view("x[..., rotary_dim:]", x, size("b s a d", x.elt, a=heads, d=d - rotary_dim),
                    backward=[Grad(0, full)])
    rot = rotary(ops, x_rot, cos, sin, heads, rotary_dim)
    elt = max(rot.elt, x.elt)
    back = [Alias(0) if rot.elt == elt else Grad(0)]
    if d > rotary_dim:
        back.append(Alias(1) if x.elt == elt else Grad(1))
    else:  # an empty (b, heads, s, 0) gradient, still defined: x_pass's SliceBackward runs
        back.append(Grad(1, ZERO))
    return g.op("cat([x_embed, x_pass])", [rot, x_pass], size("b s a d", elt, a=heads, d=d),
                backward=back, elt=elt)
