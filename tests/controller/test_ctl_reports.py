"""Report intake: validation, HMAC, sequence numbers, per-host rate limit, packet-in frame parsing."""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller.config import ReportConfig
from netapprox.controller.reports import ReportIngest, udp_payload_from_frame
from netapprox.hostlib import wire
from netapprox.hostlib.wire import Header, MalformedPacket, PacketType, Report, encode


def report(job=5, group=0, seq=1, tlr=0.3) -> Report:
    return Report(job_id=job, group_id=group, seq=seq, tlr=tlr, loss=0.01, msr=0.9, rate_kbps=1000, total=100,
                  delivered=10, lost=0, epoch=seq)


def test_valid_report_is_accepted():
    ingest = ReportIngest(ReportConfig())
    got = ingest.receive(report().encode(), "10.0.0.1", 0.0)
    assert got is not None and got.job_id == 5 and abs(got.tlr - 0.3) < 1e-4
    assert ingest.accepted == 1 and not ingest.dropped


def test_sequence_numbers_must_move_forward_per_job_and_group():
    ingest = ReportIngest(ReportConfig())
    assert ingest.receive(report(seq=5).encode(), "h", 0.0)
    assert ingest.receive(report(seq=5).encode(), "h", 0.0) is None  # replay
    assert ingest.receive(report(seq=4).encode(), "h", 0.0) is None  # reordered old
    assert ingest.receive(report(seq=1, group=1).encode(), "h", 0.0)  # other group: own sequence
    assert ingest.receive(report(seq=6).encode(), "h", 0.0)
    assert ingest.dropped["stale_seq"] == 2
    ingest.forget_job(5)  # job expired: a restarted sender may start again from 1
    assert ingest.receive(report(seq=1).encode(), "h", 0.0)


def test_hmac_required_when_a_key_is_configured():
    ingest = ReportIngest(ReportConfig(key=b"k1"))
    assert ingest.receive(report(seq=1).encode(key=b"k1"), "h", 0.0)
    assert ingest.receive(report(seq=2).encode(), "h", 0.0) is None
    assert ingest.receive(report(seq=3).encode(key=b"other"), "h", 0.0) is None
    assert ingest.dropped["bad_mac"] == 2


def test_malformed_reports_are_dropped_and_counted_by_reason():
    ingest = ReportIngest(ReportConfig())
    good = bytearray(report().encode())
    bad_tlr = bytearray(good)
    bad_tlr[14:16] = (0x9000).to_bytes(2, "big")  # TLR above 1.0
    not_report = encode(Header(type=PacketType.DATA, job_id=5))
    job0 = report(job=0).encode()
    for data in (b"", b"\x00" * 10, bytes(bad_tlr), not_report, job0, bytes(good[:-3])):
        assert ingest.receive(data, "h", 0.0) is None
    assert dict(ingest.dropped) == {"truncated": 3, "bad_tlr": 1, "not_report": 1, "bad_job": 1}
    assert ingest.accepted == 0


def test_per_host_rate_limit_with_refill():
    ingest = ReportIngest(ReportConfig(rate_per_host=10.0, burst=3))
    results = [ingest.receive(report(seq=i).encode(), "10.0.0.1", 0.0) is not None for i in range(1, 6)]
    assert results == [True, True, True, False, False]
    assert ingest.receive(report(seq=10, job=6).encode(), "10.0.0.2", 0.0)  # other host: own bucket
    assert ingest.receive(report(seq=11).encode(), "10.0.0.1", 0.1)  # 0.1 s at 10/s refills one token
    assert ingest.dropped["rate_limited"] == 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_random_bytes_never_raise(data):
    ingest = ReportIngest(ReportConfig())
    ingest.receive(data, "h", 0.0)
    assert ingest.accepted + sum(ingest.dropped.values()) == 1


def frame(payload: bytes, src="10.0.0.7", proto=17, vlan=False) -> bytes:
    udp = struct.pack("!HHHH", 40000, 7601, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, proto, 0,
                     bytes(int(x) for x in src.split(".")), bytes([10, 0, 0, 100]))
    eth = b"\x02" * 6 + b"\x04" * 6 + (b"\x81\x00\x00\x05" if vlan else b"") + b"\x08\x00"
    return eth + ip + udp


def test_udp_payload_from_packet_in_frame():
    data = report().encode()
    assert udp_payload_from_frame(frame(data)) == (data, "10.0.0.7")
    assert udp_payload_from_frame(frame(data, vlan=True)) == (data, "10.0.0.7")
    assert udp_payload_from_frame(frame(data, proto=6)) is None
    assert udp_payload_from_frame(frame(data)[:20]) is None
    assert udp_payload_from_frame(b"") is None
    # trailing Ethernet padding is cut at the UDP length
    assert udp_payload_from_frame(frame(data) + b"\x00" * 8) == (data, "10.0.0.7")


def test_an_accepted_report_is_the_wire_record():
    r = report(seq=9, tlr=0.5)
    got = ReportIngest(ReportConfig()).receive(r.encode(), "h", 0.0)
    assert type(got) is Report and got == Report.decode(r.encode())
    assert got == r._replace(tlr=wire.q15_to_tlr(wire.tlr_to_q15(0.5)), loss=wire.q15_to_tlr(wire.tlr_to_q15(0.01)),
                             msr=wire.q15_to_tlr(wire.tlr_to_q15(0.9)))


def _reference_decode(data: bytes, key: bytes | None) -> Report:
    """A REPORT decoded field by field, as docs/wire-format.md states each check (the specification
    ``Report.decode`` is held to)."""
    header, payload = wire.decode(data)
    if header.type != PacketType.REPORT:
        raise MalformedPacket("not_report", header.type.name)
    if len(payload) not in (wire.REPORT_PAYLOAD_LEN, wire.REPORT_PAYLOAD_LEN + wire.REPORT_MAC_LEN):
        raise MalformedPacket("bad_report", f"{len(payload)} bytes")
    body = payload[:wire.REPORT_PAYLOAD_LEN]
    if key is not None:
        covered = dataclasses.replace(header, length=0, count=0).encode()[4:-2]  # job_id .. count (as zero)
        want = hmac.new(key, covered + body, hashlib.sha256).digest()[:wire.REPORT_MAC_LEN]
        mac = payload[wire.REPORT_PAYLOAD_LEN:]
        if not mac or not hmac.compare_digest(mac, want):
            raise MalformedPacket("bad_mac", "")
    loss, msr, rate, total, delivered, lost, epoch = struct.unpack("!HHIIIII", body)
    if loss > wire.TLR_ONE or msr > wire.TLR_ONE:
        raise MalformedPacket("bad_report", "loss or MSR above 1.0")
    return Report(header.job_id, header.group_id, header.seq, header.tlr / wire.TLR_ONE, loss / wire.TLR_ONE,
                  msr / wire.TLR_ONE, rate, total, delivered, lost, epoch)


def _decode_both(data: bytes, key: bytes | None):
    def run(decode):
        try:
            r = decode(data, key)
        except MalformedPacket as e:
            return ("error", e.reason)
        return (type(r), tuple(r))
    return run(lambda d, k: Report.decode(d, key=k)), run(_reference_decode)


@settings(max_examples=400, deadline=None)
@given(seed=st.binary(min_size=0, max_size=80), flips=st.lists(st.tuples(st.integers(0, 79), st.integers(0, 255)),
                                                              max_size=4), signed=st.booleans(), keyed=st.booleans())
def test_the_line_rate_decoder_agrees_with_the_field_by_field_checks(seed, flips, signed, keyed):
    """``Report.decode`` (one unpack and one HMAC for a well-formed report) and the field-by-field checks accept
    the same datagrams with the same values and reject the others with the same reason, with and without a key."""
    key = b"k" if keyed else None
    base = bytearray(report(seq=3, tlr=0.25).encode(b"k" if signed else None)) if len(seed) % 2 else bytearray(seed)
    for pos, value in flips:
        if pos < len(base):
            base[pos] = value
    fast, slow = _decode_both(bytes(base), key)
    assert fast == slow
