"""transformers GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM (text)
(models/gemma/modeling_gemma.py, gemma2/, gemma3/, transformers 5.24), use_cache=False: the
Llama trunk (memcalc.families.hf_llama) with what differs.

- GemmaTextScaledWordEmbedding: embedding * embed_scale, a 0-dim buffer cast to the weight's
  dtype (`.to(self.weight.dtype)`), so the product is a new (b, s, h) tensor of the weight's dtype;
  the raw embedding is freed once multiplied.
- GemmaRMSNorm: everything in fp32 (`x.float()`, pow, mean, rsqrt, x * rsqrt), then
  `output * (1.0 + self.weight.float())`: the (h,) `1 + w` tensor is new and saved with the fp32
  normalised input, and `type_as(x)` casts the product back (a copy only for low-precision x).
- GemmaMLP: GeGLU with gelu_pytorch_tanh (one op saving its input).
- Gemma-2/3 layers: post_attention_layernorm on the attention output, pre/post_feedforward_layernorm
  around the MLP; Gemma-2's eager attention soft-caps the scores, Gemma-2/3's causal LM soft-caps
  the logits (each: / cap, tanh saving its result, * cap); Gemma-3's q_norm/k_norm; local and
  global layers get their own mask (memcalc.families.masks) and Gemma-3 its own rotary table per
  layer kind present (Gemma3RotaryEmbedding computes one per type in config.layer_types).
"""
from __future__ import annotations

from memcalc.families.base import TOKENS, Embedded, param_maker, size
from memcalc.families.hf_llama import HFLlama
from memcalc.families.layers import rms_normalise, rotary_buffers, rotary_tables, swiglu_mlp
from memcalc.families.registry import declaration
from memcalc.families.masks import build_masks
from memcalc.core.poly import Poly
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import FreeTemps, Grad, Temp, Value
from memcalc.tape.ops import Ops


def gemma_rms_norm(ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
    """GemmaRMSNorm (Gemma2/3RMSNorm are the same code) op by op; `tokens` rows are normalised."""
    g = ops.g
    normed32 = rms_normalise(ops, x, tokens, "x.float()")
    w32 = ops.to(w, 4, "weight.float()")
    # `1 + w` is a new (h,) fp32 tensor whose backward (AddBackward1) hands the gradient on
    # unchanged, so the product's weight gradient is delivered to w32 directly
    one_plus_w = g.op("1 + weight", [w32], w32.size, requires_grad=False, elt=4)
    out = g.op("* (1 + weight)", [normed32, w32, one_plus_w], normed32.size, saves=[normed32, one_plus_w],
               backward=[Grad(0), Temp(normed32.size), Grad(1), FreeTemps()], elt=4)
    y = ops.to(out, x.elt, "type_as(x)")
    ops.scope_end([x])  # the caller's argument (layers.NORM_ARGUMENT)
    return y


def softcap(ops: Ops, x: Value, name: str) -> Value:
    """x / cap, tanh (saves its result), * cap: three new tensors of x's shape and dtype."""
    return ops.scale(ops.unary_saving_output(f"{name} tanh", ops.scale(x, f"{name} / cap")), f"{name} * cap")


class HFGemma(HFLlama):
    """Gemma/Gemma2/Gemma3ForCausalLM: parameters model.embed_tokens, model.layers.{i}.*,
    model.norm, lm_head (tied to the embedding unless the config unties it)."""

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_tokens(ids) * embed_scale; position_ids; the masks; the rotary tables (one set,
        or one per layer kind present for Gemma-3)."""
        g, h, V = ops.g, spec.hidden_size, spec.vocab_size
        ids = g.input("input_ids", size("b s", 8))
        embed = ops.param("model.embed_tokens.weight", V * h, V)
        # embed_tokens.embed_scale: `nn.Buffer(torch.tensor(embed_scale))`, a 0-dim fp32 buffer
        # (modeling_gemma.py:58, gemma2:340, gemma3:97) that model.to(dtype) casts like the others
        g.buffer("model.embed_tokens.embed_scale", Poly.const(ops.buffer_elt), elt=ops.buffer_elt)
        raw = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
                   backward=[Grad(0)], elt=embed.elt)
        x = ops.scale(raw, "* embed_scale")
        pos = g.op("position_ids", [], size("b s" if regime.positions_batched else "s", 8),
                   requires_grad=False, elt=8)  # generate passes (b, s) position_ids
        masks = build_masks(ops, spec, regime, x.elt)
        if spec.family == "gemma3":  # a table per kind in config.layer_types
            kinds = sorted({"sliding" if spec.layer_is_sliding(i) else "full" for i in range(spec.num_layers)})
            for kind in kinds:  # {layer_type}_inv_freq, {layer_type}_original_inv_freq
                rotary_buffers(ops, spec.head_size, f"model.rotary_emb.{kind}_attention_")
            rope = {kind: tuple(rotary_tables(ops, spec.head_size, x.elt)) for kind in kinds}
        else:
            rotary_buffers(ops, spec.head_size)
            shared = tuple(rotary_tables(ops, spec.head_size, x.elt))
            rope = {"full": shared, "sliding": shared}
        tables = {id(t): t for pair in rope.values() for t in pair}.values()
        return Embedded(x, ids, {"masks": masks, "rope": rope, "position_ids": pos},
                        held_until_norm=[x, *masks.values(), *tables, pos])  # hf_llama.POSITION_IDS_LOCAL

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One Gemma/Gemma2/Gemma3DecoderLayer."""
        block_input = x
        h = spec.hidden_size
        sandwich = declaration(spec.family).sandwich_norms  # Gemma-2/3's norms around the MLP
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = gemma_rms_norm(ops, x, p("input_layernorm.weight", h), TOKENS)
        attn, weights = self.attention(ops, spec, regime, n1, layer, context, p)
        ops.scope_end([n1])  # `hidden_states` rebound to the attention output
        if sandwich:
            attn = gemma_rms_norm(ops, attn, p("post_attention_layernorm.weight", h), TOKENS)
        x = ops.add(x, attn, "residual 1")
        pre_mlp = "pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"
        n2 = gemma_rms_norm(ops, x, p(pre_mlp, h), TOKENS)
        m = swiglu_mlp(ops, spec, n2, TOKENS, p, "gelu_tanh")  # GemmaMLP: gelu_pytorch_tanh
        ops.scope_end([n2])  # rebound to the MLP output
        if sandwich:
            m = gemma_rms_norm(ops, m, p("post_feedforward_layernorm.weight", h), TOKENS)
        out = ops.add(x, m, "residual 2")
        ops.scope_end([block_input, weights])
        return out

    def norm(self, ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
        """GemmaRMSNorm: the q/k norms of Gemma-3 too."""
        return gemma_rms_norm(ops, x, w, tokens)

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm."""
        return gemma_rms_norm(ops, x, ops.param("model.norm.weight", spec.hidden_size), TOKENS)

    def head_output(self, ops: Ops, spec: ModelSpec, logits: Value) -> Value:
        """final_logit_softcapping (Gemma2/Gemma3ForCausalLM.forward)."""
        return softcap(ops, logits, "logits") if spec.logit_softcap else logits


PROGRAM = HFGemma()
