"""The bitsandbytes state-size rule: which tensors AdamW8bit, PagedAdamW8bit and PagedAdamW
(bitsandbytes 0.50.2, Optimizer2State) give one parameter, and what they share. The one place
this is written: the engine (memcalc.tape.finetune_optim, memcalc.tape.step) and the closed form
(memcalc.formulas.model_states.fine_tune_state_bytes) both read it.

bitsandbytes/optim/optimizer.py:
- Optimizer2State(min_8bit_size=4096): init_state gives a parameter of fewer than min_8bit_size
  elements fp32 states (`if p.numel() < config["min_8bit_size"]: dtype = torch.float32`), as
  it does every parameter under optim_bits=32 (PagedAdamW, and the module overrides the HF
  Trainer registers for nn.Embedding weights: 'adamw-32bit' here): state1 and state2, 4 bytes
  an element each (get_state_buffer's dtype, whatever the parameter's dtype).
- 8-bit: state1 and state2 uint8 (1 byte an element each), absmax1 and absmax2 fp32 with one
  value per block of 256 elements (`blocksize = 256; blocks = n // 256 + bool(n % 256)`), and
  the two qmaps (F.create_dynamic_map: 256 fp32 each, signed and unsigned) in the optimizer's
  name2qmap, shared by every parameter: made on the CPU at construction (Optimizer8bit.__init__
  fill_qmap when optim_bits == 8), moved to the device at the first 8-bit parameter's
  init_state. `step` is a Python int (no tensor).
- paged (get_state_buffer): on CUDA, state1/state2 of a parameter of at least 1e5 elements
  come from F.get_paged, managed memory the caching allocator never counts (absmax stays on the
  device); on CPU paging is off (a warning, then zeros_like).
"""
from __future__ import annotations

BNB_8BIT = ("adamw-8bit", "paged-adamw-8bit")
BNB = BNB_8BIT + ("paged-adamw",)
MIN_8BIT_SIZE = 4096  # Optimizer2State(min_8bit_size=4096)
BLOCK = 256  # Optimizer2State.init_state: blocksize = 256 (one fp32 absmax a block)
QMAP_BYTES = 256 * 4  # F.create_dynamic_map: 256 fp32 values
PAGED_MIN = 100_000  # Optimizer8bit.get_state_buffer: paged only when p.numel() >= 1e5


def eight_bit(optimizer: str, numel: int) -> bool:
    """Whether a parameter of `numel` elements gets uint8 states.

    >>> eight_bit("adamw-8bit", 4095), eight_bit("adamw-8bit", 4096), eight_bit("paged-adamw", 10**6)
    (False, True, False)
    """
    return optimizer in BNB_8BIT and numel >= MIN_8BIT_SIZE


def paged(optimizer: str, numel: int, device: str) -> bool:
    """Whether a parameter's state1/state2 are managed (paged) memory, outside the allocator.

    >>> paged("paged-adamw-8bit", 100_000, "cuda"), paged("paged-adamw-8bit", 99_999, "cuda")
    (True, False)
    >>> paged("paged-adamw", 10**6, "cpu")
    False
    """
    return optimizer.startswith("paged") and device == "cuda" and numel >= PAGED_MIN


def state_bytes(optimizer: str, numel: int, device: str) -> list[int]:
    """Bytes of each state tensor one parameter of `numel` elements gets on the device, in
    creation order (state1, state2[, absmax1, absmax2]); paged states are left out.

    >>> state_bytes("adamw-8bit", 8192, "cpu"), state_bytes("adamw-8bit", 1024, "cpu")
    ([8192, 8192, 128, 128], [4096, 4096])
    >>> state_bytes("paged-adamw-8bit", 200_000, "cuda"), state_bytes("paged-adamw", 200_000, "cuda")
    ([3128, 3128], [])
    """
    blocks = -(-numel // BLOCK)
    if eight_bit(optimizer, numel):
        states = [] if paged(optimizer, numel, device) else [numel, numel]
        return states + [4 * blocks, 4 * blocks]
    return [] if paged(optimizer, numel, device) else [4 * numel, 4 * numel]


def shared_bytes(optimizer: str, numels: list[int], device: str) -> list[int]:
    """The qmaps an 8-bit optimizer holds once for all parameters: on CPU from construction, on
    CUDA once a parameter of at least min_8bit_size elements is initialised.

    >>> shared_bytes("adamw-8bit", [10], "cpu"), shared_bytes("adamw-8bit", [10], "cuda")
    ([1024, 1024], [])
    >>> shared_bytes("adamw-8bit", [4096], "cuda"), shared_bytes("paged-adamw", [4096], "cpu")
    ([1024, 1024], [])
    """
    if optimizer not in BNB_8BIT:
        return []
    if device == "cpu" or any(n >= MIN_8BIT_SIZE for n in numels):
        return [QMAP_BYTES, QMAP_BYTES]
    return []


def paged_bytes(optimizer: str, numels: list[int], device: str) -> int:
    """Bytes of managed memory the paged optimizers hold outside torch's allocator.

    >>> paged_bytes("paged-adamw-8bit", [200_000, 100], "cuda"), paged_bytes("paged-adamw", [200_000], "cuda")
    (400000, 1600000)
    """
    return sum((2 * n if eight_bit(optimizer, n) else 8 * n) for n in numels if paged(optimizer, n, device))


def optimizer_bytes(optimizer: str, numels: list[int], device: str) -> int:
    """Every state byte a bitsandbytes optimizer holds on the device for parameters of `numels`
    elements: each parameter's states plus the shared qmaps.

    >>> optimizer_bytes("adamw-8bit", [1024], "cuda"), optimizer_bytes("adamw-8bit", [4096], "cuda")
    (8192, 10368)
    """
    return (sum(sum(state_bytes(optimizer, n, device)) for n in numels)
            + sum(shared_bytes(optimizer, numels, device)))
