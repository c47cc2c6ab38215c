"""The cluster layout planner (memcalc.queries.cluster) and its step-time model
(memcalc.queries.step_time): its per-rank peaks against memcalc.estimate, its refusals, the
invariants of its terms, and (slow) every layout it says fits measured on 4 gloo ranks."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

import memcalc
from memcalc.cli.main import main
from memcalc.core.errors import MemcalcError
from memcalc.queries.cluster import _rank_peaks, _rank_states, parse_cluster, plan_cluster
from memcalc.queries.step_time import bubble_fraction, dp_comm_bytes, ring_bytes, tp_comm_bytes

GPT2 = memcalc.ModelSpec.preset("gpt2")
TINY = memcalc.ModelSpec.make(family="gpt2", vocab_size=96, hidden_size=32, num_layers=2, num_heads=2,
                              implementation="reference")


@pytest.mark.parametrize("tp,ws,sharding,accum", [(1, 4, "none", 2), (1, 3, "zero3", 2), (1, 4, "zero1", 1),
                                                  (2, 4, "zero2", 2), (2, 2, "none", 1), (1, 6, "zero2", 1)])
def test_rank_peaks_are_estimates(tp, ws, sharding, accum):
    """The planner's fast per-rank peaks equal memcalc.estimate's rank_peak_bytes."""
    from memcalc.engine.run import candidates

    t = memcalc.TrainingConfig(micro_batch=3, seq_len=64, world_size=ws, tensor_parallel=tp,
                               sharding=sharding, grad_accum=accum, precision="bf16-amp")
    model = GPT2.with_(implementation="reference")  # TP splits the reference GPT-2's linears
    cands = candidates(model, t)
    assert _rank_peaks(cands, _rank_states(cands), 3, 64) == memcalc.estimate(model, t).rank_peak_bytes


def test_every_layout_fits_and_is_estimated():
    """Each layout returned fits the budget on every rank, by memcalc.estimate of that layout."""
    plans = plan_cluster(GPT2, memcalc.TrainingConfig(micro_batch=1, seq_len=512, precision="bf16-amp"),
                         "8xL4", global_batch=32, basis="allocated")
    assert plans
    budget = memcalc.GPUS["L4"].usable_bytes
    for x in plans[:12]:
        t = memcalc.TrainingConfig(micro_batch=x.micro_batch, seq_len=512, precision=x.precision,
                                   checkpointing=x.checkpointing, grad_accum=x.grad_accum, world_size=8,
                                   tensor_parallel=x.tensor_parallel, sharding=x.sharding)
        r = memcalc.estimate(GPT2, t)
        assert r.rank_peak_bytes == x.rank_peak_bytes and max(r.rank_peak_bytes) <= budget
        assert x.data_parallel * x.tensor_parallel == 8 and x.micro_batch * x.grad_accum * x.data_parallel == 32
    assert [x.step.total_s for x in plans] == sorted(x.step.total_s for x in plans)


def test_device_basis_layouts_fit_on_device_bytes():
    """On the device basis (the default) each layout returned is confirmed by the allocator replay
    (memcalc.queries.basis.peak_on) within the card's whole memory, above its allocated peak, and the
    layouts keep the allocated search's order."""
    from memcalc.queries.basis import peak_on

    t = memcalc.TrainingConfig(micro_batch=1, seq_len=512, precision="bf16-amp", device="cuda")
    allocated = plan_cluster(GPT2, t, "8xL4", global_batch=32, basis="allocated")
    plans = plan_cluster(GPT2, t, "8xL4", global_batch=32, top=6)
    assert 0 < len(plans) <= 6
    keys = [(x.tensor_parallel, x.sharding, x.checkpointing, x.micro_batch) for x in allocated]
    order = [keys.index((x.tensor_parallel, x.sharding, x.checkpointing, x.micro_batch)) for x in plans]
    assert order == sorted(order)
    for x in plans:
        lt = t.with_(world_size=8, tensor_parallel=x.tensor_parallel, sharding=x.sharding,
                     checkpointing=x.checkpointing, micro_batch=x.micro_batch, grad_accum=x.grad_accum)
        ok, peak, nbytes = peak_on(GPT2, lt, "L4", "device")
        assert ok and peak == x.peak_bytes and nbytes == x.budget_bytes == memcalc.GPUS["L4"].total_bytes
        assert x.peak_bytes > max(x.rank_peak_bytes)


@pytest.mark.parametrize("text", ["64 x H100-80GB", "64xH100", "0xH100-80GB", "064xH100-80GB", "x",
                                  "64*H100-80GB", "64xH100-80GB ", "-8xL4", "99999999xL4", 64])
def test_cluster_strings_refused(text):
    with pytest.raises(MemcalcError) as err:
        parse_cluster(text)
    assert err.value.field == "gpus" and err.value.fix


def test_bad_input_refused():
    t = memcalc.TrainingConfig(micro_batch=1, seq_len=64)
    for kwargs, name in (({"basis": "x"}, "basis"),
                         ({"global_batch": 0}, "global_batch"), ({"global_batch": 4}, "global_batch"),
                         ({"utilisation": 2.0}, "utilisation"),
                         ({"precisions": ["fp8"]}, "precisions")):
        args = {"gpus": "8xL4", "global_batch": 8, **kwargs}
        with pytest.raises(MemcalcError) as err:
            plan_cluster(GPT2, t, **args)
        assert err.value.field == name
    with pytest.raises(MemcalcError) as err:
        plan_cluster(GPT2, t.with_(world_size=2, sharding="zero3"), "8xL4", 8)
    assert err.value.field == "world_size"


def test_cli(capsys):
    assert main(["plan", "--model", "gpt2", "--gpus", "4xA100-80GB", "--global-batch", "16", "--seq-len", "256",
                 "--precision", "bf16-amp", "--json", "--top", "3", "--basis", "allocated"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fitting"] >= len(out["layouts"]) > 0
    first = out["layouts"][0]
    assert set(first["step"]) == {"compute_s", "bubble_s", "tp_comm_s", "dp_comm_s", "total_s"}
    assert len(first["rank_peak_bytes"]) == 4
    for argv in (["--gpus", "4xB200"], ["--gpus", "4xL4", "--gpu", "L4"], ["--gpu", "L4", "--gpus-per-node", "4"],
                 ["--gpus", "4xL4", "--basis", "x"], ["--gpus", "4xL4", "--inter-node-gbps", "-1"]):
        with pytest.raises(SystemExit) as code:
            main(["plan", "--model", "gpt2", "--global-batch", "8", "--seq-len", "64", *argv])
        assert code.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


# ---- the step-time model's invariants -------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(params=st.integers(1, 10**11), d=st.integers(1, 4096), accum=st.integers(1, 64),
       elt=st.sampled_from([2, 4]))
def test_dp_comm_orders(params, d, accum, elt):
    """Per step, over any group: DDP <= ZeRO-1; FSDP2 zero2 <= zero3; FSDP2 once = DDP's volume
    (Rajbhandari et al. 2020, sec. 7.2: ZeRO-2 as DDP, ZeRO-3 1.5x); nothing over one rank."""
    v = {s: dp_comm_bytes(params, d, s, accum, elt, elt) for s in ("none", "zero1", "zero2", "zero3")}
    assert v["none"] <= v["zero1"] and v["zero2"] <= v["zero3"]
    assert dp_comm_bytes(params, d, "zero2", 1, elt, elt) == pytest.approx(v["none"])
    assert dp_comm_bytes(params, d, "zero3", 1, elt, elt) == pytest.approx(1.5 * v["none"])
    assert dp_comm_bytes(params, 1, "zero3", accum, elt, elt) == 0


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 2**24), t=st.sampled_from([1, 2, 4, 8]),
       mode=st.sampled_from(["none", "selective", "per-layer", "sqrt"]))
def test_tp_comm(tokens, t, mode):
    """Zero without tensor parallelism; per-layer recomputation adds half the all-reduces."""
    v = tp_comm_bytes(GPT2, tokens, t, mode, 2)
    base = tp_comm_bytes(GPT2, tokens, t, "none", 2)
    assert (v == 0) == (t == 1)
    assert v == (1.5 * base if mode in ("per-layer", "sqrt") else base)


@given(p=st.integers(1, 64), m=st.integers(1, 512), v=st.integers(1, 8))
def test_bubble(p, m, v):
    """Narayanan et al. 2021: interleaving divides the bubble by v; one stage has none."""
    assert bubble_fraction("interleaved-1f1b", p, m, v) * v == pytest.approx(bubble_fraction("1f1b", p, m))
    assert (bubble_fraction("gpipe", p, m) == 0) == (p == 1)


def test_ring_bytes():
    assert ring_bytes(8, 2, 2) == 8 and ring_bytes(8, 1, 2) == 0


# ---- measured: on 4 gloo ranks, what it says fits fits and what it says does not fit does not ----
@pytest.mark.slow
def test_planner_budget_measured_on_gloo():
    """For TINY on 4 gloo ranks: pick the budget in the middle of the layouts' peaks; the two
    largest layouts the planner says fit run within it (every rank, measured), and the smallest
    one it says does not fit goes over it."""
    pytest.importorskip("torch.distributed")
    from validate.distributed.measure import measure_distributed

    t = memcalc.TrainingConfig(micro_batch=1, seq_len=32, device="cpu", precision="fp32")
    kw = dict(gpus="4xH100-80GB", global_batch=8, checkpointing=("none", "per-layer"))
    every = plan_cluster(TINY, t, **kw)
    peaks = sorted({x.peak_bytes for x in every})
    i = len(peaks) // 2
    budget = (peaks[i - 1] + peaks[i]) // 2  # between two layouts' peaks, far from either
    fits = plan_cluster(TINY, t, budget=budget, **kw)
    assert fits and all(x.peak_bytes <= budget for x in fits)
    said = {(x.tensor_parallel, x.sharding, x.checkpointing, x.micro_batch) for x in fits}
    over = min((x for x in every if (x.tensor_parallel, x.sharding, x.checkpointing, x.micro_batch) not in said),
               key=lambda x: x.peak_bytes)
    checked = sorted(fits, key=lambda x: -x.peak_bytes)[:2]
    for x, inside in [(c, True) for c in checked] + [(over, False)]:
        run = t.with_(micro_batch=x.micro_batch, grad_accum=x.grad_accum, checkpointing=x.checkpointing,
                      world_size=4, tensor_parallel=x.tensor_parallel, sharding=x.sharding)
        measured = [r["peak_bytes"] for r in measure_distributed(TINY, run)]
        assert (max(measured) <= budget) == inside, (x, measured, budget)
