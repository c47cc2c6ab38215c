"""transformers' side of an HF config, shared by the tests that check memcalc's parameter counts
against transformers' own."""
from __future__ import annotations

import pytest


def meta_num_parameters(hf_config: dict) -> int:
    """transformers' own num_parameters() of the causal LM class the validator builds for
    `hf_config` (validate.hf: _make_config, CLASSES), instantiated on the meta device (no
    memory); the test is skipped without torch or transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from validate.hf import CLASSES, _make_config

    transformers.logging.set_verbosity_error()  # config-default chatter (as validate.hf.build_hf)
    model_type, cfg = _make_config(hf_config)
    with torch.device("meta"):
        return getattr(transformers, CLASSES[model_type])._from_config(cfg).num_parameters()
