"""Result records: spread over seeds, grouping, JSON with config and seeds, plots that exist."""
from __future__ import annotations

import json
import socket
import threading

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


def test_flows_client_server_loopback(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ready = tmp_path / "ready"
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("srv", flows.run_server(("127.0.0.1", port), duration=3,
                                                                                ready_file=str(ready))))
    t.start()
    while not ready.exists():
        pass
    sched = [{"start_s": 0.0, "size": 1000}, {"start_s": 0.05, "size": 200_000}, {"start_s": 0.1, "size": 1}]
    out = flows.run_client(("127.0.0.1", port), sched, timeout=5)
    t.join()
    assert [f["error"] for f in out["flows"]] == [None, None, None]
    assert all(f["fct_s"] is not None and f["fct_s"] > 0 for f in out["flows"])
    assert box["srv"]["served"] == 3
