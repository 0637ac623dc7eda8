"""The receiver alone: garbage, limits, duplicates, SACK blocks, the announce/FIN/DONE exchange."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import AtpConfig
from netapprox.hostlib.receiver import AtpReceiver

PEER = ("10.0.0.1", 40000)


def data(job=1, msg=0, idx=0, cnt=1, seq=0, group=0, approx=True, payload=b"p", queue=wire.QUEUE_UNSET):
    h = wire.Header(flags=wire.Flags.APPROX if approx else 0, queue=queue, job_id=job, msg_id=msg, group_id=group,
                    pkt_idx=idx, pkt_cnt=cnt, seq=seq)
    return wire.encode(h, payload)


def announce(job, groups, total, seq=1000, vector_len=None):
    m = control.Manifest(total=total, vector_len=vector_len,
                         groups=tuple(control.GroupShape(g, msr, tuple(ids)) for g, msr, ids in groups))
    return data(job=job, msg=control.ANNOUNCE_MSG_ID, seq=seq, approx=False, payload=m.encode())


def fin(job, seq=2000):
    return data(job=job, msg=control.FIN_MSG_ID, seq=seq, approx=False, payload=b"")


def outputs(r):
    return [wire.decode(d) for d, _ in r.datagrams_to_send(0.0)]


def received(r):
    return [e for e in iter(r.next_event, None) if isinstance(e, events.MessageReceived)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=20))
def test_random_garbage_never_crashes_and_is_counted(blobs):
    r = AtpReceiver()
    for b in blobs:
        r.receive_datagram(b, PEER, 0.0)
    assert r.datagrams == len(blobs)
    handled = sum(r.malformed.values()) + sum(r.dropped.values()) + sum(j.packets for j in r.jobs.values())
    assert handled + sum(1 for j in r.jobs.values() for _ in j.announce_parts) <= len(blobs)
    r.datagrams_to_send(0.0)
    r.handle_timer(1e9)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 31), st.integers(0, 255), st.binary(min_size=1, max_size=4))
def test_corrupted_valid_packets_never_crash(pos, value, tail):
    good = bytearray(data(job=3, msg=5, idx=1, cnt=3, seq=9, payload=b"abcdef"))
    good[pos] = value
    r = AtpReceiver()
    r.receive_datagram(bytes(good) + tail, PEER, 0.0)
    r.receive_datagram(bytes(good[:pos]), PEER, 0.0)
    assert r.datagrams == 2


def test_garbage_is_counted_by_reason():
    r = AtpReceiver()
    r.receive_datagram(b"\x00" * 5, PEER, 0.0)
    r.receive_datagram(bytes([0x21]) + data()[1:], PEER, 0.0)
    r.receive_datagram(wire.encode(wire.Header(type=wire.PacketType.ACK, job_id=1)), PEER, 0.0)
    r.receive_datagram(data(job=0), PEER, 0.0)
    assert r.malformed == {"truncated": 1, "bad_version": 1, "not_data": 1, "job_zero": 1}
    assert r.datagrams_to_send(0.0) == []


def test_every_data_packet_is_acked_with_echoed_fields_queue_and_sack_blocks():
    r = AtpReceiver()
    for seq in (0, 1, 2, 5, 6, 9):
        r.receive_datagram(data(msg=seq, seq=seq, queue=4, cnt=2), PEER, 0.0)
    acks = outputs(r)
    assert len(acks) == 6
    h, payload = acks[-1]
    assert h.type == wire.PacketType.ACK and h.seq == 9 and h.msg_id == 9 and h.queue == 4 and h.pkt_cnt == 2
    assert wire.decode_ack_payload(payload) == [(9, 9), (5, 6), (0, 2)]  # newest first


def test_duplicates_are_acked_but_delivered_once():
    r = AtpReceiver()
    for _ in range(3):
        r.receive_datagram(data(msg=1, seq=7, payload=b"one"), PEER, 0.0)
    assert len(outputs(r)) == 3
    assert [(e.msg_id, e.data) for e in received(r)] == [(1, b"one")]
    assert r.jobs[1].duplicates == 2


def test_message_is_delivered_only_when_all_packets_arrived():
    r = AtpReceiver()
    r.receive_datagram(data(msg=4, idx=2, cnt=3, seq=0, payload=b"c"), PEER, 0.0)
    r.receive_datagram(data(msg=4, idx=0, cnt=3, seq=1, payload=b"a"), PEER, 0.0)
    assert received(r) == []
    r.receive_datagram(data(msg=4, idx=1, cnt=3, seq=2, payload=b"b"), PEER, 0.0)
    assert [e.data for e in received(r)] == [b"abc"]
    assert r.buffered == 0


def test_msr_one_messages_wait_for_the_announce_and_go_out_in_order():
    r = AtpReceiver()
    r.receive_datagram(data(msg=2, seq=0, group=1, approx=False, payload=b"2"), PEER, 0.0)
    r.receive_datagram(data(msg=0, seq=1, group=1, approx=False, payload=b"0"), PEER, 0.0)
    r.receive_datagram(data(msg=1, seq=2, group=0, payload=b"1"), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [1]  # approximate: at once
    r.receive_datagram(announce(1, [(0, 0.5, [1]), (1, 1.0, [0, 2, 3])], total=4), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [0, 2]  # group 1 in id order: 0, 2 (3 not here yet)
    r.receive_datagram(data(msg=5, seq=5, group=1, approx=False, payload=b"x"), PEER, 0.0)
    assert r.dropped["msg_id_out_of_range"] == 1  # N = 4 now known
    r.receive_datagram(data(msg=3, seq=3, group=1, approx=False, payload=b"3"), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [3]


def test_msr_one_message_waits_for_its_predecessor():
    r = AtpReceiver()
    r.receive_datagram(announce(1, [(7, 1.0, [0, 1, 2])], total=3), PEER, 0.0)
    r.receive_datagram(data(msg=2, seq=0, group=7, approx=False), PEER, 0.0)
    r.receive_datagram(data(msg=1, seq=1, group=7, approx=False), PEER, 0.0)
    assert received(r) == []
    r.receive_datagram(data(msg=0, seq=2, group=7, approx=False), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [0, 1, 2]


def test_fin_gets_done_listing_lost_messages_and_repeats_it():
    r = AtpReceiver(config=AtpConfig(finished_linger_s=1.0))
    r.receive_datagram(announce(1, [(0, 0.5, range(5))], total=5), PEER, 0.0)
    r.receive_datagram(data(msg=1, seq=1), PEER, 0.0)
    r.receive_datagram(data(msg=3, seq=2), PEER, 0.0)
    outputs(r)
    r.receive_datagram(fin(1), PEER, 0.5)
    done = outputs(r)
    assert [(h.type, h.pkt_idx, h.pkt_cnt) for h, _ in done] == [(wire.PacketType.DONE, 0, 1)]
    assert wire.decode_done_payload(done[0][1]) == [0, 2, 4]
    finished = [e for e in iter(r.next_event, None) if isinstance(e, events.JobFinished)]
    assert finished[0].result.lost_ids == (0, 2, 4) and finished[0].result.groups[0].delivered == 2
    r.receive_datagram(fin(1), PEER, 0.6)
    assert [wire.decode_done_payload(p) for _, p in outputs(r)] == [[0, 2, 4]]
    assert r.get_timer() == 1.5
    r.handle_timer(1.5)
    assert r.jobs == {}


def test_fin_before_announce_is_not_answered():
    r = AtpReceiver()
    r.receive_datagram(data(msg=0, seq=0), PEER, 0.0)
    outputs(r)
    r.receive_datagram(fin(1), PEER, 0.0)
    assert outputs(r) == [] and r.dropped["fin_before_announce"] == 1


def test_large_lost_lists_are_split_over_done_parts():
    r = AtpReceiver(config=AtpConfig(packet_size=132))  # 100-byte payloads: 24 ids per part
    r.receive_datagram(announce(1, [(0, 0.0, range(100))], total=100), PEER, 0.0)
    outputs(r)
    r.receive_datagram(fin(1), PEER, 0.0)
    done = outputs(r)
    assert len(done) == 5 and {h.pkt_cnt for h, _ in done} == {5}
    assert [i for _, p in done for i in wire.decode_done_payload(p)] == list(range(100))


def test_limits_bound_memory():
    cfg = AtpConfig(max_messages=100, max_packets_per_message=4, max_buffered_bytes=1000, max_jobs=2)
    r = AtpReceiver(config=cfg)
    r.receive_datagram(data(msg=100, seq=0), PEER, 0.0)
    r.receive_datagram(data(msg=1, cnt=5, seq=1), PEER, 0.0)
    r.receive_datagram(data(msg=2, cnt=4, seq=2, payload=b"x" * 900), PEER, 0.0)
    r.receive_datagram(data(msg=3, cnt=4, seq=3, payload=b"x" * 200), PEER, 0.0)
    r.receive_datagram(data(job=2, msg=0, cnt=2, seq=0), PEER, 0.0)
    r.receive_datagram(data(job=3, msg=0, cnt=2, seq=0), PEER, 0.0)
    assert r.dropped == {"msg_id_out_of_range": 1, "too_many_packets": 1, "buffer_full": 1, "too_many_jobs": 1}
    assert r.buffered == 901
    assert len(outputs(r)) == 2  # dropped packets are not acknowledged


def test_oversized_job_announce_is_rejected():
    r = AtpReceiver(config=AtpConfig(max_messages=10))
    r.receive_datagram(announce(1, [(0, 0.5, range(11))], total=11), PEER, 0.0)
    r.receive_datagram(data(msg=0, seq=1), PEER, 0.0)
    assert r.malformed["bad_announce"] == 1 and r.dropped["job_rejected"] == 1
    assert r.jobs[1].rejected is not None and "max_messages" in r.jobs[1].rejected
    assert [type(e) for e in iter(r.next_event, None)] == [events.JobRejected]


def test_accept_jobs_limits_which_jobs_are_acknowledged():
    r = AtpReceiver(accept_jobs=1)
    r.receive_datagram(data(job=1, seq=0), PEER, 0.0)
    r.receive_datagram(data(job=2, seq=0), PEER, 0.0)
    assert [h.job_id for h, _ in outputs(r)] == [1] and r.dropped["not_accepting_jobs"] == 1


def test_packets_contradicting_the_announce_are_dropped():
    r = AtpReceiver()
    r.receive_datagram(announce(1, [(0, 0.5, [0, 1]), (3, 0.5, [2])], total=3), PEER, 0.0)
    r.receive_datagram(data(msg=2, group=0, seq=1), PEER, 0.0)  # message 2 belongs to group 3
    assert r.malformed["inconsistent_message"] == 1 and received(r) == []
    r.receive_datagram(data(msg=2, group=3, seq=2), PEER, 0.0)
    assert [e.msg_id for e in received(r)] == [2]


def test_announce_contradicting_earlier_packets_rejects_the_job():
    r = AtpReceiver()
    r.receive_datagram(data(msg=0, group=4, seq=0), PEER, 0.0)
    r.receive_datagram(announce(1, [(0, 0.5, [0, 1])], total=2), PEER, 0.0)
    assert r.malformed["bad_announce"] == 1 and r.jobs[1].rejected and r.buffered == 0
