"""Message packing (docs/wire-format.md, "DATA"): a DATA packet carries several whole one-packet messages of one
group with the same tags, up to ``packet_size``; loss, MRDF, the MSR guarantee and acknowledgements stay per
message. Two endpoints in memory with a virtual clock, both cores."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message, Tags, pattern_bytes
from netapprox.hostlib.receiver import AtpReceiver
from hostlib_sim import SENDER_ADDR, Path, admit, messages_in, run_job
from test_hostlib_transfer import assert_guarantee

pytestmark = pytest.mark.usefixtures("cores")

FAST = AtpConfig(max_rate_bps=50e6)


class Wire(Path):
    """A path that also keeps every datagram offered to it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.datagrams: list[bytes] = []

    def transit(self, data: bytes, now: float):
        self.datagrams.append(data)
        return super().transit(data, now)


def check_packets(datagrams: list[bytes], job: JobSpec, config: AtpConfig) -> int:
    """Every packed packet is well formed and holds only what packing may put together; returns how many
    packed packets there were."""
    packed = 0
    for d in datagrams:
        h, payload = wire.decode(d)
        if h.type != wire.PacketType.DATA or h.msg_id in control.CONTROL_MSG_IDS:
            continue
        assert len(d) <= config.packet_size
        if h.count == 1:
            continue
        packed += 1
        records = wire.decode_records(payload, h)
        first = job.messages[h.msg_id]
        for mid, data in records:
            m = job.messages[mid]
            assert data == m.data, "a record carries its whole message"
            assert len(m.data) <= config.max_payload and m.group_id == h.group_id == first.group_id
            assert (m.tags or job.tags) == (first.tags or job.tags)
    return packed


_TAGS = [None, Tags(priority=1), Tags(priority=2, deadline_s=0.5)]


@st.composite
def jobs(draw):
    sizes = draw(st.lists(st.one_of(st.integers(0, 40), st.integers(41, 600), st.integers(1300, 1400),
                                    st.integers(1401, 4000)), min_size=1, max_size=60))
    msgs = tuple(Message(pattern_bytes(i, s), group_id=draw(st.sampled_from([0, 0, 1])),
                         tags=draw(st.sampled_from(_TAGS))) for i, s in enumerate(sizes))
    return JobSpec(job_id=5, messages=msgs, msr=draw(st.floats(0.0, 1.0)), group_msr={1: draw(st.sampled_from([0.5, 1.0]))})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(job=jobs(), loss=st.sampled_from([0.0, 0.1, 0.4]), jitter=st.sampled_from([0.0, 0.002]),
       dup=st.sampled_from([0.0, 0.1]), mode=st.sampled_from(["adaptive", "paper", "base"]), seed=st.integers(0, 99))
def test_any_mix_of_message_sizes_packs_and_keeps_the_guarantee(job, loss, jitter, dup, mode, seed):
    """Tiny, medium, near-MTU and multi-packet messages in two groups with three tag sets, over lossy,
    reordering, duplicating paths: every MSR met, every message byte-exact and delivered once, and every packed
    packet holds whole one-packet messages of one group with the same tags."""
    cfg = dataclasses.replace(FAST, mode=mode)
    forward = Wire(loss=loss, jitter=jitter, duplicate=dup, seed=seed)
    run = run_job(job, cfg, forward=forward, reverse=Path(loss=loss / 2, jitter=jitter, seed=seed + 1), until=900)
    assert_guarantee(run, job)
    check_packets(forward.datagrams, job, cfg)


def test_small_messages_share_packets_and_loss_stays_per_message():
    """1000 messages of 100 bytes: 12 per 1400-byte packet (106 bytes with the record header) instead of one each.
    With a quarter of the packets dropped, the sender gives up whole messages (a lost packet loses its 12) within
    the budget."""
    job = JobSpec.uniform(6, messages=1000, size=100, msr=0.7)
    for pack, most in ((True, 1000 // 12 + 1), (False, 1000)):
        forward = Wire()
        run = run_job(job, dataclasses.replace(FAST, pack_messages=pack), forward=forward)
        assert_guarantee(run, job)
        data = [d for d in forward.datagrams if wire.decode(d)[0].msg_id < 1000]
        assert len(data) <= most and (not pack or check_packets(data, job, FAST) >= len(data) - 1)
    forward = Wire(loss=0.25, seed=3)
    run = run_job(job, FAST, forward=forward)
    assert_guarantee(run, job)
    lost_in_packets = set()
    for d in forward.datagrams:
        h, p = wire.decode(d)
        if h.msg_id < 1000:
            lost_in_packets |= set(messages_in(h, p))
    assert set(run.summary.lost_ids) <= lost_in_packets and len(run.summary.lost_ids) <= 300


def test_a_packet_is_packed_only_with_what_is_ready_and_never_waits():
    """Three one-packet messages after a large one: MRDF sends the small ones first, packed, at once; the large
    message follows in its own packets (a message that spans packets is never packed)."""
    job = JobSpec(job_id=7, messages=(Message(b"L" * 3000), Message(b"a" * 10), Message(b"b" * 20),
                                      Message(b"c" * 30)))
    forward = Wire(delay=0.001)
    run = run_job(job, FAST, forward=forward)
    assert_guarantee(run, job)
    first = [wire.decode(d) for d in forward.datagrams[:3]]
    assert first[0][0].msg_id == control.ANNOUNCE_MSG_ID
    assert messages_in(*first[1]) == [1, 2, 3] and first[1][0].count == 3
    assert [h.msg_id for h, _ in first[2:]] == [0] and first[2][0].pkt_cnt == 3


def test_the_receiver_takes_a_packed_packet_whole_or_not_at_all():
    r = AtpReceiver(config=AtpConfig(ack_every=1, max_jobs=4, memory_budget_bytes=1 << 20))
    admit(r, 1, [(0, 0.5, range(10)), (1, 1.0, range(10, 20))], 20)

    def packed(records, seq, group=0, msg_id=None):
        h = wire.Header(flags=wire.Flags.APPROX, job_id=1, msg_id=records[0][0] if msg_id is None else msg_id,
                        group_id=group, seq=seq, count=len(records))
        return wire.encode(h, wire.encode_records(records))

    r.receive_datagram(packed([(0, b"x"), (1, b"yy"), (2, b"")], seq=1), SENDER_ADDR, 0.0)
    ((h, _), _), = [(wire.decode(d), a) for d, a in r.datagrams_to_send(0.0)]
    assert h.type == wire.PacketType.ACK and h.seq == 1 and h.msg_id == 0
    assert [(e.msg_id, e.data) for e in iter(r.next_event, None)] == [(0, b"x"), (1, b"yy"), (2, b"")]
    bad = [packed([(3, b"a"), (11, b"b")], seq=2),  # message 11 is in group 1
           packed([(3, b"a"), (99, b"b")], seq=3),  # past N
           packed([(3, b"a"), (4, b"b")], seq=4, msg_id=4),  # the header names another first message
           packed([(3, b"a"), (3, b"b")], seq=5)]  # a message twice
    for d in bad:
        r.receive_datagram(d, SENDER_ADDR, 0.0)
    assert r.datagrams_to_send(0.0) == [] and list(iter(r.next_event, None)) == []
    assert r.malformed == {"inconsistent_message": 1, "bad_pack": 2} and r.dropped == {"msg_id_out_of_range": 1}
    r.receive_datagram(packed([(1, b"yy"), (5, b"z")], seq=6), SENDER_ADDR, 0.0)  # one record came before
    assert len(r.datagrams_to_send(0.0)) == 1 and [e.msg_id for e in iter(r.next_event, None)] == [5]
    r.receive_datagram(packed([(1, b"yy"), (5, b"z")], seq=7), SENDER_ADDR, 0.0)  # all came before: a duplicate
    assert len(r.datagrams_to_send(0.0)) == 1 and r.jobs[1].duplicates == 1
    r.receive_datagram(packed([(11, b"1"), (10, b"0")], seq=8, group=1), SENDER_ADDR, 0.0)  # MSR 1: in id order
    r.datagrams_to_send(0.0)
    assert [e.msg_id for e in iter(r.next_event, None)] == [10, 11]
    assert r.buffered == 0


def test_a_packed_packet_that_does_not_fit_the_budget_is_dropped_whole():
    cfg = AtpConfig(max_jobs=2, memory_budget_bytes=64 << 10)  # 16 KiB guaranteed each, a 32 KiB pool
    r = AtpReceiver(config=cfg)
    admit(r, 1, [(0, 1.0, range(100))], 100)
    used = r.memory.used
    h = wire.Header(job_id=1, msg_id=50, seq=1, count=60)
    records = [(50 + i, b"h" * 1000) for i in range(50)] + [(i, b"h") for i in range(1, 11)]
    r.receive_datagram(wire.encode(h, wire.encode_records(records)), SENDER_ADDR, 0.0)  # 50 KB held (MSR 1)
    assert r.dropped["memory_budget"] == 1 and r.datagrams_to_send(0.0) == [] and r.memory.used == used
    r.receive_datagram(wire.encode(wire.Header(job_id=1, msg_id=control.FIN_MSG_ID, seq=2)), SENDER_ADDR, 0.0)
    (done,) = [e for e in iter(r.next_event, None) if isinstance(e, events.JobFinished)]
    assert done.result.lost_ranges == ((0, 100),)  # nothing taken from it
