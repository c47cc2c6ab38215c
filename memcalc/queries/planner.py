"""Training plans for one GPU: which precision, checkpointing and micro-batch fit, ranked by step time.

Step time = FLOPs / (peak TFLOPS of the precision x utilisation). FLOPs of one optimizer step over
T = global_batch * seq_len tokens (Kaplan et al. 2020, sec. 2.1: 6N per token for forward +
backward; Korthikanti et al. 2022, sec. 4 / appendix: attention adds 12 * L * h * s per token,
i.e. 12 * L * h * s**2 * b per micro-batch):
    train   = 6 * N_matmul * T + 12 * L * h_attn * s * T
    recompute (per-layer, sqrt: the whole forward again, +1/3 of forward + backward)
            = 2 * N_matmul * T + 4 * L * h_attn * s * T
    recompute (selective: only the attention core, QK^T and AV) = 4 * L * h_attn * s * T
N_matmul counts the parameters used in matrix multiplies (all but the embedding lookup tables;
a tied output layer counts once as the lm_head matmul); h_attn = num_heads * head_dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.core.arguments import shown
from memcalc.queries.estimate import check_basis
from memcalc.queries.peaks import estimate_peak, steady_polys
from memcalc.core.errors import MemcalcError
from memcalc.inputs.gpus import GPU
from memcalc.inputs.gpus import gpu as lookup_gpu
from memcalc.refusals.step import check_estimate, check_step
from memcalc.inputs.training import PRECISIONS

if TYPE_CHECKING:
    from typing import Sequence

    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
CHECKPOINTING = ("none", "per-layer", "sqrt", "selective")
DEFAULT_UTILISATION = 0.4
# The engine simulates min(grad_accum, 2) micro-steps: every grad_accum >= 2 has the same memory
# (the second micro-step accumulates into existing .grad). tests/test_planner.py checks this.
ACCUM_EQUIVALENT = 2


@dataclass(frozen=True)
class Plan:
    """One way to run the step, with its memory and time."""

    precision: str
    checkpointing: str
    micro_batch: int
    grad_accum: int
    peak_bytes: int
    """Steady-state peak, bytes."""
    headroom_bytes: int
    """GPU usable memory minus the peak."""
    flops: int
    """FLOPs of one optimizer step, recompute included."""
    step_seconds: float
    """FLOPs / (peak TFLOPS x utilisation)."""

    def as_dict(self) -> dict:
        """Plain fields, for --json."""
        return dict(self.__dict__)


def matmul_params(model: ModelSpec) -> int:
    """Parameters used in matrix multiplies: all but the embedding tables, plus the output layer.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> matmul_params(ModelSpec.preset("gpt2"))  # 12 blocks x 7.08M + ln_f + lm_head (tied wte)
    123653376
    """
    from memcalc.formulas.parameters import outer_param_shapes

    outer = dict(outer_param_shapes(model))
    lookups = outer["wte"] + outer.get("wpe", 0)
    lm_head = model.vocab_size * model.hidden_size
    return model.param_count - lookups + (lm_head if model.tie_embeddings else 0)


def step_flops(model: ModelSpec, global_batch: int, seq_len: int, checkpointing: str) -> int:
    """FLOPs of one optimizer step (module docstring: Kaplan et al. 2020; Korthikanti et al. 2022).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> m = ModelSpec.preset("gpt2")
    >>> step_flops(m, 1, 1024, "per-layer") * 3 == step_flops(m, 1, 1024, "none") * 4
    True
    """
    tokens = global_batch * seq_len
    dense = 2 * matmul_params(model) * tokens  # one forward of the matmuls
    attention = 4 * model.num_layers * model.num_heads * model.head_size * seq_len * tokens
    recompute = {"none": 0, "per-layer": dense + attention, "sqrt": dense + attention,
                 "every-k": dense + attention, "selective": attention}[checkpointing]
    return 3 * (dense + attention) + recompute


def plan(model: ModelSpec, device: str | GPU, global_batch: int, seq_len: int, training: TrainingConfig=None,
         utilisation: float = DEFAULT_UTILISATION, precisions: Sequence[str]=PRECISIONS,
         checkpointing: Sequence[str]=CHECKPOINTING, basis: str = "device") -> list[Plan]:
    """Every (precision, checkpointing, micro_batch dividing global_batch) that fits `device`
    (a catalogue GPU or its name) on `basis` (memcalc.queries.basis: device by default, reserved or
    allocated; peaks and headroom on that basis), fastest first.

    >>> from memcalc.inputs.specs import ModelSpec
    >>> best = plan(ModelSpec.preset("gpt2"), "A100-80GB", global_batch=16, seq_len=1024)[0]
    >>> best.peak_bytes <= lookup_gpu("A100-80GB").total_bytes
    True
    """
    from memcalc.inputs.training import TrainingConfig


    card = device if isinstance(device, GPU) else lookup_gpu(device)
    check_basis(basis)
    _check(global_batch, seq_len, utilisation)
    base = training or TrainingConfig(micro_batch=1, seq_len=seq_len)
    check_plan(model, base, global_batch, seq_len, precisions, checkpointing)
    plans = []
    for precision in precisions:
        peak_tflops = card.tflops(precision)
        if peak_tflops is None:
            continue  # e.g. bf16 on V100
        if _states_alone_exceed(model, base, precision, card):
            continue
        for mode in checkpointing:
            t = base.with_(precision=precision, checkpointing=mode, seq_len=seq_len)
            plans += _fitting(model, t, card, global_batch, peak_tflops * 1e12 * utilisation, basis)
    # equal FLOPs: larger micro-batches first (bigger matmuls run closer to peak), then headroom
    return sorted(plans, key=lambda p: (p.step_seconds, -p.micro_batch, -p.headroom_bytes))


def _states_alone_exceed(model: ModelSpec, training: TrainingConfig, precision: str, card: GPU) -> bool:
    """Weights + gradients + optimizer states, all alive at optimizer.step(), exceed the GPU: no
    plan of this precision can fit, and its simulations are skipped. Not a shortcut when some
    parameters are frozen (LoRA, freeze patterns): they have no gradient or state."""
    from memcalc.formulas.model_states import model_state_bytes

    if training.lora is not None or training.freeze:
        return False
    return (model_state_bytes(model.param_count, precision, training.optimizer, training.device)
            > card.usable_bytes)


def _peaks(model: ModelSpec, training: TrainingConfig, global_batch: int, card: GPU) -> dict[int, int]:
    """Steady-state peak per micro-batch dividing global_batch, from two cached simulations:
    grad_accum 1 (micro = global_batch) and ACCUM_EQUIVALENT (all others)."""

    s = training.seq_len
    accum_t = training.with_(grad_accum=ACCUM_EQUIVALENT)
    peaks = {m: estimate_peak(model, accum_t.with_(micro_batch=m, seq_len=s))
             for m in range(1, global_batch) if global_batch % m == 0}
    # without accumulation, the forward lacks at most the fp32 .grad tensors (4 bytes/param):
    lower = max(p.eval(global_batch, s) for p in steady_polys(model, accum_t)) - 4 * model.param_count
    if lower <= card.usable_bytes:
        peaks[global_batch] = estimate_peak(model, training.with_(grad_accum=1, micro_batch=global_batch, seq_len=s))
    return peaks


def _fitting(model: ModelSpec, training: TrainingConfig, card: GPU, global_batch: int,
             flops_per_s: float, basis: str = "allocated") -> list[Plan]:
    """The micro-batches that fit: on the allocated peaks first, then (reserved or device basis)
    each of those through memcalc.queries.basis.peak_on at its own accumulation."""
    from memcalc.queries.basis import peak_on

    flops = step_flops(model, global_batch, training.seq_len, training.checkpointing)
    out = []
    for micro, peak in _peaks(model, training, global_batch, card).items():
        accum = global_batch // micro
        if peak > card.usable_bytes:
            continue
        budget = card.usable_bytes
        if basis != "allocated" and training.device != "cpu":
            ok, peak, budget = peak_on(model, training.with_(micro_batch=micro, grad_accum=accum), card.name, basis)
            if not ok:
                continue
        out.append(Plan(training.precision, training.checkpointing, micro, accum, peak,
                        budget - peak, flops, flops / flops_per_s))
    return out


MIN_UTILISATION = 1e-6
"""A millionth of peak: below it a step time means nothing (and a denormal one overflows to inf)."""


def _check(global_batch: int, seq_len: int, utilisation: float) -> None:
    from memcalc.core.arguments import check_fraction, check_int
    from memcalc.core.limits import MAX_GLOBAL_BATCH, MAX_SHAPE

    check_int("global_batch", global_batch, 1, MAX_GLOBAL_BATCH)
    check_int("seq_len", seq_len, 1, MAX_SHAPE)
    check_fraction("utilisation", utilisation, "pass the fraction of peak FLOPS reached, e.g. 0.4")
    if global_batch < 1:
        raise MemcalcError("global_batch", f"must be >= 1, got {global_batch}",
                           "pass the sequences per optimizer step, e.g. 512")
    if seq_len < 1:
        raise MemcalcError("seq_len", f"must be >= 1, got {seq_len}", "pass e.g. 4096")
    if not 0 < utilisation <= 1:
        raise MemcalcError("utilisation", f"must be in (0, 1], got {utilisation}",
                           "pass the fraction of peak FLOPS reached, e.g. 0.4")
    if utilisation < MIN_UTILISATION:  # 1e-320 made step times inf (and --json print Infinity)
        raise MemcalcError("utilisation", f"{utilisation} is below {MIN_UTILISATION} of peak FLOPS",
                           "pass the fraction of peak FLOPS reached, e.g. 0.4")


def check_plan(model: ModelSpec, training: TrainingConfig, global_batch: int, seq_len: int,
               precisions: Sequence[str], checkpointing: Sequence[str]) -> None:
    """plan()'s arguments: estimate()'s checks on every variant it will evaluate."""
    for field, given, known in (("precisions", precisions, PRECISIONS),
                                ("checkpointing", checkpointing, CHECKPOINTING)):
        if not isinstance(given, (list, tuple)) or not all(isinstance(x, str) and x in known for x in given):
            raise MemcalcError(field, f"{shown(given)} is not a list of {', '.join(known)}",
                               f"pass a subset of {list(known)}")
    check_step(model, training)
    for precision in precisions:
        for mode in checkpointing:
            check_estimate(model, training.with_(precision=precision, checkpointing=mode,
                                                 seq_len=seq_len, micro_batch=global_batch))
