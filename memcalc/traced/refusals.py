"""What tracing cannot follow, refused by the op's name (issue 25 item 4).

A traced program is fitted from runs at a few small shapes under FakeTensorMode; it stands only
if every run makes the same storages in the same order. Ops whose output sizes depend on tensor
values (nonzero, masked_select, unique, a MoE router's per-expert token counts read with .item()
or .tolist()) make that false, and FakeTensorMode can only invent a size for them; ops with no
meta kernel cannot run at all. Both are refused here, before they run, naming the op.
"""
from __future__ import annotations

from typing import Any

from memcalc.core.errors import NotModelledError

DATA_DEPENDENT = frozenset({
    "aten::nonzero", "aten::nonzero_static", "aten::masked_select", "aten::unique",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::argwhere", "aten::repeat_interleave", "aten::bincount",
})
"""ATen ops whose output shape, or a Python value read from a tensor, depends on tensor values
(torch/_subclasses/fake_impls.py marks them `data_dependent_output` or
`dynamic_output_shape`). repeat_interleave with an int `repeats` has a static shape and passes.
A value read with .item() (aten::_local_scalar_dense) passes where FakeTensorMode knows it (a
constant such as an optimizer's step count) and is refused by memcalc.traced.runner where it
does not."""


def check_op(func: Any, args: tuple, kwargs: dict | None) -> None:
    """Raise NotModelledError for an op a trace cannot follow.

    >>> import torch
    >>> check_op(torch.ops.aten.nonzero.default, (), {})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.NotModelledError: module: aten::nonzero makes a tensor whose size ...
    """
    name = func._schema.name
    if name not in DATA_DEPENDENT:
        return
    if name == "aten::repeat_interleave" and not _tensor_repeats(args, kwargs):
        return
    raise NotModelledError("module", f"{name} makes a tensor whose size depends on tensor values "
                           "(data-dependent shape, e.g. nonzero or MoE routing), which a trace "
                           "at a few shapes cannot follow",
                           "use a hand-written program (memcalc.families) or replace the op "
                           "with a static-shape one (e.g. a dense mask)")


def _tensor_repeats(args: tuple, kwargs: dict | None) -> bool:
    """repeat_interleave(self, repeats: Tensor): the output size is the repeats' sum."""
    import torch

    repeats = (kwargs or {}).get("repeats", args[1] if len(args) > 1 else args[0] if args else None)
    return isinstance(repeats, torch.Tensor) and repeats.dim() > 0 and repeats.numel() > 1


def no_meta_kernel(op: str, err: Exception) -> NotModelledError:
    """The refusal of an op FakeTensorMode cannot run (no meta kernel, no fake impl).

    >>> str(no_meta_kernel("mylib::fused", RuntimeError("x")))[:60]
    'module: mylib::fused has no meta kernel (FakeTensorMode cann'
    """
    return NotModelledError("module", f"{op} has no meta kernel (FakeTensorMode cannot run it: "
                            f"{str(err).splitlines()[0][:120]})",
                            "register a fake/meta implementation (torch.library.register_fake) "
                            "or use a hand-written program")
