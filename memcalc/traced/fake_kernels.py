"""Fake kernels that disagree with the CPU kernels they stand for, replaced during a trace
(issue 25; imports torch inside its functions only).

`aten::_grouped_mm` (the experts path transformers 5.24 picks by default for MoE models,
transformers/integrations/moe.py grouped_mm_experts_forward): its meta kernel
(torch/_meta_registrations.py `_meta_grouped_mm_common`) checks the CUDA kernel's rule that both
operands are bf16 and refuses fp32 ("Expected inputs of BF16 type"), while the CPU kernel the
real step runs takes fp32 (the validator measures fp32 MoE rows through it). The output is what
the meta kernel's own `_create_grouped_mm_output_tensor` makes (one `empty` of the product's
shape; padded strides on a CUDA build only), called here without the dtype check. Its sizes
depend on the token count only (tokens x top-k rows, sorted by expert): the offsets that route
them are read by the kernel, never by a shape, so the trace stays static.
"""
from __future__ import annotations

from typing import Any


def fake_kernel(func: Any, args: tuple, kwargs: dict | None) -> Any:
    """The output of `func` on fake tensors where its meta kernel refuses what the CPU kernel
    runs; None for every other op (the op then runs as it is).

    >>> import torch
    >>> fake_kernel(torch.ops.aten.mm.default, (), {}) is None
    True
    """
    import torch

    if func is not torch.ops.aten._grouped_mm.default:
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    mat_a, mat_b, *rest = args
    if not isinstance(mat_a, FakeTensor) or mat_a.dtype == torch.bfloat16:
        return None  # a real tensor, or the dtype the meta kernel accepts
    kw = dict(kwargs or {})
    offs = kw.get("offs", rest[0] if rest else None)
    out_dtype = kw.get("out_dtype", rest[2] if len(rest) > 2 else None)
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
