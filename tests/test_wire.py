"""hostlib.wire against docs/wire-format.md: byte offsets, validation, report codec."""
from __future__ import annotations

import pytest

from netapprox.hostlib import wire


def test_header_is_32_bytes_and_fields_sit_at_documented_offsets():
    h = wire.Header(type=wire.PacketType.ACK, flags=wire.Flags.APPROX | wire.Flags.TAGGED, queue=3,
                    priority=9, job_id=0x01020304, msg_id=0x05060708, group_id=0x090A, tlr=0x1234,
                    pkt_idx=2, pkt_cnt=5, seq=0x0B0C0D0E, deadline_us=0x0F101112, weight=7)
    b = wire.encode(h, b"xy")
    assert len(b) == 34
    assert b[0] == 0x22 and b[1] == 0x09 and b[2] == 3 and b[3] == 9
    assert b[4:8] == bytes([1, 2, 3, 4]) and b[8:12] == bytes([5, 6, 7, 8])
    assert b[12:14] == bytes([9, 10]) and b[14:16] == bytes([0x12, 0x34])
    assert b[16:18] == bytes([0, 2]) and b[18:20] == bytes([0, 5])
    assert b[20:24] == bytes([11, 12, 13, 14]) and b[24:28] == bytes([15, 16, 17, 18])
    assert b[28] == 7 and b[29] == 0 and b[30:32] == bytes([0, 2])


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b[:20], "truncated"),
        (lambda b: bytes([0x11]) + b[1:], "bad_version"),  # a version-1 DATA packet: both ends speak version 2
        (lambda b: bytes([0x28]) + b[1:], "bad_type"),  # type 8: 0 and 8..15 are not types
        (lambda b: b[:14] + bytes([0x80, 0x01]) + b[16:], "bad_tlr"),
        (lambda b: b[:16] + bytes([0, 5, 0, 5]) + b[20:], "bad_index"),
        (lambda b: b[:18] + bytes([0, 0]) + b[20:], "bad_index"),
        (lambda b: b[:29] + bytes([0]) + b[30:], "bad_count"),  # DATA carries at least one message
        (lambda b: b[:29] + bytes([2]) + b[30:], "bad_count"),  # packed, but packet 4 of 5 of a message
        (lambda b: b[:-1], "truncated"),
    ],
)
def test_malformed_headers_are_rejected_with_a_reason(mutate, reason):
    good = wire.encode(wire.Header(pkt_cnt=5, pkt_idx=4), b"abcd")
    wire.decode(good)
    with pytest.raises(wire.MalformedPacket) as err:
        wire.decode(mutate(good))
    assert err.value.reason == reason


def test_tlr_fixed_point_edges():
    assert wire.tlr_to_q15(1.0) == 0x8000
    assert wire.tlr_to_q15(0.125) == 4096
    assert wire.tlr_to_q15(-0.5) == 0 and wire.tlr_to_q15(7.0) == 0x8000
    with pytest.raises(ValueError):
        wire.tlr_to_q15(float("nan"))


def test_report_roundtrip_and_hmac():
    r = wire.Report(job_id=3, group_id=1, seq=5, tlr=0.25, loss=0.5, msr=0.75, rate_kbps=1000,
                    total=10, delivered=2, lost=1, epoch=4)
    assert wire.Report.decode(r.encode()) == r
    signed = r.encode(key=b"secret")
    assert wire.Report.decode(signed, key=b"secret") == r
    with pytest.raises(wire.MalformedPacket, match="bad_mac"):
        wire.Report.decode(signed, key=b"other")
    with pytest.raises(wire.MalformedPacket, match="bad_mac"):
        wire.Report.decode(r.encode(), key=b"secret")


def test_packed_records_round_trip_and_are_checked():
    msgs = [(7, b"abc"), (3, b""), (9, b"x" * 300)]
    payload = wire.encode_records(msgs)
    assert len(payload) == sum(wire.RECORD_HEADER_LEN + len(d) for _, d in msgs)
    data = wire.encode_data(flags=1, priority=0, job_id=1, msg_id=7, group_id=0, tlr=0, pkt_idx=0, pkt_cnt=1, seq=5,
                            deadline_us=wire.NO_DEADLINE, weight=0, payload=payload, count=3)
    h, p = wire.decode(data)
    assert h.count == 3 and wire.decode_records(p, h) == msgs
    import dataclasses
    for header, body, why in [
            (dataclasses.replace(h, count=2), p, "count"),  # more records than the count
            (dataclasses.replace(h, count=4), p, "count"),
            (dataclasses.replace(h, msg_id=3), p, "first record"),
            (h, p[:-1], "cut"),
            (h, p + b"\x00", "trailing"),
            (dataclasses.replace(h, count=2), wire.encode_records([(7, b"a"), (7, b"b")]), "twice")]:
        with pytest.raises(wire.MalformedPacket, match="bad_pack"):
            wire.decode_records(body, header)
