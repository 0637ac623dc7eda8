"""The scapy layer (hostlib/scapy_atp.py): the same bytes as hostlib.wire (version 2: packed records, ACK and
GRANT payloads with their grant and token fields, trimmed DATA), both ways, bound to the ATP and report ports, TLR
shown as a fraction."""
from __future__ import annotations

import pytest

pytest.importorskip("scapy.all")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from scapy.all import IP, UDP, Raw  # noqa: E402

from netapprox.hostlib import control, wire  # noqa: E402
from netapprox.hostlib.scapy_atp import ATP, ATPAck, ATPMsrChange, ATPRecord, ATPRecords, ATPSackBlock, bind_port  # noqa: E402

F = wire.Flags


@pytest.fixture(autouse=True)
def default_ports():
    bind_port()
    yield
    bind_port()


def test_fields_and_bytes_follow_hostlib_wire():
    assert [(f.name, f.size) for f in ATP.fields_desc] == list(wire.HEADER_FIELDS)
    header = wire.Header(type=wire.PacketType.DATA, flags=0x09, queue=3, priority=7, job_id=0xDEADBEEF, msg_id=41,
                         group_id=2, tlr=0x1000, pkt_idx=1, pkt_cnt=3, seq=123456, deadline_us=5000, weight=200)
    fields = {name: getattr(header, name) for name, _ in wire.HEADER_FIELDS if name != "length"}
    assert bytes(ATP(**fields) / Raw(b"abc")) == wire.encode(header, b"abc")


def test_count_flags_and_types_of_version_2():
    assert ATP().version == wire.VERSION == 2
    assert wire.decode(bytes(ATP(type=1, job_id=1)))[0].count == 1  # left unset: 1 for DATA ...
    assert wire.decode(bytes(ATP(type=2, job_id=1)))[0].count == 0  # ... 0 for the other types
    assert bytes(ATP(type=1, count=0))[29] == 0  # set: as given (a malformed DATA, for tests)
    assert ATP(bytes(ATP(type=6)))[ATP].sprintf("%ATP.type%") == "GRANT"
    new_token = wire.encode_new_token(wire.Header(job_id=3, msg_id=control.ANNOUNCE_MSG_ID, seq=12), b"A" * 16)
    pkt = ATP(new_token)
    assert pkt.sprintf("%ATP.type%") == "NEW_TOKEN" and pkt.seq == 12 and bytes(pkt[Raw]) == b"A" * 16
    assert bytes(ATP(type=7, job_id=3, msg_id=control.ANNOUNCE_MSG_ID, seq=12) / Raw(b"A" * 16)) == new_token
    shown = ATP(flags=F.TRIM | F.GRANT | F.TOKEN).sprintf("%ATP.flags%")
    assert shown == "TRIM+GRANT+TOKEN"
    for flag in F:
        assert ATP(flags=int(flag)).flags == flag.name  # every bit has its wire.Flags name


def _packed(records: list[tuple[int, bytes]], **fields) -> bytes:
    header = wire.Header(**{"flags": F.APPROX, "job_id": 7, "msg_id": records[0][0], "tlr": 0x2000, "seq": 9,
                            "count": len(records), **fields})
    return wire.encode(header, wire.encode_records(records))


def test_packed_records_build_and_dissect():
    records = [(4, b"abc"), (9, b""), (2, bytes(range(256)) * 3)]
    pkt = ATP(type=1, flags=F.APPROX, job_id=7, msg_id=4, tlr=0x2000, seq=9) / ATPRecords(
        records=[ATPRecord(msg_id=m, data=d) for m, d in records])
    data = bytes(pkt)
    assert data == _packed(records)  # count and every record's len filled in
    header, payload = wire.decode(data)
    assert header.count == 3 and wire.decode_records(payload, header) == records
    back = ATP(data)
    assert [(r.msg_id, r.len, r.data) for r in back[ATPRecords].records] == [(m, len(d), d) for m, d in records]
    assert "records 4,9,2" in back[ATPRecords].summary()


def test_a_one_message_payload_stays_raw():
    data = wire.encode(wire.Header(job_id=7, msg_id=4), wire.encode_records([(4, b"abc")]))
    assert ATPRecords not in ATP(data) and ATP(data)[Raw].load == data[32:]


def test_ack_grant_and_token_build_and_dissect():
    token = b"\x01" * 4 + b"K" * 12
    pkt = ATP(type=2, flags=F.ECE, queue=2, job_id=7, msg_id=4, group_id=1, seq=70) / ATPAck(
        blocks=[ATPSackBlock(first=60, last=70), ATPSackBlock(first=50, last=55)], grant=200, token=token)
    want = wire.encode_ack(flags=F.ECE, queue=2, job_id=7, msg_id=4, group_id=1, pkt_idx=0, pkt_cnt=1, seq=70,
                           blocks=[(60, 70), (50, 55)], grant=200, token=token)
    assert bytes(pkt) == want  # the GRANT and TOKEN flags come with the fields, as in wire.encode_ack
    back = ATP(want)
    assert back.flags == F.ECE | F.GRANT | F.TOKEN
    assert (back[ATPAck].n, back[ATPAck].grant, back[ATPAck].token) == (2, 200, token)
    assert [(b.first, b.last) for b in back[ATPAck].blocks] == [(60, 70), (50, 55)]


def test_grant_packet_and_plain_ack():
    grant = wire.encode_ack(ptype=wire.PacketType.GRANT, flags=0, queue=1, job_id=7, msg_id=4, group_id=0, pkt_idx=0,
                            pkt_cnt=1, seq=70, blocks=[], grant=2**32 - 1)
    assert len(grant) == 38
    assert bytes(ATP(type=6, queue=1, job_id=7, msg_id=4, seq=70) / ATPAck(grant=2**32 - 1)) == grant
    back = ATP(grant)
    assert back.flags == F.GRANT and (back[ATPAck].n, back[ATPAck].grant) == (0, 2**32 - 1)
    plain = ATP(wire.encode_ack(flags=0, queue=1, job_id=7, msg_id=4, group_id=0, pkt_idx=0, pkt_cnt=1, seq=70,
                                blocks=[(1, 3)]))
    assert plain[ATPAck].grant is None and plain[ATPAck].token is None  # absent without their flags
    assert bytes(plain) == bytes(ATP(type=2, queue=1, job_id=7, msg_id=4, seq=70) /
                                 ATPAck(blocks=[ATPSackBlock(first=1, last=3)]))


def test_trimmed_data_and_announce_round_trip():
    trimmed = wire.encode(wire.Header(flags=F.TRIM | F.TAGGED, job_id=7, msg_id=4, seq=9, priority=3, weight=2))
    assert bytes(ATP(flags=F.TRIM | F.TAGGED, job_id=7, msg_id=4, seq=9, priority=3, weight=2)) == trimmed
    assert ATP(trimmed).length == 0 and ATP(trimmed).flags == F.TRIM | F.TAGGED
    manifest = control.Manifest(total=3, vector_len=None, need_bytes=4000,
                                groups=(control.GroupShape.from_ids(0, 0.5, (0, 1, 2)),))
    part = control.encode_announce_part(manifest.encode(), job_id=7, pkt_idx=0, pkt_cnt=1)
    announce = bytes(ATP(type=1, job_id=7, msg_id=control.ANNOUNCE_MSG_ID) / Raw(part))
    header, payload = wire.decode(announce)
    _token, _auth, chunk = control.decode_announce_part(payload)
    assert control.Manifest.decode(chunk, max_messages=10).need_bytes == 4000
    assert bytes(ATP(announce)) == announce


def test_msr_change_builds_and_dissects_as_hostlib_control():
    data = wire.encode(wire.Header(job_id=7, msg_id=control.MSR_MSG_ID, group_id=2, seq=11),
                       control.encode_msr_change(3, 0.25))
    built = ATP(type=1, job_id=7, msg_id=control.MSR_MSG_ID, group_id=2, seq=11) / ATPMsrChange(change=3, msr=0x2000)
    assert bytes(built) == data
    pkt = ATP(data)
    assert isinstance(pkt.payload, ATPMsrChange) and (pkt.payload.change, pkt.payload.msr) == (3, 0x2000)
    assert control.decode_msr_change(bytes(pkt.payload)) == (3, 0.25)
    assert "MSR change 3: 0.25" in pkt.payload.mysummary()
    # a trimmed one is a bare header (malformed for a receiver): no payload to dissect
    trimmed = wire.encode(wire.Header(flags=F.TRIM, job_id=7, msg_id=control.MSR_MSG_ID))
    assert not isinstance(ATP(trimmed).payload, ATPMsrChange)


# --- property tests: scapy builds what hostlib.wire decodes, and dissects what it encodes --------------------

_records = st.lists(st.tuples(st.integers(0, 0xFFFFFFEF), st.binary(max_size=64)), min_size=2,
                    max_size=wire.MAX_PACKED, unique_by=lambda r: r[0])


@settings(max_examples=150, deadline=None)
@given(records=_records, flags=st.integers(0, 0xFF), tlr=st.integers(0, wire.TLR_ONE), seq=st.integers(0, 2**32 - 1))
def test_packed_records_match_hostlib_wire(records, flags, tlr, seq):
    data = _packed(records, flags=flags, tlr=tlr, seq=seq)
    built = ATP(type=1, flags=flags, job_id=7, msg_id=records[0][0], tlr=tlr, seq=seq) / ATPRecords(
        records=[ATPRecord(msg_id=m, data=d) for m, d in records])
    assert bytes(built) == data
    header, payload = wire.decode(bytes(built))
    assert wire.decode_records(payload, header) == records
    back = ATP(data)
    assert back.count == len(records)
    assert [(r.msg_id, r.data) for r in back[ATPRecords].records] == records
    assert bytes(back) == data


_tokens = st.binary(min_size=wire.TOKEN_LEN, max_size=wire.TOKEN_LEN).filter(lambda t: t != wire.NO_TOKEN)
_blocks = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(sorted).map(tuple),
                   max_size=wire.MAX_SACK_BLOCKS)


@settings(max_examples=150, deadline=None)
@given(blocks=_blocks, grant=st.none() | st.integers(0, 2**32 - 1), token=st.none() | _tokens,
       flags=st.integers(0, 0x3F), grant_type=st.booleans())
def test_ack_payloads_match_hostlib_wire(blocks, grant, token, flags, grant_type):
    ptype = wire.PacketType.GRANT if grant_type else wire.PacketType.ACK
    data = wire.encode_ack(flags=flags, queue=3, job_id=7, msg_id=4, group_id=1, pkt_idx=0, pkt_cnt=1, seq=70,
                           blocks=blocks, grant=grant, token=token, ptype=ptype)
    built = ATP(type=int(ptype), flags=flags, queue=3, job_id=7, msg_id=4, group_id=1, seq=70) / ATPAck(
        blocks=[ATPSackBlock(first=a, last=b) for a, b in blocks], grant=grant, token=token)
    assert bytes(built) == data
    header, payload = wire.decode(bytes(built))
    assert wire.decode_ack(payload, header.flags) == (blocks, grant, token)
    back = ATP(data)
    assert [(b.first, b.last) for b in back[ATPAck].blocks] == blocks
    assert (back[ATPAck].grant, back[ATPAck].token) == (grant, token)
    assert bytes(back) == data


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
