"""The fast evaluator of a set of candidate moments: their totals (and the allocator's rounding of
each live storage) as integer rows over the monomials b**i * s**j, compiled once into a Python
function of (b, s), so a new shape costs a few microseconds.
"""
from __future__ import annotations

from typing import Callable

from memcalc.core.poly import Poly
from memcalc.tape.moment import Moment

PHASES = ("forward", "backward", "optimizer")


class MomentSet:
    """Candidate moments with a fast evaluator. Each total is a row of integer coefficients over
    the monomials b**i * s**j the moments use. The allocator's rounding of each live storage is
    grouped by size polynomial: a size that is constant rounds to a constant, a size whose
    coefficients are all multiples of the granularity never rounds, and each remaining size's
    residue is computed once per shape and shared by every moment holding it. The evaluator is
    compiled once from these integers (as sympy's lambdify would), so a new shape costs a few
    microseconds.

    >>> ms = MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1),))], 512)
    >>> ms.totals(3, 4), ms.rounded_totals(3, 4)
    ([24], [512])
    """

    def __init__(self, moments: list[Moment], granularity: int = 1):
        self.moments = moments
        self.granularity = granularity
        self.monomials = sorted({mono for m in moments for mono in m.total.terms})
        self.rows = [tuple(m.total.terms.get(mono, 0) for mono in self.monomials) for m in moments]
        self.by_phase = {p: [i for i, m in enumerate(moments) if m.phase == p] for p in PHASES}
        self.fractional = any(not isinstance(c, int) for row in self.rows for c in row)
        self._evaluators: dict[int, Callable[[int, int], list[int]]] = {}  # granularity -> totals

    def totals(self, b: int, s: int) -> list[int]:
        """Every moment's bytes at micro_batch b, seq_len s.

        >>> MomentSet([Moment("forward", "x", Poly.bs(2), {})]).totals(3, 4)
        [24]
        """
        return self.rounded_totals(b, s, 1)

    def rounded_totals(self, b: int, s: int, granularity: int | None = None) -> list[int]:
        """Totals with every live storage rounded up to `granularity` bytes (memcalc.allocator.rules;
        by default the regime's)."""
        g = self.granularity if granularity is None else granularity
        found = self._evaluators.get(g)
        if found is None:
            found = self._evaluators[g] = self._compile(g)
        return found(b, s)

    def rounding_parts(self, g: int) -> tuple[list[int], list[Poly], list[dict[int, int]]]:
        """The allocator's rounding of every moment, grouped by size polynomial: (constant
        rounding per moment, the sizes whose residue mod g varies with b and s, per moment
        {index of such a size: live storages of it}).

        >>> ms = MomentSet([Moment("forward", "x", Poly.bs(2), {}, ((Poly.bs(2), 1), (Poly.const(5), 2)))])
        >>> ms.rounding_parts(512)
        ([1014], [Poly(2*b*s)], [{0: 1}])
        """
        consts, varying, per_moment = [], {}, []
        for m in self.moments:
            const, counts = 0, {}
            for size, n in m.sizes:
                kind = _rounding_kind(size, g)
                if kind == "const":
                    const += n * (-size.terms.get((0, 0), 0) % g)
                elif kind == "varies":
                    k = varying.setdefault(tuple(sorted(size.terms.items())), (len(varying), size))[0]
                    counts[k] = counts.get(k, 0) + n
            consts.append(const)
            per_moment.append(counts)
        return consts, [size for _, size in varying.values()], per_moment

    def _compile(self, g: int) -> Callable[[int, int], list[int]]:
        rounding = g > 1
        if self.fractional:  # sequence parallelism: b*s/t tokens (Fraction coefficients)
            return self._slow(g)
        names = {mono: _monomial_source(mono) for mono in self.monomials if mono != (0, 0)}
        n = len(self.rows)
        consts, sizes, counts = self.rounding_parts(g) if rounding else ([0] * n, [], [{}] * n)
        lines = [f"    r{k} = -({_poly_source(size, names)}) % {g}" for k, size in enumerate(sizes)]
        exprs = []
        for row, const, mine in zip(self.rows, consts, counts):
            parts = [f"{c}*{names[mono]}" if mono != (0, 0) else str(c)
                     for mono, c in zip(self.monomials, row) if c]
            parts += [f"{k_n}*r{k}" for k, k_n in mine.items()] + ([str(const)] if const else [])
            exprs.append(" + ".join(parts) or "0")
        monos = [f"    {name} = {_monomial_expr(mono)}" for mono, name in names.items()]
        source = "\n".join(["def totals(b, s):", *monos, *lines,
                             "    return [" + ", ".join(exprs) + "]"])
        namespace: dict = {}
        exec(compile(source, "<memcalc.engine.codegen.MomentSet>", "exec"), namespace)  # our own integers only
        return namespace["totals"]

    def _slow(self, g: int) -> Callable[[int, int], list[int]]:
        def totals(b: int, s: int) -> list[int]:
            values = [b ** i * s ** j for i, j in self.monomials]
            out = [-(-sum(c * v for c, v in zip(row, values)) // 1) for row in self.rows]
            if g > 1:
                out = [t + sum(n * int(-p.eval(b, s) % g) for p, n in m.sizes)
                       for t, m in zip(out, self.moments)]
            return out

        return totals


def _monomial_source(mono: tuple[int, int]) -> str:
    """The variable name of b**i * s**j (i + j > 0) in compiled evaluators; constants are
    written as literals."""
    i, j = mono
    return f"b{i}s{j}"


def _monomial_expr(mono: tuple[int, int]) -> str:
    i, j = mono
    return "*".join(["b"] * i + ["s"] * j)


def _poly_source(size: Poly, names: dict) -> str:
    return " + ".join(f"{c}*{names.get(mono) or _monomial_expr(mono)}" if mono != (0, 0) else str(c)
                      for mono, c in sorted(size.terms.items()))


def _rounding_kind(size: Poly, g: int) -> str:
    """'none' when every coefficient is a multiple of g (the size always is), 'const' for a
    constant size, else 'varies'."""
    if all(c % g == 0 for c in size.terms.values()):
        return "none"
    return "const" if set(size.terms) == {(0, 0)} else "varies"

