"""Reference models (implementation='reference'): nanoGPT-style GPT-2 and Llama, op for op as the
engine models them. Do not add, drop or reorder ops here without telling the engine.

Checkpointing is a model attribute (set from TrainingConfig.checkpointing) applied in forward:
per-layer and every-k/sqrt checkpoint consecutive groups of blocks (every group, the last one
included, unlike torch.utils.checkpoint.checkpoint_sequential); selective checkpoints only the
attention core (q, k, v after rotary -> y before the output projection).
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memcalc.core.errors import MemcalcError

ROPE_THETA = 10000.0  # Llama 1/2 rotary base (HF LlamaConfig default rope_theta)
RMS_EPS = 1e-6  # HF LlamaConfig / Qwen2Config / MistralConfig default rms_norm_eps


def segment_size(spec, training) -> int | None:
    """Blocks per checkpointed segment for a TrainingConfig, or None (no block checkpointing).

    sqrt uses the engine's rule, `memcalc.sqrt_segment_size(L)`.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=10, hidden_size=8, num_layers=9, num_heads=2)
    >>> segment_size(spec, TrainingConfig(micro_batch=1, seq_len=4, checkpointing="sqrt"))
    3
    """
    kind = training.checkpointing
    if kind == "per-layer":
        return 1
    if kind == "every-k":
        return training.checkpoint_every
    if kind == "sqrt":
        import memcalc

        # the engine's rule for 'sqrt' (round(sqrt(L)) layers per segment), so both sides
        # segment alike; memcalc.optimal_segment_size is for checkpointing='every-k'
        return int(memcalc.sqrt_segment_size(spec.num_layers))
    return None


def _dropout(p: float) -> nn.Module | None:
    # A Dropout module only when p > 0: with p == 0 there is no op at all (no mask saved).
    return nn.Dropout(p) if p > 0 else None


def _causal_mask(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)


def _eager_attention(q, k, v, mask, attn_drop, d: int) -> torch.Tensor:
    s = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
    att = att.masked_fill(mask[:, :, :s, :s] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    if attn_drop is not None:
        att = attn_drop(att)
    return att @ v


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d)) v on (b, heads, s, d), eager or SDPA, then back to (b, s, heads*d).

    The part that selective checkpointing recomputes.
    """

    def __init__(self, spec, attention: str):
        super().__init__()
        self.attention = attention
        self.n_rep = spec.num_heads // spec.kv_heads
        self.d = spec.head_size
        self.p = spec.attn_dropout
        self.attn_drop = _dropout(spec.attn_dropout) if attention == "eager" else None
        if attention == "eager":
            self.register_buffer("causal_mask", _causal_mask(spec.max_position_embeddings),
                                 persistent=False)

    def forward(self, q, k, v):
        b, _, s, _ = q.shape
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.p if self.training else 0.0,
                                               enable_gqa=self.n_rep > 1)
        else:
            if self.n_rep > 1:
                k = k.repeat_interleave(self.n_rep, dim=1)
                v = v.repeat_interleave(self.n_rep, dim=1)
            y = _eager_attention(q, k, v, self.causal_mask, self.attn_drop, self.d)
        return y.transpose(1, 2).contiguous().view(b, s, -1)


class _CheckpointedCore(nn.Module):
    """Attention core behind one non-reentrant checkpoint (selective recomputation)."""

    def __init__(self, core: AttentionCore, enabled: bool):
        super().__init__()
        self.core, self.enabled = core, enabled

    def forward(self, q, k, v):
        if self.enabled and torch.is_grad_enabled():
            return checkpoint(self.core, q, k, v, use_reentrant=False)
        return self.core(q, k, v)


# ---- GPT-2 -----------------------------------------------------------------------------------
class GPT2Attention(nn.Module):
    def __init__(self, spec, training):
        super().__init__()
        a, d, h = spec.num_heads, spec.head_size, spec.hidden_size
        self.a, self.d = a, d
        self.c_attn = nn.Linear(h, 3 * a * d, bias=spec.qkv_bias)
        self.core = _CheckpointedCore(AttentionCore(spec, training.resolved_attention(spec)),
                                      training.checkpointing == "selective")
        self.c_proj = nn.Linear(a * d, h, bias=spec.out_bias)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.c_attn(x)
        # -1 heads: under tensor parallelism c_attn is column-sharded and each rank holds
        # its own heads' q, k, v (validate.distributed.tensor_parallel orders the fused rows so)
        q, k, v = qkv.split(qkv.size(-1) // 3, dim=2)
        q = q.view(b, s, -1, self.d).transpose(1, 2)
        k = k.view(b, s, -1, self.d).transpose(1, 2)
        v = v.view(b, s, -1, self.d).transpose(1, 2)
        return self.c_proj(self.core(q, k, v))


class GPT2MLP(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.c_fc = nn.Linear(spec.hidden_size, spec.ffn_size, bias=spec.mlp_bias)
        self.c_proj = nn.Linear(spec.ffn_size, spec.hidden_size, bias=spec.mlp_bias)
        self.tanh = spec.activation in ("gelu_new", "gelu_tanh")

    def forward(self, x):
        x = self.c_fc(x)
        x = F.gelu(x, approximate="tanh") if self.tanh else F.gelu(x)
        return self.c_proj(x)


class GPT2Block(nn.Module):
    def __init__(self, spec, training):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.hidden_size)
        self.attn = GPT2Attention(spec, training)
        self.ln_2 = nn.LayerNorm(spec.hidden_size)
        self.mlp = GPT2MLP(spec)
        self.resid_drop = _dropout(spec.resid_dropout)

    def _resid(self, y):
        return self.resid_drop(y) if self.resid_drop is not None else y

    def forward(self, x):
        x = x + self._resid(self.attn(self.ln_1(x)))
        x = x + self._resid(self.mlp(self.ln_2(x)))
        return x


# ---- Llama -----------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float = RMS_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.h, self.eps = h, eps

    def forward(self, x):
        return F.rms_norm(x, (self.h,), self.weight, self.eps)


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) on the last dim, as HF modeling_llama.rotate_half."""
    d = x.size(-1)
    return torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)


class Rotary(nn.Module):
    """cos/sin tables (P, d), fp32, non-persistent, computed once at init (theta 10000)."""

    def __init__(self, d: int, max_positions: int, theta: float = ROPE_THETA):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)


class LlamaAttention(nn.Module):
    def __init__(self, spec, training):
        super().__init__()
        a, kv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
        self.a, self.kv, self.d = a, kv, d
        self.q_proj = nn.Linear(h, a * d, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(h, kv * d, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(h, kv * d, bias=spec.qkv_bias)
        self.core = _CheckpointedCore(AttentionCore(spec, training.resolved_attention(spec)),
                                      training.checkpointing == "selective")
        self.o_proj = nn.Linear(a * d, h, bias=spec.out_bias)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        # -1 heads: a tensor-parallel rank holds a/t query and kv/t key/value heads
        q = self.q_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return self.o_proj(self.core(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, spec):
        super().__init__()
        h, f = spec.hidden_size, spec.ffn_size
        self.gate_proj = nn.Linear(h, f, bias=spec.mlp_bias)
        self.up_proj = nn.Linear(h, f, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(f, h, bias=spec.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, spec, training):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size)
        self.self_attn = LlamaAttention(spec, training)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size)
        self.mlp = LlamaMLP(spec)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


# ---- whole models ----------------------------------------------------------------------------
def _redistribute(x, mesh, from_shard: bool):
    """Sequence parallelism's trunk boundaries: the replicated embedding output -> this rank's
    chunk of the sequence (a slice; backward all-gathers), and the sharded trunk output -> the
    whole sequence (all-gather; backward keeps this rank's chunk)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    src, dst = ([Shard(1)], [Replicate()]) if from_shard else ([Replicate()], [Shard(1)])
    return DTensor.from_local(x, mesh, src, run_check=False).redistribute(mesh, dst).to_local()


def _run_group(blocks, x, *extra):
    for block in blocks:
        x = block(x, *extra)
    return x


class ReferenceLM(nn.Module):
    """Shared trunk: blocks with optional group checkpointing, final norm, head and loss."""

    def _init_trunk(self, spec, training, block_cls):
        self.vocab_size = spec.vocab_size
        self.blocks = nn.ModuleList(block_cls(spec, training) for _ in range(spec.num_layers))
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.segment = segment_size(spec, training)

    def run_blocks(self, x, *extra):
        mesh = getattr(self, "sequence_parallel_mesh", None)  # validate.distributed.tensor_parallel
        if mesh is not None:
            x = _redistribute(x, mesh, from_shard=False)  # this rank's s/t tokens
        if self.segment is None or not torch.is_grad_enabled():
            x = _run_group(self.blocks, x, *extra)
        else:
            blocks = list(self.blocks)
            for i in range(0, len(blocks), self.segment):
                group = blocks[i:i + self.segment]
                x = checkpoint(partial(_run_group, group), x, *extra, use_reentrant=False)
        return _redistribute(x, mesh, from_shard=True) if mesh is not None else x

    def head_loss(self, x, final_norm, targets):
        logits = self.lm_head(final_norm(x))
        return F.cross_entropy(logits.view(-1, self.vocab_size), targets.view(-1))


class ReferenceGPT2(ReferenceLM):
    """nanoGPT-style GPT-2.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=50, hidden_size=16, num_layers=2,
    ...                       num_heads=2, max_position_embeddings=8, implementation="reference")
    >>> m = ReferenceGPT2(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> ids = torch.zeros(1, 8, dtype=torch.long); m(ids, ids).shape
    torch.Size([])
    """

    def __init__(self, spec, training):
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.wpe = nn.Embedding(spec.max_position_embeddings, spec.hidden_size)
        self.drop = _dropout(spec.embd_dropout)
        self._init_trunk(spec, training, GPT2Block)
        self.ln_f = nn.LayerNorm(spec.hidden_size)
        if spec.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, ids, targets):
        pos = torch.arange(0, ids.size(1), dtype=torch.long, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        if self.drop is not None:
            x = self.drop(x)
        return self.head_loss(self.run_blocks(x), self.ln_f, targets)


class ReferenceLlama(ReferenceLM):
    """Llama-style model (RMSNorm, rotary, SwiGLU, grouped-query attention)."""

    def __init__(self, spec, training):
        super().__init__()
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.rotary = Rotary(spec.head_size, spec.max_position_embeddings)
        self._init_trunk(spec, training, LlamaBlock)
        self.norm = RMSNorm(spec.hidden_size)
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids, targets):
        s = ids.size(1)
        cos, sin = self.rotary.cos[:s], self.rotary.sin[:s]
        return self.head_loss(self.run_blocks(self.embed(ids), cos, sin), self.norm, targets)


def build_reference(spec, training) -> nn.Module:
    """The reference model for a spec (in train mode), on the current default device.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="llama", vocab_size=50, hidden_size=16, num_layers=2,
    ...     num_heads=2, intermediate_size=32, implementation="reference")
    >>> type(build_reference(spec, TrainingConfig(micro_batch=1, seq_len=4))).__name__
    'ReferenceLlama'
    """
    if spec.head_size % 2 and spec.family == "llama":
        raise MemcalcError("head_dim", f"rotary needs an even head size, got {spec.head_size}",
                           "choose hidden_size/num_heads (or head_dim) even")
    cls = ReferenceGPT2 if spec.family == "gpt2" else ReferenceLlama
    model = cls(spec, training)
    model.apply(_init_weights)
    return model.train()


def _init_weights(module) -> None:
    # nanoGPT's init (std 0.02): keeps the loss near log(V) so fp16 runs stay finite. In place,
    # so it allocates nothing.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
