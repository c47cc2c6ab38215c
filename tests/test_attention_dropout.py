"""Attention dropout under eager attention, the llama families (validate/matrices/rows/attention-locals.json): measured
peaks, and a property over every program."""
import json
from pathlib import Path

from hypothesis import assume, given, strategies as st

from memcalc.core.errors import MemcalcError
from memcalc.queries.estimate import estimate
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.strategies import cases

RESULTS = Path(__file__).resolve().parents[1] / "validate" / "results" / "cpu-ci-dropout.jsonl"

# A fresh-sweep row (scripts/fresh_sweep.py), measured by the validator's live-tensor tracker on
# CPU (torch 2.13.0, transformers 5.24): forward 6082156 B, backward 5280376 B.
FRESH = (ModelSpec(family="gemma3", implementation="hf", vocab_size=16, hidden_size=64, num_layers=1,
                   num_heads=8, num_kv_heads=1, intermediate_size=128, activation="gelu_tanh",
                   attn_dropout=0.1, qk_norm=True, qkv_bias=True, out_bias=True, mlp_bias=False,
                   logit_softcap=True, sliding_window=32, sliding_window_pattern=3,
                   tie_embeddings=False, max_position_embeddings=1024),
         TrainingConfig(micro_batch=3, seq_len=104, precision="fp16-amp", optimizer="sgd-momentum",
                        optimizer_impl="for-loop", max_grad_norm=1.0, attention="eager", grad_accum=3,
                        device="cpu"))
FRESH_MEASURED = {"forward": 6082156, "backward": 5280376}


def _error_pct(predicted: int, measured: int) -> float:
    return 100 * (predicted - measured) / measured


def test_fresh_sweep_gemma3_row_matches_its_measurement():
    phases = estimate(*FRESH).phases
    for phase, measured in FRESH_MEASURED.items():
        assert abs(_error_pct(phases[phase], measured)) < 0.005, phase


def test_recorded_dropout_rows_match_their_measurements():
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    assert len(rows) == 15
    for row in rows:
        model, training = ModelSpec(**row["model"]), TrainingConfig(**row["training"])
        r = estimate(model, training)
        assert abs(_error_pct(r.peak_bytes, row["measured_peak_bytes"])) < 0.01, row["name"]
        for phase in ("forward", "backward"):  # (the optimizer phase is small: its tens of bytes of
            # unmodelled buffers, rotary inv_freq and GradScaler scalars, are over 0.01% there)
            assert abs(_error_pct(r.phases[phase], row["phases"][phase]["measured"])) < 0.01, (row["name"], phase)


@given(cases(checkpointing=["none"]), st.sampled_from([0.1, 0.5]))
def test_attention_dropout_never_lowers_the_forward_phase(case, p):
    model, t = case
    t = t.with_(attention="eager")
    try:
        without = estimate(model.with_(attn_dropout=0.0), t).phases["forward"]
        with_dropout = estimate(model.with_(attn_dropout=p), t).phases["forward"]
    except MemcalcError:  # a combination the engine refuses by name
        assume(False)
    assert with_dropout >= without
