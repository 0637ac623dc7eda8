"""hostlib.reporting.ReportSink, the one way out for REPORTs: each adapter (the blocking API, asyncio, the
exchange) sends every REPORT to every target, signed with the report key it was given, and no other package
module encodes a REPORT."""
from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest

from netapprox.hostlib import aio, api, events, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec
from netapprox.hostlib.wire import MalformedPacket
from netapprox.hostlib.exchange import AtpExchange
from netapprox.hostlib.reporting import ReportSink, read_report_key

REPO = Path(__file__).resolve().parents[2]
KEY = b"a report key shared with the controller"
CONFIG = AtpConfig(max_rate_bps=20e6, epoch_s=0.01, idle_timeout_s=5.0, report_key=KEY)
JOB = dict(messages=300, size=1000, msr=0.9)  # ~0.12 s at 20 Mbit/s: a REPORT every 10 ms


def _report(seq: int = 1) -> wire.Report:
    return wire.Report(job_id=7, group_id=0, seq=seq, tlr=0.4, loss=0.01, msr=0.9, rate_kbps=1000, total=100,
                       delivered=10, lost=1, epoch=seq)


class Controllers:
    """Two UDP sockets on loopback standing for two controller replicas; ``reports(key)`` decodes what each got."""

    def __init__(self) -> None:
        self.socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for s in self.socks:
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
        self.addresses = [s.getsockname()[:2] for s in self.socks]
        self.raw: list[list[bytes]] = [[], []]

    def drain(self) -> None:
        for i, s in enumerate(self.socks):
            while True:
                try:
                    self.raw[i].append(s.recv(2048))
                except BlockingIOError:
                    break

    def reports(self, key: bytes | None) -> list[list[tuple[int, int]]]:
        self.drain()
        return [[(r.job_id, r.seq) for r in map(lambda d: wire.Report.decode(d, key), raw)] for raw in self.raw]

    def close(self) -> None:
        for s in self.socks:
            s.close()


@pytest.fixture
def controllers():
    c = Controllers()
    yield c
    c.close()


def _check_signed(controllers: Controllers, job_id: int) -> None:
    got = controllers.reports(KEY)
    assert got[0] and got[0] == got[1] and {j for j, _ in got[0]} == {job_id}
    with pytest.raises(MalformedPacket):  # signed with the key: another key, or none, does not verify
        wire.Report.decode(controllers.raw[0][0], b"another key")


def test_report_key_sink_signs_one_datagram_per_target():
    sink = ReportSink(["10.0.0.1", ("10.0.0.2", 7700)], KEY)
    out = sink.datagrams(events.ReportReady(_report()))
    assert [addr for _, addr in out] == [("10.0.0.1", wire.DEFAULT_REPORT_PORT), ("10.0.0.2", 7700)]
    assert out[0][0] == out[1][0] and wire.Report.decode(out[0][0], KEY).seq == 1 and sink.sent == 2
    assert sink.datagrams(events.Event()) == []  # not a REPORT: nothing
    assert ReportSink(None, KEY).datagrams(events.ReportReady(_report())) == [] and not ReportSink(None).enabled
    unsigned = ReportSink("10.0.0.1").datagrams(events.ReportReady(_report()))[0][0]
    assert len(unsigned) < len(out[0][0]) and wire.Report.decode(unsigned).seq == 1
    with pytest.raises(MalformedPacket):  # a controller with a key drops an unsigned report
        wire.Report.decode(unsigned, KEY)
    with pytest.raises(ConfigError, match="report key"):
        ReportSink("10.0.0.1", "text, not bytes")  # type: ignore[arg-type]


def test_report_key_file_is_read_as_the_controller_reads_it(tmp_path):
    path = tmp_path / "report.key"
    path.write_bytes(KEY + b"\n")
    assert read_report_key(path) == KEY
    path.write_bytes(b" \n")
    with pytest.raises(ConfigError, match="is empty"):
        read_report_key(path, "--report-key-file")
    with pytest.raises(ConfigError, match="--report-key-file .*No such file"):
        read_report_key(tmp_path / "missing", "--report-key-file")


@pytest.mark.usefixtures("cores")
def test_report_key_send_job_reports_signed_to_every_controller(controllers):
    with AtpExchange(config=CONFIG) as rx:  # bound before the job starts
        summary = api.send_job(rx.address, JobSpec.uniform(41, **JOB), config=CONFIG,
                               report_to=controllers.addresses, timeout=20)
        assert summary.msr_met() and rx.receive(41).result(30).job_id == 41
    _check_signed(controllers, 41)


def test_report_key_async_sender_reports_signed_to_every_controller(controllers):
    with AtpExchange(config=CONFIG) as rx:
        summary = asyncio.run(aio.send_job_async(rx.address, JobSpec.uniform(42, **JOB), config=CONFIG,
                                                 report_to=controllers.addresses, precise=False))
        assert summary.msr_met() and rx.receive(42).result(30).job_id == 42
    _check_signed(controllers, 42)


@pytest.mark.usefixtures("cores")
def test_report_key_exchange_reports_signed_to_every_replica(controllers):
    """``AtpExchange`` takes the replica list as the other adapters do (it took one address)."""
    with AtpExchange(config=CONFIG, report_to=controllers.addresses) as a, AtpExchange(config=CONFIG) as b:
        summary = a.send(b.address, JobSpec.uniform(43, **JOB)).result(30)
        assert summary.msr_met() and b.receive(43).result(30).job_id == 43
    _check_signed(controllers, 43)


PACKAGE_DIRS = ("hostlib", "controller", "experiments", "bench", "ml", "topo", "analytics")  # not ptf/: tests
ENCODE = re.compile(r"(?:\breport|Report\([^)]*\))\.encode\(")


def test_one_report_sink_and_no_other_place_encodes_a_report():
    """Package code encodes a REPORT in ``ReportSink.encode`` only, and one ReportSink class exists."""
    sinks, encoders = [], []
    for folder in PACKAGE_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(REPO))
            sinks += [rel for _ in re.finditer(r"^class " r"ReportSink\b", text, re.M)]
            if rel != "hostlib/reporting.py":
                encoders += [f"{rel}: {m.group(0)}" for m in ENCODE.finditer(text)]
    assert sinks == ["hostlib/reporting.py"]
    assert encoders == []
