"""Every byte a receiver sends is bounded by what asked for it (docs/hostlib.md, threat model).

A job's replies (ACKs and DONE parts) total at most ``REPLY_FACTOR`` (3) times the bytes of the datagrams its
sender sent, the QUIC rule for unvalidated addresses (RFC 9000 §8.1) applied to every job; a DONE lists lost ids
as ranges, so it is O(gaps), never O(N). Counted in ``stats()["replies"]``. Both cores.
"""
from __future__ import annotations

import pytest

from netapprox.hostlib import control, core, events, wire
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.receiver import REPLY_FACTOR, AtpReceiver
from hostlib_sim import RECEIVER_ADDR, SENDER_ADDR, admit, announce, token_for

from test_hostlib_receiver import data, fin

pytestmark = pytest.mark.usefixtures("cores")

PEER = SENDER_ADDR


def sent_and_received(r: AtpReceiver, datagrams: list[bytes], now: float = 0.0) -> tuple[int, int]:
    """Feed ``datagrams`` from PEER; returns (bytes in, reply bytes out)."""
    out = 0
    for d in datagrams:
        r.receive_datagram(d, PEER, now)
        out += sum(len(x) for x, _ in r.datagrams_to_send(now))
    return sum(len(d) for d in datagrams), out


def test_a_huge_declared_job_gets_one_range_not_n_ids():
    n = 1 << 20  # the receiver's max_messages: a job that sends nothing but its announce and a FIN
    r = AtpReceiver(config=AtpConfig(finished_linger_s=10.0))
    admit(r, 1, [(0, 0.0, range(n))], n, peer=PEER)
    r.receive_datagram(fin(1), PEER, 0.0)
    (done,) = [wire.decode(d) for d, _ in r.datagrams_to_send(0.0)]
    assert done[0].type == wire.PacketType.DONE and wire.decode_done_payload(done[1]) == [(0, n)]
    (finished,) = [e for e in iter(r.next_event, None) if isinstance(e, events.JobFinished)]
    assert finished.result.lost == n and finished.result.lost_ranges == ((0, n),)


def test_repeated_fins_buy_at_most_three_times_their_bytes():
    # 2,000 one-byte messages, every other one delivered: 1,000 gaps, a DONE of ~8 KB in 6 parts.
    n = 2000
    r = AtpReceiver(config=AtpConfig(finished_linger_s=10.0, ack_every=16))
    admit(r, 1, [(0, 0.0, range(n))], n, peer=PEER)
    before = r.stats()["replies"]
    request, reply = sent_and_received(r, [data(msg=m, seq=m) for m in range(0, n, 2)])
    request += before["request_bytes"]
    reply += before["reply_bytes"]
    fins = [fin(1, seq=5000)] * 10_000  # an attacker repeating the FIN (one seq: the sender's own FIN)
    fin_bytes, done_bytes = sent_and_received(r, fins)
    request += fin_bytes
    reply += done_bytes
    stats = r.stats()["replies"]
    assert reply <= REPLY_FACTOR * request
    assert stats["reply_bytes"] == reply and stats["request_bytes"] == request
    # 10,000 FINs of 32 bytes buy 960,000 bytes: every DONE part still went out (~115 whole DONEs)...
    assert done_bytes > 100 * 8000
    # ... and never more than their factor: without the limit they would have cost 10,000 whole DONEs (~80 MB).
    assert done_bytes <= REPLY_FACTOR * (fin_bytes + request)


def test_the_first_done_of_a_legitimate_job_goes_out_whole():
    n = 5000
    r = AtpReceiver(config=AtpConfig(finished_linger_s=10.0))
    admit(r, 1, [(0, 0.5, range(n))], n, peer=PEER)
    payload = bytes(300)
    sent_and_received(r, [data(msg=m, seq=m, payload=payload) for m in range(n) if m % 3])
    r.receive_datagram(fin(1), PEER, 0.0)
    done = [wire.decode(d) for d, _ in r.datagrams_to_send(0.0)]
    assert {h.pkt_cnt for h, _ in done} == {len(done)} and len(done) >= 2
    ranges = [rg for _, p in done for rg in wire.decode_done_payload(p)]
    assert wire.range_ids(ranges) == list(range(0, n, 3))
    assert r.stats()["replies"].get("done_deferred", 0) == 0


def test_acks_of_tiny_out_of_order_packets_carry_fewer_sack_blocks():
    """One-byte DATA packets, each a new SACK range: a full ACK (16 blocks, 162 bytes) would be ~5x the packet."""
    r = AtpReceiver(config=AtpConfig(ack_every=1))
    n = 400
    admit(r, 1, [(0, 0.0, range(n))], n, peer=PEER)
    r.datagrams_to_send(0.0)
    base = r.stats()["replies"]
    request, reply = sent_and_received(r, [data(msg=m, seq=2 * m) for m in range(n)])  # seq gaps: a range each
    assert reply <= REPLY_FACTOR * (request + base["request_bytes"]) - base["reply_bytes"]
    assert r.stats()["replies"]["sack_trimmed"] > 0


def test_a_forged_done_cannot_make_the_sender_walk_billions_of_ids():
    """A DONE saying every id up to 2^32 - 1 is lost costs the sender O(its own N), not 4 billion steps."""
    s = core.AtpSender(JobSpec.uniform(3, messages=10, size=10, msr=0.5), peer=RECEIVER_ADDR, now=0.0)
    r = AtpReceiver()
    now, fin_h = 0.0, None
    for _ in range(1000):
        for d, _addr in s.datagrams_to_send(now):
            h, _ = wire.decode(d)
            if h.msg_id == control.FIN_MSG_ID:
                fin_h = h
                break
            r.receive_datagram(d, SENDER_ADDR, now)
        if fin_h is not None:
            break
        for d, _addr in r.datagrams_to_send(now):
            s.receive_datagram(d, RECEIVER_ADDR, now)
        now = max(now, min(t for t in (s.get_timer(), now + 1e-3) if t is not None))
        s.handle_timer(now)
    assert fin_h is not None, "the sender never sent its FIN"
    (part,) = wire.encode_done_payloads([0, 2**32 - 1], 1368)
    s.receive_datagram(wire.encode_done(job_id=3, seq=fin_h.seq, pkt_idx=0, pkt_cnt=1, payload=part), RECEIVER_ADDR,
                       now)
    assert s.summary is not None and s.summary.receiver_confirmed and s.summary.lost_ids == tuple(range(10))


def test_a_manifest_is_checked_cheaply_before_its_ranges_are_read():
    """Counts that do not add up are found from the groups' fixed parts: the ranges (here garbage, which a
    range check would name) are never read."""
    head = control._HEAD.pack(control._MAGIC, 100_001, control.NO_VECTOR, 2)
    groups = b"".join(control._GROUP.pack(gid, 0, 50_000, 50_000) + bytes(400_000) for gid in (1, 2))
    with pytest.raises(wire.MalformedPacket, match="do not cover exactly"):
        control.Manifest.decode(head + groups, max_messages=1 << 20)
    with pytest.raises(wire.MalformedPacket, match="trailing bytes"):
        control.Manifest.decode(head + groups + b"x", max_messages=1 << 20)


def announce_in_parts(r: AtpReceiver, job: int, chunk: bytes, peer, now: float) -> None:
    """Admit ``job`` and send its manifest ``chunk`` in 1,300-byte announce parts, as a sender does."""
    pieces = [chunk[i:i + 1300] for i in range(0, len(chunk), 1300)]
    token = token_for(r, announce(job, None, 0, chunk=pieces[0], pkt_cnt=len(pieces)), peer, now)
    for i, piece in enumerate(pieces):
        r.receive_datagram(announce(job, None, 0, chunk=piece, pkt_idx=i, pkt_cnt=len(pieces), token=token,
                                    seq=1000 + i), peer, now)
    r.datagrams_to_send(now)


def test_manifest_decoding_is_rate_limited_per_source():
    """A source that keeps announcing 1 MiB manifests has them decoded at ``manifest_bytes_per_s`` on average;
    another source's announce is decoded at once."""
    n = 1 << 16  # two groups of 65,536 one-id ranges each, interleaved: a 1 MiB manifest
    cfg = AtpConfig(manifest_bytes_per_s=2 << 20, max_messages=2 * n, max_jobs=64, max_jobs_per_source=64,
                    memory_budget_bytes=1 << 30)
    r = AtpReceiver(config=cfg)
    chunk = control.Manifest(total=2 * n, vector_len=None,
                             groups=(control.GroupShape.from_ids(0, 0.5, range(0, 2 * n, 2)),
                                     control.GroupShape.from_ids(1, 0.5, range(1, 2 * n, 2)))).encode()
    assert len(chunk) > 1 << 20
    decoded = []
    for job in range(1, 11):  # ten 1 MiB manifests in one second from one host
        announce_in_parts(r, job, chunk, PEER, job * 0.1)
        if r.jobs[job].manifest is not None:
            decoded.append(job)
    # a one-second bucket of 2 MiB that may go into debt: at most 2 MiB + 2 MiB/s x 0.9 s + one manifest
    rate = cfg.manifest_bytes_per_s
    assert len(decoded) * len(chunk) <= rate + rate * 0.9 + len(chunk)
    assert decoded[:2] == [1, 2] and len(decoded) < 10 and r.dropped["manifest_rate"] == 10 - len(decoded)
    announce_in_parts(r, 99, chunk, ("10.0.0.9", 40000), 1.0)  # another host is not held back
    assert r.jobs[99].manifest is not None
    # the first host's debt (at most one manifest) is repaid half a second later: it is decoded again
    announce_in_parts(r, 50, chunk, PEER, 1.0 + len(chunk) / rate)
    assert r.jobs[50].manifest is not None


def test_manifest_decoding_is_bounded_in_all_but_small_manifests_pass():
    """Eight hosts announcing 1 MiB manifests are decoded at twice one host's rate in all; a job with an ordinary
    (small) manifest from a ninth host is decoded at once meanwhile."""
    n = 1 << 16
    cfg = AtpConfig(manifest_bytes_per_s=1 << 20, max_messages=2 * n, max_jobs=128, max_jobs_per_source=64,
                    memory_budget_bytes=1 << 30)
    r = AtpReceiver(config=cfg)
    chunk = control.Manifest(total=2 * n, vector_len=None,
                             groups=(control.GroupShape.from_ids(0, 0.5, range(0, 2 * n, 2)),
                                     control.GroupShape.from_ids(1, 0.5, range(1, 2 * n, 2)))).encode()
    decoded = 0
    job = 0
    for step in range(10):  # one second: every host announces one manifest every 0.1 s
        for host in range(8):
            job += 1
            announce_in_parts(r, job, chunk, (f"10.0.1.{host}", 40000), step * 0.1)
            decoded += r.jobs[job].manifest is not None
    total_rate = 2 * cfg.manifest_bytes_per_s
    assert decoded * len(chunk) <= total_rate + total_rate * 0.9 + len(chunk)
    assert r.dropped["manifest_rate"] == 80 - decoded > 0
    admit(r, 9999, [(0, 0.5, range(100))], 100, peer=("10.0.2.1", 40000), now=0.95)
    assert r.jobs[9999].manifest is not None
