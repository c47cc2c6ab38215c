"""Each rule of the caching-allocator replica on a sequence worked out by hand from
c10/cuda/CUDACachingAllocator.cpp (torch 2.11); the function each case follows is named."""
from __future__ import annotations

import pytest

from memcalc.allocator.replay import replay_events
from memcalc.allocator.replica import AllocatorOutOfMemory, CachingAllocator
from memcalc.allocator.settings import AllocatorSettings, allocation_size

MIB = 1 << 20


def test_round_size_and_roundup_power2_divisions():
    """round_size: 512 B multiples; with divisions d > 1 and size > 512 d, the next of d steps
    between the powers of two around the size (roundup_power2_next_division)."""
    plain, four = AllocatorSettings(), AllocatorSettings.parse("roundup_power2_divisions:4")
    assert [plain.round_size(n) for n in (0, 1, 512, 513)] == [512, 512, 512, 1024]
    assert four.round_size(1200) == 1536  # 1200 <= 512 * 4: plain rounding
    assert four.round_size(5 * MIB + 1) == 6 * MIB  # [4, 8) MiB in 4 steps of 1 MiB
    assert four.round_size(8 * MIB) == 8 * MIB  # a power of two stays


def test_segment_sizes():
    """get_allocation_size: 2 MiB for the small pool, 20 MiB under 10 MiB, else 2 MiB multiples."""
    assert [allocation_size(n) for n in (512, MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 10 * MIB + 512)] == [
        2 * MIB, 2 * MIB, 20 * MIB, 20 * MIB, 10 * MIB, 12 * MIB]


def test_small_requests_pack_into_2_mib_segments():
    events = [("alloc", i, 1) for i in range(4097)]  # 512 B blocks, 4096 per 2 MiB segment
    r = replay_events(events)
    assert r.segment_events == [("segment_alloc", 2 * MIB)] * 2
    assert r.placements[4095] == (("new", 0), 4095 * 512) and r.placements[4096] == (("new", 1), 0)


def test_large_remainders_split_only_above_1_mib():
    """should_split (large pool): split when the remainder exceeds kSmallSize (1 MiB)."""
    a = CachingAllocator()
    whole = a.malloc(19 * MIB + MIB // 2)  # a 20 MiB segment, remainder 0.5 MiB: not split
    assert whole.size == 20 * MIB and a.allocated_bytes == 20 * MIB
    part = a.malloc(10 * MIB + 1)  # its own 12 MiB segment, remainder 2 MiB - 512: split
    assert part.size == 10 * MIB + 512 and a.reserved_bytes == 32 * MIB


def test_best_fit_breaks_ties_by_address_and_keeps_streams_apart():
    """get_free_block: lower_bound over (stream, size, address)."""
    a = CachingAllocator()
    a.add_segment(2 << 40, 20 * MIB, 0, False, [])
    a.add_segment(1 << 40, 20 * MIB, 0, False, [])
    a.add_segment(3 << 40, 20 * MIB, 7, False, [])  # stream 7's cache
    assert a.malloc(3 * MIB).addr == 1 << 40
    assert a.malloc(3 * MIB, stream=7).addr == 3 << 40
    assert a.malloc(18 * MIB).addr == 2 << 40  # 17 MiB left at 1 << 40 is smaller than 18: the other


def test_frees_coalesce_with_both_neighbours():
    """free_block -> try_merge_blocks with the previous and the next block."""
    a = CachingAllocator()
    x, y, z = a.malloc(4 * MIB), a.malloc(4 * MIB), a.malloc(4 * MIB)  # one 20 MiB segment
    a.free(x)
    a.free(z)  # merges with the 8 MiB tail: 12 MiB free after y
    a.free(y)  # merges with both: the whole segment
    w = a.malloc(19 * MIB + MIB // 2)
    assert (w.addr, w.size, a.reserved_bytes) == (x.addr, 20 * MIB, 20 * MIB)


def test_max_split_size_and_the_oversize_rounding_limit():
    """get_free_block: a block >= max_split_size serves no request below it, and a larger request only
    when the block is under request + max_non_split_rounding_size (20 MiB)."""
    s = AllocatorSettings.parse("max_split_size_mb:64")
    b = CachingAllocator(s)
    big = b.malloc(100 * MIB)
    b.free(big)
    assert b.malloc(30 * MIB).addr != big.addr  # below max_split: a new segment
    assert b.malloc(70 * MIB).addr != big.addr  # 100 >= 70 + 20: a new segment
    assert b.malloc(90 * MIB).addr == big.addr  # 100 < 90 + 20: the cached block, not split
    assert b.allocated_bytes == 30 * MIB + 70 * MIB + 100 * MIB


def test_cudamalloc_failure_releases_the_cache_then_retries():
    """malloc: alloc_block fails at the limit -> release_cached_blocks -> alloc_block again."""
    r = replay_events([("alloc", 0, 20 * MIB), ("free", 0), ("alloc", 1, 30 * MIB)], device_limit=40 * MIB)
    assert r.segment_events == [("segment_alloc", 20 * MIB), ("segment_free", 20 * MIB),
                                ("segment_alloc", 30 * MIB)] and not r.ooms
    oom = replay_events([("alloc", 0, 20 * MIB), ("alloc", 1, 30 * MIB)], device_limit=40 * MIB)
    assert oom.ooms == [1] and oom.segment_events == [("segment_alloc", 20 * MIB)]


def test_with_max_split_size_only_the_oversize_blocks_needed_are_released():
    """release_available_cached_blocks: with max_split_size set, the smallest cached oversize block
    that covers the request is freed, and the rest of the cache stays."""
    s = AllocatorSettings.parse("max_split_size_mb:64")
    events = [("alloc", "a", 20 * MIB), ("alloc", "b", 100 * MIB), ("alloc", "c", 120 * MIB),
              ("free", "a"), ("free", "b"), ("free", "c"), ("alloc", "d", 80 * MIB)]
    r = replay_events(events, s, device_limit=240 * MIB + 10 * MIB)
    # d (80 MiB): 100 >= 80 + 20 and 120 too, so no cached block; cudaMalloc(80) exceeds the limit
    # (240 + 80 > 250); the first oversize block >= 80 MiB in (size, address) order is the 100 MiB one
    assert r.segment_events[3:] == [("segment_free", 100 * MIB), ("segment_alloc", 80 * MIB)]


def test_empty_cache_releases_large_pool_by_size_then_small_pool():
    """release_cached_blocks: release_blocks(large_blocks) then release_blocks(small_blocks), each in
    set order; split segments with an allocated block stay."""
    a = CachingAllocator()
    blocks = [a.malloc(n) for n in (30 * MIB, 512, 12 * MIB, 3 * MIB, 3 * MIB)]
    held = blocks.pop(3)  # the first 3 MiB block holds its 20 MiB segment
    for b in blocks:
        a.free(b)
    a.empty_cache()
    assert a.segment_events[-3:] == [("segment_free", 12 * MIB), ("segment_free", 30 * MIB),
                                     ("segment_free", 2 * MIB)]
    assert a.reserved_bytes == 20 * MIB and held.allocated


def test_garbage_collection_frees_the_oldest_cached_blocks_first():
    """garbage_collect_cached_blocks with threshold 0.5 of a 100 MiB maximum (see the steps)."""
    s = AllocatorSettings.parse("garbage_collection_threshold:0.5")
    a = CachingAllocator(s, device_limit=100 * MIB)
    x, y, _ = a.malloc(12 * MIB), a.malloc(14 * MIB), a.malloc(16 * MIB)  # gets 1..3
    a.free(x)
    a.free(y)  # both cached at get count 3
    a.free(a.malloc(12 * MIB))  # get 4 reuses x's block, cached again at 4
    a.malloc(30 * MIB)  # get 5: 42 MiB reserved <= 50: no collection; 72 MiB reserved
    a.malloc(40 * MIB)  # get 6: 72 > 50, reclaim 22: ages 2 (12 MiB) and 3 (14 MiB), mean 2.5:
    #                     the 14 MiB one, then (mean 2) the 12 MiB one
    assert a.segment_events[4:] == [("segment_free", 14 * MIB), ("segment_free", 12 * MIB),
                                    ("segment_alloc", 40 * MIB)]


def test_expandable_segments_map_pages_and_unmap_them():
    """try_allocate_expandable_block / map_block: one segment per pool and stream grows by pages
    (2 MiB small, 20 MiB large); release_blocks unmaps whole free pages."""
    a = CachingAllocator(AllocatorSettings(expandable_segments=True))
    x, y, z = a.malloc(3 * MIB), a.malloc(3 * MIB), a.malloc(100)
    assert (x.seg.key, y.addr - x.addr) == (("new", 0), 3 * MIB)  # contiguous in one 20 MiB page
    assert z.seg.key == ("new", 1) and a.reserved_bytes == 22 * MIB
    w = a.malloc(15 * MIB)  # 14 MiB left in the page: map one more page after it
    assert w.addr == y.addr + 3 * MIB and a.reserved_bytes == 42 * MIB
    for b in (x, y, z, w):
        a.free(b)
    a.empty_cache()
    assert a.reserved_bytes == 0
    assert a.segment_events[-2:] == [("segment_unmap", 40 * MIB), ("segment_unmap", 2 * MIB)]


def test_out_of_memory_is_raised_with_the_request():
    a = CachingAllocator(device_limit=10 * MIB)
    with pytest.raises(AllocatorOutOfMemory) as err:
        a.malloc(11 * MIB)
    assert err.value.size == 12 * MIB and a.num_ooms == 1
