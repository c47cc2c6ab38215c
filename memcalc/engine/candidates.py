"""What the engine hands the queries: the candidate moments of a step (Candidates, with their
fast evaluators) and how the steady-state ones grow with depth (DepthForm).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from memcalc.core.poly import ZERO, Poly
from memcalc.engine.codegen import MomentSet
from memcalc.engine.layout import N1, Layout
from memcalc.engine.regime import Regime
from memcalc.tape.moment import Moment, replay


@dataclass(eq=False)
class Candidates:
    """The moments that can set the peak, for the steady state and the first step, and the
    parameters the optimizer sees (for per-rank optimizer memory, memcalc.parallel.data)."""

    regime: Regime
    steady: list[Moment]
    first: list[Moment]
    param_shapes: list[tuple[int, int]]
    """(elements, dim 0) of each trainable parameter in module order."""
    param_elt: int
    """Bytes per element of the optimizer's view of the parameters (regime.master_elt)."""
    steady_set: MomentSet = field(init=False)
    first_set: MomentSet = field(init=False)
    _depth: "DepthForm | None" = field(init=False, default=None, repr=False)
    _pending: "Callable[[], DepthForm | None] | None" = field(init=False, default=None, repr=False)
    """What gives `depth` when it is first read (its check costs about a tenth of a cold estimate)."""

    def __post_init__(self):
        self.steady_set = MomentSet(self.steady, self.regime.granularity)
        self.first_set = MomentSet(self.first, self.regime.granularity)

    @property
    def depth(self) -> "DepthForm | None":
        """How the steady-state moments grow with depth, when derived (memcalc.engine.depth)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._depth = pending()
        return self._depth

    @depth.setter
    def depth(self, form: "DepthForm | None") -> None:
        self._pending, self._depth = None, form


@dataclass
class DepthForm:
    """The steady-state instants that can set the peak at any depth of one layout (memcalc.engine.depth),
    at this depth, each with what a unit more adds (Moment.per_unit)."""

    layout: Layout
    moments: list[Moment]

    def terms(self, category: str | None = None) -> list[tuple[Poly, Poly]]:
        """(bytes at this depth, bytes a unit more adds) of each instant: its total, or one
        category; those below another at every depth of N1 units or more left out.

        >>> from memcalc.engine.run import depth_form
        >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
        >>> form = depth_form(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8))
        >>> at, per_unit = form.terms("weights")[0]
        >>> per_unit.eval(1, 1) == 4 * (12 * 768 ** 2 + 13 * 768)  # one GPT-2 block's fp32 weights
        True
        """
        pick = (lambda m: m.total) if category is None else (lambda m: m.by_category.get(category, ZERO))
        back = self.layout.units - N1
        out = [(pick(m), pick(m.per_unit)) for m in self.moments]
        lifted = [Moment(m.phase, "", Poly({**{(k, 0): c for k, c in (v - d * back).terms.items()},
                                           **{(k, 1): c for k, c in d.terms.items()}}), {})
                  for m, (v, d) in zip(self.moments, out)]
        for m in lifted:
            m.phase = ""  # one frontier over every phase
        kept = {id(m) for m in replay(lifted)}
        seen, terms = set(), []
        for m, pair in zip(lifted, out):
            key = (tuple(sorted(pair[0].terms.items())), tuple(sorted(pair[1].terms.items())))
            if id(m) in kept and key not in seen:
                seen.add(key)
                terms.append(pair)
        return terms

