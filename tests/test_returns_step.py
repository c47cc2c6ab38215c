"""graph.Returns: a backward node's apply returns before the engine's validate_outputs (sum_to a
broadcast input's shape); in a checkpoint region the saved tensors it unpacked are freed there
(torch/utils/checkpoint.py unpack_hook drops the frame's reference), elsewhere after. Checked
against the live-tensor tracker on `y * w.unsqueeze(-1)` with y (S, h) and w (S,) saved by the
product only: the backward peak is the two products' (S, h) gradients with y and w alive, plus
sum_to's (S, 1) sum only outside a checkpoint (the sweep's fresh8-015, memcalc.families.moe
grouped_combine)."""
from __future__ import annotations

import pytest

from memcalc.core.poly import Poly
from memcalc.tape.graph import FreeTemps, Grad, Graph, Returns, Temp
from memcalc.tape.simulate import StepSimulator

S, H = 100, 10


def _simulated_backward_peak(checkpointed: bool) -> int:
    """memcalc's backward-phase peak of the product, less the parameters and their gradients."""
    g = Graph()
    a, b = g.param("a", Poly.const(S * H * 4)), g.param("b", Poly.const(S * 4))
    if checkpointed:
        g.begin_region()
    y = g.op("a * 2", [a], Poly.const(S * H * 4), backward=[Grad(0)])
    w = g.op("b * 3", [b], Poly.const(S * 4), backward=[Grad(0)])
    z = g.op("y * w", [y, w], Poly.const(S * H * 4), saves=[y, w],
             backward=[Grad(0), Temp(Poly.const(S * H * 4)), Returns(), Grad(1), FreeTemps()])
    loss = g.op("sum", [z], Poly.const(4), backward=[Grad(0, Poly.const(4))])  # expand: a view
    g.scope_end([y, w, z])
    if checkpointed:
        g.end_region()
    g.keep.append(loss)
    sim = StepSimulator(g)
    sim.setup()
    sim.micro_step()
    peak = max(m.total.eval(1, 1) for m in sim.mem.moments if m.phase == "backward")
    return peak - 2 * (S * H * 4 + S * 4)  # a, b: not the tracker's (made before it)


def _measured_backward_peak(checkpointed: bool) -> int:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    from validate.measure.tracker import LiveTensorTracker

    def f(a, b):
        return (a * 2.0 * (b * 3.0).unsqueeze(-1)).sum()

    a, b = torch.randn(S, H, requires_grad=True), torch.randn(S, requires_grad=True)
    with LiveTensorTracker() as tr:
        loss = checkpoint(f, a, b, use_reentrant=False) if checkpointed else f(a, b)
        tr.reset_peak()
        loss.backward()
        peak = tr.peak
    return peak - (S * H * 4 + S * 4)  # a.grad, b.grad


@pytest.mark.parametrize("checkpointed", [False, True])
def test_sum_to_after_the_saved_tensors_only_in_a_checkpoint(checkpointed):
    assert _simulated_backward_peak(checkpointed) == _measured_backward_peak(checkpointed)


def test_the_checkpoint_frees_y_and_w_before_the_sum():
    plain, recomputed = _measured_backward_peak(False), _measured_backward_peak(True)
    assert plain - recomputed == S * 4  # the (S, 1) sum
    assert _simulated_backward_peak(False) - _simulated_backward_peak(True) == S * 4
