"""Pre-flight check: does a training step fit a GPU, and if not, which combinations of up to three
changes make it fit, each checked with estimate() and ranked by what the user gives up.

The changes (memcalc.queries.changes): activation checkpointing, gradient accumulation keeping the
sequences per optimizer step, another optimizer implementation (give up nothing); bf16 autocast,
pure bf16, 8-bit optimizer states (numerics); LoRA / QLoRA adapters, SGD (the training); more GPUs
with ZeRO-3 sharding, paged optimizer states (hardware). Two are searched rather than listed: the
largest micro-batch that fits and divides the step's sequences, and the fewest GPUs (powers of two)
that fit; each is tried only in a combination that does not fit without it.

Which combinations are shown:
- a change that alone leaves the peak where it was (or raises it) is not combined with others;
- a combination is dropped when a part of it already fits and the rest gives up nothing (adding
  free changes to a fitting answer is no new answer); other combinations with a fitting part are
  shown only as numerics stacked on numerics that lower the peak by MIN_STACK_GAIN of the budget
  (pure bf16 with 8-bit states: more headroom for more precision given up, the training unchanged);
- the rest are ranked by their costs, worst first (changes.cost_key: one numerics change before
  two, two before any change of the training), then by peak; at most MAX_SHOWN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING

from memcalc.core.errors import MemcalcError
from memcalc.queries.basis import peak_on
from memcalc.queries.changes import GIVES_UP, HARDWARE, NOTHING, NUMERICS, Option, batch_option, cost_key, \
    gpus_option, options
from memcalc.queries.estimate import estimate

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

MAX_CHANGES = 3
MAX_SHOWN = 5
MAX_GPUS = 64
"""The largest GPU count searched (a power of two; 8 nodes of 8)."""
MIN_STACK_GAIN = 0.05
"""A display rule, not a model constant: a numerics change stacked on a fitting numerics answer
is shown only when it buys at least this share of the budget in headroom (pure bf16 on 8-bit
states for Llama-3-8B on an H100: 15%; 8-bit states on LoRA adapters: 0.1%, not shown)."""

# TrainingConfig field -> how a TrainingArguments user says it
TRAINER_NAMES = {"micro_batch": "per_device_train_batch_size",
                 "grad_accum": "gradient_accumulation_steps",
                 "checkpointing": "gradient_checkpointing", "precision": "bf16", "optimizer": "optim"}


@dataclass(frozen=True)
class Change:
    """One suggestion: the changes combined, with the predicted peak."""

    fields: dict
    """TrainingConfig fields changed, e.g. {'micro_batch': 2, 'grad_accum': 4}."""
    peak_bytes: int
    why: str
    """The changes in words, '; '-separated."""
    gives_up: str = "nothing"
    """The costliest thing given up: nothing, numerics, the training or hardware."""
    headroom_bytes: int = 0
    """Budget minus peak."""
    steps: tuple[str, ...] = ()
    """Each change in words."""
    rows_per_example: int = 1
    """Batch rows per example: 2 under trl.DPOTrainer (chosen and rejected), whose
    per_device_train_batch_size counts pairs."""

    def trainer_args(self) -> dict:
        """The same change in TrainingArguments fields (and, for what the Trainer does not set,
        the object that does: peft's LoraConfig, bitsandbytes' config, the model's dtype).

        >>> Change({"checkpointing": "per-layer", "micro_batch": 2}, 0, "").trainer_args()
        {'gradient_checkpointing': True, 'per_device_train_batch_size': 2}
        """
        out = {}
        for name, value in self.fields.items():
            if name in ("optimizer_impl", "checkpoint_every", "weight_decay", "hf_trainer"):
                continue  # optim names the implementation; the others are carried along
            if name == "checkpointing":
                value = value == "per-layer"
            elif name == "precision":
                if value == "bf16":
                    out["model_dtype"] = "bfloat16"  # from_pretrained(..., dtype=torch.bfloat16)
                value = value in ("bf16-amp", "bf16")
            elif name == "optimizer":  # the Trainer's optim names (memcalc.inputs.trainers.trainer_args.OPTIMS)
                value = _OPTIM.get((value, self.fields.get("optimizer_impl")), value)
            elif name == "micro_batch":
                value //= self.rows_per_example
            elif name == "dpo_reference":
                name, value = "precompute_ref_log_probs", value == "precomputed"
            elif name == "lora":
                name, value = "peft.LoraConfig", value.peft_kwargs()
            elif name == "quantization":
                name, value = "BitsAndBytesConfig", {"load_in_4bit": True, "bnb_4bit_quant_type": value}
            out[TRAINER_NAMES.get(name, name)] = value
        if "optimizer_impl" in self.fields and "optimizer" not in self.fields:
            impl = self.fields["optimizer_impl"]  # the Trainer reaches fused and torch's default
            out["optim"] = {"fused": "adamw_torch_fused", None: "adamw_torch"}.get(impl, f"adamw_torch ({impl})")
        return out


    def as_dict(self) -> dict:
        """JSON-ready: the TrainingConfig fields (LoRA as its fields), TrainingArguments, peak,
        headroom, what it gives up and each change in words.

        >>> Change({"micro_batch": 2}, 10, "b", "nothing", 5, ("b",)).as_dict()["headroom_bytes"]
        5
        """
        fields = {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in self.fields.items()}
        args = {k: v for k, v in self.trainer_args().items()}
        return {"training": fields, "trainer_args": args, "peak_bytes": self.peak_bytes,
                "headroom_bytes": self.headroom_bytes, "gives_up": self.gives_up, "why": self.why,
                "steps": list(self.steps)}

    def text(self) -> str:
        """One line for the terminal.

        >>> Change({"micro_batch": 2}, 2**30, "micro-batch 2", "nothing", 2**30, ("micro-batch 2",)).text()
        'peak 1.00 GiB, headroom 1.00 GiB, gives up nothing: micro-batch 2'
        """
        from memcalc.core.units import GIB

        return (f"peak {self.peak_bytes / GIB:.2f} GiB, headroom {self.headroom_bytes / GIB:.2f} GiB, "
                f"gives up {self.gives_up}: " + " + ".join(self.steps or (self.why,)))


_OPTIM = {("adamw-8bit", None): "adamw_bnb_8bit", ("paged-adamw", None): "paged_adamw_32bit",
          ("paged-adamw-8bit", None): "paged_adamw_8bit", ("sgd", None): "sgd"}


@dataclass(frozen=True)
class Verdict:
    """What `check` found."""

    fits: bool
    peak_bytes: int
    budget_bytes: int
    changes: list[Change] = field(default_factory=list)
    """When it does not fit: the combinations that make it fit, cheapest first."""

    @property
    def headroom_bytes(self) -> int:
        """Budget minus peak (negative when it does not fit)."""
        return self.budget_bytes - self.peak_bytes


def check(model: ModelSpec, training: TrainingConfig, budget: int | float | str, basis: str = "device") -> Verdict:
    """Whether one step fits `budget` (bytes, '24GiB', or a catalogue GPU) on `basis`
    (memcalc.queries.basis: device by default, reserved, or allocated), and when it does not, up to
    MAX_SHOWN combinations of changes that fit, cheapest first; every peak is on that basis.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> v = check(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=32, seq_len=1024), "RTX-4090")
    >>> v.fits, v.changes[0].gives_up
    (False, 'nothing')
    >>> all(estimate(ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=32, seq_len=1024).with_(
    ...     **c.fields)).peak_bytes < c.peak_bytes <= v.budget_bytes for c in v.changes)  # allocated < device
    True
    """
    ok, peak, budget_bytes = peak_on(model, training, budget, basis)
    if ok:
        return Verdict(True, peak, budget_bytes)
    return Verdict(False, peak, budget_bytes, _Search(model, training, (budget, basis), budget_bytes).run(
        estimate(model, training).peak_bytes))


class _Search:
    """Combinations of up to MAX_CHANGES options, evaluated cheapest first (module docstring)."""

    def __init__(self, model: ModelSpec, training: TrainingConfig, on: tuple, budget: int):
        self.model, self.training, self.on, self.budget = model, training, on, budget
        """`on`: (the budget as given, its basis), for peak_on; `budget`: its bytes on the basis."""
        self.peaks: dict[str, int | None] = {}
        self.fits_on: dict[str, tuple[bool, int] | None] = {}
        self.fitting: dict[frozenset, int] = {}  # evaluated combinations that fit -> peak on the basis

    def peak(self, fields: dict) -> int | None:
        """estimate()'s peak with `fields` changed; None when memcalc refuses the step."""
        key = repr(sorted(fields.items()))
        if key not in self.peaks:
            try:
                self.peaks[key] = estimate(self.model, self.training.with_(**fields)).peak_bytes
            except MemcalcError:  # not modelled with this change: not a suggestion
                self.peaks[key] = None
        return self.peaks[key]

    def fit(self, fields: dict) -> int | None:
        """The peak on the basis with `fields` changed when the step fits the budget there, else
        None (memcalc.queries.basis.peak_on; the allocated peak alone rules out a step above the
        budget: reserved >= allocated, so no replay is made for it)."""
        allocated = self.peak(fields)
        if allocated is None or allocated > self.budget:
            return None
        key = repr(sorted(fields.items()))
        if key not in self.fits_on:
            try:
                ok, peak, _ = peak_on(self.model, self.training.with_(**fields), *self.on)
            except MemcalcError:
                ok, peak = False, 0
            self.fits_on[key] = peak if ok else None
        return self.fits_on[key]

    def run(self, base_peak: int) -> list[Change]:
        useful = [o for o in options(self.training) if (p := self.peak(o.fields)) is not None and p < base_peak]
        candidates = []
        for n in range(MAX_CHANGES + 1):
            for combo in combinations(range(len(useful)), n):
                if len({useful[i].dimension for i in combo}) < n:
                    continue
                for searched in ((), ("batch",), ("gpus",)):
                    if 0 < n + len(searched) <= MAX_CHANGES:
                        costs = [useful[i].cost for i in combo] + [NOTHING if s == "batch" else HARDWARE
                                                                  for s in searched]
                        candidates.append((cost_key(costs), combo, searched))
        candidates.sort(key=lambda c: c[0])
        found: list[tuple[tuple, int, Change]] = []
        for i, (key, combo, searched) in enumerate(candidates):
            change = self._evaluate(useful, combo, searched)
            if change is not None:
                found.append((key, change.peak_bytes, change))
            if len(found) >= MAX_SHOWN and (i + 1 == len(candidates) or candidates[i + 1][0] != key):
                break
        found.sort(key=lambda f: (f[0], f[1]))
        return [c for _, _, c in found[:MAX_SHOWN]]

    def _evaluate(self, useful: list[Option], combo: tuple[int, ...], searched: tuple[str, ...]) -> Change | None:
        members = frozenset(combo) | frozenset(searched)
        for part, part_peak in self.fitting.items():  # a fitting part plus free changes: no new answer
            if part < members and all(m == "batch" or (isinstance(m, int) and useful[m].cost == NOTHING)
                                      for m in members - part):
                return None
        chosen = [useful[i] for i in combo]
        fields = {k: v for o in chosen for k, v in o.fields.items()}
        if searched == ("batch",):
            extra = self._batch(fields)
        elif searched == ("gpus",):
            extra = self._gpus(fields)
        else:
            extra = None
        if searched and extra is None:
            return None
        if extra is not None:
            chosen.append(extra)
            fields = {**fields, **extra.fields}
        peak = self.fit(fields)
        if peak is None:
            return None
        parts = [(part, part_peak) for part, part_peak in self.fitting.items() if part < members]
        self.fitting[members] = peak
        if parts and not self._stacked_numerics(useful, members, parts, peak, self.budget):
            return None
        costs = [o.cost for o in chosen]
        return Change(fields, peak, "; ".join(o.text for o in chosen), GIVES_UP[max(costs)],
                      self.budget - peak, tuple(o.text for o in chosen),
                      2 if self.training.trl == "dpo" else 1)

    @staticmethod
    def _stacked_numerics(useful: list[Option], members: frozenset, parts: list, peak: int, budget: int) -> bool:
        """A combination with a fitting part is shown only as numerics stacked on numerics (pure
        bf16 with 8-bit states: precision given up, not the training): every fitting part gives up
        numerics already, the rest adds a numerics change, and the peak falls below each part's by
        MIN_STACK_GAIN of the budget at least."""
        def cost(m: object) -> int:
            return useful[m].cost if isinstance(m, int) else NOTHING if m == "batch" else HARDWARE
        return max(map(cost, members)) == NUMERICS and all(
            part_peak - peak >= MIN_STACK_GAIN * budget and max(map(cost, part)) == NUMERICS
            and any(cost(m) == NUMERICS for m in members - part) for part, part_peak in parts)

    def _batch(self, fields: dict) -> Option | None:
        """The largest micro-batch below the current one that divides the step's sequences and
        fits with `fields` (only when `fields` alone does not fit); peaks rise with the batch."""
        current = self.training.micro_batch
        if self.peak(fields) is None or self.fit(fields) is not None:
            return None
        total = current * self.training.grad_accum
        step = 2 if self.training.trl == "dpo" else 1  # DPO: chosen and rejected rows together
        divisors = [d for d in range(step, current, step) if total % d == 0]
        lo, hi, best = 0, len(divisors) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            opt = batch_option(self.training, divisors[mid])
            if self.fit({**fields, **opt.fields}) is not None:
                best, lo = opt, mid + 1
            else:
                hi = mid - 1
        return best

    def _gpus(self, fields: dict) -> Option | None:
        """The fewest GPUs (2, 4, ... MAX_GPUS) that fit with `fields` (only when `fields` alone
        does not fit); per-rank peaks fall as the states are sharded over more ranks."""
        if self.peak(fields) is None or self.fit(fields) is not None or self.training.world_size > 1:
            return None
        counts = [2 ** k for k in range(1, MAX_GPUS.bit_length())]
        most = gpus_option(self.training, MAX_GPUS)
        if self.fit({**fields, **most.fields}) is None:  # the activations alone do not fit: no count does
            return None
        lo, hi, best = 0, len(counts) - 2, most
        while lo <= hi:
            mid = (lo + hi) // 2
            opt = gpus_option(self.training, counts[mid])
            if self.fit({**fields, **opt.fields}) is not None:
                best, hi = opt, mid - 1
            else:
                lo = mid + 1
        return best
