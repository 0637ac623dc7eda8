"""The native cores against the reference: the same inputs, every output equal (tests/hostlib/twin.py).

Each call (datagrams, timers, events, summaries, exceptions) runs on ``hostlib/sender.py`` /
``hostlib/receiver.py`` and on the C port, and the first difference fails the test with both values. Inputs:
the in-memory network of hostlib_sim (lossy, reordering, duplicating, ACK-losing, bottlenecked paths) over a
grid of modes and job shapes, hypothesis-generated jobs and paths, and hypothesis-generated event sequences
fed to one core directly (forged ACKs, GRANTs, DONEs and RETRYs, ACKs carrying grants, tokens or the TRIM flag,
garbage, announces with and without admission tokens or signatures, echoes of tokens, packed and trimmed DATA,
FINs, jobs from several hosts competing for slots and memory, timers at arbitrary times).
"""
from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netapprox.hostlib import control, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message, Tags, pattern_bytes
from hostlib_sim import Path, TrimmingPath, announce, retry_sender, run_job, trim
from twin import TwinReceiver, TwinSender

pytestmark = pytest.mark.usefixtures("native")

SENDER = ("10.0.0.1", 40000)
RECEIVER = ("10.0.0.2", 7600)


def twin_run(job, config, receiver_config=None, collect=False, **paths):
    """One job on fresh copies of ``paths`` (a path's queue, loss draws and datagram index start over): a path
    shared between runs would carry its queue's busy time (virtual, from 0 in every run) into the next run, whose
    every packet then waits behind it or is dropped from its full queue until the clock catches up."""
    paths = {k: dataclasses.replace(v) if isinstance(v, Path) else v for k, v in paths.items()}
    run = run_job(job, config, receiver_config=receiver_config,
                  sender_cls=lambda job, **kw: TwinSender(job, **kw),
                  receiver_cls=lambda **kw: TwinReceiver(collect_messages=collect, **kw), **paths)
    run.sender.check_state()
    run.receiver.check_state()
    if collect:
        run.receiver.take_messages(job.job_id)  # the same messages on both sides
    return run


JOBS = {
    "groups": JobSpec.uniform(2, messages=60, size=2000, msr=0.7, groups=[(1, 0.9, 30), (2, 1.0, 20)]),
    "small-msr1": JobSpec.uniform(3, messages=150, size=300, msr=1.0),
    "large-messages": JobSpec.uniform(4, messages=12, size=9000, msr=0.5, groups=[(7, 1.0, 4)]),
    "tagged": JobSpec(job_id=5, messages=tuple(
        Message(pattern_bytes(i, 100 + 37 * i), group_id=i % 3, tags=Tags(priority=i % 4, weight=1 + i % 5,
                                                                         deadline_s=0.002 * i) if i % 2 else None)
        for i in range(40)), msr=0.6, group_msr={1: 0.8, 2: 1.0}, tags=Tags(priority=2, weight=3, deadline_s=0.01)),
    "vector": JobSpec.from_vector(6, [i / 3 for i in range(3000)], msr=0.8, floats_per_message=200),
    "msr0": JobSpec.uniform(8, messages=30, size=500, msr=0.0),
    "mixed-sizes": JobSpec(job_id=10, messages=tuple(Message(pattern_bytes(i, (0, 40, 300, 900, 1300, 2500)[i % 6]),
                                                             i % 2) for i in range(90)), msr=0.7, group_msr={1: 1.0}),
}

PATHS = {
    "clean": {},
    "lossy": {"forward": Path(loss=0.2, seed=11), "reverse": Path(loss=0.1, seed=12)},
    "reorder-dup": {"forward": Path(loss=0.05, jitter=0.003, duplicate=0.2, seed=13),
                    "reverse": Path(jitter=0.002, duplicate=0.2, seed=14)},
    "ack-loss": {"forward": Path(seed=15), "reverse": Path(loss=0.5, seed=16)},
    "heavy-ack-loss": {"forward": Path(loss=0.1, rate_bps=20e6, seed=24), "reverse": Path(loss=0.88, seed=25)},
    "bottleneck": {"forward": Path(rate_bps=25e6, queue_packets=4, delay=0.0005, queue_byte=6, seed=17)},
    "burst-drop": {"forward": Path(drop=lambda h, i: i % 40 < 12, seed=18)},
    "trimming": {"forward": TrimmingPath(rate_bps=25e6, queue_packets=3, delay=0.0005, seed=19)},
    "spraying": {"forward": Path(jitter=0.006, seed=20), "reverse": Path(seed=21)},
    "spraying-lossy": {"forward": Path(loss=0.1, jitter=0.006, seed=22),
                       "reverse": Path(jitter=0.001, seed=23)},
}


@pytest.mark.parametrize("mode", ["adaptive", "paper", "fixtlr", "base"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_mode_on_every_path(mode, path):
    for name, job in JOBS.items():
        for mrdf, completion, collect in ((True, "early", False), (False, "all_sent", True)):
            cfg = AtpConfig(mode=mode, mrdf=mrdf, completion=completion, max_rate_bps=40e6)
            twin_run(job, cfg, collect=collect, **PATHS[path])


@pytest.mark.parametrize("knobs", [
    {"ack_every": 1}, {"ack_every": 4, "pacing_train_s": 0.0}, {"pacing_train_s": 0.002, "max_rate_bps": 400e6},
    {"epoch_s": 0.003, "initial_rate_bps": 5e6, "mode": "paper"}, {"packet_size": 200, "burst_packets": 5},
    {"initial_window": 2, "max_window": 8, "queue_packets": (0, 7, 6, 5, 4, 3, 2, 1)},
    {"reorder_threshold": 1, "min_loss_timeout_s": 0.001, "loss_memory": 8, "loss_min_samples": 2},
    {"admission_key": b"shared secret", "ack_every": 3},
    {"receiver_grants": True, "grant_window_packets": 6}, {"receiver_grants": True, "surplus": False},
    {"receiver_grants": True, "grant_window_max_packets": 4},
    {"receiver_grants": True, "grant_overrides_window": False, "initial_window": 3},
    {"receiver_grants": True, "completion": "all_sent", "initial_window": 2}, {"surplus": False},
    {"pack_messages": False}, {"first_window_low": True, "initial_window": 3}, {"open_admission_share": 0.0},
    {"adaptive_reorder": False}, {"reorder_threshold": 8, "ack_every": 2},
    {"path_reorders": True}, {"path_reorders": True, "adaptive_reorder": False},
    {"job_rank_levels": 3, "job_rank_promote_s": 0.001}, {"job_rank_levels": 7},
])
def test_knobs(knobs):
    cfg = AtpConfig(**{"max_rate_bps": 40e6, **knobs})
    for path in ("lossy", "reorder-dup", "bottleneck", "trimming", "spraying-lossy"):
        for job in ("groups", "mixed-sizes"):
            twin_run(JOBS[job], cfg, **PATHS[path])


def test_job_ranks_next_to_cadentflow_tags():
    cfg = AtpConfig(max_rate_bps=40e6, job_rank_levels=3, job_rank_promote_s=0.002)
    for path in ("clean", "lossy", "reorder-dup"):
        twin_run(JOBS["tagged"], cfg, **PATHS[path])


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_granting_receiver_not_told_its_rate(path):
    """The receiver measures the rate its link delivers (receiver.py, DeliveryRate) on every path: the same
    estimate, budget and grants in both cores (check_state compares ``grant_rate_bps`` and ``grant_budget``)."""
    for rx in (AtpConfig(receiver_grants=True), AtpConfig(receiver_grants=True, initial_rtt_s=0.002, ack_every=2)):
        for job in ("groups", "small-msr1", "mixed-sizes"):
            twin_run(JOBS[job], AtpConfig(max_rate_bps=40e6), receiver_config=rx, **PATHS[path])


def test_the_spraying_paths_go_through_the_adaptive_reorder_rule():
    """The "spraying" paths reorder enough that both cores leave the packet threshold (compared by check_state)."""
    for path in ("spraying", "spraying-lossy"):
        run = twin_run(JOBS["small-msr1"], AtpConfig(max_rate_bps=40e6), **PATHS[path])
        assert run.sender.py.recovery.reordering or run.sender.py.recovery.spurious_losses > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_answers_loss_sizes_the_tail_and_the_fin_alike(seed):
    """test_hostlib_loss.py's ACK-path job (300 messages of 1000 B at 20 Mbit/s) with 80-90 % of the ACKs lost:
    both cores measure the answers' loss alike (check_state compares ``missed_answers`` and ``answer_loss``) and size
    the tail's probes and the FINs by it (every datagram compared)."""
    job = JobSpec(job_id=7, messages=tuple(Message(bytes([i % 251]) * 1000, group_id=i % 2) for i in range(300)),
                  group_msr=((0, 1.0), (1, 0.5)))
    cfg = AtpConfig(max_rate_bps=20e6, initial_rtt_s=0.01, receiver_grants=False)
    run = twin_run(job, cfg, until=600, forward=Path(delay=0.005, rate_bps=20e6, queue_packets=64, seed=seed),
                   reverse=Path(delay=0.005, loss=0.8 + 0.05 * (seed - 1), seed=seed + 1))
    assert run.sender.py.recovery.missed_answers > 0 and run.sender.py.recovery.answer_loss() > 0.5


def test_receiver_limits_and_rejection():
    job = JOBS["groups"]
    tight = AtpConfig(memory_budget_bytes=64 << 10, max_jobs=2, max_packets_per_message=1)
    sender_cfg = AtpConfig(max_rate_bps=40e6, idle_timeout_s=0.5)
    with pytest.raises(AssertionError, match="not done"):  # the receiver drops what it cannot hold, the sender fails
        twin_run(job, sender_cfg, receiver_config=tight, until=0.3)
    run = twin_run(job, sender_cfg, receiver_config=AtpConfig(max_messages=50), until=5.0)
    assert run.summary is None and "rejecting job" in run.sender.failure
    with pytest.raises(AssertionError, match="not done"):  # a key the sender does not have: never admitted
        twin_run(job, sender_cfg, receiver_config=AtpConfig(admission_key=b"k"), until=0.3)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(loss=st.floats(0.0, 0.8), ack_loss=st.floats(0.0, 0.6), msr=st.floats(0.0, 1.0), group_msr=st.floats(0.0, 1.0),
       jitter=st.sampled_from([0.0, 0.001, 0.004]), dup=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 10_000),
       sizes=st.lists(st.integers(0, 6000), min_size=1, max_size=30),
       mode=st.sampled_from(["adaptive", "paper", "fixtlr", "base"]), mrdf=st.booleans(),
       completion=st.sampled_from(["early", "all_sent"]), ack_every=st.integers(1, 16),
       rate=st.sampled_from([None, 5e6, 30e6]), queue_byte=st.sampled_from([None, 0, 3, 7, 200]))
def test_random_jobs_and_paths(loss, ack_loss, msr, group_msr, jitter, dup, seed, sizes, mode, mrdf, completion,
                               ack_every, rate, queue_byte):
    job = JobSpec(job_id=9, messages=tuple(Message(pattern_bytes(i, s), i % 3) for i, s in enumerate(sizes)),
                  msr=msr, group_msr={1: group_msr, 2: 1.0})
    cfg = AtpConfig(mode=mode, mrdf=mrdf, completion=completion, ack_every=ack_every, max_rate_bps=40e6)
    twin_run(job, cfg, until=900,
             forward=Path(loss=loss, jitter=jitter, duplicate=dup, seed=seed, rate_bps=rate, queue_byte=queue_byte),
             reverse=Path(loss=ack_loss, jitter=jitter, duplicate=dup, seed=seed + 1))


# --- event sequences fed to one core -------------------------------------------------------------------

def _forge_ack(rng: random.Random, h: wire.Header, sent_seqs: list[int]) -> bytes:
    """An ACK (or GRANT) of ``h``: SACK blocks over what was sent, perhaps a grant (near what was sent, or anywhere), a
    token, the TRIM flag."""
    blocks = []
    for _ in range(rng.randint(0, 4)):
        a = rng.choice(sent_seqs)
        blocks.append((a, a + rng.randint(0, 80)))
    flags = rng.choice([0, 0, wire.Flags.ECE, wire.Flags.TRIM])
    grant = rng.choice([None, None, rng.choice(sent_seqs) + rng.randint(-3, 40), rng.randrange(1 << 32)])
    token = rng.choice([None, None, None, b"K" * wire.TOKEN_LEN, b"L" * wire.TOKEN_LEN])
    ptype = rng.choice([wire.PacketType.ACK] * 4 + [wire.PacketType.GRANT])
    ack = wire.encode_ack(flags=flags, queue=rng.choice([0xFF, 0, 2, 6, 9]), job_id=h.job_id, msg_id=h.msg_id,
                          group_id=h.group_id, pkt_idx=h.pkt_idx, pkt_cnt=h.pkt_cnt, seq=h.seq, blocks=blocks,
                          grant=grant, token=token, ptype=ptype)
    return ack[:rng.choice([None] * 9 + [len(ack) - 1])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), mode=st.sampled_from(["adaptive", "paper", "fixtlr", "base"]),
       mrdf=st.booleans(), steps=st.integers(5, 120), sizes=st.lists(st.integers(0, 4000), min_size=1, max_size=12))
def test_sender_event_sequences(seed, mode, mrdf, steps, sizes):
    rng = random.Random(seed)
    job = JobSpec(job_id=21, messages=tuple(Message(pattern_bytes(i, s), i % 2) for i, s in enumerate(sizes)),
                  msr=rng.choice([0.0, 0.5, 0.9, 1.0]), group_msr={1: rng.choice([0.3, 1.0])})
    cfg = AtpConfig(mode=mode, mrdf=mrdf, max_rate_bps=rng.choice([1e6, 20e6, 1e9]), idle_timeout_s=0.5,
                    fin_timeout_s=0.2, completion=rng.choice(["early", "all_sent"]),
                    pack_messages=rng.random() < 0.8, surplus=rng.random() < 0.8,
                    first_window_low=rng.random() < 0.2, initial_window=rng.choice([None, 1, 3, 16]))
    s = TwinSender(job, config=cfg, peer=RECEIVER, now=0.0,
                   address_token=rng.choice([None, bytes(rng.randrange(1, 256) for _ in range(wire.TOKEN_LEN))]))
    now = 0.0
    sent: list[wire.Header] = []
    if rng.random() < 0.8:
        sent.append(retry_sender(s, token=bytes(rng.randrange(256) for _ in range(wire.TOKEN_LEN))))
    for _ in range(steps):
        op = rng.random()
        if op < 0.05 and sent:  # a RETRY: echoing something sent, or not; a token, or none
            h = rng.choice(sent)
            token = rng.choice([bytes(wire.TOKEN_LEN), b"N" * wire.TOKEN_LEN])
            s.receive_datagram(wire.encode_retry(h, token)[:rng.choice([None, 40])], rng.choice([RECEIVER, SENDER]),
                               now)
        elif op < 0.08 and sent:  # a NEW_TOKEN: echoing something sent (an announce part, or not), or cut short
            h = rng.choice(sent)
            token = rng.choice([bytes(wire.TOKEN_LEN), b"A" * wire.TOKEN_LEN, b"B" * wire.TOKEN_LEN])
            s.receive_datagram(wire.encode_new_token(h, token)[:rng.choice([None, None, 40])],
                               rng.choice([RECEIVER, RECEIVER, SENDER]), now)
        elif op < 0.3:
            sent += [wire.decode(d)[0] for d, _ in s.datagrams_to_send(now)]
        elif op < 0.6 and sent:
            h = rng.choice(sent[-30:])
            s.receive_datagram(_forge_ack(rng, h, [x.seq for x in sent]), RECEIVER, now)
        elif op < 0.7:
            ids = rng.sample(range(len(sizes) + 3), rng.randint(0, min(3, len(sizes))))
            cnt = rng.choice([1, 1, 2])
            done = wire.Header(type=wire.PacketType.DONE, job_id=21, pkt_idx=rng.randrange(cnt), pkt_cnt=cnt)
            s.receive_datagram(wire.encode(done, wire.encode_done_payloads(wire.id_ranges(sorted(ids)), 1000)[0]), RECEIVER, now)
        elif op < 0.75:
            blob = bytes(rng.randrange(256) for _ in range(rng.randint(0, 60)))
            s.receive_datagram(blob, RECEIVER, now)
        elif op < 0.8 and sent:  # a valid ACK of another job, or a DATA packet
            h = rng.choice(sent)
            s.receive_datagram(wire.encode(dataclasses.replace(h, job_id=22, type=wire.PacketType.ACK)), RECEIVER, now)
            s.receive_datagram(wire.encode(h), RECEIVER, now)
        else:
            t = s.get_timer()
            if t is not None:
                now = max(now, t if rng.random() < 0.7 else t + rng.random() * 0.01)
                s.handle_timer(now)
        now += rng.choice([0.0, 0.0, 1e-5, 1e-4, 1e-3, 0.02])
        while s.next_event() is not None:
            pass
        s.check_state()


def _data(rng: random.Random, job: int, total: int) -> bytes:
    """A DATA packet: one message or part of one, packed records (some of them broken), or a trimmed header."""
    cnt = rng.choice([1, 1, 2, 3])
    h = wire.Header(flags=rng.choice([0, wire.Flags.APPROX]), queue=rng.choice([0xFF, 1, 5]), job_id=job,
                    msg_id=rng.randrange(total + 2), group_id=rng.choice([0, 1, 4]), pkt_idx=rng.randrange(cnt),
                    pkt_cnt=cnt, seq=rng.randrange(400))
    op = rng.random()
    if op < 0.2:  # packed: records of (mostly) distinct ids, the first the header's
        ids = [h.msg_id] + [rng.randrange(total + 2) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.8:
            ids = list(dict.fromkeys(ids))
        records = [(i, bytes([i % 256]) * rng.randint(0, 30)) for i in ids]
        n = len(records) if rng.random() < 0.9 else len(records) + rng.choice([-1, 1])
        payload = wire.encode_records(records)[:rng.choice([None] * 9 + [-1])]
        return wire.encode(dataclasses.replace(h, pkt_idx=0, pkt_cnt=1, count=max(2, n)), payload)
    if op < 0.3:  # trimmed on the way (or a forged header claiming so: APPROX left set, a payload)
        t = trim(dataclasses.replace(h, count=rng.choice([1, 1, 3])) if h.pkt_cnt == 1 else h)
        if rng.random() < 0.2:
            t = t[:1] + bytes([t[1] | rng.choice([wire.Flags.APPROX, 0])]) + t[2:30] + b"\x00\x01x"
        return t
    size = rng.randint(0, 40) if rng.random() < 0.8 else rng.randint(500, 1300)  # big ones fill the budget
    return wire.encode(h, bytes([rng.randrange(256)]) * size)


def _announce(rng: random.Random, job: int, total: int, token: bytes, key: bytes | None) -> list[bytes]:
    ids = list(range(total))
    rng.shuffle(ids)
    cut = rng.randint(0, total)
    groups = [(0, rng.choice([0.5, 1.0]), sorted(ids[:cut])), (1, rng.choice([0.2, 1.0]), sorted(ids[cut:]))]
    m = control.Manifest(total=total, vector_len=None,
                         groups=tuple(control.GroupShape.from_ids(g, msr, i) for g, msr, i in groups if i))
    blob = m.encode()
    if rng.random() < 0.15:
        blob = blob[:-3]  # malformed
    parts = [blob[i:i + 40] for i in range(0, len(blob), 40)]
    out = []
    for i, p in enumerate(parts):
        payload = control.encode_announce_part(p, job_id=job, pkt_idx=i, pkt_cnt=len(parts), token=token,
                                               key=key if rng.random() < 0.9 else b"wrong key")
        if rng.random() < 0.05:
            payload = payload[:20]  # shorter than the token and auth fields
        out.append(wire.encode(wire.Header(job_id=job, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=i, pkt_cnt=len(parts),
                                           seq=500 + i), payload))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), steps=st.integers(5, 150), ack_every=st.integers(1, 16))
def test_receiver_event_sequences(seed, steps, ack_every):
    rng = random.Random(seed)
    key = rng.choice([None, None, b"admission key"])
    max_jobs = rng.choice([1, 2, 3, 64])
    cfg = AtpConfig(ack_every=ack_every, max_jobs=max_jobs, max_jobs_per_source=rng.choice([1, 2, 16]),
                    memory_budget_bytes=max_jobs * (32 << 10) * rng.choice([1, 2, 8]), max_messages=rng.choice([8, 1000]),
                    idle_timeout_s=0.05, finished_linger_s=0.05, stall_timeout_s=rng.choice([0.01, 1.0]),
                    packet_size=rng.choice([60, 1400]), admission_key=key, token_lifetime_s=rng.choice([0.02, 10.0]),
                    address_token_lifetime_s=rng.choice([1.0, 3600.0]),
                    open_admission_share=rng.choice([0.0, 0.5, 0.5, 1.0]), receiver_grants=rng.random() < 0.5,
                    grant_window_packets=rng.choice([None, 1, 5]))
    r = TwinReceiver(config=cfg, now=0.0, accept_jobs=rng.choice([None, 1, 2, 5]), collect_messages=rng.random() < 0.3)
    now = 0.0
    totals = {j: rng.choice([rng.randint(1, 12), 80]) for j in (1, 2, 3, 4, 5)}
    peers = [SENDER, ("10.0.0.9", 1), ("10.0.0.9", 2), ("10.0.0.7", 5)]
    owner = {j: rng.choice(peers) for j in totals}
    for _ in range(steps):
        job = rng.choice([1, 1, 2, 3, 4, 5])
        op = rng.random()
        peer = owner[job] if rng.random() < 0.9 else rng.choice(peers)
        if op < 0.45:
            r.receive_datagram(_data(rng, job, totals[job]), peer, now, ce=rng.random() < 0.1)
        elif op < 0.62:
            token = rng.choice([wire.NO_TOKEN, wire.NO_TOKEN, r.tokens.mint(job, peer, now), r.tokens.mint(job, peer, now),
                                r.tokens.mint(job, peer, max(0.0, now - 0.05)),  # expired with a short lifetime
                                r.tokens.mint(job + 1, peer, now), b"x" * wire.TOKEN_LEN,
                                # address-validation tokens: this host's, another host's, one near or past its expiry
                                r.tokens.mint_address(peer, now), r.tokens.mint_address(peer, now),
                                r.tokens.mint_address(rng.choice(peers), now),
                                r.tokens.mint_address(peer, max(0.0, now - rng.choice([0.5, 1.5, 3.0])))])
            for part in _announce(rng, job, totals[job], token, key):
                if rng.random() < 0.9:
                    r.receive_datagram(part, peer, now)
        elif op < 0.69:
            fin = wire.Header(job_id=job, msg_id=control.FIN_MSG_ID, seq=rng.randrange(1000))
            r.receive_datagram(wire.encode(fin), peer, now)
        elif op < 0.74:
            r.receive_datagram(bytes(rng.randrange(256) for _ in range(rng.randint(0, 50))), peer, now)
        elif op < 0.85:
            r.datagrams_to_send(now)
        elif op < 0.88:
            r.take_messages(job)
            if rng.random() < 0.3:
                r.collect_messages = not r.collect_messages
        elif op < 0.9:
            r.stats()
        else:
            t = r.get_timer()
            if t is not None and rng.random() < 0.5:
                now = max(now, t)
            r.handle_timer(now)
        now += rng.choice([0.0, 1e-4, 0.005, 0.01, 0.03])
        while r.next_event() is not None:
            pass
        r.check_state()
    r.datagrams_to_send(now)


def test_receiver_under_memory_pressure():
    """Two jobs filling a small budget with incomplete messages (dropped for memory once full), a third job
    refused for memory, FINs whose DONE may not be kept, and the lingering records forgotten."""
    cfg = AtpConfig(max_jobs=2, memory_budget_bytes=64 << 10, ack_every=5, finished_linger_s=0.5)
    r = TwinReceiver(config=cfg)
    groups = [(0, 0.5, range(400)), (7, 1.0, range(400, 500))]
    for i, job in enumerate((1, 2)):
        peer = ("10.0.0.%d" % (i + 1), 5000)
        r.receive_datagram(_announce_part(job, groups, 500, r.tokens.mint(job, peer, 0.0)), peer, 0.0)
        for m in range(250):
            h = wire.Header(flags=wire.Flags.APPROX, job_id=job, msg_id=m, group_id=0, pkt_idx=m % 3, pkt_cnt=3,
                            seq=1000 + m)
            r.receive_datagram(wire.encode(h, bytes([m % 251]) * 1300), peer, 0.001 * m)
            if m % 17 == 0:
                r.datagrams_to_send(0.001 * m)
            r.check_state()
    assert r.py.dropped["memory_budget"] > 0
    r.receive_datagram(_announce_part(3, groups, 500, r.tokens.mint(3, ("10.0.0.3", 1), 0.3)), ("10.0.0.3", 1), 0.3)
    for i, job in enumerate((1, 2)):
        peer = ("10.0.0.%d" % (i + 1), 5000)
        for m in range(400, 420):  # the ordered group: some in order, one gap
            if m == 405:
                continue
            h = wire.Header(job_id=job, msg_id=m, group_id=7, seq=2000 + m)
            r.receive_datagram(wire.encode(h, b"in order"), peer, 0.4)
        r.receive_datagram(wire.encode(wire.Header(job_id=job, msg_id=control.FIN_MSG_ID, seq=9999)), peer, 0.5)
        r.datagrams_to_send(0.5)
        r.check_state()
    for t in (0.6, 1.1, 2.0):
        r.handle_timer(t)
        r.check_state()
    while r.next_event() is not None:
        pass


def _announce_part(job, groups, total, token):
    chunk = control.Manifest(total=total, vector_len=None, groups=tuple(
        control.GroupShape.from_ids(g, msr, ids) for g, msr, ids in groups)).encode()
    payload = control.encode_announce_part(chunk, job_id=job, pkt_idx=0, pkt_cnt=1, token=token)
    return wire.encode(wire.Header(job_id=job, msg_id=control.ANNOUNCE_MSG_ID, seq=10), payload)


@pytest.mark.parametrize("mode", ["adaptive", "paper", "fixtlr"])
@pytest.mark.parametrize("path", ["clean", "lossy"])
def test_live_msr_change_equal(mode, path):
    """set_msr on a live job (raised, lowered, refused) gives the same datagrams, TLRs, errors and summary."""
    job = JobSpec.uniform(21, messages=200, size=700, msr=0.5, groups=[(1, 0.6, 80), (2, 1.0, 20)])
    holder = []
    changes = [(5, 0, 0.9), (30, 1, 0.2), (60, 0, 0.3)]  # (step, group, MSR)
    steps = [0]

    def make(job, **kw):
        holder.append(TwinSender(job, **kw))
        return holder[-1]

    def on_step(now, receiver):
        s = holder[0]
        steps[0] += 1
        while changes and steps[0] >= changes[0][0] and s.state.value == "sending":
            _, gid, msr = changes.pop(0)
            s.set_msr(gid, msr, now)
            for g in (0, 1, 2):
                s.tlr(g)
        for bad in ((2, 0.5), (0, 1.0), (0, True), (9, 0.5)):
            with pytest.raises(RuntimeError):
                s.set_msr(*bad, now)

    run = run_job(job, AtpConfig(mode=mode), sender_cls=make, receiver_cls=lambda **kw: TwinReceiver(**kw),
                  on_step=on_step, **PATHS[path])
    run.sender.check_state()
    assert not changes, "the job ended before every change was made"
    assert [g["msr"] for g in run.summary.as_dict()["groups"]] == pytest.approx([0.3, 0.2, 1.0], abs=1 / 32768)
    with pytest.raises(RuntimeError, match="MSR can no longer change"):
        run.sender.set_msr(0, 0.5, run.now)


def test_live_msr_change_survives_a_retry_equal():
    """A change made before the job is admitted is sent again behind the announce a RETRY makes the sender repeat."""
    job = JobSpec.uniform(22, messages=50, size=200, msr=0.8, groups=[(3, 0.5, 10)])
    s = TwinSender(job, config=AtpConfig(), peer=RECEIVER, now=0.0, isn=7)
    s.set_msr(3, 0.3, 0.0)
    s.set_msr(0, 0.6, 0.0)
    retry_sender(s)
    out = [wire.decode(d) for d, _ in s.datagrams_to_send(0.001)]
    changes = [(h.group_id, control.decode_msr_change(p)) for h, p in out if h.msg_id == control.MSR_MSG_ID]
    assert [(g, c) for g, (c, _) in changes] == [(0, 2), (3, 1)]
    assert out[0][0].msg_id == control.ANNOUNCE_MSG_ID
    s.check_state()


def test_receiver_msr_changes_equal():
    r = TwinReceiver(config=AtpConfig())
    r.receive_datagram(announce(40, [(0, 0.5, range(0, 100)), (1, 1.0, range(100, 110))], 110), SENDER, 0.0)
    for change, q, group in ((2, 0x2000, 0), (1, 0x6000, 0), (3, 0x1000, 1), (4, 0x1000, 9), (0, 1, 0),
                             (5, 0x8000, 0)):
        r.receive_datagram(wire.encode(wire.Header(job_id=40, msg_id=control.MSR_MSG_ID, group_id=group,
                                                   seq=500 + change), control.MSR_CHANGE.pack(change, q)), SENDER, 0.1)
    r.receive_datagram(wire.encode(wire.Header(job_id=40, msg_id=control.MSR_MSG_ID, seq=9), b"\x00" * 5), SENDER, 0.1)
    r.receive_datagram(wire.encode(wire.Header(flags=wire.Flags.TRIM, job_id=40, msg_id=control.MSR_MSG_ID)),
                       SENDER, 0.1)
    r.datagrams_to_send(0.1)
    r.receive_datagram(wire.encode(wire.Header(job_id=40, msg_id=control.FIN_MSG_ID, seq=700)), SENDER, 0.2)
    r.datagrams_to_send(0.2)
    while r.next_event() is not None:
        pass
    r.compare("malformed", "dropped")
    assert r.py.malformed["bad_msr_change"] == 3 and r.py.malformed["bad_trim"] == 1
    assert r.py.dropped["msr_exact_group"] == 1 and r.py.dropped["msr_unknown_group"] == 1
