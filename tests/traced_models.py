"""Models that are not HF, written here from scratch, for the traced programs (memcalc.traced):
a Llama-style LM (RMSNorm, rotary, grouped-query SDPA, SwiGLU, untied head) and a nanoGPT-style
GPT (after Karpathy's nanoGPT model.py: LayerNorm, fused c_attn, causal SDPA, GELU MLP, tied
head, forward(idx, targets) -> (logits, loss)), a ViT after torchvision's VisionTransformer
(torchvision/models/vision_transformer.py: conv patchify, class token, nn.MultiheadAttention
encoder blocks; written here because torchvision 0.28's only wheel is built against CUDA torch
and fails to load its operators under torch 2.13.0+cpu), and a BERT-style encoder (HF
BertForMaskedLM) with a masked-LM loss. Each factory takes the TrainingConfig and checkpoints
each block (torch.utils.checkpoint, non-reentrant) under checkpointing='per-layer'."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, h: int, heads: int, kv: int, f: int):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, kv * self.d, bias=False)
        self.v = nn.Linear(h, kv * self.d, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        n = self.norm1(x)
        q = self.q(n).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(n).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(n).view(b, s, self.kv, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, -1))
        n = self.norm2(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class LlamaLM(nn.Module):
    def __init__(self, vocab=96, h=32, layers=2, heads=4, kv=2, f=64, checkpointing=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, heads, kv, f) for _ in range(layers))
        self.norm = RMSNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)
        self.d, self.checkpointing = h // heads, checkpointing

    def forward(self, ids):
        s = ids.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))
        angles = torch.outer(torch.arange(s, dtype=torch.float32), inv)
        emb = torch.cat((angles, angles), dim=-1)
        x = self.embed(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)  # the weights' dtype (pure bf16 too)
        for block in self.blocks:
            x = checkpoint(block, x, cos, sin, use_reentrant=False) if self.checkpointing else block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


class GPTBlock(nn.Module):
    def __init__(self, h: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.c_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.heads, self.dropout = heads, dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, s, h)))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=96, h=32, layers=2, heads=4, block_size=64, dropout=0.0, checkpointing=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(block_size, h)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPTBlock(h, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        self.checkpointing = checkpointing
        for p in self.parameters():
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


VOCAB = 96


def llama_factory(training):
    """The Llama-style LM, checkpointed per layer as training says."""
    return LlamaLM(vocab=VOCAB, checkpointing=training.checkpointing == "per-layer")


def nanogpt_factory(training):
    """The nanoGPT-style GPT (dropout 0.1), checkpointed per layer as training says."""
    return NanoGPT(vocab=VOCAB, dropout=0.1, checkpointing=training.checkpointing == "per-layer")


def llama_loss(model, ids):
    return model(ids)


def nanogpt_loss(model, ids):
    return model(ids, ids)[1]


# ---- ViT (torchvision's VisionTransformer, vit_b_16's layout at toy sizes) ----------------------
PATCH = 4
MAX_PATCHES = 64


class ViTBlock(nn.Module):
    """torchvision's EncoderBlock: ln_1, self-attention (nn.MultiheadAttention, batch_first),
    dropout, residual; ln_2, MLPBlock (Linear, GELU, Dropout, Linear, Dropout), residual."""

    def __init__(self, h: int, heads: int, mlp: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(h, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(h, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(h, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(h, mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp, h),
                                 nn.Dropout(dropout))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """Images (b, 3, PATCH, s * PATCH): s patches and a class token; the position embedding is
    held for MAX_PATCHES and sliced to the image (torchvision's is fixed to one image size, which
    a trace at several s could not build)."""

    def __init__(self, h=32, layers=2, heads=4, mlp=64, classes=10, dropout=0.1, checkpointing=False):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, h, kernel_size=PATCH, stride=PATCH)
        self.class_token = nn.Parameter(torch.zeros(1, 1, h))
        self.pos_embedding = nn.Parameter(torch.empty(1, MAX_PATCHES + 1, h).normal_(std=0.02))
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(ViTBlock(h, heads, mlp, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(h, eps=1e-6)
        self.head = nn.Linear(h, classes)
        self.checkpointing = checkpointing

    def forward(self, images):
        x = self.conv_proj(images).flatten(2).transpose(1, 2)  # (b, s, h)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.drop(x + self.pos_embedding[:, :x.shape[1]])
        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.ln(x)[:, 0])


def vit_factory(training):
    """The ViT (dropout 0.1), checkpointed per block as training says."""
    return ViT(checkpointing=training.checkpointing == "per-layer")


def vit_batch(b, s):
    """b images of s patches (one patch row): (b, 3, PATCH, s * PATCH) fp32."""
    return torch.randn(b, 3, PATCH, s * PATCH)


def vit_loss(model, images):
    """Cross-entropy over 10 classes (labels made with the batch's size: class 0)."""
    images = images.to(model.conv_proj.weight.dtype)  # a copy under pure bf16 (the batch is fp32)
    return F.cross_entropy(model(images), torch.zeros(images.shape[0], dtype=torch.long))


# ---- BERT-style encoder with a masked-LM loss (HF BertForMaskedLM) ------------------------------
MASK_EVERY, MASK_ID = 7, 3


def bert_factory(training):
    """HF BertForMaskedLM (2 layers, h 32, dropouts 0.1), checkpointed per layer as training says."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128, pad_token_id=0)
    model = transformers.BertForMaskedLM(cfg)
    if training.checkpointing == "per-layer":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def bert_mlm_loss(model, ids):
    """Every MASK_EVERY-th token replaced by MASK_ID and predicted; the others ignored (-100), as a
    data collator for masked LM makes them (a fixed pattern: the same sizes as a random one)."""
    masked = torch.arange(ids.shape[1]) % MASK_EVERY == 0
    labels = ids.masked_fill(~masked, -100)
    return model(input_ids=ids.masked_fill(masked, MASK_ID), labels=labels).loss
