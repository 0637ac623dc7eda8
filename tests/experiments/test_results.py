"""Result records: spread over seeds, grouping, JSON with config and seeds, plots that exist."""
from __future__ import annotations

import dataclasses
import json
import socket
import threading
from pathlib import Path

import pytest

from netapprox.experiments import flows
from netapprox.experiments import results as r


def test_spread_of_values_and_missing():
    s = r.spread([3.0, 1.0, None, 2.0])
    assert s == {"n": 3, "n_missing": 1, "mean": 2.0, "median": 2.0, "min": 1.0, "max": 3.0,
                 "std": pytest.approx((2 / 3) ** 0.5)}
    assert r.spread([])["n"] == 0 and r.spread([None])["mean"] is None
    assert r.spread(iter([1.0, 5.0]))["median"] == 3.0


def test_percentile_interpolates():
    assert r.percentile([1, 2, 3, 4], 50) == 2.5
    assert r.percentile([10], 99) == 10
    assert r.percentile([], 50) is None
    assert r.percentile(list(range(101)), 99) == pytest.approx(99)


def test_summarize_groups_by_params_across_seeds():
    runs = [{"seed": s, "params": {"msr": 0.5, "protocol": p}, "metrics": {"jct": s * k}}
            for s in (1, 2, 3) for p, k in (("atp", 1.0), ("tcp-es", 2.0))]
    summ = r.summarize(runs)
    atp = r.lookup(summ, "jct", protocol="atp")
    es = r.lookup(summ, "jct", protocol="tcp-es")
    assert atp["n"] == 3 and atp["mean"] == 2.0 and atp["min"] == 1.0 and atp["max"] == 3.0
    assert es["mean"] == 4.0
    assert r.lookup(summ, "jct", protocol="udp") is None


def test_result_file_records_config_seeds_and_environment(tmp_path):
    rf = r.ResultFile("demo", {"link_mbps": 20}, seeds=[1, 2, 3], out_dir=tmp_path / "demo", command=["x"])
    rf.add(1, {"msr": 0.5}, {"jct": 1.5}, raw={"anything": [1, 2]})
    path = rf.write()
    d = json.loads(path.read_text())
    assert d["experiment"] == "demo" and d["config"] == {"link_mbps": 20} and d["seeds"] == [1, 2, 3]
    assert d["environment"]["tcp_cc"] in ("cubic", "dctcp", "reno", "bbr", "unknown")
    assert d["runs"][0]["raw"] == {"anything": [1, 2]}
    assert d["summary"][0]["mean"] == 1.5


def test_plots_write_png(tmp_path):
    runs = [{"seed": s, "params": {"msr": m, "protocol": p}, "metrics": {"jct": m * s + (p == "b")}}
            for s in (1, 2) for m in (0.5, 0.9) for p in ("a", "b")]
    summ = r.summarize(runs)
    a = r.plot_lines(summ, metric="jct", x="msr", series="protocol", path=tmp_path / "l.png", title="t",
                     xlabel="MSR", ylabel="JCT")
    b = r.plot_bars(summ, metric="jct", group="msr", series="protocol", path=tmp_path / "b.png", title="t",
                    ylabel="JCT")
    c = r.plot_timeline([{"time": 0.0, "tlr": 0.5}, {"time": 1.0, "tlr": 0.4}], fields=["tlr"],
                        path=tmp_path / "t.png", title="t", events=[(0.5, "shift")])
    for p in (a, b, c):
        assert p is not None and p.read_bytes()[:4] == b"\x89PNG"
    assert r.plot_lines(summ, metric="nope", x="msr", series="protocol", path=tmp_path / "n.png", title="",
                        xlabel="", ylabel="") is None


def _flow_server(tmp_path, duration: float) -> tuple[int, threading.Thread, dict]:
    """A flow server on a free loopback port in a thread, ready: (port, thread, box whose "srv" is its summary)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ready = tmp_path / "ready"
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("srv", flows.run_server(("127.0.0.1", port), duration=duration,
                                                                                ready_file=str(ready))))
    t.start()
    while not ready.exists():
        pass
    return port, t, box


def test_flows_client_server_loopback(tmp_path):
    port, t, box = _flow_server(tmp_path, 3)
    sched = [{"start_s": 0.0, "size": 1000}, {"start_s": 0.05, "size": 200_000}, {"start_s": 0.1, "size": 1}]
    out = flows.run_client(("127.0.0.1", port), sched, timeout=5)
    t.join()
    assert [f["error"] for f in out["flows"]] == [None, None, None]
    assert all(f["fct_s"] is not None and f["fct_s"] > 0 for f in out["flows"])
    assert box["srv"]["served"] == 3


def test_flows_client_starts_no_flow_once_the_stop_file_exists(tmp_path):
    """``--stop-file`` (``TrialPlan.stop_with_jobs``): flows scheduled after the trial's jobs are done never
    start and are left out; the flow in flight when the file appears still finishes."""
    stop = tmp_path / "jobs-done"
    port, t, box = _flow_server(tmp_path, 1.5)
    timer = threading.Timer(0.3, stop.touch)
    timer.start()
    sched = [{"start_s": 0.0, "size": 1000}, {"start_s": 0.05, "size": 1}, {"start_s": 30.0, "size": 1},
             {"start_s": 31.0, "size": 1}]
    out = flows.run_client(("127.0.0.1", port), sched, timeout=5, stop_file=str(stop))
    timer.join()
    t.join()
    assert [f["id"] for f in out["flows"]] == [0, 1] and out["not_started"] == 2
    assert all(f["fct_s"] is not None and f["error"] is None for f in out["flows"])
    assert box["srv"]["served"] == 2


def test_a_trials_cache_identity_names_stop_with_jobs_only_when_it_is_not_the_default():
    from netapprox.experiments.plans import TrialPlan
    plan = TrialPlan({"msr": 0.5}, 1, "atp", ())
    assert "stop_with_jobs" not in plan.to_dict()  # trials cached before the field keep their identity
    assert dataclasses.replace(plan, stop_with_jobs=True).to_dict()["stop_with_jobs"] is True

# --- plots: every axis says what it shows and in which unit, every legend what its entries are -------------

FIGURES = Path(__file__).resolve().parents[2] / "experiments" / "figures.py"


def _plot_calls():
    """(function, {keyword: string constants}) of every R.plot_* call in experiments/figures.py."""
    import ast

    calls = []
    for node in ast.walk(ast.parse(FIGURES.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("plot_"):
            kw = {}
            for k in node.keywords:
                if k.arg in ("metric", "x", "group", "series", "fields"):
                    kw[k.arg] = [c.value for c in ast.walk(k.value) if isinstance(c, ast.Constant)
                                 and isinstance(c.value, str)]
            calls.append((node.func.attr, kw))
    return calls


def test_every_name_the_experiments_plot_has_words_and_a_unit():
    calls = _plot_calls()
    assert len(calls) >= 10
    for fn, kw in calls:
        for key in ("metric", "x", "group", "fields"):
            for name in kw.get(key, []):
                assert name in r.AXES, f"{fn}: {key} {name!r} has no entry in experiments.results.AXES"
        for name in kw.get("series", []):
            assert name in r.LEGEND_TITLES, f"{fn}: series {name!r} has no legend title in LEGEND_TITLES"


@pytest.fixture
def figures(monkeypatch):
    """Every matplotlib figure saved while the test runs."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _assert_labelled(fig):
    axes = [ax for ax in fig.axes if ax.has_data()]
    assert axes
    for ax in axes:
        label = ax.get_ylabel()
        assert "(" in label and ")" in label, f"y axis {label!r} names no unit"
        legend = ax.get_legend()
        if legend is not None and len(legend.get_texts()) > 1 and ax.containers:
            assert legend.get_title().get_text(), "a legend of several series without a title"
    bottom = axes[-1].get_xlabel()
    assert "(" in bottom and ")" in bottom, f"x axis {bottom!r} names no unit"


def _summary(metric, x, series, xs=(0.5, 0.9), names=("atp", "tcp-es")):
    return [{"metric": metric, "n": 2, "mean": 1.0 + i, "min": 0.5, "max": 2.0 + i,
             "params": {x: xv, series: name}} for i, xv in enumerate(xs) for name in names]


def test_experiment_plots_label_axes_with_units_and_title_legends(tmp_path, figures):
    r.plot_lines(_summary("jct_mean_s", "msr", "protocol"), metric="jct_mean_s", x="msr", series="protocol",
                 path=tmp_path / "a.png", title="t", xlabel="MSR", ylabel="mean JCT (s)")
    r.plot_lines(_summary("fct_small_mean_change_pct", "flow_load", "ratio", names=(2.0, 4.0)),
                 metric="fct_small_mean_change_pct", x="flow_load", series="ratio", path=tmp_path / "b.png",
                 title="ddnn", xlabel="web-search load", ylabel="small-flow FCT change (%)")
    r.plot_bars(_summary("queue_mean_pkts", "msr", "protocol"), metric="queue_mean_pkts", group="msr",
                series="protocol", path=tmp_path / "c.png", title="t", ylabel="mean backlog")
    rows = [{"time": t / 10, "loss_avg10": 0.1, "tlr": 0.4, "rate_mbps": 12.0, "queue": 3} for t in range(20)]
    r.plot_timeline(rows, fields=["loss_avg10", "tlr", "rate_mbps", "queue"], path=tmp_path / "d.png",
                    title="timeline", events=[(0.5, "bg shift"), (1.0, "bg shift")])
    assert len(figures) == 4
    for fig in figures:
        _assert_labelled(fig)
    lines, ddnn, bars, timeline = figures
    assert lines.axes[0].get_xlabel() == "MSR (fraction of messages required)"
    assert ddnn.axes[0].get_legend().get_title().get_text() == "compute-to-network time ratio"
    assert bars.axes[0].get_legend().get_title().get_text().startswith("transport")
    assert [ax.get_ylabel().split("\n")[0] for ax in timeline.axes] == ["measured loss", "TLR", "sending rate",
                                                                       "queue"]


def test_demo_timeline_labels_every_axis(tmp_path, figures):
    from netapprox.topo.demo import Demo, DemoConfig

    demo = Demo(DemoConfig(results=str(tmp_path)))
    job = demo.cfg.jobs[0]
    rows = [{"t": t / 20, "sent": 10, "acked": 9, "tlr": 0.2, "rate_bps": 20e6, "queue": 2} for t in range(60)]
    demo.plot(job, rows, bg_start=0.5, end=3.0)
    (fig,) = figures
    assert len(fig.axes) == 4
    _assert_labelled(fig)
    for ax in fig.axes:
        assert ax.get_legend() is not None and all(t.get_text() for t in ax.get_legend().get_texts())


def test_a_result_file_prints_a_line_per_run_and_writes_csv_beside_the_json(tmp_path, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(r, "PROGRESS", lines.append)
    rf = r.ResultFile("demo", {"k": 1}, [1, 2], tmp_path / "demo", expected=2)
    rf.add(1, {"msr": 0.5, "protocol": "atp"}, {"jct_mean_s": 0.25})
    rf.add(2, {"msr": 0.5, "protocol": "atp"}, {"jct_mean_s": 0.5, "msr_met_frac": 1.0})
    rf.write()
    assert lines[0].startswith("[  1/2 ") and "left] demo msr=0.5 protocol=atp seed=1: JCT mean 250.00 ms" in lines[0]
    assert lines[1].startswith("[  2/2 ") and "MSR met 100%" in lines[1]
    import csv
    rows = list(csv.DictReader((tmp_path / "demo" / "result.csv").open()))
    assert [row["seed"] for row in rows] == ["1", "2"] and rows[0]["protocol"] == "atp"
    assert rows[1]["msr_met_frac"] == "1.0" and rows[0]["msr_met_frac"] == ""
    assert json.loads((tmp_path / "demo" / "result.json").read_text())["runs"][1]["metrics"]["jct_mean_s"] == 0.5


def test_progress_lines_give_durations_a_unit_that_fits():
    assert r.brief({"jct_mean_s": 1.5, "msr_met_frac": 1.0}) == "JCT mean 1.500 s, MSR met 100%"
    assert r.brief({"jct_mean_s": 0.0123}) == "JCT mean 12.30 ms"
    assert r.brief({"jct_mean_s": 145.2e-6, "rel_l2_error": 0.25}) == "JCT mean 145.2 µs, error 0.250"
