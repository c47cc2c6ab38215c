"""transformers LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM
(models/llama/modeling_llama.py, mistral/, qwen2/, qwen3/, transformers 5.x), use_cache=False by
default (the other call paths: memcalc.families.call_path, sliding windows included).

Qwen3 adds per-head RMSNorms of q and k before rotary (spec.qk_norm). Sliding windows (Mistral's
sliding_window on every layer, Qwen2/Qwen3's on layers >= max_window_layers) change only the
masks (memcalc.families.masks) and, where SDPA gets a materialised mask, the attention kernel's
inputs (attention.sdpa_masked).

LlamaRMSNorm upcasts to fp32 and saves the fp32 copy, its square, the normalised tensor and the
rsqrt; rotary embedding multiplies q and k by cos/sin tables computed once per forward (fp32 under
autocast, so q and k are promoted to fp32); rotate_half slices and concatenates; eager attention
materialises repeat_kv copies of k and v; sdpa passes enable_gqa when there is no mask
(integrations/sdpa_attention.py use_gqa_in_sdpa).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from memcalc.families.attention import attention_core, llama_eager, sdpa_attention
from memcalc.families.call_path import cache_kv, causal_mask, position_ids, zero_window_mask
from memcalc.families.base import TOKENS, DecoderProgram, Embedded, input_require_grads, param_maker, size
from memcalc.families import mask_build
from memcalc.families.masks import build_masks, layer_mask
from memcalc.families.layers import (apply_rotary_pos_emb, qkv_projections, rms_norm, rotary, rotary_buffers,
                                     rotary_tables, swiglu_mlp)
from memcalc.families.loss import hf_causal_lm_loss
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Grad, Value
from memcalc.tape.ops import Ops

if TYPE_CHECKING:
    from memcalc.core.poly import Poly


def llama_rms_norm(ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
    """LlamaRMSNorm (Qwen2/Qwen3RMSNorm are the same code)."""
    return rms_norm(ops, x, w, tokens, weight_in_fp32=False)


POSITION_IDS_LOCAL = """inputs_embeds and position_ids (`torch.arange(s) + past_seen_tokens`: a new (s,)
int64 tensor, `.unsqueeze(0)` a view of it) are locals of the base model's forward
(modeling_llama.py LlamaModel.forward, the same code in every HF decoder family here), alive
until it returns after the final norm. Measured: Gemma-3 fp32/fp16-amp, the (s,) int64 tensor
from aten.add alive at the forward peak (validate tracker: 832 B at s=104)."""


BLOCK_REBINDING = """LlamaDecoderLayer.forward (modeling_llama.py; Mixtral's and GPT-OSS's alike) rebinds
`hidden_states` to the attention output (`hidden_states, _ = self.self_attn(...)`) and to the
MLP output (`hidden_states = self.mlp(hidden_states)`) before each residual add, so each norm
output is freed before the add (unless autograd saved it: under autocast the projections save
their low-precision casts instead). `_` keeps the attention weights (the dropout output, with
attention dropout) until the layer returns. Measured: Llama/Qwen3/Mistral/Phi-3/Granite fp16-amp
eager with attention dropout, the fp32 post_attention_layernorm output is gone at the second
residual add (validate tracker: 79872 B at b=3, s=104, h=64)."""


def qk_norms(ops: Ops, spec: ModelSpec, q: Value, k: Value, p: Callable[..., Value],
             norm: Callable[..., Value]) -> tuple[Value, Value]:
    """Qwen3's q_norm / k_norm (Gemma-3's too): the family's RMSNorm over each head's head_dim
    features, before rotary; its mean has one element per token and head."""
    if not spec.qk_norm:
        return q, k
    d = spec.head_size
    return (norm(ops, q, p("self_attn.q_norm.weight", d), TOKENS * spec.num_heads),
            norm(ops, k, p("self_attn.k_norm.weight", d), TOKENS * spec.kv_heads))


def attention_kernel(ops: Ops, spec: ModelSpec, regime: Regime, q: Value, k: Value, v: Value,
                     mask: Value | None, softcap: bool = False, contiguous: bool = False
                     ) -> tuple[Value, Value | None]:
    """The attention interface's call: SDPA (attention.sdpa_attention: no mask, is_causal and
    enable_gqa; a materialised mask, sliding or a padded batch's, sdpa_masked) or the eager
    function; returns (output, weights). `contiguous`: k and v are the DynamicCache's copies (use_cache)."""
    if regime.attention == "sdpa":
        return sdpa_attention(ops, spec, q, k, v, mask, contiguous), None
    return llama_eager(ops, spec, q, k, v, mask, softcap, contiguous=contiguous)


def token_embedding(ops: Ops, spec: ModelSpec) -> tuple[Value, Value]:
    """(input_ids, embed_tokens(input_ids)): the (b, s) int64 ids and the embedding lookup, which
    saves the ids for its backward; made to require grad when the embedding is frozen
    (input_require_grads, as enable_input_require_grads does)."""
    g, h, V = ops.g, spec.hidden_size, spec.vocab_size
    ids = g.input("input_ids", size("b s", 8))
    embed = ops.param("model.embed_tokens.weight", V * h, V)
    x = g.op("embedding", [embed, ids], size("b s h", embed.elt, h=h), saves=[ids],
             backward=[Grad(0)], elt=embed.elt)
    input_require_grads(ops, x)
    return ids, x


class HFLlama(DecoderProgram):
    """LlamaForCausalLM: parameters model.embed_tokens, model.layers.{i}.*, model.norm, lm_head.

    Hooks for the Llama-shaped families (memcalc.families.hf_phi3, hf_granite): `project_qkv`,
    `position` (rotary), `scale_embeddings`, `residual_branch`."""

    def attention(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict,
                  p: Callable[..., Value]) -> tuple[Value, Value]:
        """LlamaAttention (Qwen3Attention and Gemma3Attention with q/k norms, Gemma2Attention with
        soft-capping) with the configured attention interface, the mask and rotary table of the
        layer's kind; returns (output, weights)."""
        a, d, h = spec.num_heads, spec.head_size, spec.hidden_size
        q, k, v = self.project_qkv(ops, spec, x, p)
        q, k = qk_norms(ops, spec, q, k, p, self.norm)
        q, k = apply_rotary_pos_emb(ops, q, k, lambda q, k: self.position(ops, spec, q, k, layer, context))
        k, v, contiguous = cache_kv(ops, regime, k, v, context)  # use_cache: DynamicCache copies
        q_local, k_local, v_local = q, k, v
        mask = layer_mask(context, spec, layer)

        def core():
            return attention_kernel(ops, spec, regime, q, k, v, mask, spec.attn_softcap, contiguous)

        y, weights = attention_core(ops, regime, core, context.get("position_ids"))
        out = ops.row_linear(y, p("self_attn.o_proj.weight", a * d * h, h),
                             p("self_attn.o_proj.bias", h) if spec.out_bias else None, TOKENS, h, "o_proj")
        ops.scope_end([q_local, k_local, v_local])  # LlamaAttention's locals
        return out, weights

    def project_qkv(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> tuple[Value, Value, Value]:
        """q_proj, k_proj, v_proj, each viewed (b, heads, s, d)."""
        return qkv_projections(ops, spec, x, p)

    def position(self, ops: Ops, spec: ModelSpec, q: Value, k: Value, layer: int, context: dict) -> tuple[Value, Value]:
        """apply_rotary_pos_emb (skipped on SmolLM3's NoPE layers, modeling_smollm3.py use_rope)."""
        if layer in spec.no_rope_layers:
            return q, k
        cos, sin = context["rope"]["sliding" if spec.layer_is_sliding(layer) else "full"]
        d = spec.head_size
        return rotary(ops, q, cos, sin, spec.num_heads, d), rotary(ops, k, cos, sin, spec.kv_heads, d)

    def norm(self, ops: Ops, x: Value, w: Value, tokens: Poly) -> Value:
        """The family's RMSNorm (LlamaRMSNorm; Qwen2/Qwen3RMSNorm are the same code)."""
        return llama_rms_norm(ops, x, w, tokens)

    def mlp(self, ops: Ops, spec: ModelSpec, x: Value, p: Callable[..., Value]) -> Value:
        """LlamaMLP (SwiGLU)."""
        return swiglu_mlp(ops, spec, x, TOKENS, p)

    def rotary_dim(self, spec: ModelSpec) -> int:
        """Width of the cos/sin tables: the head size (partial rotary narrows it)."""
        return spec.head_size

    def rotary_table_elt(self, x_elt: int) -> int:
        """The tables' element size: `.to(x.dtype)` of the hidden states."""
        return x_elt

    def scale_embeddings(self, _ops: Ops, x: Value) -> Value:
        """What the base model does to inputs_embeds before the layers (nothing in Llama)."""
        return x

    def residual_branch(self, _ops: Ops, _spec: ModelSpec, y: Value) -> Value:
        """What a residual branch's output goes through before `residual + y` (nothing in Llama)."""
        return y

    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """embed_tokens(ids); position_ids; the masks (memcalc.families.masks); the rotary
        cos/sin tables computed once per forward."""
        ids, x = token_embedding(ops, spec)
        x = self.scale_embeddings(ops, x)
        return self.base_context(ops, spec, regime, x, ids)

    def stage_embedded(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value) -> Embedded:
        """A later pipeline stage runs the base model's forward on `inputs_embeds` (its receive
        buffer; validate.distributed.pipeline._hf_stage): no embedding, the same position_ids,
        masks and rotary tables as the first stage, alive until that forward returns."""
        return self.base_context(ops, spec, regime, x, None)

    def base_context(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, ids: Value | None) -> Embedded:
        """What LlamaModel.forward makes from inputs_embeds before its layers: position_ids,
        the masks, the rotary cos/sin tables (POSITION_IDS_LOCAL)."""
        if regime.positions_batched or regime.attention_mask == "packed":
            pos = position_ids(ops, regime)  # generate's (b, s) ones (TRL GRPO), the batch's when packed
        else:
            pos = mask_build.position_ids(ops)  # the arange, then the sum (mask_build)
        if spec.sliding_window is None:  # one full mask: the call path's (none / ones / padded)
            masks = {"full": causal_mask(ops, regime, x.elt)}  # create_causal_mask (call_path)
            if spec.family == "qwen2_moe":  # and a window-0 one no layer reads (call_path)
                masks["sliding"] = zero_window_mask(ops, regime, x.elt)
        else:
            masks = build_masks(ops, spec, regime, x.elt)
        rotary_buffers(ops, self.rotary_dim(spec))  # model.rotary_emb's inv_freq tables
        cos, sin = rotary_tables(ops, self.rotary_dim(spec), self.rotary_table_elt(x.elt))
        context = {"masks": masks, "rope": {"full": (cos, sin), "sliding": (cos, sin)},
                   "mask": masks.get("full"), "cos": cos, "sin": sin,  # one table, one mask kind
                   "position_ids": pos}
        return Embedded(x, ids, context,
                        held_until_norm=[x, *masks.values(), cos, sin, pos])  # POSITION_IDS_LOCAL

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One LlamaDecoderLayer."""
        block_input = x  # the caller's loop variable holds it until the block returns
        h = spec.hidden_size
        p = param_maker(ops, f"model.layers.{layer}.")
        n1 = rms_norm(ops, x, p("input_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        attn, weights = self.attention(ops, spec, regime, n1, layer, context, p)  # `hidden_states, _ = ...`
        ops.scope_end([n1])  # BLOCK_REBINDING: `hidden_states` held the norm output until rebound
        x = ops.add(x, self.residual_branch(ops, spec, attn), "residual 1")
        ops.scope_end([attn])  # rebound by this add only (Granite: `residual + hidden_states * m`)
        n2 = rms_norm(ops, x, p("post_attention_layernorm.weight", h), TOKENS, weight_in_fp32=False)
        m = self.mlp(ops, spec, n2, p)
        ops.scope_end([n2])  # BLOCK_REBINDING: `hidden_states = self.mlp(hidden_states)`
        out = ops.add(x, self.residual_branch(ops, spec, m), "residual 2")
        ops.scope_end([block_input, m, weights])  # `_` (the attention weights) lives until return
        return out

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """model.norm."""
        return rms_norm(ops, x, ops.param("model.norm.weight", spec.hidden_size), TOKENS, weight_in_fp32=False)

    def loss(self, ops: Ops, logits: Value, _ids: Value) -> None:
        """ForCausalLMLoss (labels=input_ids)."""
        hf_causal_lm_loss(ops, logits)

    def registration_rank(self, label: str) -> tuple:
        """LlamaForCausalLM registration order: embed_tokens, layers (self_attn q/k/v/o, mlp
        gate/up/down, input_layernorm, post_attention_layernorm), norm, lm_head."""
        return llama_registration_rank(label, "model.layers.", {
            "model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3})


LAYER_ORDER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "self_attn.q_norm", "self_attn.k_norm",  # Qwen3Attention / Gemma3Attention
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm",
               "pre_feedforward_layernorm", "post_feedforward_layernorm"]  # Gemma2/3DecoderLayer


def llama_registration_rank(label: str, layers: str, outer: dict[str, int],
                            order: list[str] | None = None) -> tuple:
    """(position among the top-level modules, layer, position inside the layer).

    >>> llama_registration_rank("model.layers.3.mlp.up_proj.weight", "model.layers.", {})
    (1, 3, 7)
    """
    if label.startswith(layers):
        i, name = label[len(layers):].split(".", 1)
        return (1, int(i), (order or LAYER_ORDER).index(name.rsplit(".", 1)[0]))
    return (outer[label], 0, 0)


PROGRAM = HFLlama()
