"""Every instant of a step at any number of units (memcalc.engine.depth's Derivation): the
recorded instants at n units, plus what the recorded runs leave out, which follows the
parameters one by one (DDP's buckets, FSDP's shards, clipping's norms, the optimizer's
temporaries, a memcalc.tape.finetune_optim optimizer's first-step states), added at each depth by
memcalc.tape.step's own functions on that depth's parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memcalc.allocator.rules import round_up
from memcalc.core.poly import Poly
from memcalc.engine.instants import Instant
from memcalc.engine.layout import N1, Layout, NotRepeating
from memcalc.engine.simulation import ParamView
from memcalc.parallel.fsdp import padded_shard_bytes
from memcalc.tape import step
from memcalc.tape.finetune_optim import BNB
from memcalc.tape.moment import Moment
from memcalc.tape.optimizer import clip_bytes

FINETUNE_OPTIMIZERS = BNB + ("adafactor",)


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
    steady: list[Instant]
    first: list[Instant]
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
        moments (memcalc.engine.run._checked_form).

        >>> from memcalc.engine.depth import derive; from memcalc.engine.layout import layout
        >>> from memcalc.engine.regime import Regime; from memcalc.inputs.specs import ModelSpec
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

    def _variants(self, f: Instant, outside: dict, slope: bool) -> list[list[str]]:
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
        # DDP buckets the trainable gradients only (memcalc.engine.simulation.trainable_sizes)
        buckets = sum(v.nbytes for v in graph.trainable_params) if regime.replicated else 0
        sharded = (regime.master_elt // regime.param_elt) * sum(
            padded_shard_bytes(v.nbytes, v.rows, regime.data_parallel) for v in graph.params) \
            if regime.fsdp else 0
        temp = 0
        if regime.data_parallel == 1 and regime.optimizer in FINETUNE_OPTIMIZERS:
            temp = max(step.finetune_temporaries(graph, regime), default=0)
        elif regime.data_parallel == 1:
            temp = step.transient(graph, regime)
        clip = clip_bytes(step.clip_numels(graph, regime), step.trainable_elt(graph), regime.device,
                          regime.granularity) if regime.max_grad_norm is not None else 0
        return {"buckets": ("ddp_buckets", buckets), "sharded": ("weights", sharded),
                "temp": ("temporaries", temp), "clip": ("temporaries", clip)}

    def _first_optimizer(self, m: Moment, graph: _Params, clipped: bool) -> list[Moment]:
        """The first step's optimizer.step of a memcalc.tape.finetune_optim optimizer from the
        moment with every state held (memcalc.tape.step._finetune_optimizer): states are created
        parameter by parameter, the peak at the parameter k maximising states(0..k) plus its
        temporaries, so the states after k are not yet there."""
        regime = self.layout.regime
        temps = step.finetune_temporaries(graph, regime)
        out = []
        if temps:
            _, per = step.finetune_states(graph, regime)
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
        for group, slope in ((self.steady, True), (self.first, False)):
            moments = []
            for f in group:
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
        return out[0], out[1], [(v.nbytes // regime.param_elt, v.rows) for v in graph.trainable_params]


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
