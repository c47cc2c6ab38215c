"""The one bitsandbytes state-size rule (memcalc.tape.bnb_states): the closed form
(memcalc.formulas.model_states) and the engine (estimate()'s optimizer component) agree on it
around min_8bit_size and the paging threshold, and the rule matches live bitsandbytes
optimizers on CPU."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tests.strategies  # noqa: F401  (hypothesis profiles)
from memcalc.formulas.model_states import fine_tune_state_bytes, model_state_bytes
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.estimate import estimate
from memcalc.tape import bnb_states

# elements around min_8bit_size (4096), the absmax block (256) and the paging threshold (1e5)
SIZES = st.one_of(st.integers(1, 600), st.integers(4096 - 300, 4096 + 300),
                  st.integers(100_000 - 300, 100_000 + 300))


def _engine_optimizer_bytes(numel: int, optimizer: str, device: str, precision: str) -> int:
    """estimate()'s optimizer component for a model whose one trainable parameter is the final
    RMSNorm weight (hidden_size elements): everything else frozen by pattern."""
    model = ModelSpec.make(family="llama", vocab_size=8, hidden_size=numel, num_layers=1, num_heads=1,
                           num_kv_heads=1, intermediate_size=8, max_position_embeddings=16,
                           implementation="hf", tie_embeddings=True)
    training = TrainingConfig.make(micro_batch=1, seq_len=2, optimizer=optimizer, device=device,
                                   precision=precision, freeze=("model.embed_tokens.*", "model.layers.*"))
    return estimate(model, training).components.get("optimizer", 0)


@given(SIZES, st.sampled_from(bnb_states.BNB), st.sampled_from(["cpu", "cuda"]),
       st.sampled_from(["bf16", "fp32"]))
def test_closed_form_and_engine_agree(numel, optimizer, device, precision):
    assert fine_tune_state_bytes(numel, optimizer, device) == _engine_optimizer_bytes(
        numel, optimizer, device, precision)


@given(SIZES, st.sampled_from(bnb_states.BNB_8BIT), st.sampled_from(["cpu", "cuda"]))
def test_eight_bit_shrinks_states_from_the_threshold_and_paging_only_removes(numel, optimizer, device):
    """Below min_8bit_size an 8-bit optimizer keeps what the 32-bit one keeps; from it, less;
    paging never adds device bytes."""
    eight = sum(bnb_states.state_bytes("adamw-8bit", numel, device))
    fp32 = sum(bnb_states.state_bytes("adamw-32bit", numel, device))
    assert (eight < fp32) == (numel >= bnb_states.MIN_8BIT_SIZE)
    assert eight <= fp32
    assert sum(bnb_states.state_bytes(optimizer, numel, device)) <= eight
    assert sum(bnb_states.state_bytes("paged-adamw", numel, device)) <= fp32


@pytest.mark.parametrize("optimizer", bnb_states.BNB)
@pytest.mark.parametrize("numel", [1, 255, 257, 1024, 4095, 4096, 4097, 8193])
def test_rule_matches_live_bitsandbytes(optimizer, numel):
    """The distinct state storages (states, absmax, qmaps) a real bitsandbytes optimizer holds
    after one step on CPU, against the rule and the closed form."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from tests.configs import live_optimizer_state_bytes

    params = [torch.nn.Parameter(torch.randn(numel, dtype=torch.bfloat16))]
    live = live_optimizer_state_bytes(torch, optimizer, params)
    assert live == bnb_states.optimizer_bytes(optimizer, [numel], "cpu")
    assert model_state_bytes(numel, "bf16", optimizer, "cpu") == 2 * 2 * numel + live
