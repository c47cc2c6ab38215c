"""ParamView: what the optimizer, clipping and the HF Trainer's groups see of a parameter, its decoder
layer's index replaced by '#'; memcalc.engine.simulation and memcalc.engine.depth both read it (here, below both,
so that neither imports the other; memcalc.engine.depth re-exports it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from memcalc.core.poly import Poly


@dataclass(frozen=True)
class ParamView:
    """What the optimizer, clipping and the HF Trainer's groups see of a parameter (memcalc.
    tape.step reads these fields of a graph's Values), its decoder layer's index replaced by
    '#' so that every unit's parameters compare equal."""

    nbytes: int
    elt: int
    rows: int
    label: str
    requires_grad: bool
    last2: tuple[int, int] | None = None  # memcalc.tape.graph.Value.last2

    @property
    def size(self) -> Poly:
        """Its bytes, as a Value's size."""
        return Poly.const(self.nbytes)


def param_view(v: object) -> ParamView:
    """The ParamView of a graph parameter (a memcalc.tape.graph.Value).

    >>> from memcalc.tape.graph import Graph
    >>> param_view(Graph().param("model.layers.12.mlp.up_proj.weight", Poly.const(8))).label
    'model.layers.#.mlp.up_proj.weight'
    """
    return ParamView(v.size.eval(1, 1), v.elt, v.rows, re.sub(r"\.\d+\.", ".#.", v.label, count=1),
                     v.requires_grad, v.last2)
