"""What FakeTensorMode changes in transformers, put back (issue 25 item 3; torch-free module).

Measured (validator, HF GPT-2 h64 L2, fp32, b=2, s=64, no attention mask): the 'fake' backend read
65,536 B above the real step, and the op streams (memcalc.traced.runner with and without
FakeTensorMode) part at transformers/masking_utils.py: `is_tracing(tensor)` (utils/import_utils.py)
is True for a FakeTensor, so under FakeTensorMode

- `find_packed_sequence_indices` skips its check `(packed_sequence_mask[:, -1] == 0).all()` and
  returns the packed-sequence mask instead of None, and
- `_ignore_causal_mask_sdpa` returns False ("tracing": q_offset is a fake tensor),

so the model builds a (b, 1, s, s) boolean causal mask (arange, index, le, bitwise_and, ...) and
passes it to SDPA, which real tensors never do (is_causal=True, no mask). This is the
fake-only allocation behind the 1.28 MB the issue reports on GPT-2 at its own sizes.

While a trace runs, `is_tracing` in masking_utils answers as for real tensors, and the packed-
sequence check runs its ops (the same allocations as the real step: select, eq, all) and answers
None, the value real tensors give: the traced step passes no position_ids, so transformers makes
them with arange, one sequence per row, never packed.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def real_tensor_answers() -> Iterator[None]:
    """Patch transformers.masking_utils (when imported) for the duration of a fake trace.

    >>> with real_tensor_answers():
    ...     pass
    """
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None or not hasattr(mu, "find_packed_sequence_indices"):
        yield
        return
    saved = mu.is_tracing, mu.find_packed_sequence_indices
    original_is_tracing, original_find = saved

    def is_tracing(tensor: object = None) -> bool:
        from transformers.utils.import_utils import is_torch_fx_proxy

        return original_is_tracing(None) or (tensor is not None and is_torch_fx_proxy(tensor))

    def find_packed_sequence_indices(position_ids: Any) -> None:
        mu.is_tracing = lambda _tensor=None: True  # the original's ops, up to its value check
        try:
            packed = original_find(position_ids)
        finally:
            mu.is_tracing = is_tracing
        check = (packed[:, -1] == 0).all()  # the check's own allocations, as the real step makes them
        del check, packed
        return None  # one arange-made sequence per row: never packed

    mu.is_tracing, mu.find_packed_sequence_indices = is_tracing, find_packed_sequence_indices
    try:
        yield
    finally:
        mu.is_tracing, mu.find_packed_sequence_indices = saved
