"""The allocator's data: segments, blocks and pools (c10/cuda/CUDACachingAllocator.cpp: struct Block,
struct BlockPool, struct ExpandableSegment).

A cached block's key is one int, stream << 124 | size << 62 | address: sorted, the keys are in the
order BlockComparatorSize gives the real block set (stream, then size, then address), so bisect finds
what std::set::lower_bound finds. Unmapped blocks (expandable segments) are keyed stream << 124 |
address (BlockComparatorAddress).
"""
from __future__ import annotations

from bisect import bisect_left, insort

STREAM_SHIFT, SIZE_SHIFT = 124, 62
ADDR_MASK = (1 << SIZE_SHIFT) - 1


class Segment:
    """One cudaMalloc'd segment: its base address, size and the key placements name it by."""

    __slots__ = ("base", "size", "key")
    expandable = False

    def __init__(self, base: int, size: int, key: object):
        self.base, self.size, self.key = base, size, key


class Block:
    """A block of a segment (struct Block): allocated, cached in a pool, or (expandable) unmapped."""

    __slots__ = ("addr", "size", "stream", "pool", "seg", "es", "prev", "next", "allocated",
                 "pending", "requested", "mapped", "gc_base", "key")

    def __init__(self, addr: int, size: int, stream: int, pool: Pool, seg: object, es: object = None):
        self.addr, self.size, self.stream, self.pool, self.seg, self.es = addr, size, stream, pool, seg, es
        self.prev = self.next = None
        self.allocated = self.pending = False
        self.requested, self.mapped, self.gc_base, self.key = 0, True, 0, 0


class Pool:
    """A BlockPool: its cached blocks (sorted keys + key -> Block) and its unmapped blocks."""

    __slots__ = ("small", "keys", "map", "ukeys", "umap", "gc_calls")

    def __init__(self, small: bool):
        self.small, self.keys, self.map, self.ukeys, self.umap, self.gc_calls = small, [], {}, [], {}, 0

    def insert(self, b: Block) -> None:
        """BlockPool::insert_into_blocks (records the gc counter)."""
        b.gc_base = self.gc_calls
        k = b.key = (b.stream << STREAM_SHIFT) | (b.size << SIZE_SHIFT) | b.addr
        insort(self.keys, k)
        self.map[k] = b

    def erase(self, b: Block) -> None:
        k = b.key
        del self.map[k]
        keys = self.keys
        del keys[bisect_left(keys, k)]

    def insert_unmapped(self, b: Block) -> None:
        """BlockPool::unmapped is ordered by (stream, address) (BlockComparatorAddress)."""
        k = b.key = (b.stream << STREAM_SHIFT) | b.addr
        insort(self.ukeys, k)
        self.umap[k] = b

    def erase_unmapped(self, b: Block) -> None:
        del self.umap[b.key]
        del self.ukeys[bisect_left(self.ukeys, b.key)]


class ExpandableSegment:
    """The address space of one expandable segment (struct ExpandableSegment): base, size, page size."""

    __slots__ = ("base", "size", "page", "key", "stream")
    expandable = True

    def __init__(self, base: int, size: int, page: int, key: object, stream: int):
        self.base, self.size, self.page, self.key, self.stream = base, size, page, key, stream
