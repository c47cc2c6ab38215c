"""expandable_segments:True in the replica (c10/cuda/CUDACachingAllocator.cpp, torch 2.11).

One segment per stream and pool reserves address space for 1 1/8 of the device's memory
(ExpandableSegment's constructor: numSegments(totalGlobalMem + totalGlobalMem / 8)) and maps physical
pages into it on demand: 2 MiB pages for the small pool, 20 MiB (kLargeBuffer) for the large pool
(find_expandable_block's segment_size). Mirrored here:
- pick_free_block: get_free_block's expandable branch (a block followed by unmapped space counts with
  that space for best fit; with expandable segments off, expandable blocks are skipped);
- try_allocate_expandable_block / find_expandable_block / map_block: the lowest-address run of free and
  unmapped blocks that holds the request, mapping whole pages (ExpandableSegment::map, all or nothing:
  a failed cuMemCreate releases the pages of that call);
- unmap_block / release_expandable_segment: release_blocks' path for expandable blocks (unmap every
  whole free page; drop the segment when nothing is mapped).
Mapped pages are reserved memory; the replica's segment_events name them as torch's trace does
("segment_map" / "segment_unmap"). `device_total` (default: the device limit, else 1 TiB) sets the
address space, which only decides how large the unmapped tail block is.
"""
from __future__ import annotations

from bisect import bisect_left

from memcalc.allocator.blocks import STREAM_SHIFT, Block, ExpandableSegment, Pool
from memcalc.allocator.settings import K_LARGE_BUFFER, K_SMALL_BUFFER


def _exp_size(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated


def _has_space(b: Block | None, size: int) -> bool:
    room = 0
    while room < size and _allocatable(b):
        room += b.size
        b = b.next
    return room >= size


def _splice(b: Block, before: Block | None, after: Block | None) -> None:
    """Block::splice: link `b` between `before` and `after`."""
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


class ExpandableSegments:
    """expandable_segments:True, as methods of the replica (memcalc.allocator.replica.CachingAllocator
    derives from this class; `self` is the allocator: its pools, limit, reserved bytes, try_merge)."""

    def pick_free_block(self, pool: Pool, i: int, stream: int) -> Block | None:
        """get_free_block's branch for an expandable block at index `i` of the pool's sorted keys."""
        keys, bmap, n = pool.keys, pool.map, len(pool.keys)
        b = bmap[keys[i]]
        if self.expandable_active:
            j = i + 1
            while b.es is not None and j < n and keys[j] >> STREAM_SHIFT == stream:
                nxt = bmap[keys[j]]
                if _exp_size(nxt) >= _exp_size(b):
                    break
                b, j = nxt, j + 1
            return b
        i += 1
        while i < n and bmap[keys[i]].es is not None and keys[i] >> STREAM_SHIFT == stream:
            i += 1
        if i == n or keys[i] >> STREAM_SHIFT != stream:
            return None
        return bmap[keys[i]]

    def find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest-address unmapped run (with a free block just before it)
        that holds `size`, else a new expandable segment's whole unmapped range."""
        ukeys = pool.ukeys
        for k in ukeys[bisect_left(ukeys, stream << STREAM_SHIFT):]:
            if k >> STREAM_SHIFT != stream:
                break
            c = pool.umap[k]
            if _allocatable(c.prev):
                c = c.prev
            if _has_space(c, size):
                return c
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        total = self.device_total
        vsize = -(-(total + total // 8) // page) * page
        base = self.fresh_address(vsize)
        es = ExpandableSegment(base, vsize, page, ("new", self.new_segments), stream)
        self.new_segments += 1
        self.register_segment(base, vsize)
        c = Block(base, vsize, stream, pool, es, es)
        c.mapped = False
        pool.insert_unmapped(c)
        return c

    def map_block(self, b: Block, size: int) -> bool:
        """map_block: back the first `size` bytes of unmapped block `b` with whole pages."""
        es, pool = b.es, b.pool
        page = es.page
        begin = (b.addr - es.base) // page
        end = -(-(b.addr + size - es.base) // page)
        nbytes = (end - begin) * page
        if nbytes == 0 or (self.limit is not None and self.reserved_bytes + nbytes > self.limit):
            return False  # cuMemCreate out of memory: the pages of this call are released
        pool.erase_unmapped(b)
        b.mapped = True
        if nbytes < b.size:
            rest = Block(b.addr + nbytes, b.size - nbytes, b.stream, pool, es, es)
            rest.mapped = False
            _splice(rest, b, b.next)
            pool.insert_unmapped(rest)
            b.size = nbytes
        self.try_merge(b, b.prev, pool)
        self.try_merge(b, b.next, pool)
        pool.insert(b)
        self.add_reserved(es.base, nbytes, "segment_map")
        return True

    def try_allocate_expandable_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """try_allocate_expandable_block: map pages until one free block holds `size`; None when out of memory."""
        c = self.find_expandable_block(pool, size, stream)
        if not c.mapped and not self.map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            if not self.map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        pool.erase(c)
        return c

    def unmap_block(self, b: Block) -> None:
        """unmap_block: return the whole free pages of cached block `b` to the device."""
        es, pool = b.es, b.pool
        page = es.page
        begin = -(-(b.addr - es.base) // page)
        end = (b.addr + b.size - es.base) // page
        if begin >= end:
            return
        pool.erase(b)
        start, nbytes = es.base + begin * page, (end - begin) * page
        before = start - b.addr
        if before > 0:
            head = Block(b.addr, before, b.stream, pool, es, es)
            _splice(head, b.prev, b)
            pool.insert(head)
        after = b.size - (before + nbytes)
        if after > 0:
            tail = Block(start + nbytes, after, b.stream, pool, es, es)
            _splice(tail, b, b.next)
            pool.insert(tail)
        b.addr, b.size, b.mapped = start, nbytes, False
        self.try_merge(b, b.prev, pool)
        self.try_merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self.drop_reserved(es.base, nbytes, "segment_unmap")

    def release_expandable_segment(self, b: Block) -> None:
        """release_expandable_segment: the segment's address space, once nothing in it is mapped."""
        b.pool.erase_unmapped(b)
        self.unregister_segment(b.es.base)
