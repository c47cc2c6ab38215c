"""The JSON API behind `memcalc serve`: a query string (the page's state, the URL a user shares)
in, one answer out. Pure functions of the query: no I/O, nothing the user gives is executed (a
pasted config.json is parsed by memcalc.core.files.parse_json_object, bounded).

Query keys are the `memcalc estimate` flags with underscores (model, micro_batch, seq_len,
precision, ...) plus gpu and config (a pasted config.json); a key left out takes the CLI's
default, so a page's numbers equal `memcalc estimate --json` with the same flags
(tests/test_serve_browser.py checks that in a browser).

>>> a = answer({"model": "gpt2", "gpu": "RTX-4090", "micro_batch": "2", "seq_len": "512"})
>>> a["fits"], a["peak_bytes"] == a["estimate"]["peak_bytes"]
(True, True)
>>> answer({"micro_batch": "two"})
Traceback (most recent call last):
...
memcalc.core.errors.SpecError: micro_batch: 'two' is not an integer; fix: give a whole number, e.g. 4
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.core.errors import MemcalcError, SpecError

if TYPE_CHECKING:
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

INTS = ("micro_batch", "seq_len", "grad_accum", "world_size", "lora_rank", "checkpoint_every")
FLOATS = ("max_grad_norm",)
NAMES = ("precision", "optimizer", "optimizer_impl", "checkpointing", "attention", "sharding",
         "quantization")
DEFAULTS = {"model": "gpt2", "gpu": "H100-80GB", "micro_batch": "1", "seq_len": "1024"}
"""What the page starts with; the training fields' defaults are `memcalc estimate`'s."""
KEYS = ("model", "config", "gpu", *INTS, *FLOATS, *NAMES)
MAX_QUERY_CHARS = 256 * 1024
CURVE_POINTS = 24


def options() -> dict:
    """What the page's inputs offer: presets, GPUs (usable bytes), the enumerations, defaults.

    >>> o = options(); "gpt2" in o["presets"] and o["gpus"]["H100-80GB"] > 0
    True
    """
    from memcalc.inputs import training as t
    from memcalc.inputs.gpus import GPUS
    from memcalc.inputs.presets import PRESETS

    return {"presets": list(PRESETS), "gpus": {k: g.usable_bytes for k, g in GPUS.items()},
            "precision": list(t.PRECISIONS), "optimizer": list(t.OPTIMIZERS),
            "optimizer_impl": ["", *t.OPTIMIZER_IMPLS], "checkpointing": list(t.CHECKPOINTINGS),
            "attention": list(t.ATTENTIONS), "sharding": list(t.SHARDINGS),
            "quantization": list(t.QUANTIZATIONS), "defaults": DEFAULTS}


def parse_query(query: dict[str, str]) -> dict[str, str]:
    """Known keys only (an unknown one is refused by name), empty values dropped, defaults in.

    >>> parse_query({"model": "gpt2", "seq_len": ""})["seq_len"]
    '1024'
    """
    unknown = [k for k in query if k not in KEYS]
    if unknown:
        raise SpecError(unknown[0][:40], "is not an input of this page", f"use only {', '.join(KEYS)}")
    given = {k: v.strip() for k, v in query.items() if isinstance(v, str) and v.strip()}
    return {**DEFAULTS, **given}


def model_of(q: dict[str, str]) -> ModelSpec:
    """The ModelSpec: a pasted config.json, a preset, or a hub id (org/name) when this version has
    ModelSpec.from_pretrained."""
    from memcalc.core.files import parse_json_object
    from memcalc.inputs.specs import ModelSpec

    if "config" in q:
        return ModelSpec.from_hf_config(parse_json_object(q["config"], "the pasted config.json", "config"))
    name = q["model"]
    if "/" in name:
        if not hasattr(ModelSpec, "from_pretrained"):
            raise SpecError("model", f"hub ids ({name[:60]!r}) need ModelSpec.from_pretrained, which this "
                            "memcalc does not have", "pick a preset or paste the model's config.json")
        return ModelSpec.from_pretrained(name)
    return ModelSpec.preset(name)


def training_of(q: dict[str, str]) -> TrainingConfig:
    """The TrainingConfig of the query (the CLI's defaults for what it leaves out)."""
    from memcalc.inputs.lora import LoRA
    from memcalc.inputs.training import TrainingConfig

    fields: dict = {k: _int(k, q[k]) for k in INTS if k in q and k != "lora_rank"}
    fields.update({k: _float(k, q[k]) for k in FLOATS if k in q})
    fields.update({k: q[k] for k in NAMES if k in q})
    if "lora_rank" in q:
        fields["lora"] = LoRA(rank=_int("lora_rank", q["lora_rank"]))
    return TrainingConfig.make(**fields)


def _int(field: str, text: str) -> int:
    if not text.isdigit() or len(text) > 15:
        raise SpecError(field, f"{text[:20]!r} is not an integer", "give a whole number, e.g. 4")
    return int(text)


def _float(field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(field, f"{text[:20]!r} is not a number", "give a number, e.g. 1.0") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SpecError(field, f"{text[:20]!r} is not a finite number", "give a number, e.g. 1.0")
    return value


def answer(query: dict[str, str]) -> dict:
    """Everything the page shows for one state: the estimate (as `memcalc estimate --json` gives
    it), fits or not with headroom on the GPU, each phase's breakdown, the curves, and when it
    does not fit the changes memcalc.check finds (`changes_answer`, asked for after this one
    is shown: check() simulates other steps, a few hundred ms the first time)."""
    from memcalc.inputs.gpus import gpu
    from memcalc.queries.estimate import estimate

    q = parse_query(query)
    model, training = model_of(q), training_of(q)
    card = gpu(q["gpu"])
    r = estimate(model, training)
    budget = card.usable_bytes
    out = {"model": model.name, "params": model.param_count, "gpu": card.name, "budget_bytes": budget,
           "peak_bytes": r.peak_bytes, "fits": r.peak_bytes <= budget, "headroom_bytes": budget - r.peak_bytes,
           "estimate": {"peak_bytes": r.peak_bytes, "peak_phase": r.peak_phase, "moment": r.moment,
                        "first_step_peak_bytes": r.first_step_peak_bytes, "phases": r.phases,
                        "components": r.components},
           "breakdown": phase_breakdown(model, training, r),
           "curves": {"micro_batch": curve(model, training, "micro_batch"),
                      "seq_len": curve(model, training, "seq_len")},
           "query": {k: v for k, v in q.items()}}
    return out


def phase_breakdown(model: ModelSpec, training: TrainingConfig, report: object) -> dict[str, dict[str, int]]:
    """Bytes per category at each phase's peak moment (the stacked bars). Data-parallel steps
    (per-rank optimizer shards) show each phase's total alone, the peak phase broken down."""
    from memcalc.engine.run import candidates
    from memcalc.queries.estimate import _components

    if training.data_parallel > 1:
        return {p: (report.components if p == report.peak_phase else {"total": v})
                for p, v in report.phases.items()}
    cands = candidates(model, training)
    b, s = training.micro_batch, training.seq_len
    totals = cands.steady_set.rounded_totals(b, s)
    out = {}
    for phase, idx in cands.steady_set.by_phase.items():
        if idx:
            i = max(idx, key=totals.__getitem__)
            out[phase] = _components(cands.steady[i], b, s, totals[i])
    return out


def curve(model: ModelSpec, training: TrainingConfig, axis: str) -> list[list[int]]:
    """[[x, steady peak bytes]] over micro-batch or sequence length, the rest of the step held."""
    now = getattr(training, axis)
    if axis == "micro_batch":
        xs = sorted(set(range(1, max(2 * now, 8) + 1)) if max(2 * now, 8) <= CURVE_POINTS
                    else set(_geometric(1, 2 * now)) | {now})
    else:
        top = max(4 * now, 2048)
        limit = getattr(model, "max_position_embeddings", None)
        if limit:
            top = min(top, max(limit, now))
        xs = sorted(set(_geometric(min(64, now), top)) | {now})
    return [[x, y] for x, y in zip(xs, _peaks(model, training, axis, xs)) if y is not None]


def _geometric(lo: int, hi: int) -> list[int]:
    if hi <= lo:
        return [lo]
    ratio = (hi / lo) ** (1 / (CURVE_POINTS - 1))
    return sorted({max(1, round(lo * ratio ** i)) for i in range(CURVE_POINTS)})


def _peaks(model: ModelSpec, training: TrainingConfig, axis: str, xs: list[int]) -> list[int | None]:
    """estimate_grid's steady peaks (numpy), else estimate() at each point; a point the engine
    refuses (e.g. past a shape condition) is left out."""
    try:
        import numpy as np

        from memcalc.queries.grid import estimate_grid

        return [int(v) for v in estimate_grid(model, training, **{axis: np.array(xs)})]
    except (ImportError, MemcalcError):
        pass
    from memcalc.queries.estimate import estimate

    out = []
    for x in xs:
        try:
            out.append(estimate(model, training.with_(**{axis: x})).peak_bytes)
        except MemcalcError:
            out.append(None)
    return out


def changes_answer(query: dict[str, str]) -> dict:
    """{'fits', 'changes'}: memcalc.check's changes that make the step fit, cheapest first.

    >>> c = changes_answer({"model": "gpt2", "gpu": "RTX-4090", "micro_batch": "32"})
    >>> c["fits"], all(x["peak_bytes"] <= 24564 * 2**20 for x in c["changes"]), len(c["changes"]) > 0
    (False, True, True)
    """
    from memcalc.inputs.gpus import gpu
    from memcalc.queries.preflight import check

    q = parse_query(query)
    v = check(model_of(q), training_of(q), gpu(q["gpu"]).name)
    found = [{"fields": c.as_dict()["training"], "peak_bytes": c.peak_bytes, "why": c.why,  # LoRA as its fields
              "headroom_bytes": c.headroom_bytes, "gives_up": c.gives_up} for c in v.changes]
    return {"fits": v.fits, "changes": found}
