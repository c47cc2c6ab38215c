"""Which decoder layers attend through the sliding window: the one rule ModelSpec.layer_is_sliding
and the config reader's `layer_types` check (memcalc.inputs.hf.config.check_layer_types) share, below
both so that neither imports the other.
"""
from __future__ import annotations


def is_sliding(layer: int, sliding_window: int | None, max_window_layers: int | None,
               sliding_window_pattern: int | None) -> bool:
    """Whether decoder layer `layer` (0-based) attends through the sliding window: none without a
    window, none below max_window_layers (Qwen2), else every layer but each pattern-th (Gemma-2: 2).

    >>> [is_sliding(i, 4096, None, 2) for i in range(4)]
    [True, False, True, False]
    >>> [is_sliding(i, 4096, 2, None) for i in range(3)], is_sliding(0, None, None, None)
    ([False, False, True], False)
    """
    if sliding_window is None:
        return False
    if max_window_layers is not None and layer < max_window_layers:
        return False
    return sliding_window_pattern is None or (layer + 1) % sliding_window_pattern != 0
