"""Tables are deterministic and --check notices a stale file."""
import pytest

from memcalc.queries import tables
from memcalc.cli import main


def test_render_is_deterministic_and_complete():
    # allocated basis: quick; the device basis' rendering is held to the committed tables by
    # `memcalc tables --check` in .ci/run
    first = tables.render(["gpt2"], basis="allocated")
    assert first == tables.render(["gpt2"], basis="allocated")
    rows = first["breakdown.csv"].splitlines()
    assert len(rows) == 1 + len(tables.REGIMES) * len(tables.CHECKPOINTING)
    assert "| gpt2 | fp32 Adam | none | 1024 |" in first["breakdown.md"]


def test_rows_over_processes_are_the_serial_rows_in_the_order_asked():
    presets = ["gpt2-medium", "gpt2"]  # not the catalogue's order, nor the tasks' (deepest first)
    basis = "allocated"  # the order is the property here; the device basis' replays cost 100 s on 2 CPUs
    b_rows, c_rows = tables.both_rows(presets, basis=basis)
    for jobs in (1, 2):
        files = tables.render(presets, jobs=jobs, basis=basis)
        assert files["breakdown.csv"] == tables.to_csv(tables.BREAKDOWN_HEADER, b_rows)
        assert files["max_micro_batch.csv"] == tables.to_csv(tables.capacity_header(), c_rows)


def test_jobs_out_of_range_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tables", "--check", "--jobs", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().startswith("memcalc: error: jobs:")


def test_check_detects_a_difference(tmp_path):
    tables.write(tmp_path, ["gpt2"], plots=False, basis="allocated")
    assert tables.check(tmp_path, ["gpt2"], basis="allocated") == []
    (tmp_path / "breakdown.csv").write_text("stale\n")
    assert tables.check(tmp_path, ["gpt2"], basis="allocated") == ["breakdown.csv"]
    try:
        main(["tables", "--out", str(tmp_path), "--presets", "gpt2", "--check", "--basis", "allocated"])
    except SystemExit as exit_:
        assert exit_.code == 1
    else:
        raise AssertionError("--check must exit 1 on a stale table")


def test_check_of_some_presets_compares_only_their_rows(tmp_path):
    tables.write(tmp_path, ["gpt2", "pythia-160m"], plots=False, basis="allocated")
    assert tables.check(tmp_path, ["gpt2"], basis="allocated") == []  # pythia's rows are not compared
    csv = tmp_path / "max_micro_batch.csv"
    csv.write_text(csv.read_text().replace("\ngpt2,fp32 Adam,none,", "\ngpt2,fp32 Adam,none,9"))
    assert tables.check(tmp_path, ["gpt2"], basis="allocated") == ["max_micro_batch.csv"]
    assert tables.check(tmp_path, ["pythia-160m"], basis="allocated") == []
    assert tables.check(tmp_path, ["pythia-160m", "gpt2"], basis="allocated") == ["max_micro_batch.csv"]
    csv.write_text(csv.read_text().replace("\ngpt2,fp32 Adam,none,9", "\ngpt2,fp32 Adam,none,"))
    assert tables.check(tmp_path, ["pythia-160m", "gpt2"], basis="allocated") == []  # any order asked


@pytest.mark.slow
def test_plots_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    from memcalc.queries.plots import write_plots

    names = write_plots(tmp_path)
    assert names == ["breakdown.png", "depth.png"]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
