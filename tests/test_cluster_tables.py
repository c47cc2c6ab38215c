"""tables/cluster_layouts.csv (scripts/cluster_tables.py) against memcalc.plan_cluster called
directly on a few cells (slow: each 70B cell simulates dozens of layouts; the whole table is
`python scripts/cluster_tables.py --check`)."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

import memcalc
from memcalc.queries.cluster import plan_cluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import cluster_tables  # noqa: E402

pytestmark = pytest.mark.slow


def committed(model: str, gpus: int, seq_len: int) -> list[dict]:
    with open(ROOT / "tables" / "cluster_layouts.csv") as f:
        return [r for r in csv.DictReader(f)
                if (r["model"], r["gpus"], r["seq_len"]) == (model, str(gpus), str(seq_len))]


@pytest.mark.parametrize("model,gpus,seq_len", [("llama-3-8b", 8, 4096), ("llama-3-70b", 64, 8192),
                                                ("mixtral-8x7b", 8, 4096)])
def test_cells_match_plan_cluster(model, gpus, seq_len):
    """Each committed row is plan_cluster's layout of that rank (device basis, top 2)."""
    t = memcalc.TrainingConfig(micro_batch=1, seq_len=seq_len, precision="bf16-amp", optimizer="adamw")
    plans = plan_cluster(memcalc.ModelSpec.preset(model), t, f"{gpus}xH100-80GB",
                         global_batch=cluster_tables.GLOBAL_BATCH, top=2)
    rows = committed(model, gpus, seq_len)
    if not plans:
        assert [r["dp"] for r in rows] == ["no layout fits"]
        return
    assert len(rows) == len(plans)
    for row, x in zip(rows, plans):
        assert (int(row["dp"]), int(row["tp"]), row["sharding"], row["checkpointing"], int(row["micro_batch"]),
                int(row["grad_accum"])) == (x.data_parallel, x.tensor_parallel, x.sharding, x.checkpointing,
                                            x.micro_batch, x.grad_accum)
        assert x.data_parallel * x.tensor_parallel == gpus
        assert x.micro_batch * x.grad_accum * x.data_parallel == cluster_tables.GLOBAL_BATCH
        assert float(row["peak_gib"]) == pytest.approx(x.peak_bytes / 2**30, abs=0.005)
        assert float(row["peak_gib"]) + float(row["headroom_gib"]) == pytest.approx(x.budget_bytes / 2**30, abs=0.01)
        assert float(row["step_s"]) == pytest.approx(x.step.total_s, abs=0.005)
        terms = sum(float(row[k]) for k in ("compute_s", "bubble_s", "tp_comm_s", "dp_comm_s"))
        assert terms == pytest.approx(float(row["step_s"]), abs=0.02)
