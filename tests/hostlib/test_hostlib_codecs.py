"""hostlib.wire payload codecs and the job manifest; property-based header round trips."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, wire

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


@st.composite
def headers(draw):
    ptype = draw(st.sampled_from(list(wire.PacketType)))
    packed = ptype == wire.PacketType.DATA and draw(st.booleans())
    cnt = 1 if packed else draw(st.integers(1, 0xFFFF))
    count = draw(st.integers(2, wire.MAX_PACKED)) if packed else 1 if ptype == wire.PacketType.DATA else draw(u8)
    return wire.Header(
        type=ptype, flags=draw(u8), queue=draw(u8),
        priority=draw(u8), job_id=draw(u32), msg_id=draw(u32), group_id=draw(u16),
        tlr=draw(st.integers(0, wire.TLR_ONE)), pkt_idx=draw(st.integers(0, cnt - 1)), pkt_cnt=cnt,
        seq=draw(u32), deadline_us=draw(u32), weight=draw(u8), count=count)


@settings(max_examples=300, deadline=None)
@given(headers(), st.binary(max_size=64))
def test_header_round_trips(header, payload):
    data = wire.encode(header, payload)
    got, got_payload = wire.decode(data)
    assert got_payload == payload
    assert got == wire.Header(**{**header.__dict__, "length": len(payload)})


@settings(max_examples=300, deadline=None)
@given(headers(), st.binary(max_size=64))
def test_fast_data_encoder_matches_header_encoder(header, payload):
    fields = {k: getattr(header, k) for k in ("flags", "priority", "job_id", "msg_id", "group_id", "tlr",
                                              "pkt_idx", "pkt_cnt", "seq", "deadline_us", "weight", "queue")}
    count = header.count if header.type == wire.PacketType.DATA else 1
    data = wire.encode_data(payload=payload, count=count, **fields)
    import dataclasses
    assert data == wire.encode(dataclasses.replace(header, type=wire.PacketType.DATA, count=count), payload)


@settings(max_examples=300, deadline=None)
@given(headers(), st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**31)).map(sorted).map(tuple),
                           max_size=wire.MAX_SACK_BLOCKS))
def test_fast_ack_encoder_matches_header_encoder(header, blocks):
    fields = {k: getattr(header, k) for k in ("flags", "queue", "job_id", "msg_id", "group_id", "pkt_idx", "pkt_cnt",
                                              "seq")}
    fields["flags"] &= ~(wire.Flags.GRANT | wire.Flags.TOKEN)  # those flags announce fields the payload then has
    data = wire.encode_ack(blocks=blocks, **fields)
    ack = wire.Header(type=wire.PacketType.ACK, **fields)
    assert data == wire.encode(ack, wire.encode_ack_payload(blocks))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**31)).map(sorted).map(tuple),
                max_size=wire.MAX_SACK_BLOCKS), st.one_of(st.none(), u32),
       st.one_of(st.none(), st.binary(min_size=16, max_size=16).filter(lambda t: t != wire.NO_TOKEN)))
def test_ack_grant_and_token_fields_round_trip(blocks, grant, token):
    data = wire.encode_ack(flags=wire.Flags.ECE, queue=3, job_id=1, msg_id=2, group_id=0, pkt_idx=0, pkt_cnt=1, seq=9,
                           blocks=blocks, grant=grant, token=token)
    h, payload = wire.decode(data)
    assert bool(h.flags & wire.Flags.GRANT) == (grant is not None) and bool(h.flags & wire.Flags.TOKEN) == (token
                                                                                                             is not None)
    assert wire.decode_ack(payload, h.flags) == ([tuple(b) for b in blocks], grant, token)
    with pytest.raises(wire.MalformedPacket, match="bad_ack"):  # a flag whose field is missing
        wire.decode_ack(payload[:len(payload) - 1], h.flags | wire.Flags.GRANT | wire.Flags.TOKEN)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_decode_of_random_bytes_raises_only_malformed(data):
    try:
        wire.decode(data)
    except wire.MalformedPacket as err:
        assert err.reason in {"truncated", "bad_version", "bad_type", "bad_tlr", "bad_index", "bad_count"}


@given(st.lists(st.tuples(u32, u32).map(lambda t: (min(t), max(t))), max_size=16))
def test_ack_payload_round_trips(blocks):
    assert wire.decode_ack_payload(wire.encode_ack_payload(blocks)) == blocks


def test_new_token_carries_an_address_validation_token_and_echoes_the_announce():
    announce = wire.Header(job_id=9, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=1, pkt_cnt=2, seq=77)
    token = bytes(range(1, 17))
    data = wire.encode_new_token(announce, token)
    h, payload = wire.decode(data)
    assert len(data) == 48 and h.type == wire.PacketType.NEW_TOKEN
    assert (h.job_id, h.msg_id, h.pkt_idx, h.pkt_cnt, h.seq) == (9, control.ANNOUNCE_MSG_ID, 1, 2, 77)
    assert wire.decode_new_token_payload(payload) == token
    for bad in (wire.NO_TOKEN, token[:15], token + b"x"):
        with pytest.raises(wire.MalformedPacket, match="bad_new_token"):
            wire.decode_new_token_payload(bad)


def test_ack_payload_rejects_bad_blocks():
    assert wire.decode_ack_payload(b"") == []
    with pytest.raises(wire.MalformedPacket, match="bad_ack"):
        wire.decode_ack_payload(b"\x00\x01" + b"\x00" * 4)
    with pytest.raises(wire.MalformedPacket, match="bad_ack"):
        wire.decode_ack_payload(b"\x00\x01" + (5).to_bytes(4, "big") + (4).to_bytes(4, "big"))
    with pytest.raises(ValueError):
        wire.encode_ack_payload([(1, 1)] * 17)


@given(st.lists(st.integers(0, 2**32 - 2), max_size=2000, unique=True), st.integers(12, 1400))
def test_done_payloads_split_and_join(ids, max_payload):
    ids = sorted(ids)
    parts = wire.encode_done_payloads(wire.id_ranges(ids), max_payload)
    assert all(len(p) <= max_payload for p in parts)
    ranges = [r for p in parts for r in wire.decode_done_payload(p)]
    assert wire.range_ids(ranges) == ids
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))  # adjacent ids are one range


def test_done_payload_is_one_range_for_any_number_of_consecutive_ids():
    (part,) = wire.encode_done_payloads([0, 2**32 - 1], 1368)
    assert len(part) == 12 and wire.decode_done_payload(part) == [(0, 2**32 - 1)]


def test_done_payload_rejects_wrong_count_and_bad_ranges():
    with pytest.raises(wire.MalformedPacket, match="bad_done"):
        wire.decode_done_payload((3).to_bytes(4, "big") + b"\x00" * 8)
    for first, end in ((5, 5), (6, 5)):  # empty, backwards
        with pytest.raises(wire.MalformedPacket, match="bad_done"):
            wire.decode_done_payload(wire.encode_done_payloads([first, end], 100)[0])
    with pytest.raises(wire.MalformedPacket, match="bad_done"):  # overlapping
        wire.decode_done_payload(wire.encode_done_payloads([0, 5, 3, 8], 100)[0])


@given(st.integers(0, 2**31), st.lists(st.floats(width=32, allow_nan=False), max_size=340))
def test_float_range_round_trips(first, values):
    got_first, got = wire.decode_float_range(wire.encode_float_range(first, values))
    assert got_first == first and list(got) == values


def test_float_range_layout_is_big_endian_with_range_header():
    assert wire.encode_float_range(2, [1.0]) == bytes.fromhex("00000002" "00000001" "3f800000")
    assert wire.floats_per_packet(1368) == 340
    with pytest.raises(wire.MalformedPacket, match="bad_floats"):
        wire.decode_float_range(bytes.fromhex("00000002" "00000002" "3f800000"))


@given(st.lists(st.integers(0, 3), min_size=1, max_size=300), st.booleans())
def test_manifest_round_trips(group_of, vector):
    groups = tuple(control.GroupShape.from_ids(g, 0.5 if g else 1.0, (i for i, x in enumerate(group_of) if x == g))
                   for g in sorted(set(group_of)))
    m = control.Manifest(total=len(group_of), vector_len=7 if vector else None, groups=groups)
    assert control.Manifest.decode(m.encode(), max_messages=1000) == m


def test_manifest_rejects_oversized_and_inconsistent_jobs():
    m = control.Manifest(total=10, vector_len=None, groups=(control.GroupShape.from_ids(0, 0.9, range(10)),))
    with pytest.raises(wire.MalformedPacket, match="max_messages"):
        control.Manifest.decode(m.encode(), max_messages=9)
    short = control.Manifest(total=10, vector_len=None, groups=(control.GroupShape.from_ids(0, 0.9, range(9)),))
    with pytest.raises(wire.MalformedPacket, match="bad_announce"):
        control.Manifest.decode(short.encode(), max_messages=100)
    with pytest.raises(wire.MalformedPacket, match="bad_announce"):
        control.Manifest.decode(m.encode()[:-3], max_messages=100)
