"""Run a user's training step under FakeTensorMode and record it (issue 25; imports torch inside
its functions only).

The step is the validator's (validate/measure/step.py train_step), op for op: the batch made at
the step's start, grad_accum forwards (under autocast for the amp precisions) and backwards, then
gradient clipping, optimizer.step() and zero_grad(set_to_none=True); a warm-up step (the first
step, which creates the optimizer's states) and a steady one (the validator runs two, alike).
No weight is allocated: the
model is built under FakeTensorMode, whose tensors have sizes and storages but no data.

Each storage is given a category when it can be told: the model's parameters (weights) and
buffers, the batch (inputs), each parameter's .grad before optimizer.step() (gradients), the
optimizer's states after it (optimizer); the rest are activations, or temporaries when born in
the optimizer phase.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from memcalc.core.errors import MemcalcError, NotModelledError
from memcalc.traced.hf_patches import real_tensor_answers
from memcalc.traced.record import new_recorder
from memcalc.traced.refusals import no_meta_kernel

STEPS = 2  # the warm-up step and a steady one (the validator runs a second steady step, alike)


@dataclass
class Trace:
    """One traced run at one shape: the event stream (memcalc.traced.record) and each storage's
    category (sid -> category; unnamed ones are activations or temporaries)."""

    b: int
    s: int
    events: list[tuple]
    categories: dict[int, str] = field(default_factory=dict)
    params: list[tuple[int, int, int]] = field(default_factory=list)
    """(elements, dim 0, bytes per element) of each trainable parameter in module order."""


def trace_step(factory: Callable, training: Any, b: int, s: int, inputs: int | Callable,
               loss: Callable | None = None, fake: bool = True) -> Trace:
    """Record the training step of `factory`'s model at micro_batch b, seq_len s (with real
    tensors when not `fake`: what the fake trace is compared with, memcalc.traced item 3).

    >>> import torch
    >>> from memcalc.inputs.training import TrainingConfig
    >>> def lm():
    ...     return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    >>> ce = lambda m, ids: torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    >>> t = trace_step(lm, TrainingConfig(micro_batch=2, seq_len=4, device="cpu"), 2, 4, 16, ce)
    >>> sorted(set(t.categories.values()))
    ['gradients', 'inputs', 'optimizer', 'weights']
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = new_recorder()
    gc.collect()
    gc.disable()  # cyclic garbage freed at a random moment would move frees (as the validator)
    try:
        with FakeTensorMode() if fake else contextlib.nullcontext(), rec:
            return _run(torch, rec, factory, training, b, s, inputs, loss or default_loss)
    except NotModelledError:
        raise
    except Exception as err:  # FakeTensorMode's refusals name the op: say which and why
        raise _refusal(err) from None
    finally:
        gc.enable()


def default_loss(model: Any, ids: Any) -> Any:
    """model(ids), its `.loss` or the loss itself (a 0-d tensor)."""
    out = model(ids)
    out = getattr(out, "loss", out)
    if isinstance(out, tuple):
        out = out[-1]
    return out


def _refusal(err: Exception) -> MemcalcError:
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                               UnsupportedOperatorException)

    func = getattr(err, "func", None)
    op = getattr(getattr(func, "_schema", None), "name", str(func))
    if isinstance(err, (DataDependentOutputException, DynamicOutputShapeException)):
        return NotModelledError("module", f"{op}{_where(err)} reads or makes a data-dependent value (its "
                                "size or a Python number depends on tensor values), which a trace cannot follow",
                                "use a hand-written program (memcalc.families) or a static-shape op")
    import re

    custom = re.search(r"no fake impl registered for <CustomOpDef\(([^)]+)\)>", str(err))
    if custom:  # torch.library.custom_op without register_fake (torch/_library/custom_ops.py)
        return no_meta_kernel(custom.group(1), err)
    if isinstance(err, UnsupportedOperatorException) or "meta" in str(err).lower():
        return no_meta_kernel(op, err)
    return MemcalcError("module", f"the traced step failed: {type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200] if str(err) else ''}",
                        "check that the factory, inputs and loss run on CPU")


def _where(err: Exception) -> str:
    """' at FILE:LINE `code`': the model's own line that ran the op (the last frame outside torch
    and memcalc.traced), e.g. a router's `expert_size.tolist()`.

    >>> _where(ValueError())
    ''
    """
    import traceback

    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if "/torch/" not in f.filename and "/memcalc/traced/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename.split('site-packages/')[-1]}:{f.lineno} `{(f.line or '').strip()[:80]}`"


def _run(torch: Any, rec: Any, factory: Callable, training: Any, b: int, s: int, inputs: int | Callable,
         loss_fn: Callable) -> Trace:
    from memcalc.traced.optim import make_optimizer

    trace = Trace(b, s, rec.events)
    cats = trace.categories
    torch.manual_seed(0)
    rec.mark("build")
    model = factory(training) if _takes_training(factory) else factory()
    if training.precision == "bf16":
        _to_bf16(torch, model)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in model.parameters():
        rec.track(p)
        cats[rec.sid(p)] = "weights"
    for buf in model.buffers():
        rec.track(buf)
        cats.setdefault(rec.sid(buf), "buffers")
    trace.params = [(p.numel(), p.shape[0] if p.dim() else 1, p.element_size()) for p in params]
    optimizer = make_optimizer(params, training)
    with real_tensor_answers():  # transformers' mask checks, as for real tensors (memcalc.traced.hf_patches)
        _steps(torch, rec, model, params, optimizer, training, b, s, inputs, loss_fn, cats)
    rec.mark("end")
    return trace


def _steps(torch: Any, rec: Any, model: Any, params: list, optimizer: Any, training: Any, b: int, s: int,
           inputs: int | Callable, loss_fn: Callable, cats: dict) -> None:
    """The warm-up step and the steady ones, as validate.measure.step.train_step runs them."""
    low = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(training.precision)
    model.train()
    for step in range(STEPS):
        rec.mark(f"step {step}")
        rec.mark("inputs")
        ids = inputs(b, s) if callable(inputs) else torch.randint(0, inputs, (b, s))
        cats[rec.sid(ids)] = "inputs"
        for _ in range(training.grad_accum):
            rec.mark("forward")
            with torch.autocast("cpu", dtype=low, enabled=low is not None):
                loss = loss_fn(model, ids)
                if training.grad_accum > 1:
                    loss = loss / training.grad_accum
            rec.mark("backward")
            loss.backward()
            del loss
        rec.mark("optimizer")
        if training.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        for p in params:
            if p.grad is not None:
                cats[rec.sid(p.grad)] = "gradients"
        optimizer.step()
        for state in optimizer.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor) and rec.sid(t) is not None:
                    cats.setdefault(rec.sid(t), "optimizer")
        optimizer.zero_grad(set_to_none=True)
        del ids


def _to_bf16(torch: Any, model: Any) -> None:
    """model.to(torch.bfloat16) for a model of fake tensors: nn.Module._apply swaps a tensor
    subclass's parameters in place (torch.utils.swap_tensors), which fails on FakeTensors
    ("Couldn't swap"), so each floating parameter and buffer is replaced by its cast, a tied one
    once (the same new Parameter in every module that shares it), as .to() leaves them."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None or not t.is_floating_point():
                    continue
                if id(t) not in memo:
                    cast = t.detach().to(torch.bfloat16)
                    memo[id(t)] = (torch.nn.Parameter(cast, t.requires_grad)
                                   if isinstance(t, torch.nn.Parameter) else cast)
                table[name] = memo[id(t)]


def _takes_training(factory: Callable) -> bool:
    """Whether the factory takes the TrainingConfig (so that it can apply checkpointing)."""
    try:
        return len(inspect.signature(factory).parameters) >= 1
    except (TypeError, ValueError):
        return False
