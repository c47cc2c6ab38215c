"""The real libraries' side of what tests compare memcalc with: transformers' parameter count of an
HF config, and the optimizer states a real torch / bitsandbytes / transformers optimizer holds."""
from __future__ import annotations

import pytest


def meta_num_parameters(hf_config: dict) -> int:
    """transformers' own num_parameters() of the causal LM class the validator builds for
    `hf_config` (validate.models.hf: _make_config, CLASSES), instantiated on the meta device (no
    memory); the test is skipped without torch or transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from validate.models.hf import CLASSES, _make_config

    transformers.logging.set_verbosity_error()  # config-default chatter (as validate.models.hf.build_hf)
    model_type, cfg = _make_config(hf_config)
    with torch.device("meta"):
        return getattr(transformers, CLASSES[model_type])._from_config(cfg).num_parameters()


def live_optimizer_state_bytes(torch, optimizer: str, params: list) -> int:
    """Bytes of the distinct state storages the real optimizer (validate.measure.step.optimizer_class)
    holds after one step on `params` with all-ones gradients: its per-parameter state and, for
    bitsandbytes' 8-bit optimizers, the qmaps in its name2qmap (made at construction, held
    whether or not a parameter is large enough to use them)."""
    from validate.measure.step import optimizer_class

    opt = optimizer_class(optimizer)(params, **({} if optimizer == "adafactor" else {"lr": 1e-3}))
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    seen, live = set(), 0
    held = [v for p in params for v in opt.state[p].values()]
    for v in held + list(getattr(opt, "name2qmap", {}).values()):
        if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            live += v.untyped_storage().nbytes()
    return live


def measured_step_temporaries(optimizer: str, make_params) -> int:
    """The peak above the live bytes before optimizer.step() of the real optimizer's second step
    (the steady state), under the validator's live-tensor tracker; `make_params()` builds the
    parameters inside it."""
    import torch
    from validate.measure.step import optimizer_class
    from validate.measure.tracker import LiveTensorTracker

    optimizer_class(optimizer)  # import outside the tracker
    with LiveTensorTracker() as tr:
        params = make_params()
        opt = optimizer_class(optimizer)(params, **({} if optimizer == "adafactor" else {"lr": 1e-3}))
        for _ in range(2):
            for p in params:
                p.grad = torch.ones_like(p)
            before = tr.live
            tr.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return tr.peak - before
