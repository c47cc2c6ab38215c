"""A traced program for a transformers model type with no hand-written one (issue 25, item 2).

`ModelSpec.from_hf_config(config, fallback="trace")` comes here when memcalc has no program for the
config's model_type (memcalc.families' declarations list those it has; a hand-written program wins
where both exist): the model is built by transformers' own `AutoModelForCausalLM.from_config` under
FakeTensorMode (memcalc.traced.runner), with per-layer checkpointing as the validator applies it
(validate/models/hf.py: activation_checkpointing_enable, non-reentrant), and trained on
`model(input_ids=ids, labels=ids, use_cache=False).loss`, the validator's default call path. The
spec's name ends in "(traced)", so reports say which program was used.
"""
from __future__ import annotations

from typing import Any

from memcalc.core.errors import SpecError
from memcalc.traced.spec import TracedSpec, from_module


def from_hf_config(config: dict) -> TracedSpec:
    """A traced spec of a config.json dict.

    >>> from_hf_config({"model_type": "starcoder2", "vocab_size": 64}).name
    'starcoder2 (traced)'
    """
    cfg = dict(config)
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise SpecError("hf_config.vocab_size", "a traced model needs the vocabulary of its token ids",
                        "set vocab_size in the config")
    name = f"{cfg.get('_name_or_path') or cfg['model_type']} (traced)"
    return from_module(_Factory(cfg), vocab, hf_loss, name=name, far_seq_len=FAR_SEQ_LEN)


FAR_SEQ_LEN = 1040
"""The far check's sequence length for an HF model (memcalc.traced.spec.TracedModel.far_seq_len):
past every chunk or block size transformers 5.24's models use (64, 128, 256, 512: 1040 is a
multiple of none), so a size that steps with s is refused rather than fitted as a constant."""


class _Factory:
    """factory(training): the transformers model of the config, checkpointed as training says."""

    def __init__(self, cfg: dict):
        self.cfg = cfg

    def __call__(self, training: Any) -> Any:
        import transformers

        transformers.logging.set_verbosity_error()
        cfg = dict(self.cfg)
        conf = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        self.seq_limit = seq_limit(conf)
        model = transformers.AutoModelForCausalLM.from_config(conf)
        if training.checkpointing == "per-layer":
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model.train()


SEQ_LIMITS = ("sliding_window", "attention_chunk_size", "chunk_size", "mamba_chunk_size", "block_size",
              "window_size", "local_window_size")
"""Config fields naming a length past which a model's step changes (a window's mask, an attention
chunk, a scan's chunk, a loop's block): past the largest length traced, the trace says nothing."""


def seq_limit(conf: Any) -> list | None:
    """[field, value] of the shortest such length above the far check (memcalc.traced.build
    check_seq_limit refuses longer sequences); shorter ones the fit or the far check ran past.

    >>> class C: sliding_window, attention_chunk_size = 4096, 8192
    >>> seq_limit(C())
    ['sliding_window', 4096]
    """
    found = [[name, v] for name in SEQ_LIMITS if isinstance(v := getattr(conf, name, None), int)
             and not isinstance(v, bool) and v >= FAR_SEQ_LEN]
    return min(found, key=lambda nv: nv[1]) if found else None


def hf_loss(model: Any, ids: Any) -> Any:
    """The causal-LM loss as the validator's default call path computes it."""
    return model(input_ids=ids, labels=ids, use_cache=False).loss
