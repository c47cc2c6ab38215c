"""Byte counts as polynomials in the batch symbols b (micro_batch) and s (seq_len).

Every tensor of a training step has a size that is a monomial in b and s times a constant fixed by
the architecture (b*s*h for a hidden state, b*a*s*s for attention scores, a constant for weights).
A tiny dict-based polynomial keeps the simulation fast (sympy arithmetic is ~100x slower) and
converts to a sympy expression for display and solving.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sympy

Monomial = tuple[int, int]  # (power of b, power of s)


class Poly:
    """A polynomial sum(c * b**i * s**j) with int coefficients.

    >>> (Poly.bs(2) + Poly.const(8)).eval(3, 4)
    32
    """

    __slots__ = ("terms",)

    def __init__(self, terms: dict[Monomial, int] | None = None):
        self.terms = {m: c for m, c in (terms or {}).items() if c}

    @staticmethod
    def const(c: int) -> "Poly":
        """A constant number of bytes."""
        return Poly({(0, 0): int(c)})

    @staticmethod
    def mono(c: int, b_pow: int, s_pow: int) -> "Poly":
        """c * b**b_pow * s**s_pow."""
        return Poly({(b_pow, s_pow): int(c)})

    @staticmethod
    def bs(c: int) -> "Poly":
        """c * b * s: a per-token tensor."""
        return Poly({(1, 1): int(c)})

    def __add__(self, other: "Poly") -> "Poly":
        out = dict(self.terms)
        for m, c in other.terms.items():
            out[m] = out.get(m, 0) + c
        return Poly(out)

    def __sub__(self, other: "Poly") -> "Poly":
        return self + other * -1

    def __mul__(self, k: int) -> "Poly":
        if k.__class__ is int and k:  # no product is 0: the terms need no filtering
            out = object.__new__(Poly)
            out.terms = {m: c * k for m, c in self.terms.items()}
            return out
        return Poly({m: c * k for m, c in self.terms.items()})

    __rmul__ = __mul__

    def eval(self, b: int, s: int) -> int:
        """The number of bytes at micro_batch b and seq_len s."""
        return sum(c * b ** i * s ** j for (i, j), c in self.terms.items())

    def dominates(self, other: "Poly") -> bool:
        """True when self >= other for every b, s >= 1 (each coefficient of self - other >= 0,
        and since b, s >= 1 a nonnegative-coefficient polynomial is nonnegative)."""
        mine, theirs = self.terms, other.terms  # coefficientwise, without building the difference
        return (all(mine.get(m, 0) >= c for m, c in theirs.items())
                and all(c >= 0 for m, c in mine.items() if m not in theirs))

    def is_zero(self) -> bool:
        """No bytes at any shape."""
        return not self.terms

    def to_sympy(self, b: sympy.Symbol, s: sympy.Symbol):
        """The sympy expression over symbols b and s."""
        import sympy

        return sympy.Integer(0) + sum((c * b ** i * s ** j for (i, j), c in sorted(self.terms.items())), 0)

    def __repr__(self) -> str:
        parts = [f"{c}" + "".join(f"*{v}^{p}" if p > 1 else f"*{v}" for v, p in (("b", i), ("s", j)) if p)
                 for (i, j), c in sorted(self.terms.items())]
        return "Poly(" + (" + ".join(parts) or "0") + ")"


ZERO = Poly()
