"""The caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF) and the size rules that depend on them.

Sources (torch 2.11):
- c10/core/AllocatorConfig.cpp: AcceleratorAllocatorConfig::parseArgs (the keys and their defaults:
  max_split_size = SIZE_MAX, roundup_power2_divisions = 16 zeros, garbage_collection_threshold = 0,
  each reset on every parse), parseMaxSplitSize / parseMaxNonSplitRoundingSize (MB, >= 20),
  parseGarbageCollectionThreshold (in (0, 1)), parseRoundUpPower2Divisions (a single power of two,
  or `[MB:div, ..., >:div]` over the 16 intervals 1 MB .. 32 GB), parseExpandableSegments;
  AcceleratorAllocatorConfig::roundup_power2_divisions(size) (interval index = log2(size) - 20,
  clamped to 0..15).
- c10/cuda/CUDACachingAllocator.cpp: the constants kMinBlockSize = 512, kSmallSize = 1 MiB,
  kSmallBuffer = 2 MiB, kMinLargeAlloc = 10 MiB, kRoundLarge = 2 MiB, kLargeBuffer = 20 MiB;
  DeviceCachingAllocator::round_size, roundup_power2_next_division, get_allocation_size.
- torch/cuda/memory.py _snapshot: the snapshot's `allocator_settings` dict (max_split_size is -1 when
  unlimited: SIZE_MAX cast to int64; roundup_power2_divisions keyed by the interval's MB).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from memcalc.core.errors import MemcalcError

MIB = 1024 * 1024
K_MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = MIB  # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 * MIB  # kRoundLarge: round up large allocations to 2 MiB
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
SIZE_MAX = 2**64 - 1  # max_split_size's default: every block may be split
INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MB .. 64 GB
# torch's own keys of PYTORCH_CUDA_ALLOC_CONF that do not change device memory (pinned host memory,
# the lock around cudaMalloc, graph-capture stream reuse): accepted and ignored by name.
NO_DEVICE_EFFECT = ("pinned_use_cuda_host_register", "pinned_num_register_threads",
                    "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
                    "release_lock_on_cudamalloc", "graph_capture_record_stream_reuse")


@dataclass(frozen=True)
class AllocatorSettings:
    """The PYTORCH_CUDA_ALLOC_CONF keys that change what the caching allocator reserves.

    >>> s = AllocatorSettings.parse("expandable_segments:True,max_split_size_mb:128")
    >>> s.expandable_segments, s.max_split_size // MIB
    (True, 128)
    >>> four = AllocatorSettings.parse("roundup_power2_divisions:4")
    >>> AllocatorSettings().round_size(5 * MIB + 1), four.round_size(5 * MIB + 1)
    (5243392, 6291456)
    """

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * INTERVALS)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False

    @classmethod
    def parse(cls, conf: str) -> AllocatorSettings:
        """Settings from a PYTORCH_CUDA_ALLOC_CONF string (AcceleratorAllocatorConfig::parseArgs).

        >>> AllocatorSettings.parse("roundup_power2_divisions:[256:4,>:8]").roundup_power2_divisions[7:10]
        (4, 4, 8)
        >>> AllocatorSettings.parse("garbage_collection_threshold:2")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        memcalc.core.errors.MemcalcError: PYTORCH_CUDA_ALLOC_CONF.garbage_collection_threshold: must lie in (0, 1)...
        """
        out = cls()
        for item in _split_items(conf):
            key, _, value = item.partition(":")
            key, value = key.strip(), value.strip()
            out = _apply(out, key, value)
        return out

    @classmethod
    def from_snapshot(cls, recorded: dict) -> AllocatorSettings:
        """Settings from a snapshot's `allocator_settings` (torch.cuda.memory._snapshot).

        >>> AllocatorSettings.from_snapshot({"max_split_size": -1, "expandable_segments": False,
        ...     "garbage_collection_threshold": 0.0, "PYTORCH_CUDA_ALLOC_CONF": ""}) == AllocatorSettings()
        True
        """
        if not isinstance(recorded, dict):
            raise MemcalcError("allocator_settings", f"must be a dict, got {type(recorded).__name__}",
                               "pass the dict torch.cuda.memory._snapshot() wrote")
        out = cls.parse(str(recorded.get("PYTORCH_CUDA_ALLOC_CONF") or ""))
        split = recorded.get("max_split_size", -1)
        if isinstance(split, int) and split not in (-1, SIZE_MAX) and split > 0:
            out = replace(out, max_split_size=split)
        gc = recorded.get("garbage_collection_threshold")
        if isinstance(gc, (int, float)) and 0 < gc < 1:
            out = replace(out, garbage_collection_threshold=float(gc))
        if isinstance(recorded.get("expandable_segments"), bool):
            out = replace(out, expandable_segments=recorded["expandable_segments"])
        divisions = recorded.get("roundup_power2_divisions")
        if isinstance(divisions, dict) and divisions:
            ordered = sorted(((int(k), int(v)) for k, v in divisions.items()), key=lambda kv: kv[0])
            out = replace(out, roundup_power2_divisions=tuple(v for _, v in ordered)[:INTERVALS])
        elif isinstance(divisions, (list, tuple)) and len(divisions) == INTERVALS:
            out = replace(out, roundup_power2_divisions=tuple(int(v) for v in divisions))
        return out

    def with_overrides(self, *, expandable_segments: bool | None = None, max_split_size_mb: int | None = None,
                       roundup_power2_divisions: int | list | tuple | None = None,
                       garbage_collection_threshold: float | None = None) -> AllocatorSettings:
        """These settings with the given keys replaced (None keeps the current value).

        >>> AllocatorSettings().with_overrides(max_split_size_mb=64).max_split_size == 64 * MIB
        True
        """
        out = self
        if expandable_segments is not None:
            out = replace(out, expandable_segments=bool(expandable_segments))
        if max_split_size_mb is not None:
            out = _apply(out, "max_split_size_mb", str(max_split_size_mb))
        if roundup_power2_divisions is not None:
            text = (str(roundup_power2_divisions) if isinstance(roundup_power2_divisions, int)
                    else None)
            if text is not None:
                out = _apply(out, "roundup_power2_divisions", text)
            elif len(roundup_power2_divisions) == INTERVALS:
                out = replace(out, roundup_power2_divisions=tuple(int(v) for v in roundup_power2_divisions))
            else:
                raise MemcalcError("roundup_power2_divisions", f"needs {INTERVALS} values (1 MB .. 32 GB), "
                                   f"got {len(roundup_power2_divisions)}", "pass one int or 16 ints")
        if garbage_collection_threshold is not None:
            out = _apply(out, "garbage_collection_threshold", str(garbage_collection_threshold))
        return out

    def conf_string(self) -> str:
        """These settings as a PYTORCH_CUDA_ALLOC_CONF string (only the keys off their defaults).

        >>> AllocatorSettings.parse("expandable_segments:True").conf_string()
        'expandable_segments:True'
        """
        items = []
        if self.max_split_size != SIZE_MAX:
            items.append(f"max_split_size_mb:{self.max_split_size // MIB}")
        if self.max_non_split_rounding_size != K_LARGE_BUFFER:
            items.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MIB}")
        if any(self.roundup_power2_divisions):
            pairs = ",".join(f"{1 << i}:{d}" for i, d in enumerate(self.roundup_power2_divisions))
            items.append(f"roundup_power2_divisions:[{pairs}]")
        if self.garbage_collection_threshold:
            items.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if self.expandable_segments:
            items.append("expandable_segments:True")
        return ",".join(items)

    def divisions(self, size: int) -> int:
        """roundup_power2_divisions for a request of `size` bytes (its power-of-two interval from 1 MB).

        >>> AllocatorSettings.parse("roundup_power2_divisions:[1:2,>:8]").divisions(3 * MIB)
        8
        """
        index = max(size.bit_length() - 1 - 20, 0)
        return self.roundup_power2_divisions[min(index, INTERVALS - 1)]

    def round_size(self, size: int) -> int:
        """The block size a request of `size` bytes gets (DeviceCachingAllocator::round_size).

        >>> AllocatorSettings().round_size(1), AllocatorSettings().round_size(513)
        (512, 1024)
        """
        if size < K_MIN_BLOCK:
            return K_MIN_BLOCK
        divisions = self.divisions(size)
        if divisions > 1 and size > K_MIN_BLOCK * divisions:
            return _next_division(size, divisions)
        return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


def allocation_size(size: int) -> int:
    """Bytes cudaMalloc is asked for when no cached block fits a `size`-byte block (get_allocation_size).

    >>> allocation_size(4096) // MIB, allocation_size(3 * MIB) // MIB, allocation_size(11 * MIB + 1) // MIB
    (2, 20, 12)
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def _next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: `size` rounded up to the next of `divisions` steps between powers of 2."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def _split_items(conf: str) -> list[str]:
    """`a:1,b:[x:1,y:2],c:3` -> ['a:1', 'b:[x:1,y:2]', 'c:3'] (commas inside brackets stay)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(conf):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(conf[start:i])
            start = i + 1
    items.append(conf[start:])
    return [it for it in (x.strip() for x in items) if it]


def _bad(key: str, problem: str, fix: str) -> MemcalcError:
    return MemcalcError(f"PYTORCH_CUDA_ALLOC_CONF.{key}", problem, fix)


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _bad(key, f"expects an integer, got {value!r}", f"e.g. {key}:128") from None


def _apply(s: AllocatorSettings, key: str, value: str) -> AllocatorSettings:
    """One key of PYTORCH_CUDA_ALLOC_CONF applied (the parse* functions of AllocatorConfig.cpp)."""
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        mb = _int(key, value)
        if mb < K_LARGE_BUFFER // MIB:
            raise _bad(key, f"must be >= {K_LARGE_BUFFER // MIB} (MB), got {mb}", f"e.g. {key}:128")
        name = "max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"
        return replace(s, **{name: mb * MIB})
    if key == "garbage_collection_threshold":
        try:
            gc = float(value)
        except ValueError:
            gc = -1.0
        if not 0 < gc < 1:
            raise _bad(key, f"must lie in (0, 1), got {value}", "e.g. garbage_collection_threshold:0.8")
        return replace(s, garbage_collection_threshold=gc)
    if key == "expandable_segments":
        if value.lower() not in ("true", "false"):
            raise _bad(key, f"expects True or False, got {value!r}", "expandable_segments:True")
        return replace(s, expandable_segments=value.lower() == "true")
    if key == "roundup_power2_divisions":
        return replace(s, roundup_power2_divisions=_divisions(value))
    if key == "backend":
        if value != "native":
            raise _bad(key, f"the {value!r} backend is not the caching allocator memcalc replays",
                       "replay with backend:native (the default)")
        return s
    if key in NO_DEVICE_EFFECT or key.startswith("pinned_"):
        return s
    raise _bad(key, "is not a caching-allocator key memcalc knows",
               "use max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
               "garbage_collection_threshold or expandable_segments")


def _divisions(value: str) -> tuple[int, ...]:
    """parseRoundUpPower2Divisions: one power of two for all intervals, or `[MB:div, ..., >:div]`."""
    key = "roundup_power2_divisions"
    if not value.startswith("["):
        div = _int(key, value)
        if div <= 0 or div & (div - 1):
            raise _bad(key, f"must be a power of 2, got {div}", "e.g. roundup_power2_divisions:4")
        return (div,) * INTERVALS
    out, last, first = [0] * INTERVALS, 0, True
    for pair in value.strip("[]").split(","):
        bound, _, div_text = pair.partition(":")
        div = _int(key, div_text.strip())
        if div and div & (div - 1):
            raise _bad(key, f"divisions must be a power of 2 or 0, got {div}", "e.g. [256:4,>:8]")
        if bound.strip() == ">":
            out[last + 1:] = [div] * (INTERVALS - last - 1)
            continue
        mb = _int(key, bound.strip())
        if mb <= 0 or mb & (mb - 1):
            raise _bad(key, f"intervals must be powers of 2 (MB), got {mb}", "e.g. [256:4,>:8]")
        index = min(mb.bit_length() - 1, INTERVALS - 1)
        if first:
            out[:index] = [div] * index
            first = False
        out[index], last = div, index
    return tuple(out)
