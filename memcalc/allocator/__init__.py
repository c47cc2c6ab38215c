"""The CUDA caching allocator, as memcalc models it.

- `rules`: the rounding rules the engine applies to every storage (512 B granularity, cuBLAS workspace).
- `settings`: `AllocatorSettings`, parsed from a PYTORCH_CUDA_ALLOC_CONF string or a snapshot's
  `allocator_settings`.
- `replica`: a replica of c10/cuda/CUDACachingAllocator.cpp (torch 2.11's DeviceCachingAllocator):
  request rounding, small/large pools, segment sizes, best-fit over (stream, size, address), split
  and oversize rules, coalescing, cudaMalloc failure and its cache release, empty_cache, garbage
  collection; `expandable` adds expandable_segments:True; `blocks` holds the segments, blocks and pools.
- `snapshot`: `load_snapshot`, a restricted unpickler for `torch.cuda.memory._dump_snapshot` files,
  and the reconstruction of the allocator's state when the recorded trace began.
- `replay`: `replay_snapshot` (a recorded trace through the replica) and `replay_events` (a plain
  alloc/free sequence through the replica). `memcalc snapshot PATH` is memcalc.cli.snapshot.
See docs/ALLOCATOR.md.

The package imports nothing heavy: `memcalc.allocator.rules` is imported by the engine on every
estimate; the replica is loaded only when asked for (memcalc.replay_snapshot / load_snapshot).
"""
