"""bitsandbytes' optimizer.step() as allocations, one parameter at a time (the engine's sequence,
memcalc.engine.allocations, for AdamW8bit, PagedAdamW8bit and PagedAdamW): where each parameter's
states are made in the first step, and what its update allocates and frees.
"""
from __future__ import annotations

from memcalc.engine.regime import Regime
from memcalc.tape.graph import Graph

STATES = "states"
"""A bnb_temporaries entry ("states", parameter, count): the parameter's `count` state tensors are
allocated here in the first step (Optimizer2State.step: init_state just before update_step)."""


def bnb_temporaries(graph: Graph, regime: Regime) -> list[tuple]:
    """bitsandbytes' optimizer.step() parameter by parameter (Optimizer8bit.step: for each parameter
    with a .grad, init_state in the first step, then update_step), as optimizer_temporaries gives
    them: ("states", i, count) where parameter i's states are made, then `bnb_update`'s allocations.

    >>> from memcalc.engine.simulation import build_graph
    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> regime = Regime.of(TrainingConfig(micro_batch=1, seq_len=8, optimizer="adamw-8bit", device="cpu"))
    >>> temps = bnb_temporaries(build_graph(ModelSpec.preset("gpt2"), regime), regime)
    >>> temps[:2]  # wte: two uint8 states and two absmax vectors, then its dequantised state1
    [('states', 0, 4), ('alloc', (0, 'state1 dequantised'), 154389504)]
    """
    from memcalc.tape import finetune_optim as ft
    from memcalc.tape.step import _optimizer_shapes, _param_optimizers, trainable_elt

    elt, out = trainable_elt(graph), []
    for i, (opt, (n, rows, last2)) in enumerate(zip(_param_optimizers(graph, regime), _optimizer_shapes(graph))):
        out.append((STATES, i, len(ft.state_allocations(opt, n, rows, regime.device, last2))))
        out += [(kind, (i, name), b) for kind, name, b in bnb_update(opt, n, elt, regime.device)]
    return out


def bnb_update(optimizer: str, numel: int, param_elt: int, device: str) -> list[tuple]:
    """The allocations of one parameter's Adam update, ("alloc" | "free", name, bytes) in order.
    CUDA: one kernel, none (bitsandbytes/backends/cuda/ops.py). CPU (bitsandbytes 0.50.2
    backends/cpu/ops.py, Python; memcalc.tape.finetune_optim's peaks are the largest moments here):
    - 8-bit (_optimizer_update_8bit_blockwise_cpu): both states dequantised to fp32
      (dequantize_blockwise's output), `grad = g.float() * gnorm_scale` (g.float() a copy only for
      a 16-bit gradient, freed at once), `p_fp32 = p.data.float()` (a copy only for a 16-bit
      parameter), `denom = (state2_fp32.sqrt() / correction2).add_(eps)` (the sqrt freed), then each
      state re-quantised (quantize_blockwise: absmax, one fp32 per 256-element block, and the
      uint8 output, both freed after they are copied into the state); the locals freed at return;
    - 32-bit (_optimizer_update_32bit_cpu; fewer than 4096 elements, PagedAdamW):
      `update = state1 / (state2.sqrt() + eps * correction2)`: sqrt, the sum, the sqrt freed, the
      quotient, the sum freed; the locals at return.

    >>> [(k, n, b) for k, n, b in bnb_update("adamw-8bit", 4096, 4, "cpu")][:6]  # doctest: +NORMALIZE_WHITESPACE
    [('alloc', 'state1 dequantised', 16384), ('alloc', 'state2 dequantised', 16384), ('alloc', 'grad', 16384),
     ('alloc', 'sqrt', 16384), ('alloc', 'denom', 16384), ('free', 'sqrt', 16384)]
    >>> [k[0] + n for k, n, _ in bnb_update("adamw-8bit", 100, 2, "cpu")]  # doctest: +NORMALIZE_WHITESPACE
    ['ag.float()', 'agrad', 'fg.float()', 'ap.float()', 'asqrt', 'asum', 'fsqrt', 'aupdate', 'fsum',
     'fgrad', 'fp.float()', 'fupdate']
    >>> bnb_update("adamw-8bit", 4096, 4, "cuda")
    []
    """
    from memcalc.tape.bnb_states import BLOCK, eight_bit

    if device == "cuda":
        return []
    full = 4 * numel
    seq: list[tuple] = []
    a = lambda name, b=full: seq.append(("alloc", name, b))  # noqa: E731
    f = lambda name, b=full: seq.append(("free", name, b))  # noqa: E731
    eight = eight_bit(optimizer, numel)
    if eight:
        a("state1 dequantised")
        a("state2 dequantised")
    if param_elt != 4:
        a("g.float()")
        a("grad")
        f("g.float()")
        a("p.float()")
    else:
        a("grad")
    copies = ["p.float()"] if param_elt != 4 else []
    if eight:
        a("sqrt"), a("denom"), f("sqrt")
        for k in ("1", "2"):
            absmax = 4 * -(-numel // BLOCK)
            a("absmax" + k, absmax), a("quantised" + k, numel), f("quantised" + k, numel), f("absmax" + k, absmax)
        for name in ["state1 dequantised", "state2 dequantised", "grad"] + copies + ["denom"]:
            f(name)
        return seq
    a("sqrt"), a("sum"), f("sqrt"), a("update"), f("sum")
    for name in ["grad"] + copies + ["update"]:
        f(name)
    return seq


__all__ = ["STATES", "bnb_temporaries", "bnb_update"]
