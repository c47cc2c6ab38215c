"""Fine-tuning optimizers on 3-D parameters (MoE experts' gate_up_proj / down_proj, (E, R, C)):
memcalc's state and temporary bytes against the live optimizers run on CPU (transformers'
Adafactor factors over the last two dims; bitsandbytes sizes by numel), and the engine's
parameter shapes carry the experts' last two dims."""
import pytest
from hypothesis import given

from memcalc.engine.simulation import build_graph
from memcalc.engine.regime import Regime
from memcalc.tape import finetune_optim as ft
from memcalc.inputs.training import FINE_TUNE_OPTIMIZERS
from tests.strategies import cases

# an expert stack above min_8bit_size, a small one, and a 2-D and a 1-D parameter beside them
SHAPES = [(4, 48, 32), (2, 8, 6), (40, 24), (24,)]


def _shape(shape: tuple) -> tuple:
    """(elements, dim 0, last two dims at >= 3 dims else None)."""
    n = 1
    for d in shape:
        n *= d
    return n, shape[0], tuple(shape[-2:]) if len(shape) >= 3 else None


def _params(torch, dtype):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, dtype=dtype) * 0.02) for s in SHAPES]


@pytest.mark.parametrize("optimizer", FINE_TUNE_OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_expert_states_match_the_live_optimizer(optimizer, dtype):
    """Sum of the distinct state storages the real optimizer holds after one step."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from tests.configs import live_optimizer_state_bytes

    live = live_optimizer_state_bytes(torch, optimizer, _params(torch, getattr(torch, dtype)))
    shapes = [_shape(s) for s in SHAPES]
    predicted = sum(sum(ft.state_allocations(optimizer, n, rows, "cpu", last2)) for n, rows, last2 in shapes)
    predicted += sum(ft.shared_allocations(optimizer, [n for n, _, _ in shapes], "cpu"))
    assert live == predicted


@pytest.mark.parametrize("optimizer", FINE_TUNE_OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_expert_step_temporaries_match_the_tracker(optimizer, dtype):
    """Steady-state step: the peak above the live bytes before optimizer.step()."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from tests.configs import measured_step_temporaries

    measured = measured_step_temporaries(optimizer, lambda: _params(torch, getattr(torch, dtype)))
    elt = 2 if dtype == "bfloat16" else 4
    assert measured == max(ft.step_temporaries(optimizer, [_shape(s) for s in SHAPES], elt, "cpu", 1))


@given(cases())
def test_expert_parameters_carry_their_last_two_dims(case):
    """Every parameter of >= 3 dims (the experts) has last2 with dim0 * R * C == its elements,
    and the factored states of every parameter are no larger than the parameter."""
    model, training = case
    regime = Regime.of(training)
    for v in build_graph(model, regime).params:
        n = v.size.eval(1, 1) // v.elt if not v.quant else v.quant
        if v.last2 is not None:
            assert ".experts." in v.label and v.rows * v.last2[0] * v.last2[1] == n
        sq = ft.factored(n, v.rows, v.last2)
        assert sq is None or sum(sq) <= n + v.rows  # (R - 1)(C - 1) >= 0
