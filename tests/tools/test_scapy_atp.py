"""The scapy layer (hostlib/scapy_atp.py): the same bytes as hostlib.wire, bound to the ATP and report ports,
TLR shown as a fraction."""
from __future__ import annotations

import pytest

pytest.importorskip("scapy.all")
from scapy.all import IP, UDP, Raw  # noqa: E402

from netapprox.hostlib import wire  # noqa: E402
from netapprox.hostlib.scapy_atp import ATP, bind_port  # noqa: E402


@pytest.fixture(autouse=True)
def default_ports():
    bind_port()
    yield
    bind_port()


def test_fields_and_bytes_follow_hostlib_wire():
    assert [(f.name, f.size) for f in ATP.fields_desc] == list(wire.HEADER_FIELDS)
    header = wire.Header(type=wire.PacketType.DATA, flags=0x09, queue=3, priority=7, job_id=0xDEADBEEF, msg_id=41,
                         group_id=2, tlr=0x1000, pkt_idx=1, pkt_cnt=3, seq=123456, deadline_us=5000, weight=200)
    fields = {name: getattr(header, name) for name, _ in wire.HEADER_FIELDS if name not in ("reserved", "length")}
    assert bytes(ATP(**fields) / Raw(b"abc")) == wire.encode(header, b"abc")


def test_tlr_is_shown_as_a_fraction():
    pkt = ATP(type=1, tlr=0x1000)
    assert pkt.tlr_fraction == 0.125
    assert "0x1000 (0.125)" in pkt.show(dump=True)
    assert "TLR 0.125" in pkt.summary()
    assert ATP(tlr=wire.TLR_ONE).tlr_fraction == 1.0


def test_atp_and_report_ports_are_dissected():
    report = wire.Report(job_id=7, group_id=1, seq=3, tlr=0.25, loss=0.1, msr=0.9, rate_kbps=20000, total=100,
                         delivered=50, lost=3, epoch=12).encode()
    to_controller = IP(bytes(IP() / UDP(sport=40000, dport=wire.DEFAULT_REPORT_PORT) / Raw(report)))
    assert to_controller[ATP].type == wire.PacketType.REPORT and to_controller[ATP].tlr_fraction == 0.25
    ack = IP(bytes(IP() / UDP(sport=wire.DEFAULT_ATP_PORT, dport=40000) / ATP(type=2, job_id=9)))
    assert ack[ATP].job_id == 9
    other = IP(bytes(IP() / UDP(sport=40000, dport=9000) / Raw(report)))
    assert ATP not in other


def test_ports_can_be_rebound():
    report = wire.Report(job_id=7, group_id=1, seq=3, tlr=0.25, loss=0.1, msr=0.9, rate_kbps=1, total=1,
                         delivered=0, lost=0, epoch=1).encode()
    bind_port(9000, report_port=9001)
    assert ATP in IP(bytes(IP() / UDP(sport=1, dport=9000) / Raw(report)))
    assert ATP in IP(bytes(IP() / UDP(sport=1, dport=9001) / Raw(report)))
    assert ATP not in IP(bytes(IP() / UDP(sport=1, dport=wire.DEFAULT_ATP_PORT) / Raw(report)))
    assert ATP not in IP(bytes(IP() / UDP(sport=1, dport=wire.DEFAULT_REPORT_PORT) / Raw(report)))
    bind_port(9000, report_port=None)
    assert ATP not in IP(bytes(IP() / UDP(sport=1, dport=9001) / Raw(report)))
