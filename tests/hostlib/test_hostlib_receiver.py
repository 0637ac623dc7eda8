"""The receiver alone: garbage, limits, duplicates, SACK blocks, the announce/FIN/DONE exchange.
(Admission, slots and the memory budget under attack: test_hostlib_hostile.py.)"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import AtpConfig
from netapprox.hostlib.receiver import AtpReceiver
from hostlib_sim import admit, announce

pytestmark = pytest.mark.usefixtures("cores")

EVERY_PACKET = AtpConfig(ack_every=1)  # one ACK per DATA packet (no coalescing)

PEER = ("10.0.0.1", 40000)


def data(job=1, msg=0, idx=0, cnt=1, seq=0, group=0, approx=True, payload=b"p", queue=wire.QUEUE_UNSET):
    h = wire.Header(flags=wire.Flags.APPROX if approx else 0, queue=queue, job_id=job, msg_id=msg, group_id=group,
                    pkt_idx=idx, pkt_cnt=cnt, seq=seq)
    return wire.encode(h, payload)


def fin(job, seq=2000):
    return data(job=job, msg=control.FIN_MSG_ID, seq=seq, approx=False, payload=b"")


def outputs(r):
    return [wire.decode(d) for d, _ in r.datagrams_to_send(0.0)]


def received(r):
    return [e for e in iter(r.next_event, None) if isinstance(e, events.MessageReceived)]


def counted(r):
    """Datagrams the receiver refused or answered with a RETRY: each is in exactly one counter."""
    return sum(r.malformed.values()) + sum(r.dropped.values()) + r.admission["retries"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=120), max_size=20))
def test_random_garbage_never_crashes_and_is_counted(blobs):
    r = AtpReceiver()
    for b in blobs:
        r.receive_datagram(b, PEER, 0.0)
    # garbage cannot carry a valid admission token: it creates no job and every datagram is counted once
    assert r.datagrams == counted(r) == len(blobs)
    assert r.jobs == {} and r.memory.used == 0
    r.datagrams_to_send(0.0)
    r.handle_timer(1e9)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 31), st.integers(0, 255), st.binary(min_size=1, max_size=4))
def test_corrupted_valid_packets_never_crash(pos, value, tail):
    r = AtpReceiver()
    admit(r, 3, [(0, 0.5, range(10))], 10, peer=PEER)
    before = counted(r)
    good = bytearray(data(job=3, msg=5, idx=1, cnt=3, seq=9, payload=b"abcdef"))
    good[pos] = value
    r.receive_datagram(bytes(good) + tail, PEER, 0.0)
    r.receive_datagram(bytes(good[:pos]), PEER, 0.0)
    assert r.datagrams == 4
    acked = len(outputs(r))
    assert counted(r) - before + acked == 2  # each datagram is acknowledged or counted
    assert r.memory.used <= r.memory.limit


def test_garbage_is_counted_by_reason():
    r = AtpReceiver()
    r.receive_datagram(b"\x00" * 5, PEER, 0.0)
    r.receive_datagram(bytes([0x11]) + data()[1:], PEER, 0.0)  # version 1
    r.receive_datagram(wire.encode(wire.Header(type=wire.PacketType.ACK, job_id=1)), PEER, 0.0)
    r.receive_datagram(data(job=0), PEER, 0.0)
    r.receive_datagram(data(job=1), PEER, 0.0)
    r.receive_datagram(fin(1), PEER, 0.0)
    assert r.malformed == {"truncated": 1, "bad_version": 1, "not_data": 1, "job_zero": 1}
    assert r.dropped == {"unknown_job": 1, "fin_for_unknown_job": 1}
    assert r.datagrams_to_send(0.0) == []


@pytest.mark.parametrize("grants", [False, True], ids=["no-grants", "grants"])
def test_every_data_packet_is_acked_with_echoed_fields_queue_and_sack_blocks(grants):
    """The ACK layout: SACK blocks, then (a granting receiver) the grant, the newest sequence number plus one plus
    what the job may have in flight (one job: the whole budget, here 8)."""
    r = AtpReceiver(config=dataclasses.replace(EVERY_PACKET, receiver_grants=grants, grant_window_packets=8))
    admit(r, 1, [(0, 0.5, range(10))], 10, seq=9)
    for seq in (10, 11, 12, 15, 16, 19):
        r.receive_datagram(data(msg=seq - 10, seq=seq, queue=4, cnt=2), PEER, 0.0)
    acks = outputs(r)
    assert len(acks) == 6
    h, payload = acks[-1]
    assert h.type == wire.PacketType.ACK and h.seq == 19 and h.msg_id == 9 and h.queue == 4 and h.pkt_cnt == 2
    assert bool(h.flags & wire.Flags.GRANT) == grants
    blocks, grant, token = wire.decode_ack(payload, h.flags)
    assert blocks == [(19, 19), (15, 16), (9, 12)]  # newest first, announce included
    assert grant == (19 + 1 + 8 if grants else None) and token is None


def test_duplicates_are_acked_but_delivered_once():
    r = AtpReceiver(config=EVERY_PACKET)
    admit(r, 1, [(0, 0.5, range(4))], 4)
    for _ in range(3):
        r.receive_datagram(data(msg=1, seq=7, payload=b"one"), PEER, 0.0)
    assert len(outputs(r)) == 3
    assert [(e.msg_id, e.data) for e in received(r)] == [(1, b"one")]
    assert r.jobs[1].duplicates == 2


def test_message_is_delivered_only_when_all_packets_arrived():
    r = AtpReceiver()
    admit(r, 1, [(0, 0.5, range(5))], 5)
    after_admission = r.memory.used
    r.receive_datagram(data(msg=4, idx=2, cnt=3, seq=0, payload=b"c"), PEER, 0.0)
    r.receive_datagram(data(msg=4, idx=0, cnt=3, seq=1, payload=b"a"), PEER, 0.0)
    assert received(r) == [] and r.buffered == 2 and r.memory.used > after_admission
    r.receive_datagram(data(msg=4, idx=1, cnt=3, seq=2, payload=b"b"), PEER, 0.0)
    assert [e.data for e in received(r)] == [b"abc"]
    assert r.buffered == 0


def test_data_before_the_whole_announce_is_dropped_then_msr_one_goes_out_in_order():
    r = AtpReceiver()
    m = control.Manifest(total=4, vector_len=None, groups=(control.GroupShape.from_ids(0, 0.5, [1]),
                                                           control.GroupShape.from_ids(1, 1.0, [0, 2, 3]))).encode()
    admit(r, 1, None, 4, chunk=m[:20], pkt_idx=0, pkt_cnt=2)  # part 0 of 2 admits the job
    r.receive_datagram(data(msg=2, seq=1, group=1, approx=False, payload=b"2"), PEER, 0.0)
    assert r.dropped["before_announce"] == 1 and outputs(r) == []
    r.receive_datagram(fin(1), PEER, 0.0)
    assert r.dropped["fin_before_announce"] == 1 and outputs(r) == []
    r.receive_datagram(announce(1, None, 4, chunk=m[20:], pkt_idx=1, pkt_cnt=2), PEER, 0.0)
    assert [h.type for h, _ in outputs(r)] == [wire.PacketType.ACK]
    for msg, group, seq in ((2, 1, 2), (0, 1, 3), (1, 0, 4)):
        r.receive_datagram(data(msg=msg, seq=seq, group=group, approx=not group, payload=b"%d" % msg), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [0, 2, 1]  # group 1 in id order (2 waited for 0), group 0 at once
    r.receive_datagram(data(msg=5, seq=5, group=1, approx=False, payload=b"x"), PEER, 0.0)
    assert r.dropped["msg_id_out_of_range"] == 1  # N = 4
    r.receive_datagram(data(msg=3, seq=6, group=1, approx=False, payload=b"3"), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [3]


def test_msr_one_message_waits_for_its_predecessor():
    r = AtpReceiver()
    admit(r, 1, [(7, 1.0, [0, 1, 2])], 3)
    r.receive_datagram(data(msg=2, seq=0, group=7, approx=False), PEER, 0.0)
    r.receive_datagram(data(msg=1, seq=1, group=7, approx=False), PEER, 0.0)
    assert received(r) == [] and r.buffered == 2
    r.receive_datagram(data(msg=0, seq=2, group=7, approx=False), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [0, 1, 2] and r.buffered == 0


def test_msr_one_group_with_several_ranges_goes_out_in_id_order():
    r = AtpReceiver()
    admit(r, 1, [(7, 1.0, [0, 1, 5, 6, 9]), (0, 0.5, [2, 3, 4, 7, 8])], 10)
    for seq, msg in enumerate((9, 6, 5, 1, 0)):
        r.receive_datagram(data(msg=msg, seq=seq, group=7, approx=False), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [0, 1, 5, 6, 9]


def test_fin_gets_done_listing_lost_messages_and_repeats_it():
    r = AtpReceiver(config=AtpConfig(finished_linger_s=1.0))
    admit(r, 1, [(0, 0.5, range(5))], 5)
    r.receive_datagram(data(msg=1, seq=1), PEER, 0.0)
    r.receive_datagram(data(msg=3, seq=2), PEER, 0.0)
    outputs(r)
    r.receive_datagram(fin(1), PEER, 0.5)
    done = outputs(r)
    assert [(h.type, h.pkt_idx, h.pkt_cnt, h.seq) for h, _ in done] == [(wire.PacketType.DONE, 0, 1, 2000)]
    assert wire.decode_done_payload(done[0][1]) == [(0, 1), (2, 3), (4, 5)]
    finished = [e for e in iter(r.next_event, None) if isinstance(e, events.JobFinished)]
    assert finished[0].result.lost_ids == (0, 2, 4) and finished[0].result.groups[0].delivered == 2
    assert finished[0].result.lost_ranges == ((0, 1), (2, 3), (4, 5)) and finished[0].result.lost == 3
    r.receive_datagram(fin(1), PEER, 0.6)
    assert [wire.decode_done_payload(p) for _, p in outputs(r)] == [[(0, 1), (2, 3), (4, 5)]]
    r.receive_datagram(fin(1), ("10.9.9.9", 1), 0.6)  # someone else's FIN gets nothing
    assert outputs(r) == [] and r.dropped["wrong_source"] == 1
    assert r.get_timer() == 1.5
    r.handle_timer(1.5)
    assert r.jobs == {} and r.memory.used == 0


def test_large_lost_lists_are_split_over_done_parts():
    r = AtpReceiver(config=AtpConfig(packet_size=132))  # 100-byte payloads: 12 ranges per part
    admit(r, 1, [(0, 0.0, range(100))], 100)
    for seq, msg in enumerate(range(1, 100, 2)):  # every odd message arrives: 50 one-id gaps
        r.receive_datagram(data(msg=msg, seq=seq), PEER, 0.0)
    outputs(r)
    r.receive_datagram(fin(1), PEER, 0.0)
    done = outputs(r)
    assert len(done) == 5 and {h.pkt_cnt for h, _ in done} == {5}
    assert wire.range_ids([rg for _, p in done for rg in wire.decode_done_payload(p)]) == list(range(0, 100, 2))


def test_lost_ids_come_from_the_delivered_bitmap_across_chunks():
    n = 5000  # five 1024-message chunks: one full, some partial, some never touched
    r = AtpReceiver()
    admit(r, 1, [(0, 0.0, range(n))], n)
    got = set(range(0, 1024)) | {1500, 1501, 2047, 4999}
    for seq, msg in enumerate(sorted(got)):
        r.receive_datagram(data(msg=msg, seq=seq), PEER, 0.0)
    r.receive_datagram(fin(1), PEER, 0.0)
    (result,) = [e.result for e in iter(r.next_event, None) if isinstance(e, events.JobFinished)]
    assert result.lost_ids == tuple(i for i in range(n) if i not in got)


def test_limits_and_the_memory_budget_drop_unacknowledged():
    cfg = AtpConfig(max_messages=100, max_packets_per_message=4, memory_budget_bytes=1 << 16, max_jobs=1)
    r = AtpReceiver(config=cfg)
    admit(r, 1, [(0, 0.5, range(100))], 100)
    r.receive_datagram(data(msg=100, seq=0), PEER, 0.0)
    r.receive_datagram(data(msg=1, cnt=5, seq=1), PEER, 0.0)
    r.receive_datagram(data(msg=2, cnt=4, seq=2, payload=b"x" * 40000), PEER, 0.0)
    r.receive_datagram(data(msg=3, cnt=4, seq=3, payload=b"x" * 40000), PEER, 0.0)
    assert r.dropped == {"msg_id_out_of_range": 1, "too_many_packets": 1, "memory_budget": 1}
    assert r.buffered == 40000 and r.memory.used <= r.memory.limit
    assert len(outputs(r)) == 1  # dropped packets are not acknowledged
    assert r.stats()["memory"]["peak"] == r.memory.peak <= 1 << 16


def test_oversized_job_announce_is_rejected():
    r = AtpReceiver(config=AtpConfig(max_messages=10))
    admit(r, 1, [(0, 0.5, range(11))], 11)
    before = r.dropped["job_rejected"]  # admit()'s echo of the token, if the job was admitted without one
    r.receive_datagram(data(msg=0, seq=1), PEER, 0.0)
    assert r.malformed["bad_announce"] == 1 and r.dropped["job_rejected"] == before + 1
    assert r.jobs[1].rejected is not None and "max_messages" in r.jobs[1].rejected
    assert [type(e) for e in iter(r.next_event, None)] == [events.JobRejected]
    assert len(r.slots) == 0  # a rejected job holds no slot


def test_accept_jobs_limits_which_jobs_are_admitted():
    r = AtpReceiver(accept_jobs=1)
    admit(r, 1, [(0, 0.5, [0])], 1)
    r.receive_datagram(announce(2, [(0, 0.5, [0])], 1), PEER, 0.0)
    assert outputs(r) == [] and r.dropped["not_accepting_jobs"] == 1  # not even a RETRY


def test_packets_contradicting_the_announce_are_dropped():
    r = AtpReceiver()
    admit(r, 1, [(0, 0.5, [0, 1]), (3, 0.5, [2])], 3)
    r.receive_datagram(data(msg=2, group=0, seq=1), PEER, 0.0)  # message 2 belongs to group 3
    r.receive_datagram(data(msg=0, cnt=2, seq=2), PEER, 0.0)
    r.receive_datagram(data(msg=0, cnt=3, idx=1, seq=3), PEER, 0.0)  # pkt_cnt changed mid-message
    assert r.malformed["inconsistent_message"] == 2 and received(r) == []
    r.receive_datagram(data(msg=2, group=3, seq=4), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [2]


@pytest.mark.parametrize("grants", [False, True], ids=["no-grants", "grants"])
def test_acks_are_coalesced_per_batch_and_every_ack_every_packets(grants):
    """Packets of one job received in one batch share an ACK: it echoes the newest, its SACK blocks cover the
    rest; at most ``ack_every`` packets wait; another queue byte or CE mark sends the waiting ACK first. A granting
    receiver's ACKs are the same, each with the grant past the packet it echoes (a budget of 8)."""
    r = AtpReceiver(config=AtpConfig(ack_every=4, receiver_grants=grants, grant_window_packets=8))
    admit(r, 1, [(0, 0.5, range(20))], 20, seq=99)
    for seq in range(100, 110):
        r.receive_datagram(data(msg=seq - 100, seq=seq, queue=2), PEER, 0.0)
    acks = outputs(r)
    assert [h.seq for h, _ in acks] == [103, 107, 109]
    assert [h.type for h, _ in acks] == [wire.PacketType.ACK] * 3
    decoded = [wire.decode_ack(p, h.flags) for h, p in acks]
    assert decoded[-1][0] == [(99, 109)]
    assert [g for _, g, _ in decoded] == ([h.seq + 1 + 8 for h, _ in acks] if grants else [None] * 3)
    r.receive_datagram(data(msg=10, seq=110, queue=2), PEER, 0.0)
    r.receive_datagram(data(msg=11, seq=111, queue=5), PEER, 0.0)  # another queue: the first ACK goes at once
    r.receive_datagram(data(msg=12, seq=112, queue=5), PEER, 0.0, ce=True)  # CE: likewise
    acks = outputs(r)
    assert [(h.seq, h.queue, bool(h.flags & wire.Flags.ECE)) for h, _ in acks] == [(110, 2, False), (111, 5, False),
                                                                                    (112, 5, True)]


def test_waiting_acks_go_before_the_done():
    r = AtpReceiver(config=AtpConfig(ack_every=16))
    admit(r, 1, [(0, 0.5, range(3))], 3)
    r.receive_datagram(data(msg=0, seq=1), PEER, 0.0)
    r.receive_datagram(fin(1), PEER, 0.0)
    assert [h.type for h, _ in outputs(r)] == [wire.PacketType.ACK, wire.PacketType.DONE]


def test_collected_messages_are_handed_over_once():
    r = AtpReceiver(collect_messages=True)
    admit(r, 1, [(0, 0.5, range(4))], 4)
    r.receive_datagram(data(msg=1, seq=0, payload=b"one"), PEER, 0.0)
    r.receive_datagram(data(msg=2, seq=1, payload=b"two"), PEER, 0.0)
    assert received(r) == []  # no event per message
    assert r.take_messages(1) == {1: b"one", 2: b"two"} and r.take_messages(1) == {}
    r.collect_messages = False
    r.receive_datagram(data(msg=3, seq=2, payload=b"three"), PEER, 0.0)
    assert [e.data for e in received(r)] == [b"three"]
