"""Published architectures by name. Parameter counts are checked against the published figures
in tests/test_specs.py (model cards and papers), an independent check of formulas/parameters.py."""
from __future__ import annotations

_GPT2 = dict(family="gpt2", vocab_size=50257, max_position_embeddings=1024, tie_embeddings=True,
             activation="gelu_new", embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1)
_LLAMA = dict(family="llama", tie_embeddings=False, qkv_bias=False, out_bias=False, mlp_bias=False,
              activation="silu")
_QWEN2 = dict(_LLAMA, qkv_bias=True)
# families of issue 12, part b (model cards' config.json on huggingface.co)
_PHI3 = dict(_LLAMA, family="phi3")
_NEOX = dict(family="gpt_neox", vocab_size=50304, max_position_embeddings=2048, tie_embeddings=False,
             qkv_bias=True, out_bias=True, mlp_bias=True, activation="gelu", rotary_fraction=0.25,
             parallel_residual=True)
_LLAMA3 = dict(_LLAMA, vocab_size=128256, max_position_embeddings=131072)

PRESETS: dict[str, dict] = {
    # GPT-2 (Radford et al. 2019; HF config.json of openai-community/gpt2*)
    "gpt2": dict(_GPT2, hidden_size=768, num_layers=12, num_heads=12),
    "gpt2-medium": dict(_GPT2, hidden_size=1024, num_layers=24, num_heads=16),
    "gpt2-large": dict(_GPT2, hidden_size=1280, num_layers=36, num_heads=20),
    "gpt2-xl": dict(_GPT2, hidden_size=1600, num_layers=48, num_heads=25),
    # Llama 2 (Touvron et al. 2023), Llama 3 (Meta 2024), Mistral 7B (Jiang et al. 2023)
    "llama-2-7b": dict(_LLAMA, vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                       intermediate_size=11008, max_position_embeddings=4096),
    "llama-2-13b": dict(_LLAMA, vocab_size=32000, hidden_size=5120, num_layers=40, num_heads=40,
                        intermediate_size=13824, max_position_embeddings=4096),
    "llama-2-70b": dict(_LLAMA, vocab_size=32000, hidden_size=8192, num_layers=80, num_heads=64,
                        num_kv_heads=8, intermediate_size=28672, max_position_embeddings=4096),
    "llama-3-8b": dict(_LLAMA, vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
                       num_kv_heads=8, intermediate_size=14336, max_position_embeddings=8192),
    "llama-3-70b": dict(_LLAMA, vocab_size=128256, hidden_size=8192, num_layers=80, num_heads=64,
                        num_kv_heads=8, intermediate_size=28672, max_position_embeddings=8192),
    "mistral-7b": dict(_LLAMA, vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                       num_kv_heads=8, intermediate_size=14336, max_position_embeddings=32768),
    # Qwen2 (Yang et al. 2024, arXiv 2407.10671)
    "qwen2-0.5b": dict(_QWEN2, vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                       num_kv_heads=2, intermediate_size=4864, tie_embeddings=True,
                       max_position_embeddings=32768),
    "qwen2-1.5b": dict(_QWEN2, vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12,
                       num_kv_heads=2, intermediate_size=8960, tie_embeddings=True,
                       max_position_embeddings=32768),
    "qwen2-7b": dict(_QWEN2, vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28,
                     num_kv_heads=4, intermediate_size=18944, max_position_embeddings=32768),
    # Llama 3.1 / 3.2 (meta-llama/Llama-3.1-8B, Llama-3.2-1B, Llama-3.2-3B)
    "llama-3.1-8b": dict(_LLAMA3, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                         intermediate_size=14336),
    "llama-3.2-1b": dict(_LLAMA3, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                         head_dim=64, intermediate_size=8192, tie_embeddings=True),
    "llama-3.2-3b": dict(_LLAMA3, hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8,
                         head_dim=128, intermediate_size=8192, tie_embeddings=True),
    # SmolLM3 (HuggingFaceTB/SmolLM3-3B): Llama with every 4th layer NoPE
    "smollm3-3b": dict(_LLAMA, vocab_size=128256, hidden_size=2048, num_layers=36, num_heads=16,
                       num_kv_heads=4, intermediate_size=11008, tie_embeddings=True,
                       max_position_embeddings=65536, no_rope_layers=tuple(range(3, 36, 4))),
    # Phi-3 mini 4K (microsoft/Phi-3-mini-4k-instruct), Phi-4 (microsoft/phi-4)
    "phi-3-mini": dict(_PHI3, vocab_size=32064, hidden_size=3072, num_layers=32, num_heads=32,
                       intermediate_size=8192, max_position_embeddings=4096),
    "phi-4": dict(_PHI3, vocab_size=100352, hidden_size=5120, num_layers=40, num_heads=40,
                  num_kv_heads=10, intermediate_size=17920, max_position_embeddings=16384),
    # Pythia (EleutherAI/pythia-160m, pythia-1.4b; Biderman et al. 2023)
    "pythia-160m": dict(_NEOX, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "pythia-1.4b": dict(_NEOX, hidden_size=2048, num_layers=24, num_heads=16, intermediate_size=8192),
    # OLMo 2 (allenai/OLMo-2-1124-7B)
    "olmo-2-7b": dict(_LLAMA, family="olmo2", vocab_size=100352, hidden_size=4096, num_layers=32,
                      num_heads=32, intermediate_size=11008, max_position_embeddings=4096),
    # Granite 3.0 (ibm-granite/granite-3.0-8b-base)
    "granite-3-8b": dict(_LLAMA, family="granite", vocab_size=49155, hidden_size=4096, num_layers=40,
                         num_heads=32, num_kv_heads=8, intermediate_size=12800, tie_embeddings=True,
                         max_position_embeddings=4096, attn_dropout=0.1),
}
