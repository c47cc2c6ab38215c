"""`python -m validate demo`: the lecture's demonstrations, measured on CPU with the tracker.

(a) a small transformer's training step allocates several times its model size;
(b) peak memory with and without automatic mixed precision;
(c) peak vs depth L = 4..64 with no checkpointing and sqrt checkpointing (measured under
    FakeTensorMode unless --real, which is exact for the reference models), against memcalc's
    prediction when the engine is available; plotted to depth-checkpointing.png.
"""
from __future__ import annotations

import sys
from pathlib import Path

from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.core.units import MIB
from validate.run.compare import error_pct, predict
from validate.measure.backends import measure

SMALL = ModelSpec.make(name="small-gpt2", family="gpt2", vocab_size=8192, hidden_size=256,
                       num_layers=4, num_heads=4, max_position_embeddings=256,
                       embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1)
SMALL_STEP = TrainingConfig(micro_batch=8, seq_len=256, device="cpu", optimizer="adamw",
                            attention="eager")  # the engine declines SDPA + dropout on CPU
DEPTHS = (4, 8, 16, 32, 64)
DEEP = ModelSpec.make(name="deep-gpt2", family="gpt2", vocab_size=2048, hidden_size=128,
                      num_layers=4, num_heads=4, max_position_embeddings=256,
                      implementation="reference")
DEEP_STEP = TrainingConfig(micro_batch=4, seq_len=256, device="cpu", optimizer="adamw")


def _predicted(spec, training):
    report, _ = predict(spec, training)
    return getattr(report, "peak_bytes", None)


def _fmt(x) -> str:
    return "-" if x is None else f"{x / MIB:,.1f}"


def step_vs_model_size() -> str:
    """(a) peak / weight bytes for a small GPT-2 (HF) fp32 + AdamW step, at three batch sizes."""
    weights = 4 * SMALL.param_count
    rows = []
    for b, s in ((1, 128), (2, 256), (8, 256)):
        m = measure(SMALL, SMALL_STEP.with_(micro_batch=b, seq_len=s))
        rows.append(f"| {b} x {s} | {_fmt(m.peak_bytes)} | {m.peak_bytes / weights:.1f}x | "
                    f"{_fmt(m.first_step_peak_bytes)} |")
    return ("## (a) A training step allocates several times the model\n\n"
            f"{SMALL.param_count:,} parameters ({_fmt(weights)} MiB of fp32 weights), HF GPT-2 "
            f"(L={SMALL.num_layers}, h={SMALL.hidden_size}, V={SMALL.vocab_size}), fp32, AdamW.\n\n"
            "| tokens (b x s) | steady peak (MiB) | peak / weights | first-step peak (MiB) |\n"
            "|---|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
            "Weights + grads + two Adam states are 4x the weights; activations, which grow with "
            "b x s, are the rest (the lecture saw 7-8x).\n")


def amp_table() -> str:
    """(b) the same step in fp32, bf16 autocast and fp16 autocast + GradScaler."""
    rows, base = [], None
    for precision in ("fp32", "bf16-amp", "fp16-amp"):
        training = SMALL_STEP.with_(precision=precision)
        m = measure(SMALL, training)
        base = base or m.peak_bytes
        pred = _predicted(SMALL, training)
        rows.append(f"| {precision} | {_fmt(m.peak_bytes)} | {(m.peak_bytes / base - 1) * 100:+.1f}% | "
                    f"{_fmt(pred)} | {m.wall_s:.1f} |")
    return ("## (b) Memory with and without AMP\n\n"
            "| precision | measured peak (MiB) | vs fp32 | predicted (MiB) | wall s (CPU) |\n"
            "|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
            "Autocast keeps fp32 weights, grads and Adam states; only activations shrink, and the "
            "low-precision weight copies are extra (the lecture measured -8.5%). CPU wall times "
            "say nothing about GPU speed-ups.\n")


def depth_sweep(real: bool) -> list[dict]:
    """(c) measured and predicted peaks for each depth and checkpointing strategy."""
    rows = []
    for layers in DEPTHS:
        spec = DEEP.with_(num_layers=layers)
        for ck in ("none", "sqrt"):
            training = DEEP_STEP.with_(checkpointing=ck)
            m = measure(spec, training, backend="cpu" if real else "fake")
            pred = _predicted(spec, training)
            states = 16 * spec.param_count  # fp32 weights, grads, Adam exp_avg and exp_avg_sq
            rows.append(dict(layers=layers, checkpointing=ck, measured=m.peak_bytes,
                             predicted=pred, error_pct=error_pct(pred, m.peak_bytes),
                             model_states=states))
            print(f"depth {layers} {ck}: {_fmt(m.peak_bytes)} MiB", file=sys.stderr, flush=True)
    return rows


def depth_table(rows: list[dict], real: bool) -> str:
    lines = ["| L | checkpointing | measured (MiB) | predicted (MiB) | error |", "|---:|---|---:|---:|---:|"]
    for r in rows:
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.2f}%"
        lines.append(f"| {r['layers']} | {r['checkpointing']} | {_fmt(r['measured'])} | "
                     f"{_fmt(r['predicted'])} | {err} |")
    how = "real compute" if real else "FakeTensorMode (exact for reference models)"
    return ("## (c) Peak vs depth, with and without sqrt checkpointing\n\n"
            f"Reference GPT-2, h={DEEP.hidden_size}, b={DEEP_STEP.micro_batch}, "
            f"s={DEEP_STEP.seq_len}, fp32, AdamW; measured with {how}.\n\n" + "\n".join(lines) + "\n")


def plot_depth(rows: list[dict], path: Path) -> bool:
    """depth-checkpointing.png; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((axes[0], "steady-state peak (MiB)", lambda r, key: r[key]),
              (axes[1], "peak minus 16 B/param model states (MiB)",
               lambda r, key: r[key] - r["model_states"]))
    for ax, ylabel, value in panels:
        for ck, color in (("none", "tab:red"), ("sqrt", "tab:blue")):
            sel = [r for r in rows if r["checkpointing"] == ck]
            xs = [r["layers"] for r in sel]
            ax.plot(xs, [value(r, "measured") / MIB for r in sel], "o-", color=color,
                    label=f"{ck}: measured")
            if all(r["predicted"] is not None for r in sel):
                ax.plot(xs, [value(r, "predicted") / MIB for r in sel], "x--", color=color,
                        label=f"{ck}: predicted")
        ax.set(xlabel="layers L", ylabel=ylabel)
        ax.set_xticks(DEPTHS, [str(d) for d in DEPTHS])
        ax.legend()
    fig.suptitle("Activation checkpointing: O(L) without, O(sqrt L) with sqrt(L) segments")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_demo(out: Path, real: bool = False) -> None:
    """Write out/demo.md (tables a, b, c) and out/depth-checkpointing.png."""
    out.mkdir(parents=True, exist_ok=True)
    rows = depth_sweep(real)
    parts = ["# validate demo: the lecture's measurements on CPU\n", step_vs_model_size(),
             amp_table(), depth_table(rows, real)]
    if plot_depth(rows, out / "depth-checkpointing.png"):
        parts.append("\n![peak vs depth](depth-checkpointing.png)\n")
    (out / "demo.md").write_text("\n".join(parts))
    print(f"wrote {out / 'demo.md'}", file=sys.stderr)
