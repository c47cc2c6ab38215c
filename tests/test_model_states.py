"""model_state_bytes against published figures and torch's per-dtype storage."""
import pytest
from hypothesis import given, strategies as st

import memcalc
from memcalc.core.errors import MemcalcError, UnknownNameError
from memcalc.formulas.model_states import model_state_bytes, zero_paper_mixed_precision_bytes

import tests.strategies  # noqa: F401  (hypothesis profiles)

# (precision, optimizer) -> bytes per parameter (weights + grads + states)
REGIMES = {("fp32", "adam"): 16, ("fp32", "adamw"): 16, ("fp32", "sgd-momentum"): 12, ("fp32", "sgd"): 8,
           ("bf16-amp", "adamw"): 16, ("fp16-amp", "adam"): 16, ("bf16-amp", "sgd"): 8,
           ("bf16", "adam"): 8, ("bf16", "adamw"): 8, ("bf16", "sgd-momentum"): 6, ("bf16", "sgd"): 4}


def test_lecture_figure_7b_fp32_adam():
    assert memcalc.model_state_bytes(7_000_000_000, precision="fp32", optimizer="adam") == 112_000_000_000


@pytest.mark.parametrize("regime,per_param", REGIMES.items())
def test_each_regime_exactly(regime, per_param):
    precision, optimizer = regime
    assert model_state_bytes(1_000_003, precision, optimizer) == 1_000_003 * per_param


def test_zero_paper_figure():
    # ZeRO (Rajbhandari et al. 2020) sec. 3.1: 16 bytes/param, 120 GB for a 7.5B model
    assert zero_paper_mixed_precision_bytes(7_500_000_000) == 120_000_000_000


@given(st.integers(0, 10 ** 12))
def test_pure_bf16_is_half_of_fp32(params):
    for opt in ("sgd", "sgd-momentum", "adam", "adamw"):
        assert 2 * model_state_bytes(params, "bf16", opt) == model_state_bytes(params, "fp32", opt)


@pytest.mark.parametrize("kwargs,exc", [
    (dict(params=-1), MemcalcError), (dict(params=1.5), MemcalcError),
    (dict(params=10, precision="fp8"), UnknownNameError), (dict(params=10, optimizer="lion"), UnknownNameError)])
def test_bad_input_names_the_field(kwargs, exc):
    with pytest.raises(exc) as err:
        model_state_bytes(**kwargs)
    assert "fix:" in str(err.value)
