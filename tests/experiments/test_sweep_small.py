"""A small sweep: fewer trials than workers run in this process (no Dask cluster is started for them), and
``run_figures`` says how many trials a figure ran (not its result rows, which include per-seed ratio rows), its
headline ratio and the paths of its plots."""
from __future__ import annotations

import os

import pytest

from netapprox.experiments import results as R
from netapprox.experiments.cli import headline_ratios, run_figures
from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.plans import JobPlan, TrialPlan
from netapprox.experiments.sweep import Sweep
from support.sweep_backend import FakeBackend, started


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(R, "PROGRESS", lines.append)
    return lines


def plans(seeds=(1,)) -> list[TrialPlan]:
    jobs = tuple(JobPlan(1 + h, h, (h + 1) % 4, JobWorkload("fixed", 1, (1000,) * 5, (0.0,) * 5), 0.5)
                 for h in range(4))
    return [TrialPlan({"protocol": p}, s, p, jobs) for s in seeds for p in ("atp", "tcp-es")]


def test_fewer_trials_than_workers_run_here_without_a_cluster(tmp_path, quiet):
    runs = tmp_path / "runs"
    with Sweep(FakeBackend(runs), workers=4) as sweep:
        sweep.run(R.ResultFile("small", {}, [1], tmp_path / "small"), plans())
        assert sweep._cluster is None and sweep.trials == 2
    pids = {int(p.name.split("@")[1]) for p in runs.glob("start-*")}
    assert started(runs) == ["s1-atp", "s1-tcp-es"] and pids == {os.getpid()}
    assert any("2 trials in this process (fewer than 4 workers: no Dask cluster started)" in line for line in quiet)


def test_run_figures_counts_trials_and_names_the_headline_ratio_and_plots(tmp_path):
    def figure(seeds, out, sweep, quick=False):
        rf = R.ResultFile("fig", {}, seeds, out / "fig")
        sweep.run(rf, plans(seeds))
        for seed in seeds:  # a derived row per seed, as the figures add their ATP/baseline ratios
            atp, tcp = (r["metrics"]["jct_mean_s"] for r in rf.runs if r["seed"] == seed)
            rf.add(seed, {"protocol": "atp/tcp-es"}, {"jct_ratio": atp / tcp}, progress=False)
        (rf.out_dir / "jct.png").write_bytes(b"png")
        return rf

    said: list[str] = []
    run_figures(["fig"], {"fig": figure}, Sweep(FakeBackend(tmp_path / "runs")), seeds=[1, 2], out=tmp_path,
                quick=False, overrides={"fig": {}}, say=said.append)
    assert said[0].startswith("fig: 4 trials in ")  # 6 result rows: 4 trials and 2 ratio rows
    assert said[1] == "  fig headline: jct_ratio mean [min, max] over seeds: atp/tcp-es 0.25 [0.25, 0.25]"
    assert said[2] == f"  fig plots: {tmp_path / 'fig' / 'jct.png'}"


def test_headline_ratios_without_ratio_rows_is_none():
    assert headline_ratios([{"metric": "jct_mean_s", "params": {"protocol": "atp"}, "n": 2, "mean": 1.0,
                             "min": 1.0, "max": 1.0}]) is None
