"""The Program protocol and the trunk every decoder-only causal LM shares:

    ids -> embed -> layers (checkpoint segments, FSDP module boundaries) -> final norm -> head
        -> head_output -> loss

An implementation fills in the hooks (what its embedding, block, final norm and loss run, op by
op) and its torch parameter order; `DecoderProgram.build` runs them in this order. Adding a
family means one file of what differs, one registry line (memcalc.families), one HF builder entry
(validate/models/hf.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from memcalc.families.sizes import size  # re-exported: programs import it from here
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.tape.graph import Value
from memcalc.tape.ops import Ops


TOKENS = size("b s", 1)  # one element per token: b * s


class Program(Protocol):
    """One implementation's forward program: adds its ops to `ops.g`, loss included."""

    def build(self, ops: Ops, spec: ModelSpec, regime: Regime) -> None:
        """Add the forward and loss of `spec` to the graph, as the implementation runs them."""


@dataclass
class Embedded:
    """What the embedding hook returns: the trunk's input and what the model's forward keeps."""

    x: Value
    ids: Value
    context: dict = field(default_factory=dict)
    """Tensors the blocks read (attention mask, rotary tables)."""
    held_until_norm: list = field(default_factory=list)
    """Locals of the base model's forward, freed when it returns (after the final norm)."""
    held_until_return: list = field(default_factory=list)
    """Locals of the top-level forward, freed when the loss is computed."""


class DecoderProgram:
    """The shared trunk; subclasses implement the hooks."""

    head_label = "lm_head.weight"
    keeps_norm_output = True
    """The caller holds the final norm's output (HF: outputs.last_hidden_state) until the
    loss is computed; otherwise it holds the trunk's output (the reference head_loss(x))."""

    def build(self, ops: Ops, spec: ModelSpec, regime: Regime) -> None:
        """ids -> embed -> layers -> final norm -> head -> loss, then torch's parameter order."""
        from memcalc.families.call_path import batch_inputs, cache_layers

        if regime.trl == "grpo" and regime.trl_phase != "step":  # memcalc.families.trl_grpo
            from memcalc.families.trl_grpo import declare_params, generation_phase, scoring_phase

            if regime.trl_phase == "generation":
                generation_phase(self, ops, spec, regime, run_layers)
            else:
                declare_params(self, ops, spec, regime, run_layers)
                scoring_phase(self, ops, spec, regime, run_layers)
            self._order(ops)
            return
        batch_inputs(ops, regime)  # attention_mask, labels, num_items_in_batch (HF call path)
        if regime.trl == "grpo":  # the buffered generation batch, then _compute_loss's cat and labels
            from memcalc.families.trl_grpo import buffered_inputs, compute_loss_inputs

            buffered_inputs(ops, regime, "")
            grpo_cat = compute_loss_inputs(ops)
        if regime.trl == "dpo":  # TRL's preference batch and labels (memcalc.families.trl_dpo)
            from memcalc.families.trl_dpo import dpo_batch

            dpo_labels = dpo_batch(ops, regime)
        emb = self.embed(ops, spec, regime)
        if regime.trl == "grpo":
            from memcalc.families.trl_grpo import score_labels

            grpo_labels = score_labels(ops, emb.ids, grpo_cat[1])
        cache_layers(ops, spec, regime, emb.context)  # use_cache: the DynamicCache's own tensors
        segments = regime.segment_starts(spec.num_layers)
        trunk = ops.sp_exit(run_layers(ops, spec.num_layers, segments,
                                       lambda x, layer: self.block(ops, spec, regime, x, layer, emb.context),
                                       ops.sp_enter(emb.x), emb.context.get("position_ids")))
        x = self.final_norm(ops, spec, trunk)
        ops.scope_end(emb.held_until_norm)
        if regime.trl == "grpo":
            from memcalc.families.trl_grpo import hide_inputs

            hide_inputs(ops, grpo_cat)
        head = self.tied_head(ops) if spec.tie_embeddings else \
            ops.param(self.head_label, spec.vocab_size * spec.hidden_size, spec.vocab_size)
        if regime.trl != "none":  # TRL's fused LM head (and DPO's reference forward and loss)
            from memcalc.families.trl_dpo import dpo_loss_step, sft_loss_step

            ops.scope_end(emb.held_until_return)  # the fused forward's backbone locals
            if regime.trl == "grpo":
                from memcalc.families.trl_grpo import grpo_step

                held = grpo_step(ops, spec, regime, x, head, grpo_labels) + [grpo_labels] + grpo_cat
            else:
                held = dpo_loss_step(self, ops, spec, regime, x, head, dpo_labels, run_layers) \
                    if regime.trl == "dpo" else sft_loss_step(ops, spec, x, head)
            ops.scope_end(held + ops.weight_casts)  # until compute_loss (and autocast) ends
        else:
            logits = self.head_output(ops, spec, ops.linear(x, head, None, TOKENS, spec.vocab_size, "lm_head"))
            self.loss(ops, logits, emb.ids)
            self.auxiliary_loss(ops, spec, emb.context)
            ops.scope_end([logits, x if self.keeps_norm_output else trunk] + ops.weight_casts
                          + emb.held_until_return + emb.context.get("cache", []))
        if regime.trl == "grpo":  # the reference copy, held though not run (after the policy's:
            # a tied head is the first parameter created, memcalc.families.base.tied_head)
            from memcalc.families.trl_grpo import reference_params

            reference_params(self, ops, spec, regime, run_layers)
        self._order(ops)

    def _order(self, ops: Ops) -> None:
        """torch's parameter order: a LoRA adapter sorts with its base linear, after it (created
        later; a stable sort): peft registers lora_A / lora_B after base_layer in the wrapping
        lora.Linear; a DPO or GRPO reference copy's parameters (memcalc.families.trl_dpo) come
        after the policy's, in their own registration order."""
        ops.g.order_params(lambda label: (label.startswith("ref_model."), self.registration_rank(
            adapter_base(label.removeprefix("ref_model.")))))

    # ---- hooks ---------------------------------------------------------------------------
    def embed(self, ops: Ops, spec: ModelSpec, regime: Regime) -> Embedded:
        """Token (and position) embeddings, masks and tables the blocks share."""
        raise NotImplementedError

    def block(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value, layer: int, context: dict) -> Value:
        """One decoder layer."""
        raise NotImplementedError

    shared_stage_buffers: tuple[str, ...] = ()
    """Buffers of a model-level module every pipeline stage keeps (the reference Llama's Rotary):
    the stages one rank takes from one model share them (memcalc.parallel.pipeline_peaks)."""

    def stage_context(self, _ops: Ops, _spec: ModelSpec, _regime: Regime) -> dict:
        """What the blocks of a pipeline stage without the embedding read (memcalc.parallel.stages:
        the rotary tables such a stage keeps); by default nothing."""
        return {}

    def stage_embedded(self, ops: Ops, spec: ModelSpec, regime: Regime, x: Value) -> Embedded:
        """A pipeline stage without the embedding, whose input is `x` (its receive buffer): the
        context its blocks read and the base model's locals its forward holds (the HF programs'
        position_ids, masks and rotary tables); by default stage_context's, nothing held."""
        return Embedded(x, x, self.stage_context(ops, spec, regime))

    def final_norm(self, ops: Ops, spec: ModelSpec, x: Value) -> Value:
        """The norm before the LM head."""
        raise NotImplementedError

    def tied_head(self, ops: Ops) -> Value:
        """The embedding matrix the LM head shares."""
        return ops.g.params[0]

    def head_output(self, _ops: Ops, _spec: ModelSpec, logits: Value) -> Value:
        """What the causal LM does to the LM head's output before the loss (`logits` is rebound,
        so the head's own output is freed unless this returns it; Gemma-2's final soft-capping,
        Granite's division by logits_scaling); by default nothing."""
        return logits

    def loss(self, ops: Ops, logits: Value, ids: Value) -> None:
        """The causal-LM loss on the logits."""
        raise NotImplementedError

    def auxiliary_loss(self, _ops: Ops, _spec: ModelSpec, _context: dict) -> None:
        """A loss the causal LM adds to the loss after computing it (the MoE load-balancing
        loss, memcalc.families.moe_aux); by default none."""

    def layer_period(self, _spec: ModelSpec) -> int:
        """Layers after which the decoder stack repeats op for op (2 for a local/global
        alternation); memcalc.engine.depth derives every depth from a few, and checks it at one more
        depth (a wrong period falls back to simulating every layer, never a wrong answer)."""
        return 1

    def registration_rank(self, _label: str) -> Any:
        """Sort key giving nn.Module registration order (model.parameters()); by default the
        parameters are created in that order."""
        return 0


def run_layers(ops: Ops, num_layers: int, segments: set[int], block: Callable, x: Value,
               position_ids: Value | None = None) -> Value:
    """The decoder stack: `block(x, layer)` for each layer, each a wrapped module (FSDP hooks at
    its boundaries), grouped into checkpoint regions starting at the layers in `segments`.

    Each region's checkpoint keeps the keyword tensors its layers receive until the region's
    backward: transformers 5.24's GradientCheckpointingLayer checkpoints
    `partial(forward, self, **kwargs)` (modeling_layers.py), and the validator's segments
    (validate.models.hf.SegmentLayer) pass the recorded `calls` to checkpoint. Among them is the
    `position_ids` of a decoder layer that receives it (the embed context's "position_ids"),
    held as a view at the region start like attention_core does under selective; one (1, s)
    int64 tensor shared by every layer, so 8*s bytes live until the first layer's backward
    (measured: -768 B at s 96 before it was modelled)."""
    g = ops.g
    for layer in range(num_layers):
        g.layer_starts.append(len(g.nodes))
        if layer in segments:
            g.begin_region()
            if position_ids is not None:
                g.view("checkpointed closure's position_ids", position_ids)
        g.module_boundary("begin", str(layer))
        x = block(x, layer)
        g.module_boundary("end", str(layer))
        if layer + 1 in segments or layer == num_layers - 1:
            g.end_region()
    g.layer_starts.append(len(g.nodes))
    return x


def input_require_grads(ops: Ops, x: Value) -> None:
    """transformers' activation_checkpointing_enable (what gradient_checkpointing=True runs)
    calls enable_input_require_grads for every input_ids model (modeling_utils.py,
    transformers 5.24), and peft's PeftModel does when checkpointing is on: a forward hook
    makes the input embedding's output require grad. It changes memory only when that output
    does not already require grad (a frozen embedding)."""
    if ops.regime.checkpointing == "per-layer":
        ops.g.require_grad_leaf(x)


def adapter_base(label: str) -> str:
    """The base linear's weight name for a LoRA adapter parameter, the base name for peft's
    modules_to_save original and copy (else the label itself).

    >>> adapter_base("model.layers.0.self_attn.q_proj.lora_B.default.weight")
    'model.layers.0.self_attn.q_proj.weight'
    """
    for part in (".lora_A.", ".lora_B."):
        if part in label:
            return label.split(part)[0] + ".weight"
    return label.replace(".original_module.", ".").replace(".modules_to_save.default.", ".")


def param_maker(ops: Ops, prefix: str) -> Callable[..., Value]:
    """p(name, count, rows, last2): a parameter labelled with its torch name under `prefix`."""
    return lambda name, n, rows=None, last2=None: ops.param(f"{prefix}{name}", n, rows, last2)
