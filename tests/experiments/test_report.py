"""docs/results.md is rendered from result files: tables with spread, plots copied, bench included."""
from __future__ import annotations

import json

from netapprox.experiments import report
from netapprox.experiments import results as R


def test_render_tables_plots_and_bench(tmp_path):
    res = tmp_path / "results"
    rf = R.ResultFile("ablation", {"x": 1}, [1, 2], res / "ablation", command=["python", "-m", "netapprox.experiments", "ablation"])
    for seed, jct in ((1, 1.0), (2, 3.0)):
        rf.add(seed, {"msr": 0.5, "protocol": "atp-full"}, {"jct_mean_s": jct, "msr_met_frac": 1.0, "pkt_loss": None})
    rf.write()
    R.plot_bars(R.summarize(rf.runs), metric="jct_mean_s", group="msr", series="protocol",
                path=res / "ablation" / "jct.png", title="t", ylabel="s")
    (res / "ablation" / "huge.png").write_bytes(b"\x89PNG" + b"\0" * (report.MAX_PNG_BYTES + 1))
    (res / "bench.md").write_text("# make bench (now)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (res / "bench.json").write_text(json.dumps({"command": ["python", "-m", "netapprox.bench"], "git_commit": "abcdef123456"}))
    doc = tmp_path / "docs" / "results.md"
    text = report.render(res, doc, tmp_path / "docs" / "img")
    assert doc.read_text() == text
    assert "| msr | protocol | jct_mean_s | msr_met_frac |" in text  # pkt_loss has no data: no column
    assert "| 0.500 | atp-full | 2.000 [1.000, 3.000] | 1.000 (n=2) |" in text
    assert "`python -m netapprox.experiments ablation`" in text and "| 1 | 2 |" in text and "abcdef1234" in text
    assert (tmp_path / "docs" / "img" / "ablation_jct.png").exists()
    assert not (tmp_path / "docs" / "img" / "ablation_huge.png").exists()
    assert "(img/ablation_jct.png)" in text


def test_fmt_and_cell():
    assert report.fmt(None) == "–" and report.fmt(True) == "yes" and report.fmt(0.00012) == "1.20e-04"
    assert report.cell({"n": 0}) == "–"
    assert report.cell({"n": 3, "mean": 2.0, "min": 1.0, "max": 4.0}) == "2.000 [1.000, 4.000]"


def test_cli_overrides_follow_the_experiment_signature():
    import pytest
    from netapprox.experiments.cli import UsageError, parse_overrides
    from netapprox.experiments.figures import exp_alltoall, exp_ddnn
    assert parse_overrides(["msrs=0.5,0.9", "protocols=atp"], exp_alltoall) == {"msrs": (0.5, 0.9), "protocols": ("atp",)}
    assert parse_overrides(["duration_s=5", "model_bytes=1000"], exp_ddnn) == {"duration_s": 5, "model_bytes": 1000}
    with pytest.raises(UsageError, match="known"):
        parse_overrides(["nope=1"], exp_ddnn)
    with pytest.raises(UsageError, match="--set workers: expected an integer"):
        parse_overrides(["workers=3.5"], exp_ddnn)
