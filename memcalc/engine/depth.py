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

`derive` simulates n = 3, 4 and 5 units (every instant recorded, memcalc.tape.record
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

The modules: memcalc.engine.layout (how a stack decomposes into units), memcalc.engine.instants
(an instant as live storages, affine in n), memcalc.engine.depth_runs (the recorded runs matched
instant by instant and checked), memcalc.engine.derivation (every instant at any depth, with what
the recorded runs leave out) and this one (the instants kept: memcalc.tape.frontier; derive).
"""
from __future__ import annotations

from typing import Callable

from memcalc.engine.derivation import Derivation
from memcalc.engine.depth_runs import (derive_instants, derive_shapes, first_step_instants, instant_of, on_line,
                                       pair_growing)
from memcalc.engine.instants import Instant, combine, size_terms
from memcalc.engine.layout import N1, N2, N3, Layout, NotRepeating, small_model
from memcalc.engine.simulation import run_step
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.frontier import kept_largest_first, kept_packed
from memcalc.tape.record import lifted, unpack_dense


def kept_instants(instants: list[tuple], sizes: dict, index: dict | None, reads: tuple,
              terms_of: dict | None = None) -> list[Instant]:
    """The instants Memory.mark would keep at every depth of N1 units or more, of
    derive_instants' instants (`reads`: the runs' StepRun.live at N1 and N2 units, instant_of):
    compared on their totals lifted to (b, s, n) (base coefficients, and per-unit ones, which
    n - N1 >= 0 multiplies), so a dropped one is below a kept one (or a mix of two) at every
    depth."""
    k = sum(1 for key in index or {} if key[0] == "mono")
    # each optimizer-phase instant its own frontier: memcalc.engine.derivation.Derivation adds clipping's or
    # the optimizer's temporaries to one or the other, so neither may stand for the other
    phases = [(key[0], i) if key[0] == "optimizer" else key[0] for i, (key, _, _) in enumerate(instants)]
    totals = [(e1[5], e2[5]) for _, e1, e2 in instants]
    if index is not None and all(t1 is not None and t2 is not None for t1, t2 in totals):
        packed = lifted(totals, k)
        if packed is not None:
            kept = kept_packed(*packed, _tuples(totals, k), phases)
        else:
            kept = kept_largest_first([unpack_dense(t1, k) + unpack_dense(t2 - t1, k) for t1, t2 in totals], phases)
    else:
        if terms_of is None:
            terms_of = size_terms(sizes)
        made = [instant_of(instant, *reads) for instant in instants]
        lifted_terms = []
        for inst in made:
            terms: dict = {}
            for part, v in ((0, inst.base), (1, inst.step)):
                for (_, size), n in v.items():
                    for mono, c in terms_of[size]:
                        terms[mono, part] = terms.get((mono, part), 0) + n * c
            lifted_terms.append(terms)
        columns: dict = {}
        for terms in lifted_terms:
            for key in terms:
                columns.setdefault(key, len(columns))
        kept = kept_largest_first([tuple(terms.get(key, 0) for key in columns) for terms in lifted_terms], phases)
        return _expand_all([inst for i, inst in enumerate(made) if i in kept], sizes, terms_of)
    return _expand_all([instant_of(instants[i], *reads) for i in sorted(kept)], sizes, terms_of)


def _expand_all(out: list[Instant], sizes: dict, terms_of: dict | None = None) -> list[Instant]:
    """`out`, each instant's numbers precomputed (Instant.expanded; `terms_of`: size_terms(sizes))."""
    if terms_of is None:
        terms_of = size_terms(sizes)
    for inst in out:
        inst.expanded(sizes, terms_of)
    return out


def _tuples(totals: list[tuple[int, int]], k: int) -> Callable[[int], tuple]:
    """Total i's coefficients lifted to (b, s, n) from its packed totals at N1 and N2 units
    (what kept_packed's convex test reads), each unpacked once when first asked."""
    dense: dict[int, tuple] = {}

    def tuple_of(i: int) -> tuple:
        found = dense.get(i)
        if found is None:
            t1, t2 = totals[i]
            found = dense[i] = unpack_dense(t1, k) + unpack_dense(t2 - t1, k)
        return found

    return tuple_of


def derive(model: ModelSpec, lay: Layout) -> Derivation | None:
    """The derivation for `model`'s stack layout, or None when its depths do not repeat.

    >>> from memcalc.engine.layout import layout; from memcalc.engine.regime import Regime
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
        pair_growing(steady, sizes)
        params = [run.params for run in steady]
        v1, v2, v3 = (run.states for run in steady)
        if not on_line((v1, None), (v2, None), (v3, None), 1, 1, 2):
            raise NotRepeating("optimizer states that do not repeat")
        terms_of = size_terms(sizes)
        kept = kept_instants(derive_instants(steady, lay), sizes, index, (steady[0].live, steady[1].live), terms_of)
        first = first_step_instants(kept, (v1, combine(v2, v1, 1, -1)))  # the same kept instants: every
        for inst in first:  # forward and backward one holds the same states, and the frontier is
            # blind to a common term; the others are the steady state's own, expanded already
            if not inst.is_expanded:
                inst.expanded(sizes, terms_of)
        return Derivation(lay, kept, first, sizes, derive_shapes(params))
    except NotRepeating:
        return None
