"""Planning tables from the cluster planner (issue 26 item 5): the fastest layout and the runner-up
of Llama-3-8B, Llama-3-70B and Mixtral-8x7B on 8, 64 and 512 H100-80GB at seq_len 4096 and 8192,
and a 70B QLoRA table on one consumer card.

    python scripts/cluster_tables.py            # writes tables/cluster_layouts.md and .csv
    python scripts/cluster_tables.py --check    # exit 1 when either file is stale

Every figure is memcalc.plan_cluster's (docs/cluster-planner.md): a CUDA prediction on the device
basis, not a measurement. Each cell's wall time goes to stderr, with the total.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path
from typing import NamedTuple

import memcalc
from memcalc.core.errors import MemcalcError
from memcalc.queries.cluster import Layout, plan_cluster

ROOT = Path(__file__).resolve().parent.parent
MD, CSV = ROOT / "tables" / "cluster_layouts.md", ROOT / "tables" / "cluster_layouts.csv"
MODELS = ("llama-3-8b", "llama-3-70b", "mixtral-8x7b")
COUNTS = (8, 64, 512)
SEQ_LENS = (4096, 8192)
GPU = "H100-80GB"
GLOBAL_BATCH = 1024
"""Sequences per optimizer step (4M tokens at s 4096, 8M at s 8192)."""
TOP = 2
QLORA_MODEL, QLORA_CARDS, QLORA_SEQ = "llama-3-70b", ("RTX-4090", "RTX-3090"), (2048, 4096)
GIB = 2**30
COLUMNS = ["model", "gpus", "seq_len", "rank", "dp", "tp", "sharding", "checkpointing", "micro_batch",
           "grad_accum", "peak_gib", "headroom_gib", "step_s", "compute_s", "bubble_s", "tp_comm_s",
           "dp_comm_s"]
QLORA_COLUMNS = ["model", "gpu", "seq_len", "checkpointing", "fits", "peak_gib", "budget_gib"]


class Cell(NamedTuple):
    """One (model, GPU count, seq_len) cell: its layouts, fastest first, and its wall seconds."""

    model: str
    count: int
    seq_len: int
    layouts: list[Layout]
    seconds: float


def training(seq_len: int) -> memcalc.TrainingConfig:
    """The step every cell plans: bf16-amp, AdamW (the default optimizer), micro_batch searched.

    >>> t = training(4096); t.seq_len, t.precision, t.optimizer
    (4096, 'bf16-amp', 'adamw')
    """
    return memcalc.TrainingConfig(micro_batch=1, seq_len=seq_len, precision="bf16-amp", optimizer="adamw")


def plan_cell(model: str, count: int, seq_len: int) -> Cell:
    """The TOP fastest layouts of one cell on the device basis, timed.

    >>> c = plan_cell("gpt2", 8, 1024); len(c.layouts), c.layouts[0].data_parallel * c.layouts[0].tensor_parallel
    (2, 8)
    """
    start = time.perf_counter()
    layouts = plan_cluster(memcalc.ModelSpec.preset(model), training(seq_len), f"{count}x{GPU}",
                           global_batch=GLOBAL_BATCH, basis="device", top=TOP)
    return Cell(model, count, seq_len, layouts, time.perf_counter() - start)


def gib(nbytes: int) -> str:
    """Bytes as GiB, two decimals.

    >>> gib(3 * 2**30 + 2**29)
    '3.50'
    """
    return f"{nbytes / GIB:.2f}"


def secs(value: float) -> str:
    """Seconds, two decimals.

    >>> secs(401.8449)
    '401.84'
    """
    return f"{value:.2f}"


def rows(cell: Cell) -> list[list[str]]:
    """The cell's rows (one a layout, 'no layout fits' when none does), in COLUMNS order.

    >>> rows(Cell("m", 8, 4096, [], 0.0))[0][3:6]
    ['-', 'no layout fits', '']
    """
    head = [cell.model, str(cell.count), str(cell.seq_len)]
    if not cell.layouts:
        return [head + ["-", "no layout fits"] + [""] * (len(COLUMNS) - 5)]
    return [head + [str(i), str(x.data_parallel), str(x.tensor_parallel), x.sharding, x.checkpointing,
                    str(x.micro_batch), str(x.grad_accum), gib(x.peak_bytes), gib(x.headroom_bytes),
                    secs(x.step.total_s), secs(x.step.compute_s), secs(x.step.bubble_s),
                    secs(x.step.tp_comm_s), secs(x.step.dp_comm_s)]
            for i, x in enumerate(cell.layouts, 1)]


def qlora_row(card: str, seq_len: int, checkpointing: str) -> list[str]:
    """One card, QLoRA (nf4 base, LoRA r 8 on q/v, bf16-amp, micro_batch 1) of the 70B model on the
    device basis; fits 'yes'/'no', or the refusal's field when memcalc does not answer.

    >>> row = qlora_row("RTX-4090", 128, "per-layer")  # 70.6B parameters at 4 bits: about 33 GiB alone
    >>> row[4], float(row[5]) > 70.6e9 / 2 / 2**30 > float(row[6])
    ('no', True)
    """
    from memcalc.queries.basis import peak_on

    t = memcalc.TrainingConfig(micro_batch=1, seq_len=seq_len, precision="bf16-amp", quantization="nf4",
                               lora=memcalc.LoRA(), checkpointing=checkpointing)
    head = [QLORA_MODEL, card, str(seq_len), checkpointing]
    try:
        ok, peak, budget = peak_on(memcalc.ModelSpec.preset(QLORA_MODEL), t, card, "device")
    except MemcalcError as err:
        return head + [f"refused ({err.field})", "", ""]
    return head + ["yes" if ok else "no", gib(peak), gib(budget)]


def markdown(header: list[str], lines: list[list[str]]) -> str:
    """A markdown table.

    >>> print(markdown(["a", "b"], [["1", "2"]]))
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])


def csv_text(header: list[str], lines: list[list[str]]) -> str:
    """CSV with a header line.

    >>> csv_text(["a"], [["1"]]).splitlines()
    ['a', '1']
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([header] + lines)
    return buf.getvalue()


HEADER = f"""# Cluster layouts: the fastest layout and the runner-up on {GPU}

Generated by `python scripts/cluster_tables.py` (`--check` exits 1 when stale) from
`memcalc.plan_cluster(..., basis="device", top={TOP})` (docs/cluster-planner.md). Every figure is a
CUDA prediction, not a measurement. The step: global batch {GLOBAL_BATCH} sequences per optimizer
step (4M tokens at s 4096, 8M at s 8192), bf16-amp, AdamW, micro-batch and accumulation searched;
peak and headroom on the device basis (reserved memory plus the CUDA context within 80 GB);
step seconds = compute + bubble + TP comm + DP comm at MFU 0.4, no overlap (an upper estimate
that ranks layouts). Pipeline parallelism is not searched (pp = 1). No cell took over 60 s, so
every model keeps its 512-GPU rows.

Mixtral-8x7B: no layout fits anywhere. memcalc has no tensor-parallel plan for it (tp 1 only);
DDP and ZeRO-1 hold the fp32 weights and gradients of 46.7B parameters whole (far over 80 GB),
and FSDP2 zero2/zero3 on 8 ranks still holds 1/8 of the 16 bytes a parameter (about 87 GiB).
Beyond 8 ranks FSDP2 cannot shard further: it shards each parameter on dim 0 in ceil(rows / W)
rows (torch.chunk, padded; memcalc/parallel/fsdp.py) and transformers' fused expert weights have
num_local_experts = 8 rows, so every rank keeps a padded shard of one whole expert per layer and
the all-gather buffer grows with W (estimate, zero3, per-layer, s 4096: 218 GiB a rank on 64,
1100 GiB on 512). Training it needs expert parallelism or a dim-1 shard_placement_fn, neither of
which memcalc models.
"""

QLORA_HEADER = """## Llama-3-70B QLoRA on consumer cards

One card only: QLoRA across ranks (FSDP-QLoRA, bitsandbytes Params4bit storage sharded by
fully_shard) is refused by memcalc (memcalc/refusals/finetune.py, check_finetuning_ranks): it is
not measured, as bitsandbytes' Linear4bit on CPU quantises at .to(device) and FSDP2's DTensor
shards of the packed storage are not validated on gloo ranks. So the 2-8 card rows of issue 26
are not given. The step: nf4 base weights, LoRA r 8 on q_proj/v_proj, bf16-amp, AdamW,
micro_batch 1, device basis ('no' means it does not fit the card).
"""


def render(cells: list[Cell], qlora: list[list[str]]) -> tuple[str, str]:
    """(markdown, csv) of the cells and the QLoRA rows."""
    lines = [line for cell in cells for line in rows(cell)]
    md = "\n".join([HEADER, markdown(COLUMNS, lines), "", QLORA_HEADER, markdown(QLORA_COLUMNS, qlora), ""])
    return md, csv_text(COLUMNS, lines)


def build() -> tuple[str, str]:
    """Plan every cell (timed on stderr) and render both files."""
    cells = []
    for model in MODELS:
        for count in COUNTS:
            for seq_len in SEQ_LENS:
                cells.append(plan_cell(model, count, seq_len))
                print(f"{model} {count}x{GPU} s {seq_len}: {cells[-1].seconds:.1f} s", file=sys.stderr)
    start = time.perf_counter()
    qlora = [qlora_row(card, s, "per-layer") for card in QLORA_CARDS for s in QLORA_SEQ]
    print(f"qlora rows: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(f"total: {sum(c.seconds for c in cells) + time.perf_counter() - start:.1f} s", file=sys.stderr)
    return render(cells, qlora)


def main(argv: list[str] | None = None) -> int:
    """Write the tables, or with --check exit 1 when they differ from a fresh build."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed tables are stale")
    args = parser.parse_args(argv)
    md, table = build()
    if args.check:
        stale = [p.name for p, text in ((MD, md), (CSV, table)) if not p.exists() or p.read_text() != text]
        print(f"stale: {', '.join(stale)}" if stale else "tables are current", file=sys.stderr)
        return 1 if stale else 0
    MD.write_text(md)
    CSV.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
