"""A replica of torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.11).

Every rule cites the function of DeviceCachingAllocator it mirrors:
- malloc: round_size -> get_pool (small pool for blocks <= 1 MiB) -> get_free_block; when nothing fits,
  garbage_collect_cached_blocks (only with a threshold and an allowed maximum), then alloc_block
  (cudaMalloc of get_allocation_size), then release_available_cached_blocks + alloc_block, then
  release_cached_blocks + alloc_block, then out of memory; should_split -> alloc_found_block.
- The free-block set is ordered as BlockComparatorSize orders it: (stream, size, address). Here a
  block's key is one int, stream << 124 | size << 62 | address, so that a sorted list and bisect
  find the best fit as std::set::lower_bound does.
- free: free_block (at free_completed) coalesces with the previous and next block
  (try_merge_blocks) and returns the block to its pool.
- empty_cache: release_cached_blocks -> release_blocks(large) then release_blocks(small): every
  unsplit cached block, in set order.
A device limit stands for the bytes cudaMalloc can get: cudaMalloc (and cuMemCreate) fails when the
reserved total would exceed it. Without one, cudaMalloc never fails.
expandable_segments:True is in memcalc.allocator.expandable (a base class of the replica).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from memcalc.allocator.blocks import SIZE_SHIFT, STREAM_SHIFT, Block, Pool, Segment
from memcalc.allocator.expandable import ExpandableSegments
from memcalc.allocator.settings import (K_MIN_BLOCK, K_SMALL_SIZE, SIZE_MAX, AllocatorSettings,
                                        allocation_size)

SYNTHETIC_BASE = 1 << 56  # where segments the replay invents are placed (above any real address)


class AllocatorOutOfMemory(Exception):  # noqa: N818  (torch's name: OutOfMemoryError)
    """The replica could not serve a request (torch raises torch.OutOfMemoryError here)."""

    def __init__(self, size: int, reserved: int):
        super().__init__(f"out of memory: {size} bytes requested with {reserved} bytes reserved")
        self.size, self.reserved = size, reserved


class CachingAllocator(ExpandableSegments):
    """The replica. `malloc`/`free` as torch's allocator serves them; stats as torch.cuda.memory_stats.

    >>> a = CachingAllocator()
    >>> x = a.malloc(3 * 1024 * 1024)  # large pool, under 10 MiB: a 20 MiB segment, split
    >>> a.reserved_bytes // 2**20, x.size // 2**20, x.addr == x.seg.base
    (20, 3, True)
    >>> y = a.malloc(4 * 1024 * 1024); y.addr - y.seg.base == 3 * 2**20   # best fit: the remainder
    True
    >>> a.free(x); a.free(y); a.empty_cache(); a.reserved_bytes, a.segment_events[-1]
    (0, ('segment_free', 20971520))
    """

    def __init__(self, settings: AllocatorSettings | None = None, device_limit: int | None = None,
                 device_total: int | None = None):
        s = self.settings = settings or AllocatorSettings()
        self.limit = device_limit
        self.plain_rounding = not any(s.roundup_power2_divisions)  # round_size is then ceil to 512 B
        self.max_split = s.max_split_size
        self.max_non_split = s.max_non_split_rounding_size
        self.expandable_active = s.expandable_segments
        # garbage_collect_cached_blocks runs only when an allowed maximum is set (set_per_process_memory
        # _fraction); the replica takes the device limit as that maximum.
        self.gc_active = s.garbage_collection_threshold > 0 and device_limit is not None
        self.device_total = device_total or device_limit or (1 << 40)
        self.small_pool, self.large_pool = Pool(True), Pool(False)
        self.reserved_bytes = self.allocated_bytes = self.requested_bytes = 0
        self.peak_reserved_bytes = self.peak_allocated_bytes = self.peak_requested_bytes = 0
        self.segment_events: list[tuple[str, int]] = []
        self.new_segments = 0
        self.num_ooms = 0
        self._bases: list[int] = []  # live segments (cudaMalloc'd and expandable), by base address
        self._sizes: dict[int, int] = {}
        self._next_synthetic = SYNTHETIC_BASE
        self.address_hints: list[tuple[int, int]] = []  # (address, size) cudaMalloc may answer with

    # -- the request path -------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        """DeviceCachingAllocator::malloc: a block for `orig_size` bytes on `stream`."""
        if self.plain_rounding:
            size = ((orig_size + 511) >> 9) << 9 if orig_size > K_MIN_BLOCK else K_MIN_BLOCK
        else:
            size = self.settings.round_size(orig_size)
        pool = self.small_pool if size <= K_SMALL_SIZE else self.large_pool
        b = self.get_free_block(pool, size, stream)
        if b is None:
            alloc_size = allocation_size(size)
            if self.gc_active:
                self.garbage_collect_cached_blocks()
            b = self.alloc_block(pool, size, alloc_size, stream)
            if b is None and self.release_available_cached_blocks(pool, size, stream):
                b = self.alloc_block(pool, size, alloc_size, stream)
            if b is None:
                self.release_cached_blocks()
                b = self.alloc_block(pool, size, alloc_size, stream)
            if b is None:
                self.num_ooms += 1
                raise AllocatorOutOfMemory(alloc_size, self.reserved_bytes)
        return self.alloc_found_block(b, size, orig_size, self.should_split(b, size))

    def get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """get_free_block: takes the best fit out of the pool (counting the get for the gc ages)."""
        if self.gc_active:
            pool.gc_calls += 1
        b = self.find_free_block(pool, size, stream)
        if b is not None:
            pool.erase(b)
        return b

    def find_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """get_free_block's search: the first cached block >= (stream, size), its oversize rules."""
        keys = pool.keys
        i = bisect_left(keys, (stream << STREAM_SHIFT) | (size << SIZE_SHIFT))
        n = len(keys)
        if i == n or keys[i] >> STREAM_SHIFT != stream:
            return None
        b = pool.map[keys[i]]
        if b.es is not None:
            b = self.pick_free_block(pool, i, stream)
            if b is None:
                return None
        if size < self.max_split and b.size >= self.max_split:
            return None  # do not return an oversized block for a small request
        if size >= self.max_split and b.size >= size + self.max_non_split:
            return None  # an oversized block may be rounded up only within max_non_split_rounding
        return b

    def release_plan(self, orig_size: int, stream: int = 0) -> set[int] | bool:
        """What malloc(orig_size) would release before its cudaMalloc succeeds, without doing it:
        False (nothing: a cached block fits, or cudaMalloc fits under the limit), True (the garbage
        collector runs; not predicted here), or the bases of the segments it would free
        (release_available_cached_blocks' choice when that makes room, else every unsplit cached
        block, as release_cached_blocks frees them)."""
        size = self.settings.round_size(orig_size)
        pool = self.small_pool if size <= K_SMALL_SIZE else self.large_pool
        if self.find_free_block(pool, size, stream) is not None:
            return False
        if self.gc_active and self.reserved_bytes > self.settings.garbage_collection_threshold * self.limit:
            return True
        need = allocation_size(size) if not self.expandable_active else size
        if self.limit is None or self.reserved_bytes + need <= self.limit:
            return False
        chosen = self._release_available_choice(pool, size, stream)
        if chosen and self.reserved_bytes - sum(b.size for b in chosen) + need <= self.limit:
            return {b.seg.base for b in chosen}
        return {b.seg.base for p in (self.large_pool, self.small_pool) for b in p.map.values()
                if b.es is None and b.prev is None and b.next is None}

    def _release_available_choice(self, pool: Pool, size: int, stream: int) -> list[Block]:
        """The blocks release_available_cached_blocks would free ([] when it would return false)."""
        if self.max_split == SIZE_MAX:
            return []
        need = max(size, self.max_split)
        keys = pool.keys
        i = bisect_left(keys, (stream << STREAM_SHIFT) | (need << SIZE_SHIFT))
        if i < len(keys) and keys[i] >> STREAM_SHIFT == stream and pool.map[keys[i]].es is None:
            return [pool.map[keys[i]]]
        chosen, released = [], 0
        while i > 0 and released < need:
            i -= 1
            b = pool.map[keys[i]]
            if b.size < self.max_split or b.stream != stream:
                break
            if b.es is None:
                chosen.append(b)
                released += b.size
        return chosen if released >= need else []

    def should_split(self, b: Block, size: int) -> bool:
        """should_split: small pool or expandable: any remainder >= 512 B; large: > 1 MiB, under max_split."""
        remaining = b.size - size
        if b.pool.small or self.expandable_active:
            return remaining >= K_MIN_BLOCK
        return size < self.max_split and remaining > K_SMALL_SIZE

    def alloc_found_block(self, b: Block, size: int, orig_size: int, split: bool) -> Block:
        """alloc_found_block: the block, split off the front of `b` when `split`; the stats."""
        if split:
            rest = b
            b = Block(rest.addr, size, rest.stream, rest.pool, rest.seg, rest.es)
            b.prev = rest.prev
            if b.prev is not None:
                b.prev.next = b
            b.next = rest
            rest.prev = b
            rest.addr += size
            rest.size -= size
            rest.pool.insert(rest)
        b.allocated, b.requested = True, orig_size
        self.allocated_bytes += b.size
        self.requested_bytes += orig_size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        return b

    # -- frees --------------------------------------------------------------------------------------
    def free(self, b: Block) -> None:
        """free + free_block: the block returns to its pool at once (no recorded stream uses)."""
        self.free_requested(b)
        self.free_completed(b)

    def free_requested(self, b: Block) -> None:
        """free: allocated_bytes drops now; the block stays out of the pool until free_completed."""
        if not b.pending:
            self.allocated_bytes -= b.size
            b.pending = True

    def free_completed(self, b: Block) -> None:
        """free_block: coalesce with the free neighbours (try_merge_blocks) and cache the block."""
        if not b.pending:  # free_completed without free_requested (a replayed trace may do that)
            self.allocated_bytes -= b.size
        b.pending = False
        self.requested_bytes -= b.requested
        b.allocated = False
        pool = b.pool
        self.try_merge(b, b.prev, pool)
        self.try_merge(b, b.next, pool)
        pool.insert(b)

    def try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """try_merge_blocks: absorb a free neighbour `src` into `dst`; the bytes absorbed."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- cudaMalloc and releases ---------------------------------------------------------------------
    def alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        """alloc_block: cudaMalloc(alloc_size) for a new segment (or map pages when expandable)."""
        if self.gc_active and self.reserved_bytes + alloc_size > self.limit:
            return None  # the allowed maximum of set_per_process_memory_fraction
        if self.expandable_active:
            return self.try_allocate_expandable_block(pool, size, stream)
        if self.limit is not None and self.reserved_bytes + alloc_size > self.limit:
            return None
        base = self.segment_address(alloc_size)
        seg = Segment(base, alloc_size, ("new", self.new_segments))
        self.new_segments += 1
        self.add_reserved(base, alloc_size, "segment_alloc")
        return Block(base, alloc_size, stream, pool, seg)

    def release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: with max_split_size set, free oversize cached blocks."""
        if self.max_split == SIZE_MAX:
            return False
        need = max(size, self.max_split)
        keys = pool.keys
        i = bisect_left(keys, (stream << STREAM_SHIFT) | (need << SIZE_SHIFT))
        if i == len(keys) or keys[i] >> STREAM_SHIFT != stream or pool.map[keys[i]].es is not None:
            if i == 0:
                return False
            released, i = 0, i - 1  # no single block is large enough: free the largest ones
            while released < need:
                b = pool.map[keys[i]]
                if b.size < self.max_split or b.stream != stream:
                    break
                first = i == 0
                i -= 0 if first else 1
                if b.es is None:
                    released += b.size
                    self.release_block(b)
                if first:
                    break
            return released >= need
        self.release_block(pool.map[keys[i]])
        return True

    def release_cached_blocks(self) -> None:
        """release_cached_blocks (empty_cache): every unsplit cached block, large pool first."""
        for pool in (self.large_pool, self.small_pool):
            to_unmap = []
            for k in list(pool.keys):
                b = pool.map[k]
                if b.es is not None:
                    to_unmap.append(b)
                elif b.prev is None and b.next is None:
                    self.release_block(b)
            for b in to_unmap:
                self.unmap_block(b)
                if b.prev is None and b.next is None:
                    self.release_expandable_segment(b)

    empty_cache = release_cached_blocks

    def release_block(self, b: Block) -> None:
        """release_block: cudaFree a whole cached segment."""
        b.pool.erase(b)
        self.drop_reserved(b.seg.base, b.size, "segment_free")

    def garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: above threshold x limit, free unsplit large blocks of
        at least the average age (gets since cached), repeating until the excess is reclaimed."""
        threshold = int(self.settings.garbage_collection_threshold * self.limit)
        if self.reserved_bytes <= threshold:
            return
        target, reclaimed = self.reserved_bytes - threshold, 0
        pool = self.large_pool
        ages = [pool.gc_calls - b.gc_base for b in pool.map.values() if b.prev is None and b.next is None]
        total_age, count = sum(ages), len(ages)
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for k in list(pool.keys):
                b = pool.map[k]
                age = pool.gc_calls - b.gc_base
                if b.prev is None and b.next is None and b.es is None and age >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self.release_block(b)

    # -- reserved memory and addresses ---------------------------------------------------------------
    def add_reserved(self, base: int, size: int, event: str) -> None:
        self.reserved_bytes += size
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        self.segment_events.append((event, size))
        if event == "segment_alloc":
            self.register_segment(base, size)

    def drop_reserved(self, base: int, size: int, event: str) -> None:
        self.reserved_bytes -= size
        self.segment_events.append((event, size))
        if event == "segment_free":
            self.unregister_segment(base)

    def register_segment(self, base: int, size: int) -> None:
        """A live segment's address range (so that cudaMalloc's answers never overlap it)."""
        insort(self._bases, base)
        self._sizes[base] = size
        self._next_synthetic = max(self._next_synthetic, -(-(base + size) // (2 << 20)) * (2 << 20))

    def unregister_segment(self, base: int) -> None:
        del self._bases[bisect_left(self._bases, base)]
        del self._sizes[base]

    def segment_address(self, size: int) -> int:
        """cudaMalloc's answer: the first address hint of this size that overlaps no live segment,
        else a fresh address above every other (the replay passes the recording's answers as hints)."""
        for j, (addr, hint_size) in enumerate(self.address_hints):
            if hint_size == size and self._free_range(addr, size):
                del self.address_hints[j]
                return addr
        return self.fresh_address(size)

    def fresh_address(self, size: int) -> int:
        addr = self._next_synthetic
        self._next_synthetic += -(-size // (2 << 20)) * (2 << 20)
        return addr

    def _free_range(self, addr: int, size: int) -> bool:
        bases = self._bases
        i = bisect_right(bases, addr)
        if i and bases[i - 1] + self._sizes[bases[i - 1]] > addr:
            return False
        return i == len(bases) or bases[i] >= addr + size

    # -- a state that did not start empty ------------------------------------------------------------
    def add_segment(self, base: int, size: int, stream: int, small: bool,
                    allocated: list[tuple[int, int, int]], key: object = None) -> list[Block]:
        """Install a cudaMalloc'd segment that exists before the replay: `allocated` lists its
        allocated blocks as (address, size, requested bytes), by address; the gaps are cached free
        blocks. Returns the allocated blocks. Its reserved bytes count from the start."""
        pool = self.small_pool if small else self.large_pool
        seg = Segment(base, size, base if key is None else key)
        blocks, out, at = [], [], base
        for addr, bsize, requested in allocated:
            if addr > at:
                blocks.append(Block(at, addr - at, stream, pool, seg))
            b = Block(addr, bsize, stream, pool, seg)
            b.allocated, b.requested = True, requested
            blocks.append(b)
            out.append(b)
            at = addr + bsize
        if at < base + size:
            blocks.append(Block(at, base + size - at, stream, pool, seg))
        for left, right in zip(blocks, blocks[1:]):
            left.next, right.prev = right, left
        for b in blocks:
            if not b.allocated:
                pool.insert(b)
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        self.allocated_bytes += sum(b.size for b in out)
        self.requested_bytes += sum(b.requested for b in out)
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        self.register_segment(base, size)
        return out
