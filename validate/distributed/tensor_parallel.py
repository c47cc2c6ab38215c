"""Megatron-style tensor parallelism (torch.distributed.tensor.parallel) of the reference models
and the HF classes whose family declares a plan (memcalc.families.declaration
Supports.tensor_parallel_plan).

The plans follow PyTorch's TP tutorial and torchtitan (torchtitan/models/llama/parallelize_llama.py):
attention q/k/v (GPT-2: the fused c_attn) and the MLP's first projections are ColwiseParallel
(each rank computes its own heads / its slice of the FFN), the attention output projection and
the MLP's last projection are RowwiseParallel (partial sums all-reduced). Embeddings, the final
norm and the LM head stay replicated (each rank holds them whole; their gradients are the same
on every rank, so no collective is needed for them).

With sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2) the norms, dropouts and residual adds of each block work on
s/t tokens: the norms are SequenceParallel, each attention / MLP input is all-gathered along the
sequence (PrepareModuleInput Shard(1) -> Replicate) and each output projection reduce-scatters
(RowwiseParallel(output_layouts=Shard(1))). The trunk's input is the rank's chunk of the
sequence (a local slice of the replicated embedding output), and the trunk's output is
all-gathered before the final norm.

    >>> sorted(llama_plan(False))[:3]
    ['mlp.down_proj', 'mlp.gate_proj', 'mlp.up_proj']
"""
from __future__ import annotations

from validate.models.layers import decoder_layers


def llama_plan(sequence_parallel: bool) -> dict:
    """Per-block plan of validate.models.reference.LlamaBlock (keys relative to the block)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    if sequence_parallel:
        plan.update({
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1))})
    return plan


def declared_plan(spec) -> dict:
    """Per-layer plan of an HF class: its family declaration's Supports.tensor_parallel_plan
    (memcalc.families.declaration.LLAMA_TP_PLAN for the Llama-shaped classes).

    >>> from memcalc.inputs.specs import ModelSpec
    >>> sorted(declared_plan(ModelSpec.preset("gemma-2-2b")))[:2]
    ['mlp.down_proj', 'mlp.gate_proj']
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from memcalc.families.registry import declaration

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {name: styles[style]() for name, style in declaration(spec.family).supports.tensor_parallel_plan}


def gpt2_plan(sequence_parallel: bool) -> dict:
    """Per-block plan of validate.models.reference.GPT2Block (keys relative to the block)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    plan = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
    if sequence_parallel:
        plan.update({
            "ln_1": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln_2": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1))})
    return plan


def interleave_qkv(weight, heads_dim: int, tp: int):
    """Rows of GPT-2's fused c_attn reordered [q|k|v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], so a
    column shard holds one rank's heads of all three (Megatron's per-partition QKV layout).

    >>> import torch
    >>> interleave_qkv(torch.arange(12.).view(12, 1), 4, 2).view(-1).tolist()[:6]
    [0.0, 1.0, 4.0, 5.0, 8.0, 9.0]
    """
    import torch

    q, k, v = weight.split(heads_dim, dim=0)
    parts = [t.chunk(tp, dim=0) for t in (q, k, v)]
    return torch.cat([torch.cat([parts[j][r] for j in range(3)]) for r in range(tp)])


def apply_tensor_parallel(model, spec, tp: int, sequence_parallel: bool, mesh=None) -> dict:
    """Parallelize a model's decoder layers over `mesh` (a 1-D mesh of `tp` ranks; by default
    all ranks), in place. Returns what was applied, for the result's `extra`.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = mesh if mesh is not None else init_device_mesh("cpu", (tp,))
    plan = (gpt2_plan(sequence_parallel) if spec.family == "gpt2" else
            llama_plan(sequence_parallel) if spec.implementation == "reference" else declared_plan(spec))
    for block in decoder_layers(model):
        if spec.family == "gpt2":
            attn = block.attn.c_attn
            with torch.no_grad():
                attn.weight.copy_(interleave_qkv(attn.weight, spec.num_heads * spec.head_size, tp))
                if attn.bias is not None:
                    attn.bias.copy_(interleave_qkv(attn.bias.view(-1, 1),
                                                   spec.num_heads * spec.head_size, tp).view(-1))
        parallelize_module(block, mesh, plan)
    replicated = replicate_rest(model, mesh)
    if sequence_parallel:
        model.sequence_parallel_mesh = mesh
    return {"tensor_parallel": {"degree": tp, "sequence_parallel": sequence_parallel,
                                "plan": {k: type(v).__name__ for k, v in plan.items()},
                                "replicated_modules": replicated}}


def replicate_rest(model, mesh) -> list[str]:
    """Make every parameter the plan left plain (embeddings, norms, LM head) a Replicate DTensor,
    with inputs wrapped (DTensor.from_local, no copy) and outputs unwrapped (to_local) at those
    modules. torch's foreach/fused optimizers and GradScaler refuse a mix of DTensor and plain
    parameters ("got mixed torch.Tensor and DTensor"); each rank still holds the same bytes.
    Tied weights are tied again afterwards. Returns the modules converted."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def to_dtensor(_mod, inputs, device_mesh):
        return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x
                     for x in inputs)

    def to_local(_mod, out, _mesh):
        return out.to_local() if isinstance(out, DTensor) else out

    shared: dict[int, list[str]] = {}  # parameter -> every name it has (tied weights: several)
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    done = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if not isinstance(p, DTensor)]
        if own:
            distribute_module(module, mesh, input_fn=to_dtensor, output_fn=to_local)
            done.append(name)
    for names in shared.values():  # re-tie (GPT-2: lm_head.weight is wte.weight)
        first = model.get_parameter(names[0])
        for other in names[1:]:
            owner, _, attr = other.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)
    return done
