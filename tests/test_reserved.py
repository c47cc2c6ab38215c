"""Reserved memory from the engine's own allocation sequence (memcalc.engine.allocations,
memcalc.engine.reserved) and the bases capacity answers on (memcalc.queries.basis).

Checked against independent things: the sequence's live bytes against the engine's allocated
peak (a second walk of the same step by a different Memory), the replica's own invariants
(reserved >= allocated after every request, a steady step that reserves nothing new repeats
exactly), and capacity answers against estimate() at the answer and the next value.
"""
from __future__ import annotations

import pytest

from hypothesis import given
from hypothesis import strategies as st

from memcalc.allocator.rules import round_up
from memcalc.core.errors import MemcalcError
from memcalc.engine.allocations import allocation_events
from memcalc.engine.reserved import _sequences, replay_sequence
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.basis import fits_on
from memcalc.queries.capacity import max_micro_batch
from memcalc.queries.estimate import estimate
from tests.strategies import cases


def _cuda(training: TrainingConfig) -> TrainingConfig | None:
    """The same step on CUDA (the caching allocator's device), None where that is refused."""
    try:
        return training.with_(device="cuda")
    except MemcalcError:
        return None


def _refused(model: ModelSpec, training: TrainingConfig | None) -> bool:
    if training is None:
        return True
    try:
        estimate(model, training)
    except MemcalcError:
        return True
    return False


@given(cases(parallel=True))
def test_reserved_at_least_allocated_at_every_event(case: tuple) -> None:
    """After every event of the engine's sequence (construction, first step, steady steps until one
    reserves nothing new), the replica's reserved bytes are at least its allocated bytes, and the
    report's reserved peak is at least its allocated peak."""
    model, training = case
    training = _cuda(training)
    if _refused(model, training):
        return
    for seq in _sequences(model, training):
        r = replay_sequence(seq, training.allocator, trace=True)
        assert r.oom is None and r.steady
        assert all(reserved >= allocated for reserved, allocated in r.trace)
    report = estimate(model, training)
    assert report.reserved_peak_bytes >= report.peak_bytes
    assert report.device_bytes > report.reserved_peak_bytes


@given(cases(parallel=True), st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:64",
                                              "roundup_power2_divisions:4"]))
def test_steady_step_once_more_reserves_nothing(case: tuple, conf: str) -> None:
    """Once a steady step reserved nothing new, replaying it once more reserves nothing new and
    leaves the reserved bytes where they were (the replay's stopping rule holds one step further)."""
    model, training = case
    training = _cuda(training)
    if _refused(model, training):
        return
    training = training.with_(allocator=conf)
    seq = _sequences(model, training)[-1]
    r = replay_sequence(seq, conf)
    assert r.steady
    from memcalc.allocator.replica import CachingAllocator
    from memcalc.allocator.settings import AllocatorSettings

    a, live = CachingAllocator(AllocatorSettings.parse(conf)), {}
    events = seq.construction + seq.first + seq.steady * (r.steps - 1)
    for e in events:
        if e.kind == "alloc":
            live[e.handle] = a.malloc(e.nbytes)
        else:
            a.free(live.pop(e.handle))
    before, segments = a.reserved_bytes, len(a.segment_events)
    assert before == r.peak_reserved_bytes
    for e in seq.steady:
        if e.kind == "alloc":
            live[e.handle] = a.malloc(e.nbytes)
        else:
            a.free(live.pop(e.handle))
    assert a.reserved_bytes == before and len(a.segment_events) == segments


@given(cases())
def test_sequence_live_bytes_peak_is_the_engine_peak(case: tuple) -> None:
    """The sequence's live bytes (each request rounded to 512 B, as the engine rounds storages on
    CUDA) peak in the steady step's forward and backward at the engine's allocated peaks of those
    phases: the same step, walked by EventMemory instead of Memory (over each routing of a MoE
    'worst' bound, whose union the engine takes; an expert's storages there count with the most
    rounding can add, so at most it). In the optimizer phase the sequence has one allocation per
    tensor where the engine holds one block of their sum: at least the engine's peak, and less than
    512 B more per temporary tensor."""
    model, training = case
    training = _cuda(training)
    if _refused(model, training):
        return
    report = estimate(model, training)
    engine = max(report.phases["forward"], report.phases["backward"])
    peaks, optimizer = [], []
    for seq in _sequences(model, training):
        live, size, peak, opt, temporaries = 0, {}, 0, 0, 0
        for e in seq.construction + seq.first + seq.steady:
            n = round_up(e.nbytes, 512)
            if e.step == 2 and e.phase == "end":  # what optimizer.step()'s last mark holds
                opt = max(opt, live)
            if e.kind == "alloc":
                size[e.handle] = n
                live += n
                temporaries += e.step == 2 and e.label.startswith("optimizer temporary")
            else:
                live -= size.pop(e.handle)
            if e.step == 2 and e.phase == "optimizer":
                opt = max(opt, live)
            elif e.step == 2:
                peak = max(peak, live)
        peaks.append(peak)
        optimizer.append((opt, temporaries))
    if model.moe is not None and training.experts_implementation == "eager":
        if training.moe_routing == "worst":
            if engine < max(peaks) < engine + 512:  # open gap (docs/known-gaps.md, reserved memory)
                pytest.xfail(f"open gap: the MoE 'worst' bound's rounding slack is {max(peaks) - engine} B "
                             "short of one routing's 512-B-rounded sequence (found at b=1, s=1)")
            assert max(peaks) <= engine
        return  # 'balanced': fractional tokens per expert, each storage rounded up in the sequence
    assert max(peaks) == engine
    opt, temporaries = optimizer[0]
    assert report.phases["optimizer"] <= opt < report.phases["optimizer"] + 512 * temporaries + 1


def test_allocation_events_replay_through_the_public_replay() -> None:
    """allocation_events feeds memcalc.replay_events as it is; its peak reserved is the report's
    (three steps reach the steady step for GPT-2 here: replay_sequence says how many it took)."""
    from memcalc.allocator.replay import replay_events

    model, training = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=256)
    r = estimate(model, training)
    steps = r.reserved.steps
    assert replay_events(allocation_events(model, training, steps=steps)).peak_reserved_bytes == r.reserved_peak_bytes


def test_cpu_reserved_is_allocated() -> None:
    r = estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=64, device="cpu"))
    assert r.reserved is None and r.reserved_peak_bytes == r.device_bytes == r.peak_bytes


def test_allocator_settings_on_cpu_are_refused_by_name() -> None:
    """device='cpu' has no caching allocator: its settings would change nothing, so they are refused."""
    try:
        TrainingConfig(micro_batch=1, seq_len=8, device="cpu", allocator="expandable_segments:True")
    except MemcalcError as err:
        assert str(err).startswith("allocator:") and "device='cpu'" in str(err)
    else:
        raise AssertionError("allocator settings on cpu were accepted")


def test_allocator_settings_are_refused_by_name() -> None:
    try:
        TrainingConfig(micro_batch=1, seq_len=8, allocator="expandable:True")
    except MemcalcError as err:
        assert "allocator" in str(err) and "expandable" in str(err)
    else:
        raise AssertionError("an unknown key was accepted")


def test_capacity_on_device_bytes_is_the_boundary() -> None:
    """The device-basis answer fits and the next micro-batch does not, each checked with fits_on,
    and it is at most the allocated-basis answer (reserved >= allocated)."""
    model, training = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=512)
    dev = max_micro_batch(model, training, "RTX-4090")
    alloc = max_micro_batch(model, training, "RTX-4090", basis="allocated")
    assert 0 < dev.value <= alloc.value
    budget = dev.budget_bytes
    assert fits_on(model, training.with_(micro_batch=dev.value), budget, "device", "RTX-4090")[0]
    assert not fits_on(model, training.with_(micro_batch=dev.value + 1), budget, "device", "RTX-4090")[0]
    assert dev.peak_bytes <= budget < dev.next_peak_bytes


@given(cases(max_layers=2), st.integers(520, 900))
def test_device_basis_boundary(case: tuple, budget_mib: int) -> None:
    """On the device basis the answer n fits (the replay under the budget less the context serves
    every request) and n + 1 does not, and n is at most the allocated-basis answer."""
    model, training = case
    training = _cuda(training)
    if _refused(model, training):
        return
    budget = budget_mib << 20
    dev = max_micro_batch(model, training, budget)
    assert dev.value <= max_micro_batch(model, training, budget, basis="allocated").value
    if dev.value:
        assert fits_on(model, training.with_(micro_batch=dev.value), budget, "device")[0]
        assert dev.peak_bytes <= budget
    assert not fits_on(model, training.with_(micro_batch=dev.value + 1), budget, "device")[0]


@given(cases(), st.integers(3, 6))
def test_skipped_micro_step_repeats_change_nothing(case: tuple, grad_accum: int) -> None:
    """The replay stops repeating a micro-step once a repeat reserves nothing new: the same run with
    every micro-step written out (EngineSequence.events, through memcalc.replay_events) reserves the
    same bytes."""
    from memcalc.allocator.replay import replay_events

    model, training = case
    training = _cuda(training)
    if _refused(model, training):
        return
    training = training.with_(grad_accum=grad_accum)
    for seq in _sequences(model, training):
        r = replay_sequence(seq)
        full = replay_events([e.as_tuple() for e in seq.events(r.steps)])
        assert full.peak_reserved_bytes == r.peak_reserved_bytes


def test_estimate_screen_and_json_show_allocated_reserved_device(capsys) -> None:
    """`memcalc estimate` prints the three peaks on its first screen and carries them in --json;
    device bytes are reserved plus the CUDA context of memcalc.allocator.outside; --allocator sets
    TrainingConfig.allocator (expandable segments reserve no more here, allocated unchanged)."""
    import json

    from memcalc.allocator.outside import outside_bytes
    from memcalc.cli import main

    flags = ["estimate", "--model", "gpt2", "--micro-batch", "2", "--seq-len", "256"]
    main(flags)
    head = capsys.readouterr().out.splitlines()[1]
    assert head.startswith("  allocated ") and " | reserved " in head and " | device " in head
    main(flags + ["--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["peak_bytes"] <= out["reserved_peak_bytes"] < out["device_bytes"]
    assert out["device_bytes"] - out["reserved_peak_bytes"] == outside_bytes("cuda")
    main(flags + ["--json", "--allocator", "expandable_segments:True"])
    expandable = json.loads(capsys.readouterr().out)
    assert expandable["peak_bytes"] == out["peak_bytes"]
    assert expandable["reserved_peak_bytes"] <= out["reserved_peak_bytes"]
