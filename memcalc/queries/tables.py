"""Reference tables: the memory breakdown of every preset under standard regimes, and the
largest micro-batch per catalogue GPU; markdown and CSV (deterministic, checked in CI with
`memcalc tables --check`), plus PNG plots when matplotlib is installed (not checked: PNG bytes
depend on the matplotlib and freetype versions).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from memcalc.core.errors import NotModelledError
from memcalc.core.units import GIB

REGIMES = {"fp32 Adam": dict(precision="fp32", optimizer="adam"),
           "bf16-amp AdamW": dict(precision="bf16-amp", optimizer="adamw"),
           "bf16 AdamW": dict(precision="bf16", optimizer="adamw")}
CHECKPOINTING = ("none", "per-layer", "sqrt")
COMPONENTS = ("weights", "gradients", "optimizer", "activations", "activation_grads",
              "temporaries", "other")
NOT_MODELLED = "not modelled yet"


def standard_seq_len(preset: str) -> int:
    """The shape a preset is tabulated at: 1024 tokens for GPT-2 (its context), 4096 otherwise.

    >>> standard_seq_len("gpt2-xl"), standard_seq_len("llama-3-8b")
    (1024, 4096)
    """
    return 1024 if preset.startswith("gpt2") else 4096


def configs(presets: list[str]=None, regimes: list[str]=None):
    """(preset, regime, checkpointing, ModelSpec, TrainingConfig) of every table row, in order
    (only `regimes`, names of REGIMES, when given)."""
    from memcalc.inputs.presets import PRESETS
    from memcalc.inputs.specs import ModelSpec
    from memcalc.families.registry import declaration
    from memcalc.inputs.training import TrainingConfig

    for name in presets or PRESETS:
        model = ModelSpec.preset(name)
        no_sdpa = declaration(model.family).supports.sdpa_refusal is not None
        attention = "eager" if no_sdpa else "sdpa"  # what its class can run
        for regime, fields in REGIMES.items():
            if regimes and regime not in regimes:
                continue
            for mode in CHECKPOINTING:
                yield name, regime, mode, model, TrainingConfig(
                    micro_batch=1, seq_len=standard_seq_len(name), checkpointing=mode, attention=attention,
                    **fields)


def _gib(n: int) -> str:
    return f"{n / GIB:.3f}"


def breakdown_rows(presets: list[str]=None) -> list[list[str]]:
    """One row per (preset, regime, checkpointing): peak, phase and components in GiB."""
    return [_breakdown_row(*config) for config in configs(presets)]


def _breakdown_row(name: str, regime: str, mode: str, model: object, training: object) -> list[str]:
    from memcalc.queries.estimate import estimate

    head = [name, regime, mode, str(training.seq_len)]
    try:
        r = estimate(model, training)
    except (NotImplementedError, NotModelledError):
        return head + [NOT_MODELLED] + [""] * (len(COMPONENTS) + 1)
    comps = dict.fromkeys(COMPONENTS, 0)
    for k, v in r.components.items():
        comps[k if k in comps else "other"] += v
    return head + [_gib(r.peak_bytes), r.peak_phase] + [_gib(v) for v in comps.values()]


def both_rows(presets: list[str]=None, regimes: list[str]=None,
              basis: str = "device") -> tuple[list[list[str]], list[list[str]]]:
    """(breakdown_rows, capacity_rows) in one pass over the configurations, so that each
    configuration's simulation (memcalc.engine.cache, bounded) serves both of its rows."""
    b_rows, c_rows = [], []
    for config in configs(presets, regimes):
        b_rows.append(_breakdown_row(*config))
        c_rows.append(_capacity_row(*config, basis=basis))
    return b_rows, c_rows


BREAKDOWN_HEADER = ["model", "regime", "checkpointing", "seq_len", "peak GiB", "peak phase"] + [
    f"{c} GiB" for c in COMPONENTS]


def capacity_rows(presets: list[str]=None, basis: str = "device") -> list[list[str]]:
    """One row per (preset, regime, checkpointing): the largest micro-batch on each GPU."""

    return [_capacity_row(*config, basis=basis) for config in configs(presets)]


def _capacity_row(name: str, regime: str, mode: str, model: object, training: object,
                  basis: str = "device") -> list[str]:
    from memcalc.queries.capacity import max_micro_batch
    from memcalc.inputs.gpus import GPUS

    head = [name, regime, mode, str(training.seq_len)]
    try:
        return head + [str(max_micro_batch(model, training, g.name, basis).value) for g in GPUS.values()]
    except (NotImplementedError, NotModelledError):
        return head + [NOT_MODELLED] * len(GPUS)


def capacity_header() -> list[str]:
    """Columns of the capacity table."""
    from memcalc.inputs.gpus import GPUS

    return ["model", "regime", "checkpointing", "seq_len"] + list(GPUS)


def to_markdown(header: list[str], rows: list[list[str]], title: str) -> str:
    """A markdown table with a title line.

    >>> print(to_markdown(["a", "b"], [["1", "2"]], "T"), end="")
    # T
    <BLANKLINE>
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(header: list[str], rows: list[list[str]]) -> str:
    """CSV text with \\n line endings."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


BREAKDOWN_TITLE = ("Peak memory of one training step (steady state, micro_batch 1, cuda, sdpa "
                   "attention, eager for Gemma-2 and GPT-OSS, which have no SDPA path; GiB = 2**30 bytes)")
CAPACITY_TITLES = {
    "allocated": ("Largest micro-batch per GPU on allocated memory (within total - 500 MiB CUDA context; "
                  "0 = does not fit)"),
    "reserved": ("Largest micro-batch per GPU on reserved memory (the caching allocator's segments, replayed from "
                 "the step's own allocations, within total - 500 MiB CUDA context; 0 = does not fit)")}
CAPACITY_TITLE = ("Largest micro-batch per GPU on device bytes (the caching allocator's reserved peak, "
                  "replayed from the step's own allocations, plus the CUDA context of memcalc.allocator.outside, "
                  "within the GPU's total memory; 0 = does not fit)")


MULTI_GPU_PRESETS = ("llama-2-13b", "mistral-7b", "llama-2-70b", "llama-3-70b")
MULTI_GPU = ("H100-80GB", "H200-141GB")
MULTI_GPU_SHARDINGS = ("zero1", "zero2", "zero3")
MULTI_GPU_TP = 4  # divides the heads, kv heads and MLP width of every MULTI_GPU_PRESETS model
MULTI_GPU_HEADER = (["model", "gpu"] + [f"{s} ranks" for s in MULTI_GPU_SHARDINGS]
                    + [f"zero3 x TP{MULTI_GPU_TP} GPUs"])
MULTI_GPU_TITLE = ("Fewest ranks that train the model (allocated memory within total - 500 MiB CUDA context; "
                   "pure bf16 AdamW, per-layer checkpointing, "
                   "micro_batch 1, seq_len 4096; 0 = not within 512 ranks). Last column: FSDP2 "
                   f"zero3 across groups of {MULTI_GPU_TP} tensor-parallel GPUs, every GPU counted")


def multi_gpu_rows(presets: list[str]=None) -> list[list[str]]:
    """One row per (preset, GPU): the fewest ranks under each sharding, then under zero3 across
    tensor-parallel groups."""
    from memcalc.queries.capacity import min_world_size
    from memcalc.inputs.gpus import GPUS
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    rows = []
    for name in MULTI_GPU_PRESETS:
        if presets and name not in presets:
            continue
        model = ModelSpec.preset(name)
        for gpu in MULTI_GPU:
            cells = []
            for sharding, tp in [(sh, 1) for sh in MULTI_GPU_SHARDINGS] + [("zero3", MULTI_GPU_TP)]:
                t = TrainingConfig(micro_batch=1, seq_len=4096, precision="bf16",
                                   checkpointing="per-layer", sharding=sharding, world_size=tp,
                                   tensor_parallel=tp)
                cap = 512 // tp
                cells.append(str(min_world_size(model, t, GPUS[gpu].usable_bytes, cap=cap).value))
            rows.append([name, gpu] + cells)
    return rows


def render(presets: list[str]=None, jobs: int | None = None, basis: str = "device") -> dict[str, str]:
    """File name -> text of every checked table; the rows are computed over `jobs` processes
    (memcalc.queries.jobs; every row is computed on its own, so the text does not depend on them).

    >>> render(["gpt2"], jobs=1) == render(["gpt2"], jobs=2)
    True
    """
    from memcalc.queries.jobs import run_all

    tasks = _tasks(presets, basis)
    return _assemble(presets, tasks, run_all(tasks, jobs), basis)


def _tasks(presets: list[str] | None, basis: str = "device") -> list[tuple]:
    """The tasks of render: each multi-GPU preset's rows, then the breakdown and capacity rows
    of each (preset, regime), deepest and eager-attention models first (the longest:
    memcalc.queries.jobs hands tasks out in order, and tasks a third of a preset's keep the last ones
    short, so the processes end together). Every program the tasks run is imported here, once,
    before memcalc.queries.jobs forks the workers."""
    from memcalc.families import program_for
    from memcalc.inputs.specs import ModelSpec
    from memcalc.families.registry import declaration

    import memcalc.queries.capacity  # noqa: F401 (the tasks' modules, imported before the fork)
    import memcalc.inputs.gpus  # noqa: F401

    models = {name: ModelSpec.preset(name) for name in _preset_names(presets)}
    for model in models.values():
        program_for(model)  # its module imported here, before the fork

    def cost(name: str) -> tuple:
        return (declaration(models[name].family).supports.sdpa_refusal is not None, models[name].num_layers)

    multi = [(_multi_gpu_preset, (name,)) for name in MULTI_GPU_PRESETS if not presets or name in presets]
    names = sorted(models, key=cost, reverse=True)
    return multi + [(_preset_rows, (name, regime, basis)) for name in names for regime in REGIMES]


def _assemble(presets: list[str] | None, tasks: list[tuple], results: list, basis: str = "device") -> dict[str, str]:
    """The files of render from its tasks' results, rows in the order of configs()."""
    b_rows, c_rows, m_rows, by_config = [], [], [], {}
    for (fn, args), result in zip(tasks, results):
        if fn is _multi_gpu_preset:
            m_rows += result
        elif fn is _preset_rows:
            by_config[args[:2]] = result
    for name in _preset_names(presets):
        for regime in REGIMES:
            if (name, regime) in by_config:
                b_rows += by_config[name, regime][0]
                c_rows += by_config[name, regime][1]
    return _files(b_rows, c_rows, m_rows, CAPACITY_TITLES.get(basis, CAPACITY_TITLE))


def _preset_names(presets: list[str] | None) -> list[str]:
    from memcalc.inputs.presets import PRESETS

    return list(presets or PRESETS)


def _preset_rows(name: str, regime: str, basis: str = "device") -> tuple[list[list[str]], list[list[str]]]:
    """The breakdown and capacity rows of one preset under one regime (one task of render;
    memcalc.queries.jobs holds the garbage collector off while tasks run)."""
    return both_rows([name], [regime], basis)


def _multi_gpu_preset(name: str) -> list[list[str]]:
    """The multi-GPU rows of one preset (one task of render)."""
    return multi_gpu_rows([name])


def _files(b_rows: list, c_rows: list, m_rows: list, capacity_title: str = "") -> dict[str, str]:
    return {"breakdown.md": to_markdown(BREAKDOWN_HEADER, b_rows, BREAKDOWN_TITLE),
            "breakdown.csv": to_csv(BREAKDOWN_HEADER, b_rows),
            "max_micro_batch.md": to_markdown(capacity_header(), c_rows, capacity_title or CAPACITY_TITLE),
            "max_micro_batch.csv": to_csv(capacity_header(), c_rows),
            "multi_gpu.md": to_markdown(MULTI_GPU_HEADER, m_rows, MULTI_GPU_TITLE),
            "multi_gpu.csv": to_csv(MULTI_GPU_HEADER, m_rows)}


def write(out: Path, presets: list[str]=None, plots: bool = True, jobs: int | None = None,
          basis: str = "device") -> list[str]:
    """Write the tables (and the plots when matplotlib is importable), over `jobs` processes
    (memcalc.queries.jobs); return the file names."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from memcalc.queries.jobs import run_all

    tasks = _tasks(presets, basis)
    extra = [(_plots, (str(out),))] if plots else []
    results = run_all(extra + tasks, jobs)
    files = _assemble(presets, tasks, results[len(extra):], basis)
    for name, text in files.items():
        (out / name).write_text(text)
    return list(files) + (results[0] if plots else [])


def _plots(out: str) -> list[str]:
    from memcalc.queries.plots import write_plots

    return write_plots(Path(out))


def check(out: Path, presets: list[str]=None, jobs: int | None = None, basis: str = "device") -> list[str]:
    """Names of the checked tables under `out` that differ from what the code generates; with
    `presets`, only those presets' rows (and the titles and headers) are compared."""
    out = Path(out)
    if presets:  # the committed files hold the presets in the catalogue's order
        presets = [name for name in _preset_names(None) if name in presets]
    return [name for name, text in render(presets, jobs, basis).items()
            if not (out / name).exists() or _rows_of((out / name).read_text(), presets) != _rows_of(text, presets)]


def _rows_of(text: str, presets: list[str] | None) -> list[str]:
    """The lines of a table's text that `presets` generate: the title, the header and the rows
    whose model cell is one of them (every line without `presets`).

    >>> _rows_of("# T\\n\\n| model | x |\\n|---|---|\\n| gpt2 | 1 |\\n| opt | 2 |\\n", ["gpt2"])
    ['# T', '', '| model | x |', '|---|---|', '| gpt2 | 1 |']
    >>> _rows_of("model,x\\ngpt2,1\\nopt,2\\n", ["opt"])
    ['model,x', 'opt,2']
    """
    lines = text.splitlines()
    if not presets:
        return lines
    head = 4 if lines and lines[0].startswith("# ") else 1  # markdown: title, blank, header, rule
    return lines[:head] + [line for line in lines[head:] if _model_cell(line) in presets]


def _model_cell(line: str) -> str:
    """The first cell of a markdown or CSV row."""
    return line.strip("| ").split(" | ")[0] if line.startswith("|") else line.split(",")[0]
