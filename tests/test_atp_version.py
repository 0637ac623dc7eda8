"""One statement of what a switch does with an ATP packet of another version, true in every doc and every data
plane: "A switch drops an ATP packet of another version and counts it (malformed, `bad_version`)"
(docs/wire-format.md, Versions). The P4 program's validation does so (its model: tests/support/conformance.py
``p4_outcome``, which the PTF suite checks on BMv2); the reference model, the kernel switch's u32 layout and the
ns-3 queue disc must agree with it on the same packets (the real kernel: test_kernel_agreement.py, on generated
packets with other versions among them)."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from netapprox.controller.kernel import compiler as ks
from netapprox.controller.model import SwitchState, default_tlr_rules
from netapprox.controller.reference import DROPPED, other_atp_version, reference_queue
from netapprox.hostlib import wire
from support.conformance import p4_outcome
from support.skips import requires_ns3

REPO = Path(__file__).resolve().parents[1]
STATEMENT = "A switch drops an ATP packet of another version and counts it (malformed, `bad_version`)"
STATE = SwitchState(tlr_rules=default_tlr_rules())
ATP, REPORT = wire.DEFAULT_ATP_PORT, wire.DEFAULT_REPORT_PORT
# (destination port, source port): the three ways the P4 parser takes a UDP packet for ATP, and one it does not
PORTS = [(ATP, 40000), (REPORT, 40000), (5201, ATP), (5201, 40000)]


def packet(version: int, dport: int, sport: int) -> bytes:
    """An approximate DATA header (TLR 0.25) with ``version`` in byte 0, in UDP in IPv4 (checksum right)."""
    atp = bytearray(wire.encode(wire.Header(type=wire.PacketType.DATA, flags=int(wire.Flags.APPROX), job_id=7,
                                            tlr=0x2000), bytes(16)))
    atp[0] = (version << 4) | (atp[0] & 0x0F)
    udp = struct.pack("!HHHH", sport, dport, 8 + len(atp), 0) + bytes(atp)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, bytes([10, 0, 1, 1]),
                               bytes([10, 0, 2, 1])))
    s = sum(struct.unpack("!10H", ip))
    s = (s & 0xFFFF) + (s >> 16)
    struct.pack_into("!H", ip, 10, ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF)
    return bytes(ip) + udp


CASES = [(v, d, s) for v in (0, 1, wire.VERSION, 3, 15) for d, s in PORTS]


def expected(version: int, dport: int, sport: int) -> bool:
    return version != wire.VERSION and (dport in (ATP, REPORT) or sport == ATP)


def test_the_docs_say_it_once_and_nothing_else():
    wire_doc = " ".join((REPO / "docs" / "wire-format.md").read_text().replace("**", "").split())
    assert STATEMENT in wire_doc
    dataplane = (REPO / "docs" / "dataplane.md").read_text()
    assert "| 1 | `bad_version` | `version != 2`" in dataplane and "`version != 1`" not in dataplane
    for doc in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        text = " ".join(doc.read_text().split())
        assert "other ATP versions go to the non-approximate class" not in text, doc


@pytest.mark.parametrize("version, dport, sport", CASES)
def test_p4_model_reference_and_kernel_agree(version, dport, sport):
    pkt = packet(version, dport, sport)
    drop = expected(version, dport, sport)
    outcome = p4_outcome(STATE, pkt)
    assert (outcome.verdict, outcome.reason) == ("drop", "bad_version") if drop else outcome.reason != "bad_version"
    assert other_atp_version(pkt) is drop
    ref = reference_queue(STATE, pkt)
    assert (ref == DROPPED) is drop
    assert ks.u32_queue(ks.compile_filters(STATE), pkt) == ref


@requires_ns3
def test_the_ns3_switch_agrees():
    from netapprox.controller.sim import native
    from netapprox.controller.sim.switch import write_state
    tables = native.cpp().netapprox.Tables.Create()
    write_state(tables, STATE)
    for version, dport, sport in CASES:
        pkt = packet(version, dport, sport)
        assert tables.ClassifyBytes(pkt, len(pkt)) == reference_queue(STATE, pkt), (version, dport, sport)
