"""The sweep3 rows' Mixtral (validate/matrices/rows/sdpa-math.json, sweep302): a refusal its
config exposes. Every sweep3 row's recorded peak and phases are held by tests/test_recorded_rows.py."""
from __future__ import annotations

import pytest


def test_mixtral_refuses_unnormalised_top_k():
    """MixtralTopKRouter renormalises its top-k weights whatever the config, so a spec saying it
    does not is refused (it would describe a model the HF class never builds)."""
    from validate.matrices import topic_cases

    base = next(c.spec for c in topic_cases("sdpa-math", "cpu") if c.name == "sweep302")
    assert base.family == "mixtral"
    with pytest.raises(ValueError, match="norm_topk_prob"):
        base.with_(moe=base.moe.model_copy(update={"norm_topk_prob": False}))
