"""Invariants of the caching-allocator replica over random alloc/free sequences (hypothesis).

Two invariants the reserved-memory issue proposed do not hold for torch's allocator, and the tests
at the end show why with sequences worked out by hand from CUDACachingAllocator.cpp's rules:
expandable segments can reserve more than the default mode (they map 20 MiB pages and cannot reuse a
hole smaller than the request, where the default mode's 2 MiB-rounded segment happened to fit), and a
second pass of the same step can reserve more (best fit moves the first request into a segment that
did not exist yet in the first pass). What does hold is tested instead: expandable segments never
reserve more than the default mode plus one page per pool on sequences without frees, and a repeated
step reaches a pass that reserves nothing new, after which every pass is identical.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import tests.strategies  # noqa: F401  (registers and loads the hypothesis profile)
from memcalc.allocator.replay import replay_events
from memcalc.allocator.replica import AllocatorOutOfMemory, CachingAllocator
from memcalc.allocator.settings import K_LARGE_BUFFER, K_SMALL_BUFFER, AllocatorSettings

MIB = 1 << 20
SIZES = st.one_of(st.integers(1, MIB), st.integers(MIB + 1, 12 * MIB), st.integers(10 * MIB, 200 * MIB))
DEFAULT, EXPANDABLE = AllocatorSettings(), AllocatorSettings(expandable_segments=True)
SETTINGS = st.sampled_from([DEFAULT, EXPANDABLE, AllocatorSettings.parse("max_split_size_mb:64"),
                            AllocatorSettings.parse("roundup_power2_divisions:4"),
                            AllocatorSettings.parse("expandable_segments:True,roundup_power2_divisions:[2:2,>:8]")])


@st.composite
def sequences(draw: st.DrawFn, frees: bool = True, free_all: bool = False, streams: int = 1) -> list[tuple]:
    """A random alloc/free sequence over a few recurring sizes (as a training step has)."""
    sizes = draw(st.lists(SIZES, min_size=1, max_size=6))
    events, live = [], []
    for h in range(draw(st.integers(1, 40))):
        if frees and live and draw(st.booleans()):
            events.append(("free", live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            events.append(("alloc", h, draw(st.sampled_from(sizes)), draw(st.integers(0, streams - 1))))
            live.append(h)
    if free_all:
        events += [("free", h) for h in draw(st.permutations(live))]
    return events


@given(sequences(streams=2), SETTINGS, st.one_of(st.none(), st.integers(20, 400).map(lambda m: m * MIB)))
def test_reserved_covers_allocated_at_every_event(events, settings, limit):
    a, live = CachingAllocator(settings, limit), {}
    for e in events:
        if e[0] == "alloc":
            try:
                live[e[1]] = a.malloc(e[2], e[3])
            except AllocatorOutOfMemory:
                assert limit is not None
        elif e[1] in live:
            a.free(live.pop(e[1]))
        assert a.reserved_bytes >= a.allocated_bytes >= a.requested_bytes >= 0
        assert limit is None or a.reserved_bytes <= limit
    a.empty_cache()
    assert a.reserved_bytes >= a.allocated_bytes
    if not live and not settings.expandable_segments:
        assert a.reserved_bytes == 0  # every segment is unsplit and free again: empty_cache frees all


@given(sequences(frees=False))
def test_expandable_within_one_page_of_default_without_frees(events):
    """Without frees, an expandable segment packs its pool's blocks end to end (split remainders
    >= 512 B; pages mapped at the lowest free address), so it maps at most one page beyond them;
    the default mode reserves at least the blocks."""
    default = replay_events(events, DEFAULT).peak_reserved_bytes
    assert replay_events(events, EXPANDABLE).peak_reserved_bytes <= default + K_LARGE_BUFFER + K_SMALL_BUFFER


@given(sequences(free_all=True), st.sampled_from([DEFAULT, EXPANDABLE]))
def test_a_repeated_step_reaches_a_steady_state(events, settings):
    """A step that frees all it allocates, run again and again: some pass reserves nothing new (the
    cache only grows, and each pass leaves every segment whole and free); from then on each pass
    starts from the same state, so it places every request as the pass before did."""
    def passes(n: int) -> list[tuple]:
        return [(e[0], (k, e[1]), *e[2:]) for k in range(n) for e in events]

    per_pass = len([e for e in events if e[0] == "alloc"])
    previous = replay_events(passes(1), settings)
    for n in range(2, 12):
        r = replay_events(passes(n), settings)
        if r.segment_events == previous.segment_events:
            again = replay_events(passes(n + 1), settings)
            assert again.segment_events == r.segment_events
            assert again.placements[-per_pass:] == r.placements[-per_pass:]
            return
        previous = r
    raise AssertionError("no steady state within 11 passes")


def test_expandable_segments_can_reserve_more_than_the_default_mode():
    """Worked by hand from the source. A = 189,340,561 B, B = 191,288,291 B, C = 190,198,179 B
    (180.6, 182.4, 181.4 MiB). Default: A gets a 182 MiB segment (get_allocation_size: >= 10 MiB,
    rounded up to 2 MiB), B a 184 MiB one; A is freed and C (181.4 MiB <= 182 MiB) takes A's
    segment: 366 MiB. Expandable: A maps 10 pages of 20 MiB (200 MiB), B continues after it and maps
    9 more (380 MiB); A's hole (180.6 MiB) is smaller than C, so C maps 9 more pages: 560 MiB."""
    events = [("alloc", "A", 189340561), ("alloc", "B", 191288291), ("free", "A"), ("alloc", "C", 190198179)]
    assert replay_events(events, DEFAULT).peak_reserved_bytes == 366 * MIB
    assert replay_events(events, EXPANDABLE).peak_reserved_bytes == 560 * MIB


def test_a_second_pass_can_reserve_more():
    """Worked by hand. A = 8.8 MiB, B = C = 10.17 MiB, all freed. Pass 1: A opens a 20 MiB segment
    (requests under 10 MiB), B fits its 11.2 MiB remainder, C opens a 12 MiB segment. Pass 2 starts
    with both free: best fit puts A in the 12 MiB segment, B in the 20 MiB one, and C fits neither
    remainder (3.2 and 9.8 MiB): a third segment, 12 MiB."""
    step = [("alloc", "A", 9225825), ("alloc", "B", 10664016), ("alloc", "C", 10664016),
            ("free", "A"), ("free", "C"), ("free", "B")]
    twice = step + [(e[0], ("2", e[1]), *e[2:]) for e in step]
    assert replay_events(step).peak_reserved_bytes == 32 * MIB
    assert replay_events(twice).segment_events[2:] == [("segment_alloc", 12 * MIB)]
