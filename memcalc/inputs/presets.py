"""Published architectures by name. Parameter counts are checked against the published figures
in tests/test_specs.py (model cards and papers), an independent check of formulas/parameters.py."""
from __future__ import annotations

_GPT2 = dict(family="gpt2", vocab_size=50257, max_position_embeddings=1024, tie_embeddings=True,
             activation="gelu_new", embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1)
_LLAMA = dict(family="llama", tie_embeddings=False, qkv_bias=False, out_bias=False, mlp_bias=False,
              activation="silu")
_QWEN2 = dict(_LLAMA, qkv_bias=True)
_MOE = dict(_LLAMA)
_GPT_OSS = dict(_LLAMA, family="gpt_oss", qkv_bias=True, out_bias=True, mlp_bias=True, vocab_size=201088,
                hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64, intermediate_size=2880,
                max_position_embeddings=131072, sliding_window=128, sliding_window_pattern=2)
# families of issue 12, part b (model cards' config.json on huggingface.co)
_PHI3 = dict(_LLAMA, family="phi3")
_NEOX = dict(family="gpt_neox", vocab_size=50304, max_position_embeddings=2048, tie_embeddings=False,
             qkv_bias=True, out_bias=True, mlp_bias=True, activation="gelu", rotary_fraction=0.25,
             parallel_residual=True)
_LLAMA3 = dict(_LLAMA, vocab_size=128256, max_position_embeddings=131072)
_QWEN3 = dict(_LLAMA, qk_norm=True, head_dim=128, num_kv_heads=8, vocab_size=151936,
              max_position_embeddings=40960)
_GEMMA = dict(family="gemma", tie_embeddings=True, qkv_bias=False, out_bias=False, mlp_bias=False,
              activation="gelu_tanh", head_dim=256, max_position_embeddings=8192)
_GEMMA2 = dict(_GEMMA, family="gemma2", vocab_size=256000, sliding_window=4096, sliding_window_pattern=2,
               attn_softcap=True, logit_softcap=True)
_GEMMA3 = dict(_GEMMA, family="gemma3", qk_norm=True, sliding_window_pattern=6)

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
    # Mixture of experts (HF config.json of each; total and active counts in tests/test_moe.py)
    # Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088: 46.7B total, 12.9B active)
    "mixtral-8x7b": dict(_MOE, family="mixtral", vocab_size=32000, hidden_size=4096, num_layers=32,
                         num_heads=32, num_kv_heads=8, intermediate_size=14336, max_position_embeddings=32768,
                         moe=dict(num_experts=8, top_k=2, expert_ffn_size=14336)),
    # Qwen3-30B-A3B (Qwen3 technical report, arXiv 2505.09388: 30.5B total, 3.3B active)
    "qwen3-30b-a3b": dict(_MOE, family="qwen3_moe", vocab_size=151936, hidden_size=2048, num_layers=48,
                          num_heads=32, num_kv_heads=4, head_dim=128, intermediate_size=6144,
                          max_position_embeddings=40960,
                          moe=dict(num_experts=128, top_k=8, expert_ffn_size=768)),
    # OLMoE-1B-7B-0924 (Muennighoff et al. 2024, arXiv 2409.02060: 6.9B total, 1.3B active)
    "olmoe-1b-7b": dict(_MOE, family="olmoe", vocab_size=50304, hidden_size=2048, num_layers=16,
                        num_heads=16, num_kv_heads=16, intermediate_size=1024, max_position_embeddings=4096,
                        moe=dict(num_experts=64, top_k=8, expert_ffn_size=1024, norm_topk_prob=False)),
    # Qwen1.5-MoE-A2.7B (model card: 14.3B total, 2.7B active)
    "qwen1.5-moe-a2.7b": dict(_MOE, family="qwen2_moe", qkv_bias=True, vocab_size=151936, hidden_size=2048,
                              num_layers=24, num_heads=16, num_kv_heads=16, intermediate_size=5632,
                              max_position_embeddings=8192,
                              moe=dict(num_experts=60, top_k=4, expert_ffn_size=1408, norm_topk_prob=False,
                                       shared_expert_ffn_size=5632)),
    # gpt-oss (openai/gpt-oss-20b and -120b config.json; model card arXiv 2508.10925: 20.91B total,
    # 3.61B active; 116.83B total, 5.13B active); the dequantised (bf16) model training runs
    "gpt-oss-20b": dict(_GPT_OSS, num_layers=24, moe=dict(num_experts=32, top_k=4, expert_ffn_size=2880)),
    "gpt-oss-120b": dict(_GPT_OSS, num_layers=36, moe=dict(num_experts=128, top_k=4, expert_ffn_size=2880)),
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
    # Qwen3 (Qwen team 2025, arXiv 2505.09388; config.json of Qwen/Qwen3-0.6B, Qwen/Qwen3-8B)
    "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, num_layers=28, num_heads=16, intermediate_size=3072,
                       tie_embeddings=True),
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, num_layers=36, num_heads=32, intermediate_size=12288),
    # Gemma (Gemma team 2024, arXiv 2403.08295; config.json of google/gemma-2b, google/gemma-7b)
    "gemma-2b": dict(_GEMMA, vocab_size=256000, hidden_size=2048, num_layers=18, num_heads=8,
                     num_kv_heads=1, intermediate_size=16384),
    "gemma-7b": dict(_GEMMA, vocab_size=256000, hidden_size=3072, num_layers=28, num_heads=16,
                     intermediate_size=24576),
    # Gemma 2 (arXiv 2408.00118; google/gemma-2-2b, google/gemma-2-9b)
    "gemma-2-2b": dict(_GEMMA2, hidden_size=2304, num_layers=26, num_heads=8, num_kv_heads=4,
                       intermediate_size=9216),
    "gemma-2-9b": dict(_GEMMA2, hidden_size=3584, num_layers=42, num_heads=16, num_kv_heads=8,
                       intermediate_size=14336),
    # Gemma 3 (arXiv 2503.19786; google/gemma-3-1b-pt, the text_config of google/gemma-3-4b-pt)
    "gemma-3-1b": dict(_GEMMA3, vocab_size=262144, hidden_size=1152, num_layers=26, num_heads=4,
                       num_kv_heads=1, intermediate_size=6912, sliding_window=512,
                       max_position_embeddings=32768),
    "gemma-3-4b": dict(_GEMMA3, vocab_size=262208, hidden_size=2560, num_layers=34, num_heads=8,
                       num_kv_heads=4, intermediate_size=10240, sliding_window=1024,
                       max_position_embeddings=131072),
}
