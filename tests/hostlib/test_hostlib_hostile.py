"""Hostile input (model: aioquic's forged-packet tests): admission tokens, the admission key, floods of forged
announces, job slots, the memory budget, forged ACK/DONE/RETRY at the sender, garbage. Two endpoints in memory
with a virtual clock; tests/hostlib/test_hostlib_hostile_io.py repeats the flood over real sockets."""
from __future__ import annotations

import dataclasses
import gc
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec
from netapprox.hostlib.receiver import AtpReceiver
from netapprox.hostlib.sender import AtpSender
from hostlib_sim import (RECEIVER_ADDR, SENDER_ADDR, Path, admit, announce, messages_in, retry_sender, run_job,
                         token_for, token_of)

pytestmark = pytest.mark.usefixtures("cores")

G10 = [(0, 0.5, range(10))]
FAST = AtpConfig(max_rate_bps=50e6)


def out(r, now=0.0):
    return [(wire.decode(d), addr) for d, addr in r.datagrams_to_send(now)]


# --- admission: at once while not under pressure, tokens under pressure ------------------------------

TOKENS = AtpConfig(open_admission_share=0.0)  # a receiver that always asks for a token (always "under pressure")


def test_an_announce_without_token_under_pressure_gets_a_retry_and_no_state():
    r = AtpReceiver(config=TOKENS)
    hello = announce(7, G10, 10, seq=42)
    r.receive_datagram(hello, SENDER_ADDR, 0.0)
    ((d, addr),) = r.datagrams_to_send(0.0)
    h, token = wire.decode(d)
    assert addr == SENDER_ADDR and h.type == wire.PacketType.RETRY
    assert (h.job_id, h.msg_id, h.seq, h.pkt_idx, h.pkt_cnt) == (7, control.ANNOUNCE_MSG_ID, 42, 0, 1)
    assert len(token) == wire.TOKEN_LEN and len(d) == 48 < len(hello)  # never amplifies
    assert r.jobs == {} and r.memory.used == 0 and r.admission == {"retries": 1}
    assert r.stats()["admission_mode"] == "tokens"
    data = wire.encode(wire.Header(flags=1, job_id=7, msg_id=3, seq=43), b"x" * 100)  # the first window behind it
    r.receive_datagram(data, SENDER_ADDR, 0.0)
    assert r.datagrams_to_send(0.0) == [] and r.dropped == {"unknown_job": 1} and r.memory.used == 0


@pytest.mark.parametrize("grants", [False, True], ids=["no-grants", "grants"])
def test_an_announce_without_token_is_admitted_at_once_while_not_under_pressure(grants):
    # told its rate: a receiver not told grants nothing before it has measured one (test_hostlib_mechanisms.py)
    r = AtpReceiver(config=AtpConfig(receiver_grants=grants, max_rate_bps=20e6))
    hello = announce(7, G10, 10, seq=42)
    r.receive_datagram(hello, SENDER_ADDR, 0.0)
    r.receive_datagram(wire.encode(wire.Header(flags=1, job_id=7, msg_id=3, seq=43), b"x" * 100), SENDER_ADDR, 0.0)
    answers = out(r)
    assert [h.type for (h, _), _ in answers] == [wire.PacketType.ACK]  # one coalesced ACK: announce and data
    (h, payload), addr = answers[0]
    blocks, grant, token = wire.decode_ack(payload, h.flags)
    assert addr == SENDER_ADDR and h.seq == 43 and blocks == [(42, 43)]
    assert grant == (44 + r.grant_budget if grants else None)  # a granting receiver: one job, the whole budget
    assert token is not None and h.flags & wire.Flags.TOKEN  # the sender is asked to prove its address
    assert 7 in r.jobs and not r.jobs[7].validated
    assert [e.msg_id for e in iter(r.next_event, None)] == [3]  # the first window's data was kept
    assert r.admission == {"admitted": 1, "admitted_without_token": 1} and r.stats()["admission_mode"] == "open"
    r.receive_datagram(announce(7, G10, 10, seq=44, token=token), SENDER_ADDR, 0.001)  # the echo
    answers = out(r, 0.001)
    assert [h.type for (h, _), _ in answers] == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK]
    (h, new_token), addr = answers[0]  # an address-validation token for the host's next jobs, echoing the echo
    assert addr == SENDER_ADDR and h.seq == 44 and r.tokens.check_address(new_token, SENDER_ADDR, 0.001) is None
    (h, payload), _ = answers[1]
    assert h.type == wire.PacketType.ACK and not h.flags & wire.Flags.TOKEN and r.jobs[7].validated
    assert r.admission["validated"] == 1


def test_a_token_admits_one_job_from_one_address_for_a_limited_time():
    r = AtpReceiver(config=dataclasses.replace(TOKENS, token_lifetime_s=2.0))
    token = token_for(r, announce(7, G10, 10), SENDER_ADDR, 0.0)
    forged = bytes(16 - len(b"forged")) + b"forged"
    for job, src, tok, now, reason in [
            (7, ("10.0.0.9", 40000), token, 0.5, "bad_token"),   # another host
            (7, ("10.0.0.1", 40001), token, 0.5, "bad_token"),   # another port of the same host
            (8, SENDER_ADDR, token, 0.5, "bad_token"),           # another job
            (7, SENDER_ADDR, forged, 0.5, "bad_token"),          # made up
            (7, SENDER_ADDR, token, 2.1, "expired_token")]:      # too late
        r.receive_datagram(announce(job, G10, 10, token=tok), src, now)
        ((h, _), addr), = out(r, now)
        assert h.type == wire.PacketType.RETRY and addr == src, reason  # a fresh token, nothing kept
        assert r.dropped[reason] >= 1 and r.jobs == {} and r.memory.used == 0
    r.receive_datagram(announce(7, G10, 10, token=token), SENDER_ADDR, 1.0)
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK]
    assert 7 in r.jobs and r.jobs[7].validated
    assert r.admission["admitted"] == 1 and r.memory.used > 0
    r.receive_datagram(wire.encode(wire.Header(flags=1, job_id=7, msg_id=3, seq=5), b"x"), ("10.0.0.9", 4), 1.0)
    assert r.dropped["wrong_source"] == 1 and out(r) == []  # the job is bound to the admitted address


def test_pressure_switches_the_receiver_to_tokens_and_back():
    """Slots: at most half (``open_admission_share``) are given without a token; then token-less announces get a
    RETRY until jobs finish, whatever their source address: a source validated a moment ago gets one too, and is
    admitted at once only with the address-validation token its last job was given. Every switch is counted."""
    cfg = AtpConfig(max_jobs=4, max_jobs_per_source=4, memory_budget_bytes=1 << 20)
    r = AtpReceiver(config=cfg)
    peers = [(f"10.0.0.{i}", 9) for i in range(1, 6)]
    for j in (1, 2):
        r.receive_datagram(announce(j, G10, 10), peers[j], 0.0)
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.ACK] * 2 and set(r.jobs) == {1, 2}
    r.receive_datagram(announce(3, G10, 10), peers[3], 0.0)  # 2 of 4 slots held: under pressure
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.RETRY] and 3 not in r.jobs
    assert r.stats()["admission_mode"] == "tokens" and r.admission["to_tokens"] == 1
    answers = admit(r, 4, G10, 10, peer=peers[4], now=0.1)  # with the token of its RETRY: validated
    (new_token,) = [p for h, p in answers if h.type == wire.PacketType.NEW_TOKEN]
    r.receive_datagram(wire.encode(wire.Header(job_id=4, msg_id=control.FIN_MSG_ID, seq=2000)), peers[4], 0.2)
    out(r)
    r.receive_datagram(announce(5, G10, 10), peers[4], 0.3)  # validated 0.2 s ago, but no token: a RETRY
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.RETRY] and 5 not in r.jobs
    r.receive_datagram(announce(5, G10, 10, token=new_token), (peers[4][0], 10), 0.3)  # another port, same host
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK] and 5 in r.jobs
    assert r.jobs[5].validated and r.admission["admitted_by_address_token"] == 1
    for j, p in ((1, peers[1]), (2, peers[2]), (5, (peers[4][0], 10))):
        r.receive_datagram(wire.encode(wire.Header(job_id=j, msg_id=control.FIN_MSG_ID, seq=2000)), p, 0.4)
    out(r)
    r.receive_datagram(announce(6, G10, 10), peers[3], 0.5)
    assert [h.type for (h, _), _ in out(r)] == [wire.PacketType.ACK] and 6 in r.jobs
    assert r.admission["to_open"] == 1 and r.stats()["admission_mode"] == "open"


def test_an_unvalidated_job_holds_at_most_its_guarantee_and_is_sent_no_more_than_it_sent():
    """Admitted at once and never echoing the token (a forged source address, say): its buffer stops at its slot's
    guarantee (the pool is for validated jobs), and what it is sent (ACKs, DONE) never exceeds what came from its
    address. The echo lifts both limits."""
    cfg = AtpConfig(max_jobs=4, memory_budget_bytes=256 << 10, max_jobs_per_source=4)  # 32 KiB guaranteed each
    r = AtpReceiver(config=cfg)
    n = 1000
    r.receive_datagram(announce(1, [(0, 0.5, range(n))], n), SENDER_ADDR, 0.0)
    for m in range(100):  # incomplete messages: buffer the receiver must keep
        r.receive_datagram(wire.encode(wire.Header(flags=1, job_id=1, msg_id=m, pkt_cnt=9, seq=m + 1), b"h" * 1300),
                           SENDER_ADDR, 0.0)
    job = r.jobs[1]
    assert not job.validated and job.charged <= r.memory.guarantee and r.dropped["memory_budget"] > 70
    sent = sum(len(d) for d, _ in r.datagrams_to_send(0.0))
    assert sent <= job.rx_bytes
    # a FIN on a job with every other message delivered (one packed packet of empty records): its DONE lists 101
    # ranges, 844 bytes, more than the 766 its address sent, so an unvalidated job does not get it (deferred until
    # more FINs pay for it); validated (3x), the same job gets it at once
    for validate in (False, True):
        r2 = AtpReceiver(config=cfg)
        r2.receive_datagram(announce(2, [(0, 0.5, range(n))], n), SENDER_ADDR, 0.0)
        token = token_of([wire.decode(d) for d, _ in r2.datagrams_to_send(0.0)])
        if validate:  # the sender echoes the token its ACK carried
            r2.receive_datagram(announce(2, [(0, 0.5, range(n))], n, token=token, seq=2000), SENDER_ADDR, 0.0)
            r2.datagrams_to_send(0.0)
        assert r2.jobs[2].validated == validate
        records = [(m, b"") for m in range(0, 200, 2)]
        h = wire.Header(flags=1, job_id=2, msg_id=0, seq=1, count=len(records))
        r2.receive_datagram(wire.encode(h, wire.encode_records(records)), SENDER_ADDR, 0.0)
        r2.receive_datagram(wire.encode(wire.Header(job_id=2, msg_id=control.FIN_MSG_ID, seq=5)), SENDER_ADDR, 0.0)
        answers = [wire.decode(d)[0].type for d, _ in r2.datagrams_to_send(0.0)]
        assert (wire.PacketType.DONE in answers) == validate, answers
        assert r2.jobs[2].tx_bytes <= (3 if validate else 1) * r2.jobs[2].rx_bytes
        assert validate or r2.replies["done_deferred"] >= 1
    # validated, the same job may use the pool
    token = token_of([wire.decode(d) for d, _ in [(wire.encode_ack(flags=0, queue=0, job_id=1, msg_id=0, group_id=0,
                                                                   pkt_idx=0, pkt_cnt=1, seq=0, blocks=[],
                                                                   token=job.token), None)]])
    r.receive_datagram(announce(1, [(0, 0.5, range(n))], n, token=token, seq=500), SENDER_ADDR, 0.1)
    assert r.jobs[1].validated
    before = r.dropped["memory_budget"]
    for m in range(100, 130):
        r.receive_datagram(wire.encode(wire.Header(flags=1, job_id=1, msg_id=m, pkt_cnt=9, seq=m + 1), b"h" * 1300),
                           SENDER_ADDR, 0.1)
    assert r.dropped["memory_budget"] == before and r.jobs[1].charged > r.memory.guarantee


def test_a_one_packet_job_takes_one_rtt_plus_its_serialization_on_an_idle_path():
    """Zero round trips of admission: the announce and the data leave at once, and the job is complete when their
    ACK returns: one RTT (2 x 5 ms) plus the two datagrams' serialization at 100 Mbit/s (virtual clock)."""
    job = JobSpec.uniform(4, messages=1, size=1000, msr=1.0)
    rate = 100e6
    record: list = []
    run = run_job(job, AtpConfig(max_rate_bps=rate), forward=Path(delay=0.005, rate_bps=rate, record=record),
                  reverse=Path(delay=0.005, seed=2))
    (t0, hello), (t1, data) = record[:2]
    assert (t0, hello.msg_id, t1, data.msg_id) == (0.0, control.ANNOUNCE_MSG_ID, 0.0, 0)
    serialization = sum(h.length + wire.HEADER_LEN + 42 for _, h in record[:2]) * 8 / rate
    assert run.summary.jct_s == pytest.approx(0.010 + serialization, abs=1e-9)
    assert run.receiver.admission == {"admitted": 1, "admitted_without_token": 1, "validated": 1}


def test_under_pressure_the_retry_costs_one_rtt_and_the_first_window_goes_again():
    """A receiver under pressure drops the first window (counted) and answers the announce with a RETRY; the
    sender starts over at once with the token: the announce and the data again, no loss declared, no timer."""
    job = JobSpec.uniform(4, messages=100, size=1368, msr=1.0)
    record: list = []
    run = run_job(job, FAST, receiver_config=TOKENS, forward=Path(delay=0.005, record=record),
                  reverse=Path(delay=0.005, seed=2))
    first = [(round(t, 6), h.msg_id) for t, h in record if t == 0.0]
    assert first == [(0.0, control.ANNOUNCE_MSG_ID), (0.0, 0)]  # the first window rides behind it, paced
    again = [(round(t, 6), h.msg_id) for t, h in record if t >= 0.01]
    assert again[0] == (0.01, control.ANNOUNCE_MSG_ID) and again[1] == (0.01, 0)  # one RTT later, from the start
    assert run.receiver.admission == {"retries": 1, "admitted": 1}
    assert run.receiver.dropped["unknown_job"] == sum(1 for t, h in record if t < 0.01) - 1  # all but the announce
    s = run.summary
    assert s.packets_lost == 0 and s.retransmissions == 0 and s.msr_met() and s.receiver_confirmed
    assert sum(1 for t, h in record if h.msg_id == 0) == 2  # message 0: in the dropped window, then once more


def test_with_an_admission_key_unsigned_announces_get_nothing():
    key = b"shared admission key"
    r = AtpReceiver(config=AtpConfig(admission_key=key))
    r.receive_datagram(announce(7, G10, 10), SENDER_ADDR, 0.0)
    r.receive_datagram(announce(7, G10, 10, key=b"another key"), SENDER_ADDR, 0.0)
    assert out(r) == [] and r.dropped["bad_auth"] == 2 and r.admission["retries"] == 0
    admit(r, 7, G10, 10, key=key)


def test_senders_sign_with_the_admission_key_transparently():
    key = b"shared admission key"
    job = JobSpec.uniform(3, messages=200, size=1368, msr=0.9)
    run = run_job(job, dataclasses.replace(FAST, admission_key=key), forward=Path(loss=0.05, seed=3))
    assert run.summary.receiver_confirmed and run.summary.msr_met()
    # the announce goes again at every tail timeout, which backs off to 4x (30, 60, 120, 120 ... ms): ten in 1 s
    run = run_job(job, dataclasses.replace(FAST, idle_timeout_s=1.0), receiver_config=AtpConfig(admission_key=key),
                  until=5)
    assert run.summary is None and "admission key" in run.sender.failure
    assert run.receiver.dropped["bad_auth"] >= 10 and run.receiver.jobs == {}


# --- floods of forged announces --------------------------------------------------------------------

class AnnounceFlood:
    """Forged job announces, ``rate`` per second from ``start`` to ``stop``, each for a new job id and
    declaring ``n_declared`` messages (every tenth one more than any receiver accepts).

    Off path (``hosts=None``): from random spoofed addresses; the RETRYs and ACKs go to hosts that never asked.
    With ``hosts``: a hostile host that owns those addresses, echoes every token it gets (its jobs are
    admitted and validated: the token of a RETRY, or of the first ACK of a job admitted at once), then sends
    each admitted job ``hold`` packets of ``hold``-packet messages (buffer the receiver must keep) and never
    another one."""

    def __init__(self, *, rate: float, start: float = 0.0, stop: float = 1e9, n_declared: int = 1 << 20,
                 hosts: list | None = None, hold: int = 0, seed: int = 7) -> None:
        self.rate, self.t, self.stop = rate, start, stop
        self.n_declared, self.hosts, self.hold = n_declared, hosts, hold
        self.rng = random.Random(seed)
        self.job_id = 1_000_000
        self.sent = 0
        self.replies: list[tuple[str, bytes, object]] = []
        self.admitted: set[int] = set()

    def next_time(self):
        if self.replies:
            return self.t
        return self.t if self.t <= self.stop else None

    def _announce(self, job_id, token=wire.NO_TOKEN):
        total = 0xFFFFFFF0 if job_id % 10 == 0 else self.n_declared
        chunk = control.Manifest(total=total, vector_len=None,
                                 groups=(control.GroupShape.from_ids(0, 0.5, range(total)),)).encode()
        return announce(job_id, None, 0, chunk=chunk, token=token, seq=job_id)

    def fire(self, now):
        batch, self.replies = self.replies, []
        if self.t <= self.stop and now >= self.t:
            self.job_id += 1
            self.sent += 1
            if self.hosts is None:
                src = (f"10.66.{self.rng.randrange(256)}.{self.rng.randrange(256)}", self.rng.randrange(1024, 65536))
            else:
                src = self.hosts[self.job_id % len(self.hosts)]
            batch.append(("r", self._announce(self.job_id), src))
            self.t += 1.0 / self.rate
        return batch

    def on_datagram(self, data, addr, now):
        h, payload = wire.decode(data)
        if self.hosts is None or h.job_id in self.admitted:
            return
        if h.type == wire.PacketType.RETRY:
            token = payload
        elif h.type == wire.PacketType.ACK and h.flags & wire.Flags.TOKEN:
            token = wire.decode_ack(payload, h.flags)[2]
        else:
            return
        self.admitted.add(h.job_id)
        self.replies.append(("r", self._announce(h.job_id, token=token), addr))
        for m in range(self.hold):  # one packet of each of `hold` messages: never complete
            d = wire.Header(flags=wire.Flags.APPROX, job_id=h.job_id, msg_id=m, pkt_cnt=4096, seq=h.job_id + m + 1)
            self.replies.append(("r", wire.encode(d, b"\xee" * 1300), addr))

    def observe(self, direction, data, now):
        pass


def flood_run(job, attacker, rcfg, **kw):
    peak = [0]

    def sample(now, r):
        peak[0] = max(peak[0], r.memory.used)
    run = run_job(job, FAST, receiver_config=rcfg, attacker=attacker, on_step=sample, **kw)
    return run, peak[0]


RCFG = AtpConfig(max_rate_bps=50e6, memory_budget_bytes=4 << 20)  # 64 slots, 32 KiB guaranteed each
LEGIT = JobSpec.uniform(9, messages=2000, size=1368, msr=0.9)


def test_off_path_announce_flood_switches_to_tokens_and_the_job_runs_within_2x():
    """Forged token-less announces from random addresses: the receiver admits them at once only while not under
    pressure (a share of its slots, each job unvalidated: no pool memory, replies no larger than what came), then
    switches to tokens and holds nothing more; the real job, admitted with a token, finishes within 2x alone."""
    alone, _ = flood_run(LEGIT, None, RCFG)
    flood = AnnounceFlood(rate=20_000)  # forged announces per (virtual) second, each a new job, N = 2^20
    run, peak = flood_run(LEGIT, flood, RCFG)
    r = run.receiver
    assert flood.sent > 5000 and run.summary.receiver_confirmed and run.summary.msr_met()
    assert r.stats()["admission_mode"] == "tokens" and r.admission["to_tokens"] >= 1
    at_once = r.admission["admitted_without_token"]
    rejected = r.malformed["bad_announce"]  # absurd N: admitted, then rejected (no slot held)
    real = run.sender.retries_received == 0  # the real job came early enough to be admitted at once too
    assert 0 < at_once - rejected - real <= RCFG.open_admission_share * RCFG.max_jobs  # then tokens: no more state
    assert r.admission["admitted"] == at_once + (not real)
    assert r.admission["retries"] >= flood.sent - at_once
    assert r.admission.get("validated", 0) == 1  # only the real job proved its address
    assert peak <= RCFG.memory_budget_bytes
    assert all(j.charged <= r.memory.guarantee for j in r.jobs.values() if not j.validated)
    assert run.summary.jct_s <= 2 * alone.summary.jct_s


def test_a_hostile_host_that_echoes_tokens_cannot_crowd_out_a_job():
    """Four attacking addresses echo every token and park buffer in every job they get; the job still gets a
    slot (the attackers hold more than their share) and its memory guarantee, and finishes within 2x."""
    alone, _ = flood_run(LEGIT, None, RCFG)
    hosts = [(f"10.66.0.{i}", 5000 + i) for i in range(4)]
    flood = AnnounceFlood(rate=5000, start=-0.05, hosts=hosts, hold=64)  # every slot is taken when the job starts
    run, peak = flood_run(LEGIT, flood, RCFG)
    r = run.receiver
    assert run.summary.receiver_confirmed and run.summary.msr_met()
    assert run.summary.jct_s <= 2 * alone.summary.jct_s
    assert peak <= RCFG.memory_budget_bytes and r.memory.peak <= RCFG.memory_budget_bytes
    assert r.dropped["memory_budget"] > 0 and r.dropped["source_share"] > 0  # the attack did hit the limits
    assert r.admission["evicted_share"] + r.admission["evicted_stalled"] > 0
    assert max(r.slots.per_source.values()) <= RCFG.max_jobs_per_source
    assert r.stats()["admission_mode"] == "tokens"


def test_jobs_that_never_progress_lose_their_slot_first():
    cfg = AtpConfig(max_jobs=3, max_jobs_per_source=2, stall_timeout_s=1.0, memory_budget_bytes=1 << 20)
    r = AtpReceiver(config=cfg)
    a, b, c = ("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)
    admit(r, 1, G10, 10, peer=a, now=0.0)  # never sends data
    admit(r, 2, G10, 10, peer=b, now=0.1)
    admit(r, 3, G10, 10, peer=c, now=0.2)
    for t in (0.5, 1.5):  # jobs 2 and 3 progress; job 1 does not
        for job, src in ((2, b), (3, c)):
            r.receive_datagram(wire.encode(wire.Header(flags=1, job_id=job, msg_id=int(t), seq=int(t * 10)), b"x"),
                               src, t)
    r.datagrams_to_send(0.0)
    d = ("10.0.0.4", 1)
    r.receive_datagram(announce(4, G10, 10), d, 0.9)
    assert out(r) == [] and r.dropped["no_slot"] == 1  # full, nothing stalled for 1 s yet, no one over share
    admit(r, 4, G10, 10, peer=d, now=1.6)  # job 1 has made no progress for 1.6 s: it goes
    assert 1 not in r.jobs and {2, 3, 4} <= set(r.jobs) and r.admission["evicted_stalled"] == 1
    abandoned = [e for e in iter(r.next_event, None) if isinstance(e, events.JobAbandoned)]
    assert [(e.job_id, e.reason) for e in abandoned] == [(1, "stalled")]


def test_one_source_cannot_hold_more_than_its_share():
    cfg = AtpConfig(max_jobs=4, max_jobs_per_source=3, memory_budget_bytes=1 << 20)
    r = AtpReceiver(config=cfg)
    greedy = ("10.0.0.1", 9)
    for j in (1, 2, 3):
        admit(r, j, G10, 10, peer=greedy, now=0.0)
    r.receive_datagram(announce(4, G10, 10), greedy, 0.0)  # no token: not the host's (anyone may forge its address)
    answers = out(r)
    assert [h.type for (h, _), _ in answers] == [wire.PacketType.RETRY] and 4 not in r.jobs  # under pressure
    r.receive_datagram(announce(4, G10, 10, token=answers[0][0][1]), greedy, 0.0)  # validated: the host's account
    assert out(r) == [] and r.dropped["source_share"] == 1 and 4 not in r.jobs  # per-source cap: not even a RETRY
    admit(r, 5, G10, 10, peer=("10.0.0.2", 9), now=0.1)  # the last free slot
    admit(r, 6, G10, 10, peer=("10.0.0.3", 9), now=0.2)  # full: greedy holds 3 > 4 // 3 sources
    assert r.admission["evicted_share"] == 1 and r.slots.per_source[greedy[0]] == 2


def test_every_admitted_job_keeps_its_memory_guarantee():
    cfg = AtpConfig(max_jobs=4, memory_budget_bytes=256 << 10, max_jobs_per_source=4)  # 32 KiB guaranteed each
    r = AtpReceiver(config=cfg)
    hog, late = ("10.0.0.1", 9), ("10.0.0.2", 9)
    admit(r, 1, [(0, 0.5, range(1000))], 1000, peer=hog)
    for m in range(1000):  # incomplete messages: buffer the receiver must keep
        d = wire.Header(flags=1, job_id=1, msg_id=m, pkt_cnt=100, seq=m + 1)
        r.receive_datagram(wire.encode(d, b"h" * 1300), hog, 0.0)
    hog_bytes = r.jobs[1].charged
    assert r.dropped["memory_budget"] > 0 and hog_bytes <= r.memory.pool_limit + r.memory.guarantee
    admit(r, 2, [(0, 0.5, range(1000))], 1000, peer=late)
    before = r.dropped["memory_budget"]
    for m in range(10):  # ~20 KB with the job record and its manifest: within its 32 KiB
        d = wire.Header(flags=1, job_id=2, msg_id=m, pkt_cnt=2, seq=m + 1)
        r.receive_datagram(wire.encode(d, b"l" * 1300), late, 0.0)
    assert r.dropped["memory_budget"] == before  # within its guarantee, however full the pool is
    assert r.memory.used <= r.memory.limit


def test_the_budget_charges_at_least_what_python_allocates():
    """Fill a receiver every way an admitted attacker can (job records, huge declared N, scattered messages
    across many bitmap chunks, incomplete messages, held MSR = 1 messages, a large announce, finished jobs
    keeping long DONEs) and compare the charge with what tracemalloc sees."""
    cfg = AtpConfig(memory_budget_bytes=16 << 20, max_jobs=64, max_jobs_per_source=64)
    gc.collect()
    tracemalloc.start()
    try:
        r = AtpReceiver(config=cfg)
        base = tracemalloc.get_traced_memory()[0]
        for j in range(1, 41):
            src = ("10.0.1.%d" % j, 7)
            msr = 1.0 if j % 2 else 0.5
            n = 20_000 if j % 5 == 0 else cfg.max_messages  # the jobs that finish list every lost id
            admit(r, j, [(0, msr, range(n))], n, peer=src)
            for k in range(60):
                msg = (k * 7919 * j) % n  # scattered: a new chunk nearly every time
                cnt = 1 if k % 3 else 50
                d = wire.Header(flags=0 if msr == 1.0 else 1, job_id=j, msg_id=msg, pkt_cnt=cnt, seq=k + 1)
                r.receive_datagram(wire.encode(d, b"z" * 700), src, 0.0)
            if j % 5 == 0:
                r.receive_datagram(wire.encode(wire.Header(job_id=j, msg_id=control.FIN_MSG_ID, seq=999)), src, 0.0)
            r.datagrams_to_send(0.0)
            list(iter(r.next_event, None))
        groups = [(g, 0.5, range(g, 30000, 300)) for g in range(300)]  # ~30 KB announce over 25 parts
        m = control.Manifest(total=30000, vector_len=None, groups=tuple(
            control.GroupShape.from_ids(g, msr, ids) for g, msr, ids in groups)).encode()
        parts = [m[i:i + 1300] for i in range(0, len(m), 1300)]
        src = ("10.0.2.1", 7)
        token = token_for(r, announce(99, None, 0, chunk=parts[0], pkt_cnt=len(parts)), src)
        for i, c in enumerate(parts):
            r.receive_datagram(announce(99, None, 0, chunk=c, pkt_idx=i, pkt_cnt=len(parts), token=token, seq=i), src,
                               0.0)
        r.datagrams_to_send(0.0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert r.memory.used <= r.memory.limit and r.admission["admitted"] == 41
    assert r.jobs[99].manifest is not None and len(r._finished) == 8
    assert held <= r.memory.used, f"receiver holds {held} bytes but charged only {r.memory.used}"
    assert held >= r.memory.used // 3, "the charges are far above what is held: recalibrate them"


# --- the sender does not follow forged answers -------------------------------------------------------

class SenderForger:
    """Watches the real job on the path and, every ``every`` seconds, forges what a receiver sends, in
    every way a sender must see through: a copy of the latest real ACK from another address and for
    another job; ACKs from the receiver's address for sequence numbers never sent and SACKing all of
    them; an ACK of a real sequence number naming another message; a DONE claiming no loss that echoes
    a DATA sequence number rather than a FIN (before and during the close); a RETRY with a new token."""

    def __init__(self, every: float = 0.001) -> None:
        self.every, self.t = every, 0.0
        self.ack: bytes | None = None
        self.data: wire.Header | None = None
        self.sent: dict[str, int] = {}

    def next_time(self):
        return self.t if self.ack is not None else None

    def observe(self, direction, data, now):
        h, _ = wire.decode(data)
        if direction == "r->s" and h.type == wire.PacketType.ACK:
            self.ack = data
        elif direction == "s->r" and h.msg_id < control.FIN_MSG_ID:
            self.data = h
        if self.t < now and self.ack is not None and not self.sent:
            self.t = now

    def on_datagram(self, data, addr, now):
        pass

    def fire(self, now):
        self.t = now + self.every
        ack, _ = wire.decode(self.ack)
        ack = dataclasses.replace(ack, flags=ack.flags & ~(wire.Flags.TOKEN | wire.Flags.GRANT))  # blocks only
        d = self.data
        sack_all = wire.encode_ack_payload([(0, 0xFFFFFFFF)])
        forged = [
            ("wrong_source", self.ack, ("10.66.6.6", 7600)),
            ("wrong_job", wire.encode(dataclasses.replace(ack, job_id=ack.job_id + 1), wire.encode_ack_payload([])),
             RECEIVER_ADDR),
            ("ack_unsent_seq", wire.encode(dataclasses.replace(ack, seq=(d.seq + 100_000) & 0xFFFFFFFF), sack_all),
             RECEIVER_ADDR),
            ("ack_unsent_seq", wire.encode(dataclasses.replace(ack, seq=d.seq, msg_id=d.msg_id, pkt_idx=d.pkt_idx),
                                           sack_all), RECEIVER_ADDR),
            ("ack_mismatch", wire.encode(dataclasses.replace(ack, seq=d.seq, msg_id=d.msg_id + 1),
                                         wire.encode_ack_payload([])), RECEIVER_ADDR),
            ("done", wire.encode(wire.Header(type=wire.PacketType.DONE, job_id=ack.job_id, seq=d.seq),
                                 wire.encode_done_payloads([], 1000)[0]), RECEIVER_ADDR),
            ("retry", wire.encode_retry(d, b"forged token 16b"), RECEIVER_ADDR),
        ]
        for kind, _, _ in forged:
            self.sent[kind] = self.sent.get(kind, 0) + 1
        return [("s", data, src) for _, data, src in forged]


def outcome(s):
    d = s.as_dict()
    d.pop("rejected")
    return d


@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_forged_acks_dones_and_retries_do_not_change_the_senders_outcome(loss):
    job = JobSpec.uniform(11, messages=400, size=2000, msr=0.8, groups=[(1, 1.0, 50)])
    clean = run_job(job, FAST, forward=Path(loss=loss, seed=11), reverse=Path(loss=loss / 2, seed=12))
    forger = SenderForger()
    run = run_job(job, FAST, forward=Path(loss=loss, seed=11), reverse=Path(loss=loss / 2, seed=12), attacker=forger)
    assert outcome(run.summary) == outcome(clean.summary)
    assert clean.summary.rejected == {}
    rej = run.summary.rejected
    assert forger.sent["wrong_source"] > 100
    for reason in ("wrong_source", "wrong_job", "ack_mismatch"):
        assert rej[reason] == forger.sent[reason]
    assert rej["ack_unsent_seq"] == forger.sent["ack_unsent_seq"]
    assert rej["done_before_fin"] + rej.get("done_unsent_seq", 0) == forger.sent["done"]
    assert rej.get("retry_unexpected", 0) + rej.get("retry_unsent_seq", 0) == forger.sent["retry"]


def test_a_retry_must_echo_an_announce_the_sender_sent():
    s = AtpSender(JobSpec.uniform(5, messages=3, size=10), config=FAST, peer=RECEIVER_ADDR, now=0.0)
    first = [wire.decode(d)[0] for d, _ in s.datagrams_to_send(0.0)]
    hello = first[0]
    assert [(h.msg_id, h.count) for h in first] == [(control.ANNOUNCE_MSG_ID, 1), (0, 3)]  # zero-RTT: data behind it
    s.receive_datagram(wire.encode_retry(first[1], b"T" * 16), RECEIVER_ADDR, 0.0)  # echoes data, not the announce
    s.receive_datagram(wire.encode_retry(dataclasses.replace(hello, seq=hello.seq + 9), b"T" * 16), RECEIVER_ADDR, 0)
    s.receive_datagram(wire.encode_retry(hello, b"T" * 16), ("10.6.6.6", 7600), 0.0)
    assert s.datagrams_to_send(0.001) == [] and s.rejected == {"retry_unsent_seq": 2, "wrong_source": 1}
    s.receive_datagram(wire.encode_retry(hello, b"T" * 16), RECEIVER_ADDR, 0.0)
    sent = [wire.decode(d) for d, _ in s.datagrams_to_send(0.001)]
    assert sent[0][0].msg_id == control.ANNOUNCE_MSG_ID and sent[0][1][:16] == b"T" * 16  # echoed
    assert [m for h, p in sent[1:] for m in messages_in(h, p)] == [0, 1, 2]  # and the data again, from the start
    assert not any(h.flags & wire.Flags.RETX for h, _ in sent)
    # once an ACK came, the job is admitted: a RETRY is stale
    ack = wire.encode_ack(flags=0, queue=0, job_id=5, msg_id=0, group_id=0, pkt_idx=0, pkt_cnt=1, seq=sent[1][0].seq,
                          blocks=[])
    s.receive_datagram(ack, RECEIVER_ADDR, 0.002)
    s.receive_datagram(wire.encode_retry(sent[0][0], b"U" * 16), RECEIVER_ADDR, 0.002)
    assert s.rejected["retry_unexpected"] == 1


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.binary(max_size=80), st.booleans()), max_size=30))
def test_garbage_at_the_sender_never_crashes_and_is_counted(blobs):
    s = AtpSender(JobSpec.uniform(5, messages=3, size=10), config=FAST, peer=RECEIVER_ADDR, now=0.0)
    retry_sender(s)
    s.datagrams_to_send(0.0)
    for b, from_peer in blobs:
        s.receive_datagram(b, RECEIVER_ADDR if from_peer else ("10.6.6.6", 1), 0.001)
    assert sum(s.rejected.values()) == len(blobs)  # none of it could answer anything this sender sent
    assert s.state.value == "sending" and s.delivered(0) == 0
    s.handle_timer(s.get_timer())


# --- garbage and malformed headers at the receiver -------------------------------------------------

_FIELD = st.sampled_from([name for name, _ in wire.HEADER_FIELDS])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_FIELD, st.integers(0, 0xFFFFFFFF), st.integers(-40, 40)), min_size=1, max_size=30))
def test_headers_with_any_field_any_value_and_any_length_are_counted(mutations):
    """Valid packets of an admitted job with one field set to an arbitrary value and the datagram cut short
    or padded: nothing crashes, each datagram is acknowledged (one ACK each), answered (a msg_id that makes it
    the job's FIN gets a DONE) or counted, memory stays in budget."""
    cfg = AtpConfig(max_jobs=2, memory_budget_bytes=1 << 20, ack_every=1)
    r = AtpReceiver(config=cfg)
    admit(r, 3, [(0, 0.5, range(100)), (1, 1.0, range(100, 200))], 200)
    r.datagrams_to_send(0.0)
    retries = r.admission["retries"]
    offsets = wire.OFFSETS
    for i, (name, value, cut) in enumerate(mutations):
        good = bytearray(wire.encode(wire.Header(flags=1, job_id=3, msg_id=i % 100, pkt_idx=1, pkt_cnt=3, seq=i),
                                     b"payload!" * 10))
        width = dict(wire.HEADER_FIELDS)[name]
        if width >= 8:
            good[offsets[name]:offsets[name] + width // 8] = (value % (1 << width)).to_bytes(width // 8, "big")
        else:  # version / type nibble
            good[0] = value & 0xFF
        data = bytes(good[:len(good) + cut]) if cut < 0 else bytes(good) + b"\x00" * cut
        r.receive_datagram(data, SENDER_ADDR, 0.001 * i)
    answers = [wire.decode(d)[0] for d, _ in r.datagrams_to_send(1.0)]
    acked = sum(1 for h in answers if h.type == wire.PacketType.ACK)
    fins = sum(1 for h in answers if h.type == wire.PacketType.DONE and h.pkt_idx == 0)
    counted = sum(r.malformed.values()) + sum(r.dropped.values()) + r.admission["retries"] - retries
    assert acked + fins + counted == len(mutations)
    assert r.memory.used <= r.memory.limit
    r.handle_timer(1e6)
    assert r.memory.used == 0 and r.buffered == 0


def test_config_refuses_a_budget_too_small_for_its_slots():
    with pytest.raises(ConfigError, match="per job slot"):
        AtpConfig(memory_budget_bytes=1 << 20, max_jobs=64)
