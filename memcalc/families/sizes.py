"""`size`: bytes of a tensor of a named shape, symbolic in b and s; the lowest piece every program
module uses (memcalc.families.base re-exports it; call_path imports it from here, below base).
"""
from __future__ import annotations

from memcalc.core.poly import Poly


def size(dims: str, elt: int | float, **extent: int) -> Poly:
    """Bytes of a tensor of shape `dims` with `elt` bytes per element: b (micro_batch) and s
    (seq_len) stay symbolic, every other letter is looked up in `extent`, digits are numbers.

    >>> size("b a s s", 2, a=12)  # attention scores of 12 heads in bf16
    Poly(24*b*s^2)
    >>> size("b s h", 4, h=768)
    Poly(3072*b*s)
    """
    coeff, b_pow, s_pow = elt, 0, 0
    for dim in dims.split():
        if dim == "b":
            b_pow += 1
        elif dim == "s":
            s_pow += 1
        else:
            coeff *= int(dim) if dim.isdigit() else extent[dim]
    return Poly._of({(b_pow, s_pow): coeff} if coeff else {})
