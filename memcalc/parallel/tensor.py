"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, section 3) as torch runs it
(torch.distributed.tensor.parallel: ColwiseParallel / RowwiseParallel, the plan of PyTorch's TP
tutorial and torchtitan).

Each of the `t` ranks holds a/t query heads, kv/t key/value heads and f/t of the MLP's inner
width: q/k/v (GPT-2: the fused c_attn) and the MLP's first projections are split by output
rows, the attention output and the MLP's last projection by input columns (their biases
replicated). Embeddings, norms and the LM head stay whole on every rank. A rank's program is
then the single-device program of a narrower model (`local_spec`) plus the collectives that
memcalc.tape.ops.Ops.col_linear / row_linear add. Measured on gloo CPU ranks by
validate.distributed.measure (validate/results/dist-ci.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.errors import NotModelledError, SpecError
from memcalc.families.registry import declaration, families_with
from memcalc.inputs.specs import ModelSpec

if TYPE_CHECKING:
    from memcalc.inputs.training import TrainingConfig

__all__ = ["check_tensor_parallel", "local_spec"]


def check_tensor_parallel(model: ModelSpec, training: TrainingConfig) -> None:
    """Refuse, naming the field, what cannot be split evenly or is not modelled.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> check_tensor_parallel(ModelSpec.preset("llama-2-7b"),
    ...     TrainingConfig(micro_batch=1, seq_len=8, world_size=3, tensor_parallel=3))
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: tensor_parallel: 3 does not divide num_heads=32; fix: use a divisor of 32 (e.g. 2)
    """
    t = training.tensor_parallel
    if t == 1:
        return
    for field, n in (("num_heads", model.num_heads), ("num_kv_heads", model.kv_heads),
                     ("intermediate_size", model.ffn_size)):
        if n % t:
            some = next(d for d in range(2, n + 1) if n % d == 0) if n > 1 else 1
            raise SpecError("tensor_parallel", f"{t} does not divide {field}={n}",
                            f"use a divisor of {n} (e.g. {some})")
    if training.sequence_parallel and model.implementation != "reference":
        raise NotModelledError("sequence_parallel", "sequence parallelism is modelled (and "
                               "measured) for the reference models only (the HF classes' norms "
                               "and attention take keyword arguments no SequenceParallel plan "
                               "here shards)", "use implementation='reference' or sequence_parallel=False")
    if training.sequence_parallel and training.seq_len % t:
        raise SpecError("seq_len", f"{training.seq_len} tokens do not split evenly over "
                        f"tensor_parallel={t}", f"use a multiple of {t}")
    if model.moe is not None:
        raise NotModelledError("tensor_parallel", f"tensor parallelism of {model.family}'s experts "
                               "(3-D expert parameters; expert parallelism) is not modelled",
                               "use tensor_parallel=1 with data-parallel sharding (zero1-3)")
    can = declaration(model.family).supports
    if can.tensor_parallel == "none":
        why, fix = can.tensor_parallel_refusal
        names = " and ".join(families_with(tensor_parallel="all") + families_with(tensor_parallel="reference"))
        raise NotModelledError("tensor_parallel", why or f"tensor parallelism is modelled and measured "
                               f"for the {names} families, not {model.family}",
                               fix or "use tensor_parallel=1 (data parallelism and FSDP are modelled)")
    if can.tensor_parallel == "reference" and model.implementation != "reference":
        raise NotModelledError("tensor_parallel", *can.tensor_parallel_refusal)
    # what a rank runs is the narrower model's program (local_spec): per-head q/k norms (Qwen3's,
    # Gemma-3's RMSNorm over head_dim) replicated on every rank, sliding-window and NoPE layers
    # (masks and rotary tables are per token, not per head) need nothing more


def local_spec(model: ModelSpec, tensor_parallel: int) -> ModelSpec:
    """The model one tensor-parallel rank runs: heads and MLP width divided by `t`, the head
    size, hidden size and vocabulary unchanged.

    >>> s = local_spec(ModelSpec.preset("llama-2-7b"), 4)
    >>> s.num_heads, s.head_size, s.ffn_size, s.hidden_size
    (8, 128, 2752, 4096)
    """
    if tensor_parallel == 1:
        return model
    t = tensor_parallel
    return model.with_(num_heads=model.num_heads // t, head_dim=model.head_size,
                       num_kv_heads=model.kv_heads // t if model.num_kv_heads else None,
                       intermediate_size=model.ffn_size // t)
