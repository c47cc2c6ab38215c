"""Depth as a symbol: any depth of a decoder stack from three small ones.

The layers of a decoder repeat (every layer alike, or a short pattern: what the spec says of
each layer by index, `layer_kinds`, and `layer_period` of the program), possibly after a prefix
of different layers (a MoE model's dense first layers), and a checkpointed stack repeats per
segment, so a stack of L = p + n*u + r layers is p prefix layers, n identical units of u layers
(u: the period and the checkpoint segment's common multiple; `repeat`) and r layers more, which
run with the suffix (a short last segment); the small depths are the stack's first layers
(`small_model`), so the pattern and the prefix stay as they are. Every instant of the step then has
a structural key: phase, micro-step, where in the program (before the stack, op `k` of a unit,
after the stack) and which mark there; and the instants of units 1 .. n-2 are affine in the
unit's index j and in n (saved activations of the j units before, gradients of the n-1-j after,
weights of all n), so the largest over them is that of unit 1 or n-2; units 0 and n-1 differ
(the last backward use of what every layer shares, FSDP's prefetch) and are kept as they are.

`derive` simulates n = 3, 4 and 5 units (every instant recorded, memcalc.tape.simulate.Memory
record mode, live storages counted per (category, size) and packed into one integer), takes each
instant of units 0, 1, n-2, n-1 and of the prefix and suffix as affine in n from n = 3 and 4, and
checks it at n = 5 exactly: the number of live storages of every (category, size), so totals,
categories and the CUDA allocator's per-storage rounding all follow, and the labels; at n = 5 it
also checks that unit 2's instants are exactly the interpolation of units 1 and 3. Storages
whose size grows with depth are paired across the depths (_growing); those that hold every
parameter at once, clipping's norms, the optimizer's temporaries and a memcalc.tape.
finetune_optim optimizer's first-step states, all of which follow the parameters one by one,
are added at each depth by memcalc.tape.step's own functions on that depth's parameters
(ParamView; Derivation.at).
Any mismatch (a program whose layers do not repeat with its declared period, a prefix of
different layers) gives None, and the engine simulates the depth itself: never a wrong answer.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable
from operator import ge

from memcalc.parallel.fsdp import padded_shard_bytes
from memcalc.core.poly import Poly
from memcalc.families import program_for
from memcalc.engine.regime import Regime, sqrt_segment_size
from memcalc.engine.simulation import StepRun, run_step
from memcalc.inputs.specs import ModelSpec
from memcalc.allocator.rules import round_up
from memcalc.tape import step
from memcalc.tape.finetune_optim import BNB
from memcalc.inputs.moe import is_worst
from memcalc.tape.param_view import ParamView, param_view  # noqa: F401 (param_view re-exported; memcalc.engine.simulation reads it)
from memcalc.tape.optimizer import clip_bytes
from memcalc.tape.simulate import Memory, Moment, _below_mix_dense, prune_convex_dense

FINETUNE_OPTIMIZERS = BNB + ("adafactor",)
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
    the eager experts' 'worst' routing bound (memcalc.inputs.moe.worst_routings), whose per-expert
    storages carry their largest rounding outside the recorded sizes.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, use_cache=True)))
    True
    >>> supported(Regime.of(TrainingConfig(micro_batch=1, seq_len=8, freeze=("model.layers.1*",))))
    False
    """
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
    MLP in a mixture-of-experts stack). The layers repeat where these do (memcalc.engine.depth.repeat).

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
        if (len(kinds) - p) // unit > N3:  # deep enough to derive (memcalc.engine.core)
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


# ---- moments as vectors ------------------------------------------------------------------------
Vec = dict
"""A moment as its live storages: {(category, size terms): how many}, zeros dropped. Every number
of the moment (total, each category, storages per size) is linear in these counts."""


def combine(u: Vec, v: Vec, x: int, y: int) -> Vec:
    """x*u + y*v, zeros dropped.

    >>> combine({("a", ()): 2}, {("a", ()): 1, ("w", ()): 1}, 1, -2)
    {('w', ()): -2}
    """
    out = {k: c * x for k, c in u.items()} if x != 1 else dict(u)
    for k, c in v.items():
        out[k] = out.get(k, 0) + c * y
    return {k: c for k, c in out.items() if c}


def expand(v: Vec, cats: tuple[str, ...], sizes: dict,
           terms_of: dict | None = None) -> tuple[Poly, dict[str, Poly], dict]:
    """(total, bytes per category in `cats` order, {size terms: storages}) of live storages
    (`terms_of`: each size's terms as pairs, _size_terms(sizes), when already made).

    >>> expand({("activations", ((1, 1),)): 3}, ("weights", "activations"), {((1, 1),): Poly.bs(2)})
    (Poly(6*b*s), {'weights': Poly(0), 'activations': Poly(6*b*s)}, {((1, 1),): 3})
    """
    if terms_of is None:
        terms_of = _size_terms(sizes)
    total: dict = {}
    by_cat: dict[str, dict] = {c: {} for c in cats}
    counts: dict[tuple, int] = {}
    for (cat, size), n in v.items():
        _add_storages(total, by_cat, counts, cat, size, n, terms_of)
    return _poly(total), {c: _poly(terms) for c, terms in by_cat.items()}, counts


def _expand_pair(base: Vec, second: Vec, cats: tuple[str, ...], terms_of: dict) -> tuple[tuple, tuple, Vec]:
    """(expand(base), expand(step), step) with step = combine(second, base, 1, -1), in one pass
    over each: step's storages in combine's order (second's, then those of base alone), each
    added up in that order as expand adds them up.

    >>> sizes = {((1, 1),): Poly.bs(2), ((0, 0),): Poly.const(4)}
    >>> base, second = {("w", ((0, 0),)): 1, ("a", ((1, 1),)): 2}, {("a", ((1, 1),)): 3, ("g", ((0, 0),)): 1}
    >>> _, (total, by_cat, counts), step = _expand_pair(base, second, ("w", "a"), _size_terms(sizes))
    >>> step == combine(second, base, 1, -1), total, by_cat["w"], counts
    (True, Poly(2*b*s), Poly(-4), {((1, 1),): 1, ((0, 0),): 0})
    """
    step: dict = {}
    total: dict = {}
    by_cat: dict[str, dict] = {c: {} for c in cats}
    counts: dict[tuple, int] = {}
    get = base.get
    for key, c2 in second.items():
        n = c2 - get(key, 0)
        if not n:
            continue
        step[key] = n
        _add_storages(total, by_cat, counts, *key, n, terms_of)
    b_total: dict = {}
    b_by_cat: dict[str, dict] = {c: {} for c in cats}
    b_counts: dict[tuple, int] = {}
    for key, n in base.items():
        _add_storages(b_total, b_by_cat, b_counts, *key, n, terms_of)
        if key in second or not n:
            continue
        step[key] = -n  # (only in base: combine's 0 - n, after second's storages)
        _add_storages(total, by_cat, counts, *key, -n, terms_of)
    return ((_poly(b_total), {c: _poly(t) for c, t in b_by_cat.items()}, b_counts),
            (_poly(total), {c: _poly(t) for c, t in by_cat.items()}, counts), step)


def _add_storages(total: dict, by_cat: dict, counts: dict, cat: str, size: tuple, n: int,
                  terms_of: dict) -> None:
    """Add n storages of one (category, size) to a total's, its category's and the size's
    counts (expand's sums, in its order; by_cat gains the category when first added).

    >>> total, by_cat, counts = {}, {}, {}
    >>> _add_storages(total, by_cat, counts, "a", "k", 2, {"k": (((1, 1), 3),)})
    >>> total, by_cat, counts
    ({(1, 1): 6}, {'a': {(1, 1): 6}}, {'k': 2})
    """
    terms = by_cat.get(cat)
    if terms is None:
        terms = by_cat[cat] = {}
    for mono, c in terms_of[size]:
        c *= n
        total[mono] = total.get(mono, 0) + c
        terms[mono] = terms.get(mono, 0) + c
    counts[size] = counts.get(size, 0) + n


def _size_terms(sizes: dict) -> dict:
    """Each size's terms as (monomial, coefficient) pairs, by its key in `sizes` (expand)."""
    return {k: tuple(p.terms.items()) for k, p in sizes.items()}


def _poly(terms: dict) -> Poly:
    """Poly(terms), taken as is where no coefficient is 0 (Poly._of)."""
    return Poly(terms) if 0 in terms.values() else Poly._of(terms)


def _label_at(first: str, second: str, n: int) -> str:
    """A label at n units from its labels at N1 and N2: numbers that differ (a layer's index in
    an FSDP group name) move by their difference per unit."""
    if first == second:
        return first
    a, b = re.split(r"(\d+)", first), re.split(r"(\d+)", second)
    if len(a) != len(b):
        raise NotRepeating(f"labels {first!r} and {second!r}")
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if i % 2 == 0:
            if x != y:
                raise NotRepeating(f"labels {first!r} and {second!r}")
            out.append(x)
        else:
            out.append(str(int(x) + (n - N1) * (int(y) - int(x))))
    return "".join(out)


class Family:
    """One instant of the step (before the stack, in one of the ENDS units, after it) at every
    depth: its live storages at N1 units and what each unit more adds."""

    __slots__ = ("phase", "where", "labels", "cats", "_vecs", "totals", "_step_vec", "_numbers")

    def __init__(self, phase: str, where: object, labels: tuple[str, str], cats: tuple[str, ...],
                 base: Vec | tuple, second: Vec | tuple, totals: tuple = (None, None)) -> None:
        self.phase, self.where, self.labels = phase, where, labels
        self.cats = cats
        """The categories seen so far, in the order they were first held (a freed one stays at 0)."""
        self._vecs = [base, second]
        """`base` and `second`, each a Vec or, recorded, (StepRun.live, stamp, packed): read
        back when first needed (most instants fall under others and never need theirs)."""
        self.totals = totals
        """Packed totals at N1 and N2 units (Memory.packed_total), when every size is integral."""
        self._step_vec: Vec | None = None
        self._numbers: tuple = ()

    def _vec(self, i: int) -> Vec:
        v = self._vecs[i]
        if not isinstance(v, dict):
            read, stamp, packed = v
            v = self._vecs[i] = read(stamp, packed)
        return v

    @property
    def base(self) -> Vec:
        """Its live storages at N1 units."""
        return self._vec(0)

    @property
    def second(self) -> Vec:
        """Its live storages at N2 units: `step` is what each unit more adds (computed when
        first read)."""
        return self._vec(1)

    @property
    def step(self) -> Vec:
        """What each unit more adds to its live storages."""
        found = self._step_vec
        if found is None:
            found = self._step_vec = combine(self.second, self.base, 1, -1)
        return found

    def vec(self, n: int) -> Vec:
        """Its live storages at n units."""
        return combine(self.base, self.step, 1, n - N1)

    def expanded(self, sizes: dict, terms_of: dict | None = None) -> None:
        """Precompute the numbers of `base` and `step` (what `moment` adds up; `terms_of`:
        _size_terms(sizes), when already made)."""
        if terms_of is None:
            terms_of = _size_terms(sizes)
        if self._step_vec is None:  # `step` made on the way (_expand_pair)
            base, step, self._step_vec = _expand_pair(self.base, self.second, self.cats, terms_of)
            self._numbers = (base, step)
        else:
            self._numbers = (expand(self.base, self.cats, sizes, terms_of),
                             expand(self.step, self.cats, sizes, terms_of))

    def moment(self, n: int, sizes: dict, slope: bool = True) -> Moment:
        """The instant at n units (with its growth per unit, `per_unit`, for the formula in L)."""
        ((total, cats, _), (d_total, d_cats, _)), x = self._numbers, n - N1
        m = Moment(self.phase, _label_at(*self.labels, n), _affine(total, d_total, x),
                   {c: _affine(p, d_cats[c], x) for c, p in cats.items()},
                   _storages(self._live(x), sizes, x))
        if slope:
            m.per_unit = Moment(self.phase, m.label, d_total, d_cats)
        return m

    def _live(self, x: int) -> dict:
        """Its live storages per size x units past N1; NotRepeating where a count would be
        negative."""
        counts, d_counts = self._numbers[0][2], self._numbers[1][2]
        live = {k: counts.get(k, 0) + x * d_counts.get(k, 0) for k in {**counts, **d_counts}} if x else counts
        if any(c < 0 for c in live.values()):
            raise NotRepeating("a negative number of storages")
        return live

    def total(self, n: int) -> Poly:
        """Its total at n units (`moment`'s, without the moment: the same NotRepeating)."""
        (total, _, _), (d_total, _, _) = self._numbers
        self._live(n - N1)
        return _affine(total, d_total, n - N1)


def _affine(p: Poly, d: Poly, x: int) -> Poly:
    """p + d * x (p itself where d * x is zero: a Poly is never changed in place).

    >>> _affine(Poly.const(3), Poly.bs(2), 2), _affine(Poly.const(3), Poly(), 2)
    (Poly(3 + 4*b*s), Poly(3))
    """
    if not x or not d.terms:
        return p
    out = dict(p.terms)
    for mono, c in d.terms.items():
        out[mono] = out.get(mono, 0) + c * x
    return Poly(out)


def _storages(live: dict, sizes: dict, x: int) -> tuple:
    """(size, live storages of it) for the allocator's rounding: a growing storage (one whose
    size grows with depth, _growing) at its size x units past N1; its growth key is no storage."""
    out = []
    for k, c in live.items():  # k: size terms (pairs), ("grow", i) or ("grow-d", i)
        if not c or not k:
            continue
        head = k[0]
        if head == "grow":
            out.append((sizes[k] + sizes["grow-d", k[1]] * x, c))
        elif head != "grow-d":
            out.append((sizes[k], c))
    return tuple(out)


def _growing(runs: list[StepRun], sizes: dict) -> None:
    """Storages whose size grows with depth (a causal-mask buffer of every layer, (L, P, P)):
    a size seen at one depth only, paired with one at each other depth, the sizes affine in
    n. Each is rewritten in the runs' logs as ("grow", i) (its size at N1) and ("grow-d", i),
    counted n - N1 times per storage (its growth per unit), so that every number stays linear
    in the live counts; `sizes` gets both."""
    keys = [set(run.sizes) for run in runs]
    alone = [sorted(k - keys[(i + 1) % 3] - keys[(i + 2) % 3], key=lambda k: runs[i].sizes[k].eval(1, 1))
             for i, k in enumerate(keys)]
    if not len(alone[0]) == len(alone[1]) == len(alone[2]):
        raise NotRepeating("storage sizes that do not pair across depths")
    if alone[0]:  # every mark's live storages read back, its `packed` stale once rewritten
        for run in runs:
            run.moments = [entry[:3] + (run.live(*entry[3:5]), None) + entry[5:] for entry in run.moments]
    for i, (k1, k2, k3) in enumerate(zip(*alone)):
        p1, p2, p3 = (run.sizes[k] for run, k in zip(runs, (k1, k2, k3)))
        if (p2 - p1).terms != (p3 - p2).terms:
            raise NotRepeating("a storage whose size is not affine in depth")
        sizes["grow", i], sizes["grow-d", i] = p1, p2 - p1
        for run, k, n in zip(runs, (k1, k2, k3), (N1, N2, N3)):
            for _, _, _, live, _, _ in run.moments:
                for cat, size in [key for key in live if key[1] == k]:
                    c = live.pop((cat, size))
                    live[cat, ("grow", i)] = c
                    if n != N1:
                        live[cat, ("grow-d", i)] = c * (n - N1)


# ---- the structure of one simulated depth ------------------------------------------------------
def _positions(run: StepRun, lay: Layout, n: int) -> tuple[Callable, dict]:
    """A function from a mark's `where` to (position key, unit index or None), and its values
    at the nodes before and in the units (each node is marked in forward), by node index."""
    starts = run.layer_starts
    if len(starts) != lay.depth(n) + 1:
        raise NotRepeating("the program does not mark its layers")
    edges = [starts[lay.prefix + j * lay.unit] for j in range(n + 1)]
    width = edges[1] - edges[0]
    if any(b - a != width for a, b in zip(edges, edges[1:])):
        raise NotRepeating("units of different lengths")

    def node(i: int) -> tuple[tuple, int | None]:
        if i < edges[0]:
            return ("pre", i), None
        if i >= edges[-1]:
            return ("post", i - edges[-1]), None
        return ("unit", (i - edges[0]) % width), (i - edges[0]) // width

    def where(w: object) -> tuple[object, int | None]:
        if isinstance(w, int):
            return node(w)
        if isinstance(w, tuple):
            (ka, ja), (kb, jb) = known.get(w[0]) or node(w[0]), known.get(w[1]) or node(w[1])
            if ja != jb:
                raise NotRepeating("a recomputation across units")
            return (ka, kb), ja
        return w, None

    first = edges[0]
    known = {i: (("pre", i), None) for i in range(first)}
    places = [("unit", r) for r in range(width)]  # (node's values, each key made once)
    known.update(zip(range(first, edges[-1]), ((pos, j) for j in range(n) for pos in places)))
    return where, known


def _families(run: StepRun, lay: Layout, n: int, ordered: bool = True) -> tuple[dict, list]:
    """{family key: {unit or None: its mark}} of a recorded run (Memory.log's entries: key,
    label, categories, live storages, packed, packed total; the live storages a Vec where
    `packed` is None, _growing, else the mark's stamp, which StepRun.live reads back), and the
    (key, unit, mark) step order (when `ordered`, else [])."""
    where, cache = _positions(run, lay, n)
    out: dict[tuple, dict] = {}
    order: list = []
    add = order.append
    get = out.get
    for entry in run.moments:
        phase, micro, w, count = entry[0]
        found = cache.get(w)
        if found is None:  # each mark's place is looked up once per node (forward, backward)
            found = cache[w] = where(w)
        pos, j = found
        key = (phase, micro, pos, count)
        members = get(key)
        if members is None:
            out[key] = {j: entry}
        elif j in members:
            raise NotRepeating(f"two instants at {key}")
        else:
            members[j] = entry
        if ordered:
            add((key, j, entry))
    for key, members in out.items():
        if None not in members and len(members) != n and any(j not in members for j in range(2, n - 2)):
            raise NotRepeating(f"instant {key} not in every middle unit")
    return out, order


def _absent(members: dict, n: int) -> frozenset:
    """The ENDS units an instant is not in (the first unit's backward prefetches no next group)."""
    return frozenset(e for e in ENDS if e % n not in members)


@dataclass
class _Params:
    """The parameters of a depth, as memcalc.tape.step's functions read a Graph."""

    params: list[ParamView]

    @property
    def trainable_params(self) -> list[ParamView]:
        return [v for v in self.params if v.requires_grad]


@dataclass
class Derivation:
    """Every instant of a step at any number of units, and the parameters."""

    layout: Layout
    steady: list[Family]
    first: list[Family]
    sizes: dict[tuple, Poly]
    params: tuple[list, list, list]
    """ParamViews before the units, of one unit (repeated), and after."""
    _outsides: dict = field(default_factory=dict, repr=False, compare=False)
    """_outside by number of units, the last few asked (at(n) reads n and n + 1)."""

    def at(self, n: int) -> tuple[list[Moment], list[Moment], list[tuple[int, int]]]:
        """(steady moments, first-step moments, parameter shapes) at n units, in step order; the
        storages the recorded runs leave out (DDP buckets, FSDP shards, clipping's and the
        optimizer's temporaries) follow the parameters, so each steady moment's `per_unit` gets
        their growth to n+1."""
        steady, first, shapes = self._at(n)
        here, deeper = self._outside_at(n), self._outside_at(n + 1)
        for m in steady:
            for kind in getattr(m, "outside", ()):
                grow = deeper[kind][1] - here[kind][1]
                if m.per_unit is not None and grow:
                    d, category = Poly.const(grow), here[kind][0]
                    m.per_unit.total = m.per_unit.total + d
                    m.per_unit.by_category = {**m.per_unit.by_category,
                                              category: m.per_unit.by_category.get(category, Poly()) + d}
        return steady, first, shapes

    def steady_totals(self, n: int) -> list[Poly]:
        """The totals of the steady moments at n units, at(n)[0]'s, without building the
        moments (memcalc.engine.core._checked_form).

        >>> from memcalc.inputs.training import TrainingConfig
        >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, max_grad_norm=1.0))
        >>> d = derive(ModelSpec.preset("gpt2"), layout(ModelSpec.preset("gpt2"), regime))
        >>> [t.terms for t in d.steady_totals(13)] == [m.total.terms for m in d.at(13)[0]]
        True
        """
        outside = self._outside_at(n)
        out = []
        for f in self.steady:
            total = f.total(n)
            for parts in self._variants(f, outside, True):
                extra = sum(outside[kind][1] for kind in parts if kind in ("buckets", "sharded", "temp", "clip"))
                out.append(total + Poly.const(extra) if extra else total)
        return out

    def _outside_at(self, n: int) -> dict[str, tuple[str, int]]:
        found = self._outsides.get(n)
        if found is None:
            if len(self._outsides) > 8:
                self._outsides.clear()
            found = self._outsides[n] = self._outside(self._graph(n))
        return found

    def _variants(self, f: Family, outside: dict, slope: bool) -> list[list[str]]:
        """The moments an instant gives at one depth, each as the storages the recorded runs
        left out that it holds ('first': the first step's states come one by one, 'freed': a
        temporary freed, its category at 0)."""
        regime = self.layout.regime
        kinds = [k for k in ("buckets", "sharded") if outside[k][1]]
        if f.where != "optimizer":
            return [kinds]
        if f.labels[0] == "clip_grad_norm_":
            return [kinds + ["clip"]]
        if not slope and regime.optimizer in FINETUNE_OPTIMIZERS and regime.data_parallel == 1:
            return [kinds + ["first"]]  # the first step's states come one by one
        temp, clip = outside["temp"][1], outside["clip"][1]  # memcalc.tape.step: temporaries held, then freed
        return ([kinds + ["temp"]] if temp else []) + [kinds + (["freed"] if temp or clip else [])]

    def _graph(self, n: int) -> _Params:
        before, one, after = self.params
        return _Params(before + one * (n - N1) + after)

    def _outside(self, graph: _Params) -> dict[str, tuple[str, int]]:
        """{kind: (category, bytes)} of the storages the recorded runs leave out, at one depth:
        DDP's buckets and FSDP's shards (memcalc.engine.simulation.run_step), clipping's norms and the
        optimizer's temporaries in the steady state (memcalc.tape.step, its own functions)."""
        regime = self.layout.regime
        sizes = [v.nbytes for v in graph.params]
        buckets = sum(sizes) if regime.replicated else 0
        sharded = (regime.master_elt // regime.param_elt) * sum(
            padded_shard_bytes(v.nbytes, v.rows, regime.data_parallel) for v in graph.params) \
            if regime.fsdp else 0
        temp = 0
        if regime.data_parallel == 1 and regime.optimizer in FINETUNE_OPTIMIZERS:
            temp = max(step._finetune_temporaries(graph, regime), default=0)
        elif regime.data_parallel == 1:
            temp = step._transient(graph, regime)
        clip = clip_bytes([n for n, _ in step._shapes(graph)], step.trainable_elt(graph), regime.device,
                          regime.granularity) if regime.max_grad_norm is not None else 0
        return {"buckets": ("ddp_buckets", buckets), "sharded": ("weights", sharded),
                "temp": ("temporaries", temp), "clip": ("temporaries", clip)}

    def _first_optimizer(self, m: Moment, graph: _Params, clipped: bool) -> list[Moment]:
        """The first step's optimizer.step of a memcalc.tape.finetune_optim optimizer from the
        moment with every state held (memcalc.tape.step._finetune_optimizer): states are created
        parameter by parameter, the peak at the parameter k maximising states(0..k) plus its
        temporaries, so the states after k are not yet there."""
        regime = self.layout.regime
        temps = step._finetune_temporaries(graph, regime)
        out = []
        if temps:
            _, per = step._finetune_states(graph, regime)
            cum, best = 0, None
            for i, sts in enumerate(per):
                cum += sum(round_up(st.size.eval(1, 1), regime.granularity) for st in sts)
                if best is None or cum + temps[i] > best[0]:
                    best = (cum + temps[i], i)
            k = best[1]
            if temps[k]:
                early = Moment(m.phase, m.label, m.total, dict(m.by_category), m.sizes)
                _remove(early, "optimizer", [st.size.eval(1, 1) for sts in per[k + 1:] for st in sts])
                _add(early, "temporaries", temps[k])
                out.append(early)
        if out or clipped:  # a freed temporary leaves its category at 0
            _add(m, "temporaries", 0)
        return out + [m]

    def _at(self, n: int) -> tuple[list[Moment], list[Moment], list[tuple[int, int]]]:
        graph = self._graph(n)
        outside = self._outside_at(n)
        clip = outside["clip"][1]
        out = []
        for families, slope in ((self.steady, True), (self.first, False)):
            moments = []
            for f in families:
                for parts in self._variants(f, outside, slope):
                    m = f.moment(n, self.sizes, slope)
                    for kind in parts:
                        if kind in ("buckets", "sharded", "temp", "clip"):
                            _add(m, *outside[kind])
                        elif kind == "freed":
                            _add(m, "temporaries", 0)
                    m.outside = [k for k in parts if k in outside]
                    moments.extend(self._first_optimizer(m, graph, bool(clip)) if "first" in parts else [m])
            out.append(moments)
        regime = self.layout.regime
        return out[0], out[1], [(v.nbytes // regime.param_elt, v.rows) for v in graph.params]


def _remove(m: Moment, category: str, sizes: list[int]) -> None:
    """Storages of these byte sizes, alive at `m`, not there after all."""
    if not sizes:
        return
    const = Poly.const(sum(sizes))
    m.total = m.total - const
    m.by_category = {**m.by_category, category: m.by_category[category] - const}
    drop: dict[int, int] = {}
    for nbytes in sizes:
        drop[nbytes] = drop.get(nbytes, 0) + 1
    kept = []
    for p, c in m.sizes:
        nbytes = p.eval(1, 1) if set(p.terms) <= {(0, 0)} else None
        take = min(c, drop.get(nbytes, 0)) if nbytes is not None else 0
        if take:
            drop[nbytes] -= take
        if c - take:
            kept.append((p, c - take))
    if any(drop.values()):
        raise NotRepeating("first-step states that the moment does not hold")
    m.sizes = tuple(kept)


def _add(m: Moment, category: str, nbytes: int) -> None:
    """One storage of `nbytes` alive at `m` that the recorded runs leave out (DDP's gradient
    buckets, the optimizer's temporaries; memcalc.engine.simulation.run_step); 0 bytes: the category
    has been seen (a freed storage leaves its category at 0)."""
    const = Poly.const(nbytes)
    m.total = m.total + const
    m.by_category = {**m.by_category, category: m.by_category.get(category, Poly()) + const}
    if nbytes:
        m.sizes = m.sizes + ((const, 1),)


def _derive_moments(runs: list[StepRun], lay: Layout) -> list[tuple]:
    """The instants of three recorded runs (N1, N2, N3 units), checked; in step order, each as
    (family key, its mark at N1 units, at N2 units) (Memory.log's entries, _families), which
    _family makes a Family of (most instants fall under others and never need one)."""
    (f1, _), (f2, _), (f3, order3) = (_families(run, lay, n, n == N3) for run, n in zip(runs, (N1, N2, N3)))
    if f1.keys() != f2.keys() or f1.keys() != f3.keys():
        raise NotRepeating("different instants at different depths")
    for key, members in f1.items():  # each instant in the same ENDS units at every depth
        if None in members:
            continue
        m2, m3 = f2[key], f3[key]
        if len(members) == N1 and len(m2) == N2 and len(m3) == N3:  # in every unit
            continue
        if not _absent(members, N1) == _absent(m2, N2) == _absent(m3, N3):
            raise NotRepeating(f"instant {key} in different units at different depths")
    units = {end % N3: (end % N1, end % N2) for end in ENDS}  # its unit at N3 -> at N1 and N2
    units[None] = (None, None)  # (before or after the units)
    out = []
    add = out.append
    for key, j, (_, l3, c3, v3, p3, _) in order3:  # each kept instant of ENDS units once
        found = units.get(j)
        if found is None:  # a middle unit's (_check_middle)
            continue
        j1, j2 = found
        e1, e2 = f1[key][j1], f2[key][j2]
        _, l1, c1, v1, p1, _ = e1
        _, l2, c2, v2, p2, _ = e2
        if p1 is not None and p2 is not None and p3 is not None:
            on_line = p1 + p3 == p2 << 1  # _on_line's test on the packed counts
        else:
            on_line = _on_line((v1, p1), (v2, p2), (v3, p3), 1, 1, 2)
        if not on_line or (l3 != l1 if l1 == l2 else _label_at(l1, l2, N3) != l3) or not c1 == c2 == c3:
            raise NotRepeating(f"instant {key} not affine in depth")
        add((key, e1, e2))
    _check_middle(f3, N3)  # (N1 and N2 units have no middle unit between the second and second-last)
    return out


def _family(instant: tuple, read1: Callable, read2: Callable) -> Family:
    """The Family of one of _derive_moments' instants (`read1`, `read2`: the runs' StepRun.live
    at N1 and N2 units)."""
    key, (_, l1, c1, v1, p1, t1), (_, l2, _, v2, p2, t2) = instant
    return Family(key[0], key[2], (l1, l2), c1, v1 if p1 is None else (read1, v1, p1),
                  v2 if p2 is None else (read2, v2, p2), (t1, t2))


def _first_step(steady: list[Family], states: tuple[Vec, Vec]) -> list[Family]:
    """The first step's instants: the steady state's without the optimizer states (`states`:
    at N1 units and a unit's more) before optimizer.step() creates them, that is in forward,
    backward and clip_grad_norm_ (memcalc.tape.step; a bitsandbytes optimizer's CPU qmaps,
    made with the optimizer, stay), the same from there on."""
    out = []
    for fam in steady:
        if fam.phase in ("forward", "backward") or fam.labels[0] == "clip_grad_norm_":
            base, per = combine(fam.base, states[0], 1, -1), combine(fam.step, states[1], 1, -1)
            if any(c < 0 for c in base.values()):
                raise NotRepeating("states the steady state does not hold")
            cats = fam.cats if any(k[0] == "optimizer" for k in base) else \
                tuple(c for c in fam.cats if c != "optimizer")
            fam = Family(fam.phase, fam.where, fam.labels, cats, base, combine(base, per, 1, 1))
        out.append(fam)
    return out


def _unpack_dense(x: int, k: int) -> tuple:
    """The first k balanced digits of a packed total (Memory.packed_total): its coefficient of
    each monomial, in the order of their slots, zeros included.

    >>> _unpack_dense(5 - (3 << Memory.TOTAL_SLOT), 3)
    (5, -3, 0)
    """
    out, slot = [], Memory.TOTAL_SLOT
    mask, half, full = (1 << slot) - 1, 1 << (slot - 1), 1 << slot
    for _ in range(k):
        d = x & mask
        if d >= half:
            d -= full
        out.append(d)
        x = (x - d) >> slot
    return tuple(out)


def _frontier(instants: list[tuple], sizes: dict, index: dict | None, reads: tuple,
              terms_of: dict | None = None) -> list[Family]:
    """The families Memory.mark would keep at every depth of N1 units or more, of
    _derive_moments' instants (`reads`: the runs' StepRun.live at N1 and N2 units, _family):
    compared on their totals lifted to (b, s, n) (base coefficients, and per-unit ones, which
    n - N1 >= 0 multiplies), so a dropped one is below a kept one (or a mix of two) at every
    depth."""
    k = sum(1 for key in index or {} if key[0] == "mono")
    # each optimizer-phase instant its own frontier: memcalc.engine.depth.Derivation adds clipping's or
    # the optimizer's temporaries to one or the other, so neither may stand for the other
    phases = [(key[0], i) if key[0] == "optimizer" else key[0] for i, (key, _, _) in enumerate(instants)]
    totals = [(e1[5], e2[5]) for _, e1, e2 in instants]
    if index is not None and all(t1 is not None and t2 is not None for t1, t2 in totals):
        lifted = _lifted(totals, k)
        if lifted is not None:
            kept = _kept_packed(lifted, totals, k, phases)
        else:
            kept = _kept([_unpack_dense(t1, k) + _unpack_dense(t2 - t1, k) for t1, t2 in totals], phases)
    else:
        if terms_of is None:
            terms_of = _size_terms(sizes)
        families = [_family(instant, *reads) for instant in instants]
        lifted = []
        for fam in families:
            terms: dict = {}
            for part, v in ((0, fam.base), (1, fam.step)):
                for (_, size), n in v.items():
                    for mono, c in terms_of[size]:
                        terms[mono, part] = terms.get((mono, part), 0) + n * c
            lifted.append(terms)
        columns: dict = {}
        for terms in lifted:
            for key in terms:
                columns.setdefault(key, len(columns))
        kept = _kept([tuple(terms.get(key, 0) for key in columns) for terms in lifted], phases)
        return _expanded([fam for i, fam in enumerate(families) if i in kept], sizes, terms_of)
    return _expanded([_family(instants[i], *reads) for i in sorted(kept)], sizes, terms_of)


def _expanded(out: list[Family], sizes: dict, terms_of: dict | None = None) -> list[Family]:
    """`out`, each family's numbers precomputed (Family.expanded; `terms_of`: _size_terms(sizes))."""
    if terms_of is None:
        terms_of = _size_terms(sizes)
    for fam in out:
        fam.expanded(sizes, terms_of)
    return out


LIFT_BIAS = 180
"""memcalc.engine.depth._lifted: each coefficient of a lifted total is held as itself + 2**LIFT_BIAS in
its Memory.TOTAL_SLOT bits, so under 2**LIFT_BIAS in size it leaves the slot's top bits clear
(a guard bit for comparing all slots with one subtraction, and room for sums of slots)."""


def _lifted(totals: list[tuple[int, int]], k: int) -> tuple[list[int], list[int], int] | None:
    """The packed totals (Memory.packed_total) at N1 and N2 units of each family as one
    integer of 2k slots, the coefficients of its total lifted to (b, s, n) (_unpack_dense(t1, k)
    + _unpack_dense(t2 - t1, k), what _kept compares) each biased by 2**LIFT_BIAS, so that
    one integer subtraction compares every coefficient (_kept_packed); with each one's sum of
    coefficients and the guard bits. None where a coefficient is 2**LIFT_BIAS or more in size
    (then _kept compares the tuples).

    >>> t1, t2 = 5 - (3 << Memory.TOTAL_SLOT), 7 - (3 << Memory.TOTAL_SLOT)
    >>> xs, sums, guard = _lifted([(t1, t2)], 2)
    >>> sums, _unpack_dense(xs[0] - (guard >> (Memory.TOTAL_SLOT - 1 - LIFT_BIAS)), 4)
    ([4], (5, -3, 2, 0))
    """
    slot, width = Memory.TOTAL_SLOT, Memory.TOTAL_SLOT * k
    if 2 * k >= 1 << (slot - 2 - LIFT_BIAS):
        return None
    ones = sum(1 << (slot * i) for i in range(2 * k))  # 1 in every slot
    bias, guard = ones << LIFT_BIAS, ones << (slot - 1)
    clear = ones * (((1 << slot) - 1) ^ ((1 << (LIFT_BIAS + 1)) - 1))  # bits LIFT_BIAS+1 .. slot-1
    low, top, bias_k, modulus = (1 << width) - 1, 1 << (2 * width), bias & ((1 << width) - 1), (1 << slot) - 1
    half = modulus >> 1
    xs, sums = [], []
    for t1, t2 in totals:
        x = t1 + ((t2 - t1) << width) + bias
        if not 0 <= x < top or x & clear or (x & low) - bias_k != t1:
            return None
        xs.append(x)
        # the coefficients' sum: t2 = t1 + (t2 - t1) is the sum of digits * 2**(slot * i), and
        # 2**slot is 1 modulo 2**slot - 1; every digit under 2**LIFT_BIAS, the sum is too small
        # for the modulus to wrap it (2k slots, k monomials: far under 2**(slot - 2 - LIFT_BIAS))
        r = t2 % modulus
        sums.append(r - modulus if r > half else r)
    return xs, sums, guard


def _kept_packed(lifted: tuple[list[int], list[int], int], totals: list[tuple[int, int]], k: int,
                 phases: list) -> set[int]:
    """_kept on the integers of _lifted: the same order (largest sum first, step order among
    equal ones), the same dominance test (x >= v in every slot: (x | guard) - v keeps every guard
    bit, no slot borrowing from the next, each biased coefficient under 2**(slot - 1)) and the
    same convex pruning (_Pruning, prune_convex_dense's). A new total is never above a kept one
    without being equal to it (the kept ones' sums are at least its own), so _kept's removal of
    the kept ones below it has nothing to remove here."""
    xs, sums, guard = lifted
    dense: dict[int, tuple] = {}

    def tuple_of(i: int) -> tuple:
        found = dense.get(i)
        if found is None:
            t1, t2 = totals[i]
            found = dense[i] = _unpack_dense(t1, k) + _unpack_dense(t2 - t1, k)
        return found

    frontiers: dict[object, _Pruning] = {}
    guarded: dict[object, list[int]] = {}  # the frontier's integers, guard bits set
    last: dict[object, int] = {}  # the kept one found above the one before (tried first)
    for i in sorted(range(len(xs)), key=[-t for t in sums].__getitem__):  # (stable: step order among equal sums)
        phase, v = phases[i], xs[i]
        above = guarded.get(phase)
        if above is None:
            above = guarded[phase] = []
            frontiers[phase] = _Pruning(xs, guard, tuple_of)
        x = last.get(phase)
        if x is not None and (x - v) & guard == guard:
            continue
        for x in above:
            if (x - v) & guard == guard:
                last[phase] = x
                break
        else:
            frontier = frontiers[phase]
            frontier.kept.append(i)
            above.append(v | guard)
            if len(frontier.kept) >= Memory.PRUNE_AT:
                frontier.prune()
                above[:] = [xs[j] | guard for j in frontier.kept]
                last.pop(phase, None)  # (it may be gone)
    return {i for frontier in frontiers.values() for i in frontier.kept}


class _Pruning:
    """One frontier of _kept_packed and its convex pruning, prune_convex_dense's result (the
    same test of each kept total, in the same order, against every pair of the others) without
    repeating what an earlier pruning showed: a total that stayed was under no mix of two
    others then (each pair failed), those that stayed with it are among them, and a frontier
    only grows between prunings, so only the pairs with a total added since are tested again.
    prune_convex_dense's masks of the coefficients where one total is at least another are the
    guard bits of _kept_packed's subtraction (one bit per coefficient, in other places)."""

    def __init__(self, xs: list[int], guard: int, tuple_of: Callable[[int], tuple]) -> None:
        self.kept: list[int] = []
        self.settled: set[int] = set()
        """The totals left by the last pruning: no pair of these holds one of them below it."""
        self._xs, self._guard, self._tuple = xs, guard, tuple_of

    def prune(self) -> None:
        """prune_convex_dense on the kept totals (in the same order, the same test, the same
        ones dropped)."""
        kept, xs, full = self.kept, self._xs, self._guard
        i = 0
        while i < len(kept):
            b = kept[i]
            others = kept[:i] + kept[i + 1:]
            v = xs[b]
            if self._below_a_mix(b, others, [((xs[x] | full) - v) & full for x in others]):
                kept.pop(i)
            else:
                i += 1
        self.settled = set(kept)

    def _below_a_mix(self, b: int, others: list[int], covers: list[int]) -> bool:
        """Whether total b is under a mix of two of `others` (`covers`: where each is at least
        b), as prune_convex_dense tests it: the pairs that cover b together, by _below_mix_dense
        (for one left by the last pruning, only those with a total added since)."""
        settled, full, tuple_of, n = self.settled, self._guard, self._tuple, len(others)
        fresh = [j for j in range(n) if others[j] not in settled] if b in settled else None
        dense = tuple_of(b)
        for j in range(n):
            cj = covers[j]
            if fresh is not None and others[j] in settled:  # (the pairs of two settled ones failed)
                ms = [m for m in fresh if m > j and cj | covers[m] == full]
            else:
                ms = [m for m in range(j + 1, n) if cj | covers[m] == full]
            if ms:
                tj = tuple_of(others[j])
                for m in ms:
                    if _below_mix_dense(dense, tj, tuple_of(others[m])):
                        return True
        return False


def _kept(dense: list[tuple], phases: list) -> set[int]:
    """Indices of the totals memcalc.tape.simulate.replay keeps (dominance, then the convex
    pruning), on dense coefficient tuples: largest first (at b = s = 1, n = N1 + 1) so the
    frontier stays small, equal totals in step order so the earliest is kept, as Memory.mark
    keeps it."""
    frontiers: dict[object, list[int]] = {}
    for i in sorted(range(len(dense)), key=lambda i: -sum(dense[i])):
        frontier, v = frontiers.setdefault(phases[i], []), dense[i]
        if any(all(map(ge, dense[j], v)) for j in frontier):
            continue
        frontier[:] = [j for j in frontier if not all(map(ge, v, dense[j]))] + [i]
        if len(frontier) >= Memory.PRUNE_AT:
            frontier[:] = [frontier[j] for j in prune_convex_dense([dense[j] for j in frontier])]
    return {i for frontier in frontiers.values() for i in frontier}


def _on_line(u: tuple, v: tuple, w: tuple, x: int, y: int, z: int) -> bool:
    """x*u + y*w == z*v for (live storages, packed) instants (v lies on the line through u
    and w), x, y, z >= 0: on the packed integers when all three have one (each count is under
    2**30 and x, y, z small, so no digit carries into the next: equal integers are equal
    counts), else key by key.

    >>> _on_line(({"a": 1}, 1), ({"a": 2}, 2), ({"a": 3}, 3), 1, 1, 2)
    True
    >>> _on_line(({"a": 1}, None), ({"a": 2}, None), ({}, None), 1, 1, 2)
    False
    """
    if u[1] is not None and v[1] is not None and w[1] is not None:
        return x * u[1] + y * w[1] == z * v[1]
    u, v, w = u[0], v[0], w[0]
    get_u, get_v, get_w = u.get, v.get, w.get
    return all(x * get_u(k, 0) + y * get_w(k, 0) == z * get_v(k, 0) for k in {**u, **v, **w})


def _check_middle(fams: dict, n: int) -> None:
    """Every middle unit's instant is the interpolation of the second and the second-last
    unit's: (n-3) * M_j == (n-2-j) * M_1 + (j-1) * M_(n-2), so the largest is at an end."""
    if n <= 4:
        return
    for key, members in fams.items():
        if None in members:
            continue
        if 1 not in members or n - 2 not in members:
            raise NotRepeating(f"instant {key} in the middle units only")
        first, last = members[1], members[n - 2]
        for j in range(2, n - 2):
            mid = members[j]
            if first[4] is not None and mid[4] is not None and last[4] is not None:  # _on_line's test
                on_line = (n - 2 - j) * first[4] + (j - 1) * last[4] == (n - 3) * mid[4]
            else:
                on_line = _on_line(first[3:5], mid[3:5], last[3:5], n - 2 - j, j - 1, n - 3)
            if not on_line:
                raise NotRepeating(f"instant {key} not affine across units")


def _derive_shapes(shapes: list[list]) -> tuple[list, list, list]:
    """Parameters as before + one unit's * n + after, from N1 and N2 units, checked at N3."""
    p1, p2, p3 = shapes
    a = 0  # the longest common start, then one unit's parameters inserted
    while a < len(p1) and p1[a] == p2[a]:
        a += 1
    d = len(p2) - len(p1)
    one = p2[a:a + d]
    if d < 0 or p2[a + d:] != p1[a:] or p1[:a] + one * (N3 - N1) + p1[a:] != p3:
        raise NotRepeating("parameters do not repeat")
    return p1[:a], one, p1[a:]


def derive(model: ModelSpec, lay: Layout) -> Derivation | None:
    """The derivation for `model`'s stack layout, or None when its depths do not repeat.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, checkpointing="per-layer"))
    >>> model = ModelSpec.preset("gpt2")
    >>> d = derive(model, layout(model, regime))
    >>> steady, first, shapes = d.at(12)
    >>> len(shapes)
    148
    """
    try:  # a spec tied to its depth (no_rope_layers naming layer 7) has no smaller one: simulate
        models = [small_model(model, lay, n) for n in (N1, N2, N3)]
    except ValueError:  # memcalc.core.errors.SpecError, pydantic's ValidationError
        return None
    try:
        index: dict = {}  # one numbering of (category, size) for the three runs' packed counts
        steady = [run_step(m, lay.regime, False, record=index, whole=False) for m in models]
        sizes = {k: p for run in steady for k, p in run.sizes.items()}
        _growing(steady, sizes)
        params = [run.params for run in steady]
        v1, v2, v3 = (run.states for run in steady)
        if not _on_line((v1, None), (v2, None), (v3, None), 1, 1, 2):
            raise NotRepeating("optimizer states that do not repeat")
        terms_of = _size_terms(sizes)
        kept = _frontier(_derive_moments(steady, lay), sizes, index, (steady[0].live, steady[1].live), terms_of)
        first = _first_step(kept, (v1, combine(v2, v1, 1, -1)))  # the same kept instants: every
        for fam in first:  # forward and backward one holds the same states, and the frontier is
            # blind to a common term; the others are the steady state's own, expanded already
            if not fam._numbers:
                fam.expanded(sizes, terms_of)
        return Derivation(lay, kept, first, sizes, _derive_shapes(params))
    except NotRepeating:
        return None
