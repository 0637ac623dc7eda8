"""Observation: the Grafana dashboard and the Prometheus metrics the runtime exports agree."""
from __future__ import annotations

import json
import re
from pathlib import Path

from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
from netapprox.controller.runtime import Runtime

from test_runtime import Clock, ScriptedDriver, report

REPO = Path(__file__).resolve().parents[2]


def exported_families() -> set[str]:
    clock, driver = Clock(), ScriptedDriver()
    driver.clock = clock
    config = ControllerConfig(switches=(SwitchConfig("s1"),), reports=ReportConfig(port=-1), counters_every=1)
    with Runtime(config, drivers={"s1": driver}, clock=clock, connect_clock=clock, background_connect=False) as rt:
        assert rt.connect(1)
        rt.ingest(report(5, 1, 0.3), "10.0.0.1")
        rt.epoch()
        text = rt.metrics_text()
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert 'netapprox_job_queue{atp_job="5"}' in text and "job=" not in text.replace("atp_job=", "")
    return names


def test_every_dashboard_query_names_a_metric_the_controller_exports():
    families = exported_families()
    histogram_series = {f"{h}{s}" for h in families for s in ("_bucket", "_sum", "_count")}
    dashboard = json.loads((REPO / "tools" / "grafana" / "netapprox.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = re.findall(r"\bnetapprox_[a-z0-9_]+", target["expr"])
            assert names, (panel["title"], target["expr"])
            for name in names:
                assert name in families or name in histogram_series, f"{panel['title']}: {name} is not exported"
            queried.update(names)
    for wanted in ("netapprox_job_tlr", "netapprox_job_rate_bps", "netapprox_job_loss", "netapprox_job_queue",
                   "netapprox_queue_depth_packets", "netapprox_queue_dropped_packets_total",
                   "netapprox_epoch_duration_seconds_bucket", "netapprox_write_errors_total"):
        assert wanted in queried, f"the dashboard has no panel on {wanted}"


def test_counters_end_in_total():
    families = exported_families()
    text_types = {n for n in families if n.endswith("_total")}
    assert {"netapprox_epochs_total", "netapprox_reports_dropped_total", "netapprox_table_updates_total"} <= text_types


def test_the_scrape_config_points_at_the_metrics_path():
    text = (REPO / "tools" / "prometheus" / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in text and "job_name: netapprox-controller" in text
