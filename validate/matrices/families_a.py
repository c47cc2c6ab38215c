"""ci rows for the families read from their HF config.json: Qwen3, Mistral with a sliding window,
Qwen2 with use_sliding_window / max_window_layers, Gemma, Gemma-2, Gemma-3 text. One pairwise
design over family x precision x checkpointing x attention x window x optimizer x dropout x
shape, each case built from a config dict (so config reading, memcalc.inputs.hf.config, is validated
with the program). The window is shorter than, equal to, or longer than the sequence; a window
equal to it is materialised for SDPA (masking_utils: `kv_length >= local_attention_size`).

    python -m validate run --matrix ci --only '^fam' --device cpu
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import CHECKPOINTINGS, PRECISIONS, TrainingConfig
from validate.run.case import Case

# Small shapes (about 1 s a row on 2 cores): grouped-query, multi-query and multi-head attention,
# layer counts that mix local and global layers under each family's rule.
SHAPES = (
    dict(h=64, a=4, kv=2, d=16, L=2, V=500, b=4, s=64, f=176, tie=True),
    dict(h=128, a=4, kv=1, d=32, L=3, V=1000, b=2, s=96, f=256, tie=False),
    dict(h=96, a=6, kv=6, d=16, L=4, V=800, b=2, s=128, f=256, tie=True),
)
AXES = {
    "family": ("qwen3", "mistral", "qwen2", "gemma", "gemma2", "gemma3_text"),
    "precision": PRECISIONS,
    "checkpointing": CHECKPOINTINGS,
    "attention": ("sdpa", "eager"),
    "window": ("short", "equal", "long"),
    "optimizer": ("sgd", "sgd-momentum", "adam", "adamw"),  # torch.optim (validate/matrices/optim.py: the rest)
    "dropout": (0.0, 0.1),
    "shape": tuple(range(len(SHAPES))),
}
WINDOWED = ("mistral", "qwen2", "gemma2", "gemma3_text")
# hand-picked rows the design above leaves out: SDPA with a reached window and 1 < kv heads < heads
# (repeat_kv's contiguous copies; with dropout the math kernel on them), and Qwen3's sliding rule
EXTRA = (
    dict(family="mistral", precision="bf16-amp", checkpointing="none", attention="sdpa", window="short",
         optimizer="adamw", dropout=0.0, shape=0),
    dict(family="gemma3_text", precision="fp16-amp", checkpointing="selective", attention="sdpa",
         window="equal", optimizer="adam", dropout=0.1, shape=0),
    dict(family="qwen3", precision="bf16", checkpointing="per-layer", attention="sdpa", window="short",
         optimizer="sgd-momentum", dropout=0.0, shape=0, qwen3_window=True),
)


def family_config(family: str, shape: dict, window: str, dropout: float, qwen3_window: bool = False) -> dict:
    """A trimmed config.json dict of `family` on `shape`, its window (when the family has one)
    s // 4, s or 2 s.

    >>> family_config("qwen2", SHAPES[1], "short", 0.0)["sliding_window"]
    24
    """
    sh = shape
    cfg = {"model_type": family, "vocab_size": sh["V"], "hidden_size": sh["h"],
           "num_hidden_layers": sh["L"], "num_attention_heads": sh["a"], "num_key_value_heads": sh["kv"],
           "head_dim": sh["d"], "intermediate_size": sh["f"], "max_position_embeddings": 512,
           "tie_word_embeddings": sh["tie"], "attention_dropout": dropout, "rms_norm_eps": 1e-6,
           "bos_token_id": 0, "eos_token_id": 0}
    w = {"short": sh["s"] // 4, "equal": sh["s"], "long": 2 * sh["s"]}[window]
    if family in ("qwen3", "mistral", "qwen2"):
        cfg.update(hidden_act="silu", rope_theta=10000.0)
    if family == "mistral":
        cfg.update(sliding_window=w)
    if family == "qwen2":  # the first layer global, the rest sliding
        cfg.update(use_sliding_window=True, sliding_window=w, max_window_layers=1)
    if family == "qwen3":
        cfg.update(attention_bias=sh["kv"] == 1)  # q/k/v and o_proj biases on one shape
        if qwen3_window:
            cfg.update(use_sliding_window=True, sliding_window=w, max_window_layers=1)
    if family == "gemma":
        cfg.update(hidden_act="gelu_pytorch_tanh")
    if family in ("gemma2", "gemma3_text"):
        cfg.update(hidden_activation="gelu_pytorch_tanh", sliding_window=w, query_pre_attn_scalar=sh["d"])
    if family == "gemma3_text":  # one global layer in 3 at these depths (Gemma-3's is 1 in 6)
        cfg.update(sliding_window_pattern=3, final_logit_softcapping=30.0 if sh["tie"] else None)
    return cfg


def families_cases(device: str = "cpu") -> list[Case]:
    """The family rows, named fam00, fam01, ... (Gemma-2 runs eager: transformers refuses SDPA).

    >>> cases = families_cases(); 25 <= len(cases) <= 45
    True
    """
    from validate.matrices.pairwise import pairwise

    cases = []
    for i, row in enumerate(pairwise(AXES, seed=0) + list(EXTRA)):
        shape, ck, dropout = SHAPES[row["shape"]], row["checkpointing"], row["dropout"]
        if dropout and row["attention"] == "sdpa" and row["precision"] != "fp32" \
                and ck in ("per-layer", "sqrt", "every-k"):
            # SDPA's CPU math kernel (taken with attention dropout) adds the mask in place, but
            # out of place under any TorchDispatchMode (areAnyTensorSubclassLike). Reproduce:
            # torch.profiler over F.scaled_dot_product_attention(q, k, v, dropout_p=0.1,
            # is_causal=True) lists aten::add_ alone, aten::add inside a no-op TorchDispatchMode.
            # These rows run without dropout; the math kernel's checkpointed path with dropout is
            # measured by validate/matrices/neox.py's rows (the in-place add: docs/known-gaps.md)
            dropout = 0.0
        windowed = row["family"] in WINDOWED or row.get("qwen3_window", False)
        cfg = family_config(row["family"], shape, row["window"], dropout, row.get("qwen3_window", False))
        spec = ModelSpec.from_hf_config(cfg).with_(name=f"{row['family']}-{row['window']}"
                                                   if windowed else row["family"])
        training = TrainingConfig.make(
            micro_batch=shape["b"], seq_len=shape["s"], precision=row["precision"],
            optimizer=row["optimizer"], checkpointing=ck, checkpoint_every=2 if ck == "every-k" else None,
            attention="eager" if row["family"] == "gemma2" else row["attention"], device=device)
        cases.append(Case(f"fam{i:02d}", spec, training, cfg))
    return cases
