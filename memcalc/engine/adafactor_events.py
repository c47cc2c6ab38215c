"""transformers' Adafactor.step() as allocations, one parameter at a time (the engine's sequence,
memcalc.engine.allocations): where each parameter's states are made in the first step, and what its
update allocates and frees. memcalc.tape.finetune_optim keeps one block of the largest moment (the
allocated peak); the allocator sees these tensors one by one, mostly small-pool blocks.
"""
from __future__ import annotations

from memcalc.engine.bnb_events import STATES
from memcalc.engine.regime import Regime
from memcalc.tape.graph import Graph

RENEW, RENEWED = "renew", "renewed"
"""Entries ("renew", key, bytes) and ("renewed", key, bytes): a state tensor replaced by a new one of the
same size (state["RMS"] = self._rms(...)). In a steady step the new one is made at "renew" and the old one
freed at "renewed" (written as an alloc and a free of one handle: the allocator sees a block of that size
made, then one freed); in the first step neither (the state itself is made by a ("states", ...) entry)."""
SCALAR = 4  # a 0-dim fp32 tensor
BOOL = 1  # a 0-dim bool tensor


def adafactor_temporaries(graph: Graph, regime: Regime) -> list[tuple]:
    """Adafactor.step() parameter by parameter, as optimizer_temporaries gives its entries:
    ("states", i, count) where parameter i's states are made in the first step, ("renew", ...) where
    its RMS state is replaced, then `adafactor_update`'s allocations; each parameter's locals (grad,
    p_data_fp32, update, lr) stay bound until the next parameter rebinds them, the last ones until
    step() returns.

    >>> from memcalc.engine.simulation import build_graph
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> tc = TrainingConfig(micro_batch=1, seq_len=8, optimizer="adafactor", device="cpu")
    >>> temps = adafactor_temporaries(build_graph(ModelSpec.preset("gpt2"), Regime.of(tc)), Regime.of(tc))
    >>> temps[:3]  # wte (fp32): its factored row and column states, then ||p|| for its RMS
    [('states', 0, 2), ('alloc', (0, 'norm'), 4), ('states', 0, 1)]
    """
    from memcalc.tape import finetune_optim as ft
    from memcalc.tape.step import _optimizer_shapes, trainable_elt

    elt, out, prev = trainable_elt(graph), [], None
    shapes = _optimizer_shapes(graph)
    for i, (n, rows, last2) in enumerate(shapes):
        out += adafactor_update(i, n, ft.factored(n, rows, last2), elt, prev, regime.weight_decay != 0)
        prev = 4 * n
    if prev is not None:  # step() returns: its locals go
        kept = ("grad", "p32", "lr", "update") if elt != 4 else ("lr", "update")
        out += [("free", (len(shapes) - 1, name), SCALAR if name == "lr" else prev) for name in kept]
    return out


def adafactor_update(i: int, numel: int, sq: tuple[int, int] | None, param_elt: int,
                     prev: int | None = None, weight_decay: bool = False) -> list[tuple]:
    """Parameter i's update (`prev`: the previous parameter's fp32 bytes, None for the first)
    (transformers 5.24 transformers/optimization.py Adafactor.step, defaults: beta1=None,
    relative_step, scale_parameter), ("alloc" | "free", (i, name), bytes) and the states' entries:
    - `grad = p.grad` frees the previous parameter's fp32 grad, `grad.float()` (16-bit parameters);
    - first step: zeros(shape[:-1]) and zeros(shape[:-2] + shape[-1:]) (or zeros_like(grad) 1-D),
      `.to(grad)` no copy (both fp32);
    - `p_data_fp32 = p` frees the previous fp32 copy, `.float()` (16-bit parameters);
    - `state["RMS"] = self._rms(p_data_fp32)`: norm(2), its quotient (the new RMS), the norm freed;
    - `_get_lr`: max(eps[1], RMS) compares (a bool tensor, freed), `param_scale * rel_step_sz` the lr
      tensor (RMS > 1e-3, the weights' case), the previous one freed;
    - `update = grad**2 + eps`: pow, the sum, pow freed, the previous update freed;
    - factored: `update.mean(dim=-1)`, `update.mean(dim=-2)` (each freed after its add_),
      `_approx_sq_grad`: row.mean(keepdim) (shape[:-2] + (1,)), the quotient, the mean freed, rsqrt_
      in place, c_factor = col.rsqrt(), torch.mul(r, c) (the new update), r and c freed, the old
      update freed; 1-D: `exp_avg_sq.rsqrt()` (the new update), the old freed;
    - `update.div_((self._rms(update) / clip).clamp_(min=1.0))`: norm, quotient, norm freed, / clip,
      quotient freed, then the clamped one; `update.mul_(lr)` in place;
    - weight decay: `-wd * lr` (a 0-dim tensor, freed after add_);
    - `p_data_fp32.add_(-update)`: the negation, freed; `p.copy_(p_data_fp32)` in place.

    >>> adafactor_update(1, 6000, (100, 60), 2, 800)[:6]  # doctest: +NORMALIZE_WHITESPACE
    [('free', (0, 'grad'), 800), ('alloc', (1, 'grad'), 24000), ('states', 1, 2),
     ('free', (0, 'p32'), 800), ('alloc', (1, 'p32'), 24000), ('alloc', (1, 'norm'), 4)]
    """
    full, seq = 4 * numel, []
    a = lambda name, b=full: seq.append(("alloc", (i, name), b))  # noqa: E731
    f = lambda name, b=full, j=i: seq.append(("free", (j, name), b))  # noqa: E731
    copies = param_elt != 4
    if copies:
        if prev is not None:
            f("grad", prev, i - 1)
        a("grad")
    seq.append((STATES, i, 2 if sq is not None else 1))
    if copies:
        if prev is not None:
            f("p32", prev, i - 1)
        a("p32")
    a("norm", SCALAR)
    seq.append((STATES, i, 1))  # the RMS: made here in the first step
    seq.append((RENEW, (i, "rms"), SCALAR))
    f("norm", SCALAR)
    seq.append((RENEWED, (i, "rms"), SCALAR))  # the old RMS
    a("gt", BOOL)
    f("gt", BOOL)
    a("lr", SCALAR)
    if prev is not None:
        f("lr", SCALAR, i - 1)
    a("pow")
    a("sq+eps")
    f("pow")
    if prev is not None:
        f("update", prev, i - 1)
    if sq is not None:
        rows, cols = 4 * sq[0], 4 * sq[1]
        a("row mean", rows)
        f("row mean", rows)
        a("col mean", cols)
        f("col mean", cols)
        lead = 4 * (sq[0] * sq[1] // numel)  # row.mean(dim=-1, keepdim=True): shape[:-2] + (1,)
        a("row.mean", lead)
        a("r_factor", rows)
        f("row.mean", lead)
        a("c_factor", cols)
        a("update")
        f("r_factor", rows)
        f("c_factor", cols)
    else:
        a("update")
    f("sq+eps")
    a("rms norm", SCALAR)
    a("rms", SCALAR)
    f("rms norm", SCALAR)
    a("rms/clip", SCALAR)
    f("rms", SCALAR)
    f("rms/clip", SCALAR)
    if weight_decay:
        a("-wd*lr", SCALAR)
        f("-wd*lr", SCALAR)
    a("-update")
    f("-update")
    return seq
