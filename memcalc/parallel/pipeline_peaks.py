"""Each pipeline rank's steady-state peak: its stages' micro-batches walked in the schedule's
order (memcalc.parallel.pipeline.rank_actions) over their one-micro-batch profiles
(memcalc.parallel.stages.stage_profile).

At each action the rank holds, besides the action's own bytes (a forward's or backward's most
over its start):
- per stage: parameters, buffers, the optimizer states (steady state), the receive and gradient
  receive buffers of every micro-batch, the batch's ids (first stage) or targets (last); the
  buffers of a model-level module every stage keeps (the reference Llama's rotary tables) once
  per rank;
- the saved tensors of each micro-batch in flight (forward run, backward not yet);
- the .grad of the stage's parameters once its first backward of the step has run (set to None
  by zero_grad(set_to_none=True) after the previous optimizer.step);
- after each backward: the receive buffer's .grad (a later stage), the logits kept in
  output_chunks and the loss (the last stage), all until the next step.
After the last action the last stage's step() merges output_chunks (torch.cat: one more copy of
every micro-batch's logits, schedules.py _merge_outputs), then the optimizer steps every
parameter of the rank (one param group: its temporaries over all of them), output_chunks and
the receive buffers' .grad still alive.

>>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
>>> spec = ModelSpec.make(family="gpt2", vocab_size=96, hidden_size=32, num_layers=4, num_heads=2,
...                       implementation="reference", tie_embeddings=False)
>>> t = TrainingConfig(micro_batch=4, seq_len=16, device="cpu", world_size=2, pipeline_parallel=2,
...                    pipeline_schedule="gpipe", num_microbatches=4)
>>> [(p.peak_bytes, p.moment) for p in pipeline_peaks(spec, t)]  # measured: 1,265,128 and 732,424 B
[(1265128, 'B 1 stage 0'), (732420, 'B 1 stage 1')]
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import PIPELINE_DEFAULTS, TrainingConfig
from memcalc.parallel.pipeline import rank_actions, stage_layers
from memcalc.parallel.stages import StageProfile, stage_profile
from memcalc.refusals.pipeline import check_pipeline_supported
from memcalc.tape.optimizer import transient_bytes


@dataclass(frozen=True)
class RankPeak:
    """One pipeline rank's steady-state peak and where it happens."""

    peak_bytes: int
    phase: str
    """forward, backward or optimizer (step()'s merge of the outputs counts as backward's end)."""
    moment: str
    """The action at the peak: 'F 3 stage 1', 'B 0 stage 0', 'merge outputs' or 'optimizer.step'."""
    phases: dict
    """The steady-state peak of each phase."""
    first_step_peak_bytes: int = 0
    """The first step's: no optimizer states until optimizer.step() makes them (PipelineStage's
    first-step shape inference and buffer set-up are not modelled)."""


def _profiles(model: ModelSpec, training: TrainingConfig) -> list[StageProfile]:
    """The profile of every stage, in stage order, at one micro-batch's shape."""
    pp, v = training.pipeline_parallel, training.pipeline_stages_per_rank
    total = pp * v
    parts = stage_layers(model.num_layers, total, training.stage_boundaries)
    one = training.with_(**PIPELINE_DEFAULTS, world_size=1,
                         micro_batch=training.micro_batch // training.num_microbatches)
    out: list[StageProfile] = []
    recv = None
    for i, layers in enumerate(parts):
        prof = _stage_profile(model, one, _layer_key(model, layers), i == 0, i == total - 1, recv)
        recv = (prof.output.eval(one.micro_batch, one.seq_len), prof.output_elt)
        out.append(prof)
    return out


def _layer_key(model: ModelSpec, layers: range) -> range | tuple:
    """What of a stage's layer indices changes its bytes: nothing but their count when every layer
    is alike (no sliding-window or NoPE layers), so equal stages share one profile (the planner
    walks a 64-stage split as a few); else the indices themselves."""
    alike = not model.no_rope_layers and not any(model.layer_is_sliding(i) for i in range(model.num_layers))
    return ("alike", len(layers)) if alike else layers


@lru_cache(maxsize=4096)
def _stage_profile(model: ModelSpec, one: TrainingConfig, key: range | tuple, first: bool, last: bool,
                   recv: tuple[int, int] | None) -> StageProfile:
    """stage_profile of the stage `key` names (_layer_key); the indices of alike layers do not
    change its bytes, only the parameters' labels."""
    layers = range(key[1]) if isinstance(key, tuple) else key
    return stage_profile(model, one, layers, first, last, recv)


def pipeline_peaks(model: ModelSpec, training: TrainingConfig) -> list[RankPeak]:
    """Every pipeline rank's steady-state peak (module docstring), in rank order."""
    check_pipeline_supported(model, training)
    pp, m = training.pipeline_parallel, training.num_microbatches
    profiles = _profiles(model, training)
    regime = Regime.of(training, model)
    total = len(profiles)
    out = []
    for rank in range(pp):
        mine = list(range(rank, total, pp))  # torch's stage_index_to_group_rank: stage % pp
        actions = rank_actions(training.pipeline_schedule, pp, m, rank, training.pipeline_stages_per_rank)
        out.append(_rank_peak(profiles, mine, actions, m, total, regime, training.pipeline_schedule))
    return out


def _rank_peak(profiles: list[StageProfile], mine: list[int], actions: list, m: int, total: int,
               regime: Regime, schedule: str) -> RankPeak:
    """Walk one rank's actions (module docstring)."""
    states = sum(profiles[i].states for i in mine)
    static = sum(profiles[i].base + (m - 1) * profiles[i].per_microbatch for i in mine) + states
    shared = [x for i in mine for x in profiles[i].shared]
    static -= sum(n for _, n in shared) - sum(dict(shared).values())  # each shared buffer once
    flight = {i: 0 for i in mine}
    done = {i: 0 for i in mine}
    sends = _SendRefs(schedule, profiles, mine, m, total)

    def held() -> int:
        return sum(flight[i] * profiles[i].saved + (profiles[i].grads if done[i] else 0)
                   + done[i] * profiles[i].kept for i in mine) + sends.bytes()

    moments: list[tuple[int, str, str]] = []  # (bytes, phase, what)
    for stage, kind, mb in actions:
        p = profiles[stage]
        if kind == "F":
            moments.append((static + held() + p.forward, "forward", f"F {mb} stage {stage}"))
            flight[stage] += 1
        else:
            extra = p.backward if done[stage] else p.first_backward
            moments.append((static + held() + extra, "backward", f"B {mb} stage {stage}"))
            flight[stage] -= 1
            done[stage] += 1
        sends.after(stage, kind, mb)
    end = static + held() - sends.bytes()  # _step_microbatches returned: its send lists are gone
    if total - 1 in mine:
        moments.append((end + m * profiles[total - 1].logits, "backward", "merge outputs"))
    temps = transient_bytes(regime.optimizer, regime.optimizer_impl, regime.weight_decay,
                            [n for i in mine for n in profiles[i].param_sizes])
    moments.append((end + temps, "optimizer", "optimizer.step"))
    peak = max(moments, key=lambda x: x[0])
    phases: dict[str, int] = {}
    for nbytes, phase, _ in moments:
        phases[phase] = max(phases.get(phase, 0), nbytes)
    first = max(nbytes - (0 if phase == "optimizer" else states) for nbytes, phase, _ in moments)
    return RankPeak(peak[0], peak[1], peak[2], phases, first)


class _SendRefs:
    """What the schedule's send ops keep alive past the compute that made it (gloo's send Work
    and the P2POp lists hold their tensors; stage_backward sets the input's .grad to None, so the
    input gradient a backward sends lives only there):
    - GPipe (fwd_sends_to_wait, bwd_sends_to_wait) and the runtime schedules (LoopedBFS,
      Interleaved1F1B: send_ops) keep every send until _step_microbatches returns: each stage
      output after its backward, each input gradient;
    - Schedule1F1B rebinds them: the input gradient of the latest backward lives (bwd_sends,
      send_work) until the next backward has run; the warm-up's last fired send (send_work, the
      output of micro-batch warmup - 2) until the 1B1F loop breaks (after backward m - warmup).
    """

    def __init__(self, schedule: str, profiles: list[StageProfile], mine: list[int], m: int, total: int):
        self.schedule, self.profiles, self.m, self.total = schedule, profiles, m, total
        self.outputs: dict[tuple[int, int], int] = {}  # (stage, mb) sent, backward run -> bytes
        self.grads: dict[tuple[int, int], int] = {}
        self.fired_output: tuple[int, int] | None = None  # 1F1B send_work after the warm-up
        self.forwards = 0
        if schedule == "1f1b":
            stage = mine[0]
            self.warmup = min(m, total - stage)

    def after(self, stage: int, kind: str, mb: int) -> None:
        """Update after a compute action."""
        p = self.profiles[stage]
        last, first = stage == self.total - 1, stage == 0
        if kind == "F":
            self.forwards += 1
            return
        if self.schedule != "1f1b":
            if not last:
                self.outputs[(stage, mb)] = self.output_bytes(stage)
            if not first:
                self.grads[(stage, mb)] = p.input_grad
            return
        if not first:  # the latest input gradient only
            self.grads = {(stage, mb): p.input_grad}
        if not last and self.warmup >= 2 and mb == self.warmup - 2:
            self.outputs[(stage, mb)] = self.output_bytes(stage)
        if mb == self.m - self.warmup:  # the 1B1F loop breaks: send_work is rebound
            self.outputs.clear()

    def output_bytes(self, stage: int) -> int:
        """A stage's output: the next stage's receive buffer."""
        return self.profiles[stage + 1].input_grad

    def bytes(self) -> int:
        """What the send ops hold now."""
        return sum(self.outputs.values()) + sum(self.grads.values())


__all__ = ["RankPeak", "pipeline_peaks"]
