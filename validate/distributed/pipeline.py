"""Pipeline parallelism measured on gloo ranks: the reference GPT-2 or Llama split by hand into
stages as torchtitan splits its decoder (the embedding on the first stage, the final norm, LM head
and loss on the last, contiguous decoder layers between: memcalc.parallel.pipeline.stage_layers),
each rank running its stage(s) under torch.distributed.pipelining's PipelineStage and a schedule
(memcalc.parallel.pipeline.SCHEDULES), then its optimizer, under validate.distributed.tracker.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
    ...                       implementation="reference", tie_embeddings=False)
    >>> ranks = measure_pipeline(spec, TrainingConfig(micro_batch=4, seq_len=8, device="cpu"), 2, "1f1b", 2)
    >>> [r["rank"] for r in ranks], all(r["peak_bytes"] > 0 for r in ranks)
    ([0, 1], True)

The engine's model of these ranks is memcalc.parallel.pipeline_peaks (dist-ci topic 'pipeline',
through validate.distributed.measure.measure_distributed); the first step's losses check the split
itself.
"""
from __future__ import annotations

import gc
import os
import time

from memcalc.core.errors import MemcalcError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.parallel.pipeline import MULTI, SCHEDULES, check_pipeline, stage_layers
from validate.distributed.launch import TIMEOUT_S, Launch, launch


def measure_pipeline(spec: ModelSpec, training: TrainingConfig, stages: int, schedule: str,
                     microbatches: int, stages_per_rank: int = 1, boundaries: list[int] | None = None,
                     steps: int = 3, timeout_s: float = TIMEOUT_S, events: bool = False) -> list[dict]:
    """Run `steps` pipeline steps of training.micro_batch sequences (split into `microbatches`)
    on `stages` gloo ranks; per rank: peak_bytes (steady state, steps >= 2), first_step_peak_bytes,
    losses (the last rank's per-micro-batch losses of the first step), in rank order; with
    `events`, each rank's allocation timeline (validate.distributed.tracker.DistTracker events)."""
    check_pipeline(spec.num_layers, stages, schedule, microbatches, stages_per_rank, boundaries)
    hf_llama = spec.implementation == "hf" and spec.family == "llama"
    if not (spec.implementation == "reference" or hf_llama) or spec.tie_embeddings:
        raise MemcalcError("model", "pipeline stages are split for the untied reference GPT-2 and Llama and "
                           "the untied HF Llama family only (a tied head would span the first and last stages)",
                           "use implementation='reference' or an HF Llama-family model, tie_embeddings=False")
    if training.checkpointing not in ("none", "per-layer", "selective"):
        raise MemcalcError("checkpointing", f"{training.checkpointing} is not split by stage here",
                           "use none, per-layer or selective")
    if training.precision not in ("fp32", "bf16"):
        raise MemcalcError("precision", f"{training.precision} needs autocast around each stage's forward, "
                           "which this harness does not run", "use precision fp32 or bf16")
    if training.device != "cpu" or training.micro_batch % microbatches:
        raise MemcalcError("micro_batch", f"{training.micro_batch} sequences on {training.device} do not "
                           f"split into {microbatches} micro-batches on CPU", "use device='cpu' and a multiple")
    payload = dict(spec=spec, training=training, stages=stages, schedule=schedule, microbatches=microbatches,
                   stages_per_rank=stages_per_rank, boundaries=boundaries, steps=steps, events=events)
    job = Launch("validate.distributed.pipeline:run_rank", payload, stages, what=f"pipeline {schedule} x{stages}",
                 threads=max(1, (os.cpu_count() or 1) // stages))
    return launch(job, timeout_s)


def run_rank(p: dict, rank: int) -> dict:
    """One rank: build the model under the tracker, keep this rank's stages, run the schedule."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    from validate.distributed.tracker import DistTracker
    from validate.measure.step import make_optimizer
    from validate.models.reference import build_reference

    spec, training, stages, v = p["spec"], p["training"], p["stages"], p["stages_per_rank"]
    total = stages * v
    parts = stage_layers(spec.num_layers, total, p["boundaries"])
    indices = list(range(rank, total, stages))  # torch's stage_index_to_group_rank: stage % pp
    tracker = DistTracker(events=p.get("events", False))
    start = time.perf_counter()
    with tracker:
        gc.collect()
        gc.disable()
        try:
            if spec.implementation == "hf":
                modules = [_hf_stage(spec, training, parts[i], i == 0, i == total - 1) for i in indices]
            else:
                torch.manual_seed(0)
                full = build_reference(spec, training)
                if training.precision == "bf16":  # as validate.measure.step.build_trainee
                    full.to(torch.bfloat16)
                modules = [_Stage(full, spec, parts[i], i == 0, i == total - 1, training.checkpointing)
                           for i in indices]
                del full
            gc.collect()
            built = tracker.live
            device = torch.device("cpu")
            pipeline_stages = [PipelineStage(m, i, total, device) for m, i in zip(modules, indices)]
            vocab = spec.vocab_size

            def loss_fn(logits, target):
                return F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

            cls = get_schedule_class(SCHEDULES[p["schedule"]])
            sched = cls(pipeline_stages if p["schedule"] in MULTI else pipeline_stages[0], p["microbatches"],
                        loss_fn=loss_fn)
            optimizer = make_optimizer([q for m in modules for q in m.parameters()], training)
            # the batch on the first stage's rank, the targets on the last's (the same ids here);
            # a middle rank holds neither
            ids = torch.randint(0, vocab, (training.micro_batch, training.seq_len),
                                generator=torch.Generator().manual_seed(1)) \
                if 0 in indices or total - 1 in indices else None
            peaks, losses, phases = [], [], []
            for step in range(p["steps"]):
                tracker.reset_peak()
                tracker.mark(f"step {step}")
                step_losses: list = []
                sched.step(*([ids] if 0 in indices else []),
                           **({"target": ids, "losses": step_losses} if total - 1 in indices else {}))
                walked = tracker.peak  # the schedule's forwards and backwards, and the merge
                tracker.reset_peak()
                tracker.mark(f"optimizer {step}")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                peaks.append(max(walked, tracker.peak))
                phases.append({"backward": walked, "optimizer": tracker.peak})
                if step == 0:
                    losses = [float(x) for x in step_losses]
        finally:
            gc.enable()
    steady = max(range(1, len(peaks)), key=peaks.__getitem__)
    return {"rank": rank, "peak_bytes": peaks[steady], "first_step_peak_bytes": peaks[0], "step_peaks": peaks,
            "phases": phases[steady], "losses": losses, "built_bytes": built, "stages": indices,
            "backend": "cpu-gloo", "implementation": f"reference:{spec.family}:pipeline-{p['schedule']}",
            "torch_version": torch.__version__, "wall_s": round(time.perf_counter() - start, 3),
            **({"events": [list(e[:5]) + [[list(x) for x in e[5]]] for e in tracker.events]}
               if p.get("events") else {})}


def _hf_stage(spec: ModelSpec, training: TrainingConfig, layers: range, first: bool, last: bool):
    """One stage of an HF Llama-family model as torchtitan's pipeline_llama splits its own
    (pipeline_module_split: a whole model per stage, the layers outside the stage deleted, the
    embedding kept on the first stage only, the final norm and LM head on the last only): the
    whole HF model is built (seed 0, so every stage holds the same weights as the unsplit model;
    checkpointing applied by validate.models.hf.build_hf), then `model.model.layers` keeps this
    stage's layers, `embed_tokens` is None past the first stage, `norm` is nn.Identity and
    `lm_head` dropped before the last. The stage runs the base model's own forward
    (LlamaModel.forward: position_ids, masks and rotary tables on every stage), on input_ids
    (first) or inputs_embeds (the receive buffer), use_cache=False, then the LM head (last)."""
    import torch
    from torch import nn

    from validate.models.hf import build_hf

    torch.manual_seed(0)
    model, _ = build_hf(spec, training)
    if training.precision == "bf16":  # as validate.measure.step.build_trainee
        model.to(torch.bfloat16)
    base = model.model
    base.layers = nn.ModuleList([base.layers[i] for i in layers])
    if not first:
        base.embed_tokens = None
    if not last:
        base.norm = nn.Identity()
    head = model.lm_head if last else None

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.lm_head = base, head

        def forward(self, x):
            kw = {"input_ids": x} if first else {"inputs_embeds": x}
            h = self.model(**kw, use_cache=False).last_hidden_state
            return h if self.lm_head is None else self.lm_head(h)

    return Stage()


def _Stage(full, spec: ModelSpec, layers: range, first: bool, last: bool, checkpointing: str = "none"):
    """The modules of one stage, taken from the whole model; the class closes over these
    modules only, so the model's other modules are freed with it (torchtitan builds each stage
    on its own)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    llama = spec.family == "llama"
    per_layer = checkpointing == "per-layer"  # selective runs inside the blocks (AttentionCore)
    blocks = [full.blocks[i] for i in layers]
    embed = (full.embed if llama else full.wte) if first else None
    wpe = full.wpe if first and not llama else None
    rotary = full.rotary if llama else None
    norm = (full.norm if llama else full.ln_f) if last else None
    lm_head = full.lm_head if last else None

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(blocks)
            self.embed, self.wpe, self.rotary, self.norm, self.lm_head = embed, wpe, rotary, norm, lm_head

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
                if self.wpe is not None:
                    x = x + self.wpe(torch.arange(x.size(1), device=x.device))
            extra = ()
            if self.rotary is not None:
                s = x.size(1)
                extra = (self.rotary.cos[:s], self.rotary.sin[:s])
            if per_layer and torch.is_grad_enabled():  # as ReferenceLM.run_blocks at segment size 1
                for block in self.blocks:
                    x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                for block in self.blocks:
                    x = block(x, *extra)
            if self.norm is not None:
                x = self.lm_head(self.norm(x))
            return x

    return Stage()


__all__ = ["measure_pipeline", "run_rank"]
