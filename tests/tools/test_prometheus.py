"""The Grafana dashboard's queries against a real Prometheus server scraping a running controller.

``test_observe.py`` checks that every metric name the dashboard mentions is exported; this test checks what a
user sees: Debian's ``prometheus`` scrapes ``netapprox-controller`` (a separate process, started from a TOML file
as a user starts it) through the shipped ``tools/prometheus/prometheus.yml``, and every PromQL expression of
``tools/grafana/netapprox.json`` returns data. A renamed metric, a label the query filters on that no series
has, or a function applied to the wrong type makes an expression return nothing, and the test names it.

The controller drives two switches, so every panel has something to show: a real kernel switch in network
namespaces carrying approximate traffic that overflows its small queues (queue depth, drops, transmitted
bytes), and a P4Runtime switch served by the in-process fake (the P4 targets' malformed-packet counter, which
the kernel switch does not have). Hosts' REPORTs are real REPORT datagrams on the controller's report port.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.hostlib import wire
from netapprox.topo.netns import NetnsLab, socket_in_netns, stop_process
from netapprox.controller.p4runtime.fake_server import SHIPPED_P4INFO, FakeP4RuntimeServer
from support.skips import requires_root

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    requires_root, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180),
    pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus server on PATH (apt-get install "
                       "prometheus; tools/setup-system.sh installs it)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, deadline: float, proc: subprocess.Popen) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer")
        time.sleep(0.2)


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((REPO / "tools" / "grafana" / "netapprox.json").read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]


def query(base: str, expr: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def controller_toml(path: Path, *, lab: NetnsLab, fake: FakeP4RuntimeServer, bmv2_json: Path, report_port: int,
                    metrics_port: int) -> None:
    ports = ", ".join(f'"{p}"' for p in lab.ports)
    path.write_text(f"""
[controller]
epoch_ms = 20
counters_every = 5
metrics_bind = "127.0.0.1"
metrics_port = {metrics_port}

[reports]
bind = "127.0.0.1"
port = {report_port}

[policy]
job_timeout_s = 5.0

[[switch]]
name = "kern"
kind = "kernel"

[switch.options]
netns = "{lab.switch_ns}"
ports = [{ports}]
rate_mbit = 5

[[switch]]
name = "p4"
kind = "p4runtime"

[switch.options]
address = "{fake.address}"
device_id = {fake.device_id}
target = "bmv2"
p4info = "{SHIPPED_P4INFO}"
bmv2_json = "{bmv2_json}"
check_bmv2_version = false
ports = [1, 2]
""")


def prometheus_config(path: Path, metrics_port: int) -> None:
    """The shipped scrape configuration, pointed at this controller and scraping every 0.5 s."""
    config = yaml.safe_load((REPO / "tools" / "prometheus" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "500ms"
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "netapprox-controller"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    path.write_text(yaml.safe_dump(config))


def fill_p4_counters(fake: FakeP4RuntimeServer) -> None:
    """What a P4 switch's counters hold after some traffic, one malformed packet among it."""
    schema = P4Info.load(SHIPPED_P4INFO)
    enq = schema.counter_id("NetApproxIngress.enqueued_packets")
    txd = schema.counter_id("NetApproxEgress.transmitted_packets")
    bad = schema.counter_id("NetApproxIngress.malformed_packets")
    with fake.lock:
        for port in (1, 2):
            fake.counters[(enq, port * 8)] = (100 * port, 150_000 * port)
            fake.counters[(txd, port * 8)] = (100 * port, 150_000 * port)
        fake.counters[(bad, 1)] = (1, 64)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path):
    bmv2_json = tmp_path / "bmv2.json"
    bmv2_json.write_bytes(b'{"program": "netapprox-test"}')
    report_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with NetnsLab(hosts=2) as lab, FakeP4RuntimeServer() as fake:
        toml = tmp_path / "controller.toml"
        controller_toml(toml, lab=lab, fake=fake, bmv2_json=bmv2_json, report_port=report_port,
                        metrics_port=metrics_port)
        prom_yml = tmp_path / "prometheus.yml"
        prometheus_config(prom_yml, metrics_port)
        try:
            ctl = subprocess.Popen([sys.executable, "-m", "netapprox.controller", "--config", str(toml)],
                                   stdout=subprocess.DEVNULL, stderr=open(tmp_path / "controller.log", "w"),
                                   start_new_session=True)
            procs.append(ctl)
            deadline = time.monotonic() + 30
            wait_http(f"http://127.0.0.1:{metrics_port}/metrics", deadline, ctl)
            while fake.pipeline is None:  # a pipeline push clears a switch's counters: count after it
                assert time.monotonic() < deadline and ctl.poll() is None, "the controller pushed no pipeline"
                time.sleep(0.1)
            fill_p4_counters(fake)
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={prom_yml}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),
                                    start_new_session=True)
            procs.append(prom)
            base = f"http://127.0.0.1:{prom_port}"
            wait_http(f"{base}/-/ready", deadline, prom)

            reports = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            blast = socket_in_netns(lab.host_ns[0])
            datagram = wire.encode_data(flags=wire.Flags.APPROX, priority=0, job_id=9, msg_id=0, group_id=0,
                                        tlr=wire.tlr_to_q15(0.5), pkt_idx=0, pkt_cnt=1, seq=0,
                                        deadline_us=wire.NO_DEADLINE, weight=1, payload=bytes(1200))
            queries = dashboard_queries()
            empty = [title for title, _ in queries]
            seq = 0
            try:
                # Keep two jobs reporting and the kernel switch's queue 4 overflowing (TLR 0.5 -> queue 4,
                # 4 packets of buffer at 5 Mbit/s) until every query has data, or 60 s have passed.
                stop_at = time.monotonic() + 60
                while empty and time.monotonic() < stop_at:
                    seq += 1
                    for job, tlr in ((101, 0.3), (102, 0.6)):
                        r = wire.Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=tlr / 2, msr=1 - tlr,
                                        rate_kbps=5000, total=1000, delivered=10 * seq, lost=seq, epoch=seq)
                        reports.sendto(r.encode(), ("127.0.0.1", report_port))
                    reports.sendto(b"not a report", ("127.0.0.1", report_port))  # counted as dropped
                    for _ in range(40):
                        blast.sendto(datagram, (lab.host_ips[1], wire.DEFAULT_ATP_PORT))
                    time.sleep(0.1)
                    if seq % 10 == 0:
                        empty = [title for title, expr in queries if not query(base, expr)]
            finally:
                reports.close()
                blast.close()
            assert ctl.poll() is None, (tmp_path / "controller.log").read_text()[-2000:]
            assert not empty, f"dashboard panels whose query returned no data: {empty}"
            # And the data is what the controller saw, not just present: the reported TLRs, a tail drop.
            tlrs = {r["metric"]["atp_job"]: float(r["value"][1]) for r in query(base, "netapprox_job_tlr")}
            assert tlrs["101"] == pytest.approx(0.3, abs=1e-3) and tlrs["102"] == pytest.approx(0.6, abs=1e-3)
            drops = query(base, 'netapprox_queue_dropped_packets_total{switch="kern"}')
            assert sum(float(r["value"][1]) for r in drops) > 0
        finally:
            for p in reversed(procs):
                stop_process(p)
