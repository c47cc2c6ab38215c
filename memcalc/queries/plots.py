"""PNG plots for the tables (needs matplotlib, extra 'plots'); metadata fixed so that reruns with
the same matplotlib give the same bytes."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from memcalc.queries.peaks import activation_peak_bytes
from memcalc.core.units import GIB

if TYPE_CHECKING:
    from types import ModuleType
_META = {"Software": None}  # no matplotlib version string (PNG has no timestamp by default)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: Path) -> list[str]:
    """breakdown.png (stacked components per GPT-2 preset) and depth.png (activations vs depth,
    none vs sqrt checkpointing); nothing when matplotlib is missing (tests/test_tables.py
    checks both files).
    """
    plt = _pyplot()
    if plt is None:
        return []
    _breakdown_plot(plt, Path(out) / "breakdown.png")
    _depth_plot(plt, Path(out) / "depth.png")
    return ["breakdown.png", "depth.png"]


def _breakdown_plot(plt: ModuleType, path: Path) -> None:
    from memcalc.queries.estimate import estimate
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    names = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
    t = TrainingConfig(micro_batch=1, seq_len=1024, precision="bf16-amp")
    reports = [estimate(ModelSpec.preset(n), t).components for n in names]
    cats = sorted({k for r in reports for k in r})
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(names)
    for cat in cats:
        vals = [r.get(cat, 0) / GIB for r in reports]
        ax.bar(names, vals, bottom=bottom, label=cat)
        bottom = [a + v for a, v in zip(bottom, vals)]
    ax.set_ylabel("GiB at the peak")
    ax.set_title("bf16-amp AdamW, micro_batch 1, seq_len 1024")
    ax.legend(fontsize=7)
    fig.savefig(path, metadata=_META)
    plt.close(fig)


def activation_bytes_at_depth(layers: int, mode: str) -> int:
    """activation_peak_bytes of GPT-2 small at `layers` layers, micro_batch 1, seq_len 1024."""
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig

    model = ModelSpec.preset("gpt2").with_(num_layers=layers)
    return activation_peak_bytes(model, TrainingConfig(micro_batch=1, seq_len=1024, checkpointing=mode))


def _depth_plot(plt: ModuleType, path: Path) -> None:
    activation_bytes_at_peak = activation_bytes_at_depth
    depths = [4, 8, 16, 32, 48]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("none", "sqrt"):
        ax.plot(depths, [activation_bytes_at_peak(L, mode) / GIB for L in depths], marker="o", label=mode)
    ax.set_xlabel("layers (gpt2 width 768, micro_batch 1, seq_len 1024)")
    ax.set_ylabel("activations at the peak, GiB")
    ax.legend()
    fig.savefig(path, metadata=_META)
    plt.close(fig)
