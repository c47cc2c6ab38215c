"""The ci matrix's model shapes and row builders (CI_SHAPES, qwen2_config, _model, _case), below
validate.matrices and the ci_* row modules that import them, so that matrices only imports the row
modules (validate.matrices re-exports these names).
"""
from __future__ import annotations

from memcalc.inputs.specs import ModelSpec
from validate.run.case import Case
from validate.matrices.pairwise import pairwise_case


# ---- models ------------------------------------------------------------------------------------
def qwen2_config(h: int, layers: int, heads: int, kv: int, ffn: int, vocab: int,
                 positions: int = 256, tie: bool = True) -> dict:
    """A Qwen2 config.json dict (as on the Hub, trimmed), for ModelSpec.from_hf_config."""
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": h,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": positions, "tie_word_embeddings": tie,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None}


def _model(kind: str, shape: dict):
    """(spec, hf_config) for a model kind on a shape dict."""
    h, L, a, V, P = shape["h"], shape["L"], shape["a"], shape["V"], shape["P"]
    if kind.startswith("gpt2"):
        p = shape["dropout"]
        spec = ModelSpec.make(name="gpt2-like", family="gpt2", vocab_size=V, hidden_size=h,
                              num_layers=L, num_heads=a, max_position_embeddings=P,
                              embd_dropout=p, attn_dropout=shape.get("attn_dropout", p),
                              resid_dropout=p,
                              implementation="hf" if kind.endswith("hf") else "reference")
        return spec, None
    if kind == "qwen2-hf":
        cfg = qwen2_config(h, L, a, shape["kv"], shape["f"], V, P)
        return ModelSpec.from_hf_config(cfg).with_(name="qwen2-like"), cfg
    spec = ModelSpec.make(name="llama-like", family="llama", vocab_size=V, hidden_size=h,
                          num_layers=L, num_heads=a, num_kv_heads=shape["kv"],
                          intermediate_size=shape["f"], max_position_embeddings=P,
                          tie_embeddings=shape["tie"], qkv_bias=False, out_bias=False,
                          mlp_bias=False, activation="silu",
                          attn_dropout=shape.get("attn_dropout", shape["dropout"]),
                          implementation="hf" if kind.endswith("hf") else "reference")
    return spec, None


def _case(name: str, row: dict, shape: dict, device: str) -> Case:
    """A ci row: validate.matrices.pairwise.pairwise_case for the row's model kind (`_model`)."""
    return pairwise_case(name, row, shape, device, *_model(row["model"], shape))


# Small enough for ~1 s a configuration on 2 cores under the tracker, big enough that matrices,
# not scalars, set the peak (smallest activation tensor ~16K elements).
CI_SHAPES = (
    dict(h=64, a=4, kv=2, L=2, V=500, b=4, s=64, f=176, P=256, dropout=0.0, tie=False),
    dict(h=128, a=4, kv=4, L=4, V=2000, b=2, s=128, f=344, P=256, dropout=0.1, tie=False),
    dict(h=256, a=8, kv=2, L=3, V=4000, b=1, s=256, f=688, P=256, dropout=0.0, tie=True),
    dict(h=96, a=6, kv=3, L=6, V=1000, b=3, s=32, f=256, P=256, dropout=0.1, tie=False),
    dict(h=128, a=8, kv=1, L=3, V=3000, b=2, s=96, f=384, P=256, dropout=0.0, tie=True),
    dict(h=192, a=3, kv=3, L=2, V=800, b=1, s=384, f=512, P=512, dropout=0.1, tie=False),
)
