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
    def _of(terms: dict[Monomial, int]) -> "Poly":
        """A Poly of `terms` that has no zero coefficient (taken as is, not filtered)."""
        out = object.__new__(Poly)
        out.terms = terms
        return out

    @staticmethod
    def const(c: int) -> "Poly":
        """A constant number of bytes."""
        c = int(c)
        return Poly._of({(0, 0): c} if c else {})

    @staticmethod
    def mono(c: int, b_pow: int, s_pow: int) -> "Poly":
        """c * b**b_pow * s**s_pow."""
        c = int(c)
        return Poly._of({(b_pow, s_pow): c} if c else {})

    @staticmethod
    def bs(c: int) -> "Poly":
        """c * b * s: a per-token tensor."""
        c = int(c)
        return Poly._of({(1, 1): c} if c else {})

    def __add__(self, other: "Poly") -> "Poly":
        out = dict(self.terms)
        cancelled = False
        for m, c in other.terms.items():
            out[m] = total = out.get(m, 0) + c
            cancelled = cancelled or not total
        return Poly(out) if cancelled else Poly._of(out)

    def __sub__(self, other: "Poly") -> "Poly":
        return self + other * -1

    def __mul__(self, k: int) -> "Poly":
        if k.__class__ is int and k:  # no product is 0: the terms need no filtering
            return Poly._of({m: c * k for m, c in self.terms.items()})
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
