"""Reports punted as packet-in are accepted only from the port their sender lives behind (the packet-in's
ingress_port against the switch's route to the report's source address)."""
from __future__ import annotations

from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
from netapprox.controller.core import ControllerCore
from netapprox.controller.model import Route
from netapprox.hostlib.wire import Report

from test_ctl_reports import frame

MACS = ("02:00:00:00:01:00", "02:00:00:00:00:01")


def core() -> ControllerCore:
    routes = (Route("10.0.1.0", 24, 1, *MACS), Route("10.0.1.128", 25, 2, *MACS), Route("10.0.0.0", 8, 3, *MACS))
    return ControllerCore(ControllerConfig(switches=(SwitchConfig("s1", routes=routes), SwitchConfig("s2")),
                                           reports=ReportConfig(port=-1)))


def report(job: int) -> bytes:
    return Report(job_id=job, group_id=0, seq=1, tlr=0.5, loss=0.0, msr=0.9, rate_kbps=1000, total=10, delivered=0,
                  lost=0, epoch=1).encode()


def test_a_report_is_accepted_only_from_its_senders_port():
    c = core()
    assert c.sender_port("s1", "10.0.1.7") == 1
    assert c.sender_port("s1", "10.0.1.200") == 2  # the longest prefix
    assert c.sender_port("s1", "10.9.9.9") == 3
    assert c.sender_port("s1", "192.168.0.1") is None
    assert c.ingest_frame(frame(report(1), src="10.0.1.7"), 0.0, switch="s1", ingress_port=1) is not None
    assert c.ingest_frame(frame(report(2), src="10.0.1.7"), 0.0, switch="s1", ingress_port=2) is None
    assert c.ingest_frame(frame(report(3), src="10.0.1.200"), 0.0, switch="s1", ingress_port=2) is not None
    assert c.ingest_frame(frame(report(4), src="192.168.0.1"), 0.0, switch="s1", ingress_port=1) is None
    assert c.ingest_frame(frame(report(5), src="10.0.1.7"), 0.0, switch="s2", ingress_port=1) is None  # no routes
    assert c.ingest_stats.dropped["wrong_port"] == 3
    # without the packet-in's port (a data plane that does not say) the report is not checked
    assert c.ingest_frame(frame(report(6), src="10.9.9.9"), 0.0) is not None
    assert c.ingest_stats.accepted == 3
