"""Tables are deterministic and --check notices a stale file."""
import pytest

from memcalc.queries import tables
from memcalc.cli import main


def test_render_is_deterministic_and_complete():
    first = tables.render(["gpt2"])
    assert first == tables.render(["gpt2"])
    rows = first["breakdown.csv"].splitlines()
    assert len(rows) == 1 + len(tables.REGIMES) * len(tables.CHECKPOINTING)
    assert "| gpt2 | fp32 Adam | none | 1024 |" in first["breakdown.md"]


def test_rows_over_processes_are_the_serial_rows_in_the_order_asked():
    presets = ["gpt2-medium", "gpt2"]  # not the catalogue's order, nor the tasks' (deepest first)
    b_rows, c_rows = tables.both_rows(presets)
    for jobs in (1, 2):
        files = tables.render(presets, jobs=jobs)
        assert files["breakdown.csv"] == tables.to_csv(tables.BREAKDOWN_HEADER, b_rows)
        assert files["max_micro_batch.csv"] == tables.to_csv(tables.capacity_header(), c_rows)


def test_jobs_out_of_range_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tables", "--check", "--jobs", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().startswith("memcalc: error: jobs:")


def test_check_detects_a_difference(tmp_path):
    tables.write(tmp_path, ["gpt2"], plots=False)
    assert tables.check(tmp_path, ["gpt2"]) == []
    (tmp_path / "breakdown.csv").write_text("stale\n")
    assert tables.check(tmp_path, ["gpt2"]) == ["breakdown.csv"]
    try:
        main(["tables", "--out", str(tmp_path), "--presets", "gpt2", "--check"])
    except SystemExit as exit_:
        assert exit_.code == 1
    else:
        raise AssertionError("--check must exit 1 on a stale table")


@pytest.mark.slow
def test_plots_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    from memcalc.queries.plots import write_plots

    names = write_plots(tmp_path)
    assert names == ["breakdown.png", "depth.png"]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
