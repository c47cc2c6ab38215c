"""Documented ceilings: the sizes past which memcalc refuses rather than hang or overflow.

Each ceiling keeps one call finite and fast (measured on 2 CPU cores, a cold `estimate`):
- depth: where the layers repeat (memcalc.engine.depth) any depth costs the same (a derivation from
  3, 4 and 5 repeats, checked), so the ceiling is 1024 layers (8x Llama-3.1-405B's 126); where
  they do not, the engine simulates every block, ~6 ms (GPT-2) to ~11 ms (Llama) a layer, and
  refuses past 128 layers (~1 s). Data-parallel accounting visits every rank's parameters, so
  data_parallel x num_layers is capped at 2048 x 128 (~2 s).
- data-parallel ranks: per-rank optimizer and FSDP shard accounting loops over every rank;
  llama-2-70b under zero3 takes 1.7 s at 2048 ranks (3.5 s at 4096).
- widths: exact integer arithmetic never overflows, but a divisor search over heads and numpy's
  int64 grid do not want 20-digit sizes; 2**31 is past any vocabulary or width in use.
- shapes: micro_batch and seq_len up to 2**40 (capacity.NO_LIMIT, the answer cap of the solvers).
- budgets: 1 PiB (2**50 bytes) per rank, past any accelerator by 4 orders of magnitude.
- files: a config.json is read only from a regular file of at most 1 MiB.
"""
from __future__ import annotations

MAX_LAYERS = 1024
"""num_layers, where memcalc.engine.depth derives the depth from a few repeats of the layers."""
MAX_SIMULATED_LAYERS = 128
"""num_layers where the layers do not repeat and the engine simulates each block (time grows
linearly with depth)."""
MAX_DATA_PARALLEL = 2048
"""world_size / tensor_parallel: per-rank accounting loops over every data-parallel rank."""
MAX_RANK_LAYERS = MAX_DATA_PARALLEL * 128
"""data-parallel ranks x num_layers: per-rank accounting visits every rank's parameters."""
MAX_TENSOR_PARALLEL = 256
"""tensor_parallel: past any NVLink domain; it must divide num_heads as well."""
MAX_HEADS = 65536
"""num_heads, num_kv_heads."""
MAX_WIDTH = 2 ** 31
"""vocab_size, hidden_size, intermediate_size, head_dim, max_position_embeddings."""
MAX_SHAPE = 2 ** 40
"""micro_batch, seq_len, grad_accum, checkpoint_every (and estimate_grid's arrays)."""
MAX_GLOBAL_BATCH = 2 ** 20
"""plan(global_batch=...): every divisor is a candidate micro-batch."""
MAX_GRID_POINTS = 2 ** 24
"""estimate_grid: points after broadcasting (int64 arrays of a few hundred MiB at most)."""
MAX_GRID_VARIANTS = 64
"""estimate_grid: distinct combinations of non-shape fields (one simulation each)."""
MAX_BUDGET = 2 ** 50
"""Memory budget per rank, bytes (1 PiB)."""
MAX_CONFIG_BYTES = 2 ** 20
"""A config.json, bytes (real ones are a few KiB)."""
MAX_PATH_CHARS = 4096
"""A path, characters (Linux PATH_MAX)."""

MODEL_CEILINGS = {"num_layers": MAX_LAYERS, "num_heads": MAX_HEADS, "num_kv_heads": MAX_HEADS,
                  "vocab_size": MAX_WIDTH, "hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH,
                  "head_dim": MAX_WIDTH, "max_position_embeddings": MAX_WIDTH}
TRAINING_CEILINGS = {"micro_batch": MAX_SHAPE, "seq_len": MAX_SHAPE, "grad_accum": MAX_SHAPE,
                     "checkpoint_every": MAX_SHAPE, "tensor_parallel": MAX_TENSOR_PARALLEL}
MAX_JOBS = 256
"""`memcalc tables --jobs`: worker processes."""
