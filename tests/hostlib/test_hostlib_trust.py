"""Trust no address: address-validation tokens (NEW_TOKEN) instead of trusted source addresses, separate accounts for
unvalidated jobs, and the outgoing queue inside the memory budget. Both cores (the ``cores`` fixture), two endpoints
in memory with a virtual clock; tests/hostlib/test_hostlib_budget_rss.py measures a receiver process's RSS."""
from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from netapprox.hostlib import control, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec
from netapprox.hostlib.receiver import OUT_BYTES, PACKET_BYTES, PARTIAL_BYTES, AtpReceiver
from netapprox.hostlib.sender import AtpSender
from hostlib_sim import RECEIVER_ADDR, admit, announce, token_of

pytestmark = pytest.mark.usefixtures("cores")

G10 = [(0, 0.5, range(10))]
CLIENT = ("10.0.0.1", 40000)
OTHERS = [(f"10.0.1.{i}", 9) for i in range(1, 9)]


def answers(r, now=0.0):
    return [(wire.decode(d), addr) for d, addr in r.datagrams_to_send(now)]


def types(out):
    return [h.type for (h, _), _ in out]


def validated_client(r, job_id=1, now=0.0) -> bytes:
    """Admit and validate a job of CLIENT (the open path: admitted at once, the ACK's token echoed); return the
    address-validation token its NEW_TOKEN carried."""
    out = [wire.decode(d) for d, _ in r.datagrams_to_send(now)]
    assert not out
    got = admit(r, job_id, G10, 10, peer=CLIENT, now=now)
    (token,) = [p for h, p in got if h.type == wire.PacketType.NEW_TOKEN]
    assert r.jobs[job_id].validated
    return token


def forged_announces(rng: random.Random, r, n: int, now: float, job_base: int = 1000) -> None:
    """``n`` announces in CLIENT's name (any port) from an off-path host: token-less, random tokens, admission tokens
    it could only have guessed (minted for another job or address), and CLIENT's address-validation token format
    with a made-up MAC."""
    for k in range(n):
        port = rng.randrange(1024, 65536)
        job = job_base + k
        token = rng.choice([wire.NO_TOKEN, wire.NO_TOKEN, bytes(rng.randrange(256) for _ in range(16)),
                            r.tokens.mint(job + 1, (CLIENT[0], port), now),
                            r.tokens.mint_address(("10.9.9.9", 1), now),
                            r.tokens.mint_address(CLIENT, now)[:5] + bytes(11)])
        r.receive_datagram(announce(job, G10, 10, seq=k, token=token), (CLIENT[0], port), now)


@pytest.mark.parametrize("pressure_first", [True, False], ids=["under-pressure", "flood-then-pressure"])
def test_spoofed_announces_in_a_validated_clients_name_admit_nothing_without_token_and_its_next_job_gets_in(
        pressure_first):
    """A flood of announces forged in a validated client's address: under pressure none is admitted (each gets a
    48-byte RETRY and leaves no state, whatever address it claims); while the receiver is still open some are
    admitted, but unvalidated and in the client's *unvalidated* account only, so they never fill its share. Either
    way the client's next job, presenting the address-validation token of its last one, is admitted at once."""
    cfg = AtpConfig(max_jobs=8, max_jobs_per_source=4, memory_budget_bytes=4 << 20)
    r = AtpReceiver(config=cfg)
    token = validated_client(r)
    if pressure_first:
        for j, peer in enumerate(OTHERS[:3], start=2):  # 4 of 8 slots held: under pressure
            admit(r, j, G10, 10, peer=peer)
        answers(r)
    jobs_before, used_before, validated_before = set(r.jobs), r.memory.used, r.admission["validated"]
    rng = random.Random(7)
    forged_announces(rng, r, 3000, now=0.1)
    out = answers(r, 0.1)
    forged_in = set(r.jobs) - jobs_before
    assert all(not r.jobs[j].validated for j in forged_in) and r.admission["validated"] == validated_before
    assert all(h.type in (wire.PacketType.RETRY, wire.PacketType.ACK) for (h, _), _ in out)
    assert all(addr[0] == CLIENT[0] for _, addr in out)  # nothing went to anyone the announces did not name
    if pressure_first:
        assert forged_in == set() and r.memory.used == used_before  # no job, no byte held
        assert r.admission["retries"] == 3000 - sum(r.dropped[k] for k in ("source_share", "no_slot"))
    else:
        # at most the open share of the client's unvalidated account; its validated account is untouched
        assert 0 < len(forged_in) <= cfg.open_admission_share * cfg.max_jobs_per_source
        assert r.slots.per_source[("unvalidated", CLIENT[0])] == len(forged_in)
        assert r.slots.per_source[CLIENT[0]] == 1
    assert r.dropped["bad_token"] > 0 and r.slots.per_source[CLIENT[0]] == 1
    # the client's next job: another port, its address-validation token, admitted at once (no RETRY), validated
    r.receive_datagram(announce(99, G10, 10, seq=5000, token=token), (CLIENT[0], 41000), 0.2)
    out = answers(r, 0.2)
    assert types(out) == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK], out
    assert 99 in r.jobs and r.jobs[99].validated and r.admission["admitted_by_address_token"] == 1
    assert r.slots.per_source[CLIENT[0]] == 2
    data = wire.encode(wire.Header(flags=wire.Flags.APPROX, job_id=99, msg_id=3, seq=5001), b"x" * 100)
    r.receive_datagram(data, (CLIENT[0], 41000), 0.2)
    assert types(answers(r, 0.2)) == [wire.PacketType.ACK]  # its data is kept at once


def test_spoofed_announces_never_lock_a_host_out_of_its_own_share():
    """Forged announces admitted in a host's name (while the receiver was open) hold slots of the host's
    unvalidated account: the host, at its validated limit minus one, still gets its next job in with its token,
    and the forged jobs validate nothing."""
    cfg = AtpConfig(max_jobs=16, max_jobs_per_source=2, memory_budget_bytes=4 << 20, open_admission_share=1.0)
    r = AtpReceiver(config=cfg)
    token = validated_client(r)
    forged_announces(random.Random(3), r, 200, now=0.1)
    answers(r, 0.1)
    assert r.slots.per_source[("unvalidated", CLIENT[0])] == cfg.max_jobs_per_source  # the forger's account is full
    r.receive_datagram(announce(50, G10, 10, token=token), (CLIENT[0], 5), 0.2)
    assert types(answers(r, 0.2)) == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK] and r.jobs[50].validated
    assert r.slots.per_source[CLIENT[0]] == 2 and r.admission["validated"] == 1


def test_address_token_refused_when_expired_for_another_address_or_from_a_rotated_out_key():
    cfg = AtpConfig(max_jobs=8, memory_budget_bytes=4 << 20, open_admission_share=0.0,  # always asks for a token
                    address_token_lifetime_s=60.0)

    def fresh():
        r = AtpReceiver(config=cfg, token_secret=b"s" * 32)
        tok = admit(r, 1, G10, 10, peer=CLIENT, now=0.0)  # a RETRY's token first, then validated
        (token,) = [p for h, p in tok if h.type == wire.PacketType.NEW_TOKEN]
        return r, token

    def present(r, token, peer, now, job=2):
        r.receive_datagram(announce(job, G10, 10, seq=77, token=token), peer, now)
        return answers(r, now)

    r, token = fresh()
    assert types(present(r, token, (CLIENT[0], 1234), 30.0)) == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK]
    assert r.admission["admitted_by_address_token"] == 1  # any port of the host it was given to, within its life
    for why, peer, now, rotate, reason in [
            ("another address", ("10.0.0.5", CLIENT[1]), 1.0, 0, "bad_token"),
            ("expired", CLIENT, 60.5, 0, "expired_token"),  # its key is still the previous one: the MAC checks
            ("rotated out by time", CLIENT, 121.0, 0, "bad_token"),  # two rotations later: the key is gone
            ("rotated out by the operator", CLIENT, 1.0, 2, "bad_token"),
            ("one rotation: still valid", CLIENT, 1.0, 1, None)]:
        r, token = fresh()
        for _ in range(rotate):
            r.tokens.rotate()
        out = present(r, token, peer, now)
        if reason is None:
            assert types(out) == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK] and r.jobs[2].validated, why
            continue
        ((h, payload), addr), = out
        assert h.type == wire.PacketType.RETRY and addr == peer and h.seq == 77, why  # a fresh token, nothing kept
        assert r.dropped[reason] == 1 and 2 not in r.jobs and r.admission.get("admitted_by_address_token", 0) == 0, \
            (why, dict(r.dropped))
    # the refused sender goes on as any: the RETRY's token admits it
    r.receive_datagram(announce(2, G10, 10, seq=78, token=payload), peer, 1.0)
    assert 2 in r.jobs and r.jobs[2].validated


def test_a_token_from_another_receiver_is_refused():
    a = AtpReceiver(config=AtpConfig(open_admission_share=0.0))
    b = AtpReceiver(config=AtpConfig(open_admission_share=0.0))
    token = a.tokens.mint_address(CLIENT, 0.0)
    b.receive_datagram(announce(3, G10, 10, token=token), CLIENT, 0.0)
    assert types(answers(b)) == [wire.PacketType.RETRY] and b.dropped["bad_token"] == 1 and b.jobs == {}


def _talk(sender, receiver, now: float, until: float = 5.0) -> float:
    """Run one job over a lossless 1 ms path; returns the time it finished."""
    while not sender.done and now < until:
        for d, _ in sender.datagrams_to_send(now):
            receiver.receive_datagram(d, CLIENT, now)
        while receiver.next_event() is not None:
            pass
        for d, _ in receiver.datagrams_to_send(now):
            sender.receive_datagram(d, RECEIVER_ADDR, now)
        t = sender.get_timer()
        now = max(now + 0.001, min(t, now + 0.01) if t is not None else now + 0.001)
        sender.handle_timer(now)
        receiver.handle_timer(now)
    return now


def test_a_returning_sender_presents_its_address_token_and_skips_the_retry(cores):
    """End to end, sender and receiver: the first job to a receiver that asks for tokens costs a RETRY and ends
    with a NEW_TOKEN; the next job from the same host (another port) presents it and needs no round trip."""
    cfg = AtpConfig(max_rate_bps=50e6, open_admission_share=0.0)
    r = cores.AtpReceiver(config=cfg)
    first = cores.AtpSender(JobSpec.uniform(11, messages=20, size=500, msr=1.0), config=cfg, peer=RECEIVER_ADDR,
                            now=0.0)
    now = _talk(first, r, 0.0)
    assert first.summary is not None and first.summary.receiver_confirmed
    assert first.retries_received == 1 and first.new_token is not None
    second = cores.AtpSender(JobSpec.uniform(12, messages=20, size=500, msr=1.0), config=cfg, peer=RECEIVER_ADDR,
                             now=now, address_token=first.new_token)
    _talk(second, r, now, until=now + 5.0)
    assert second.summary is not None and second.summary.receiver_confirmed and second.retries_received == 0
    assert r.admission["admitted_by_address_token"] == 1 and r.admission["retries"] == 1
    assert second.new_token is not None and second.new_token != first.new_token  # a fresh one for the next job
    with pytest.raises(ConfigError, match="address_token"):
        cores.AtpSender(JobSpec.uniform(13, messages=1, size=1), config=cfg, peer=RECEIVER_ADDR, now=0.0,
                        address_token=wire.NO_TOKEN)


def test_a_forged_new_token_is_ignored_by_the_sender():
    s = AtpSender(JobSpec.uniform(5, messages=4, size=100, msr=1.0), config=AtpConfig(max_rate_bps=50e6),
                  peer=RECEIVER_ADDR, now=0.0, isn=1000)
    sent = [wire.decode(d)[0] for d, _ in s.datagrams_to_send(0.0)]
    hello, data = sent[0], sent[1]
    s.receive_datagram(wire.encode_new_token(dataclasses.replace(hello, seq=5), b"F" * 16), RECEIVER_ADDR, 0.0)
    s.receive_datagram(wire.encode_new_token(data, b"F" * 16), RECEIVER_ADDR, 0.0)  # echoes DATA, not the announce
    s.receive_datagram(wire.encode_new_token(hello, b"F" * 16), ("10.6.6.6", 7600), 0.0)  # not the receiver
    assert s.new_token is None
    assert s.rejected["new_token_unsent_seq"] == 2 and s.rejected["wrong_source"] == 1
    s.receive_datagram(wire.encode_new_token(hello, b"G" * 16), RECEIVER_ADDR, 0.0)
    assert s.new_token == b"G" * 16


def test_replies_drive_to_their_cap_inside_a_full_budget():
    """The outgoing queue is inside the memory budget: with every byte of the pool and the job's guarantee taken by
    buffered data, duplicates still draw ACKs, which fill the reserve for replies and no more; ``used`` never passes
    the budget, counts what waits to be sent, and gives it back when the replies leave."""
    cfg = AtpConfig(max_jobs=2, max_jobs_per_source=2, memory_budget_bytes=256 << 10, ack_every=1)
    r = AtpReceiver(config=cfg)
    m = r.memory  # (a snapshot with the native core: read again below)
    assert m.reserve == 64 << 10 and r.memory.pool_limit == r.memory.limit - 2 * r.memory.guarantee - r.memory.reserve
    admit(r, 1, [(0, 0.5, range(4000))], 4000, peer=CLIENT)
    answers(r)
    seq = 0
    for msg in range(400):  # first packets of 4-packet messages: buffered until the budget refuses
        h = wire.Header(flags=wire.Flags.APPROX, job_id=1, msg_id=msg, pkt_cnt=4, seq=seq)
        r.receive_datagram(wire.encode(h, b"d" * 1300), CLIENT, 0.0)
        seq += 1
        answers(r)  # replies leave as they come: the budget fills with data alone
    assert r.dropped["memory_budget"] > 0
    full = r.memory.used
    assert full <= r.memory.limit - r.memory.reserve and r.memory.out == 0
    assert r.memory.pool_limit - r.memory.pool < 1300 + PACKET_BYTES + PARTIAL_BYTES  # the job has its guarantee and the pool
    peak_out = 0
    for k in range(2000):  # duplicates of what was kept: acknowledged again, nothing new held
        h = wire.Header(flags=wire.Flags.APPROX, job_id=1, msg_id=k % 40, pkt_cnt=4, seq=k % 40)
        r.receive_datagram(wire.encode(h, b"d" * 1300), CLIENT, 0.0)
        assert r.memory.used <= r.memory.limit and r.memory.out <= r.memory.reserve
        peak_out = max(peak_out, r.memory.out)
    assert r.replies["dropped_queue_full"] > 0  # the reserve was reached ...
    assert peak_out > r.memory.reserve - (wire.ACK_BASE_LEN + 16 * wire.SACK_BLOCK_LEN + OUT_BYTES)  # ... and filled
    assert r.memory.used == full + r.memory.out and r.stats()["memory"]["replies_queued"] == r.memory.out
    assert r.stats()["memory"]["replies_reserve"] == r.memory.reserve
    sent = r.datagrams_to_send(0.0)
    assert sum(len(d) + OUT_BYTES for d, _ in sent) == peak_out
    assert r.memory.used == full and r.memory.out == 0


def test_a_forged_announce_costs_a_counter_and_a_retry_never_a_slot_or_memory_under_pressure():
    """Hostile input stays cheap: under pressure, 10,000 forged announces in a validated host's name leave the slot
    table, the memory budget and the job table as they were."""
    cfg = AtpConfig(max_jobs=4, max_jobs_per_source=4, memory_budget_bytes=1 << 20)
    r = AtpReceiver(config=cfg)
    validated_client(r)
    admit(r, 2, G10, 10, peer=OTHERS[0])
    answers(r)
    before = (dict(r.slots.per_source), r.memory.used, set(r.jobs))
    forged_announces(random.Random(11), r, 10_000, now=0.5)
    assert (dict(r.slots.per_source), r.memory.used - r.memory.out, set(r.jobs)) == before
    out = answers(r, 0.5)
    assert set(types(out)) == {wire.PacketType.RETRY} and all(len(wire.encode_retry(h, p)) == 48 for (h, p), _ in out)


def test_address_token_keys_rotate_by_time_and_a_long_idle_drops_them_all():
    from netapprox.hostlib.admission import TokenMinter
    t = TokenMinter(lifetime_s=10.0, secret=b"k" * 32, address_lifetime_s=60.0)
    old = t.mint_address(CLIENT, 0.0)
    assert t.check_address(old, (CLIENT[0], 1), 59.0) is None and t.key_id == 0
    assert t.check_address(old, CLIENT, 61.0) == "expired_token" and t.key_id == 1  # its key is the previous one
    fresh = t.mint_address(CLIENT, 61.0)
    assert t.check_address(fresh, CLIENT, 100.0) is None
    assert t.check_address(fresh, CLIENT, 1e6) == "bad_token"  # thousands of lifetimes later: its key is gone
    late = t.mint_address(CLIENT, 1e6)
    assert t.check_address(late, CLIENT, 1e6 + 1) is None and t.check_address(late, ("10.0.0.2", 1), 1e6) == \
        "bad_token"
