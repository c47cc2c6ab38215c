"""How a decoder stack decomposes for memcalc.engine.depth: p prefix layers, n identical units of
u layers (the program's layer period and the checkpoint segment's common multiple) and r layers
more; the small depths that are simulated (N1, N2, N3 units) and whether a step is derivable.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from memcalc.engine.regime import Regime, sqrt_segment_size
from memcalc.families import program_for
from memcalc.inputs.moe_routing import is_worst
from memcalc.inputs.specs import ModelSpec

N1, N2, N3 = 3, 4, 5
"""Units simulated: each instant is derived from the first two and checked at the third."""
ENDS = (0, 1, -2, -1)
"""The units whose instants are kept: the first and the last (which differ from the others: the
last backward use of the tensors every layer shares, FSDP's prefetch) and their neighbours,
between which the middle units' instants are affine in the unit's index."""


class NotRepeating(Exception):
    """The simulated depths do not repeat as derived (memcalc.engine.depth falls back)."""


@dataclass(frozen=True)
class Layout:
    """How a stack of `layers` decomposes: `prefix` layers unlike the rest (MoE models' dense
    first layers), then `units` repeats of `unit` layers, then `rest` (the pattern's start)."""

    unit: int
    rest: int
    units: int
    regime: Regime
    """The regime the small depths run: under 'sqrt' the segment size of this depth, as every-k."""
    prefix: int = 0

    def depth(self, n: int) -> int:
        """Layers of a stack of n units."""
        return self.prefix + n * self.unit + self.rest


def segment_size(regime: Regime, num_layers: int) -> int:
    """Layers per checkpoint segment (1 when no segments repeat).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> segment_size(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="sqrt")), 80)
    9
    """
    if regime.checkpointing == "every-k":
        return regime.checkpoint_every or 1
    return sqrt_segment_size(num_layers) if regime.checkpointing == "sqrt" else 1


def supported(regime: Regime, model: ModelSpec | None = None) -> bool:
    """Whether memcalc.engine.depth derives this step: every regime, except the fine-tuning and routing
    settings that single out some layers by index, which a few small depths cannot show (the
    depth is then simulated layer by layer): LoRA's layers_to_transform short of every layer,
    LoRA targets / modules_to_save / freeze patterns that could name a layer (a digit, or a
    freeze pattern's '?' or '[...]'), explicit MoE routing counts that differ between layers; and
    the eager experts' 'worst' routing bound (memcalc.inputs.moe_routing.worst_routings), whose per-expert
    storages carry their largest rounding outside the recorded sizes.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, use_cache=True)))
    True
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, freeze=("model.layers.1*",))))
    False
    """
    if regime.trl != "none":
        return False  # a second stack (the reference forward) after the policy's
    if any(re.search(r"[0-9?\[]", p) for p in regime.freeze):
        return False  # '*' alone spans a layer index whatever its digits: the same in every layer
    lora = regime.lora
    if lora is not None:
        named = (() if lora.targets == "all-linear" else lora.targets) + lora.modules_to_save
        if any(re.search(r"[0-9]", t) for t in named):
            return False  # a full module name (model.layers.3.mlp.up_proj) targets one layer
        if lora.layers is not None and (model is None or set(lora.layers) != set(range(model.num_layers))):
            return False
    routing = regime.moe_routing
    if regime.experts_implementation == "eager" and is_worst(routing):
        return False  # the bound's per-expert storages (Storage.count) are held at their largest
        # rounding and left out of the rounded sizes, which the recorded runs do not carry
    if not isinstance(routing, str) and not is_worst(routing):
        return len(set(routing)) <= 1  # measured counts: the same in every MoE layer
    return True


def layout(model: ModelSpec, regime: Regime) -> Layout:
    """The units of `model`'s stack under `regime`.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> t = TrainingConfig(micro_batch=1, seq_len=8, checkpointing="every-k", checkpoint_every=3)
    >>> lay = layout(ModelSpec.preset("gpt2"), Regime.of(t))
    >>> lay.unit, lay.units, lay.rest
    (3, 4, 0)
    """
    L = model.num_layers
    k = segment_size(regime, L)
    period = getattr(program_for(model), "layer_period", lambda _spec: 1)(model)
    prefix, unit = repeat(layer_kinds(model), math.lcm(max(1, int(period)), k))
    run_regime = replace(regime, checkpointing="every-k", checkpoint_every=k) \
        if regime.checkpointing == "sqrt" else regime
    return Layout(unit, (L - prefix) % unit, (L - prefix) // unit, run_regime, prefix)


def layer_kinds(model: ModelSpec) -> list[tuple[bool, bool, bool]]:
    """What the spec says of each decoder layer by its index: (slides, no rotary (NoPE), dense
    MLP in a mixture-of-experts stack). The layers repeat where these do (memcalc.engine.layout.repeat).

    >>> layer_kinds(ModelSpec.preset("gemma-2-2b"))[:3]
    [(True, False, False), (False, False, False), (True, False, False)]
    """
    dense = set(model.moe.dense_layers) if model.moe is not None else set()
    nope = set(model.no_rope_layers)
    return [(model.layer_is_sliding(i), i in nope, i in dense) for i in range(model.num_layers)]


def _period(seq: list) -> int:
    """The smallest u with seq[i] == seq[i + u] wherever both exist (Knuth-Morris-Pratt's
    failure function: len - the longest border).

    >>> _period("abcab"), _period("aaaa"), _period("ab")
    (3, 1, 2)
    """
    border = [0] * len(seq)
    for i in range(1, len(seq)):
        j = border[i - 1]
        while j and seq[i] != seq[j]:
            j = border[j - 1]
        border[i] = j + (seq[i] == seq[j])
    return len(seq) - (border[-1] if seq else 0)


def repeat(kinds: list, align: int) -> tuple[int, int]:
    """(prefix, unit): the layers from `prefix` on repeat every `unit` (a multiple of `align`,
    the program's period and the checkpoint segment, and prefix one too, so that segments start
    at a unit), choosing the fewest layers to simulate, prefix + N3 units, among those with
    more than N3 units.

    >>> repeat([1, 0, 0, 0, 0, 0, 0, 0], 1), repeat([0, 1] * 6, 1), repeat([0, 1] * 20, 3)
    ((1, 1), (0, 2), (0, 6))
    """
    if len(set(kinds)) <= 1:
        return 0, align
    best = (len(kinds) * (N3 + 1), 0, math.lcm(_period(kinds), align))  # (layers simulated, prefix, unit)
    for p in range(0, len(kinds), align):
        if p >= best[0]:
            break
        unit = math.lcm(_period(kinds[p:]), align)
        if (len(kinds) - p) // unit > N3:  # deep enough to derive (memcalc.engine.run)
            best = min(best, (p + N3 * unit, p, unit))
    return best[1], best[2]


def small_model(model: ModelSpec, lay: Layout, n: int) -> ModelSpec:
    """`model` at n units of `lay` (its first lay.depth(n) layers: the pattern of kinds from
    the prefix on repeats, so the rest runs as in the full stack); ValueError where the spec
    cannot say so (memcalc.core.errors.SpecError is one).

    >>> from memcalc.inputs.training import TrainingConfig
    >>> m = ModelSpec.preset("smollm3-3b")
    >>> small_model(m, layout(m, Regime.of(TrainingConfig(micro_batch=1, seq_len=8))), 3).no_rope_layers
    (3, 7, 11)
    """
    d = lay.depth(n)
    fields: dict = {"num_layers": d}
    if model.no_rope_layers:
        fields["no_rope_layers"] = tuple(i for i in model.no_rope_layers if i < d)
    if model.moe is not None and model.moe.dense_layers:
        fields["moe"] = model.moe.model_copy(update={"dense_layers": tuple(i for i in model.moe.dense_layers if i < d)})
    out = model.with_(**fields)
    if layer_kinds(out) != layer_kinds(model)[:d]:
        raise ValueError(f"{d} layers of this spec do not keep its layer pattern")
    return out
