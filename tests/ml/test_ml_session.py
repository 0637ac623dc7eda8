"""Persistent per-peer ATP sessions (ml/session.py) over loopback: what a session carries from one job to the
next, a restarted peer re-admitted cleanly, both I/O paths (native cores on the sockets, and the socket module
with injected loss) delivering exactly what was sent within every group's bound."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from netapprox.hostlib import core as hostlib_core
from netapprox.hostlib import wire
from netapprox.hostlib.config import AtpConfig, ConfigError
from netapprox.ml.exchange import ExchangeError, vector_job
from netapprox.ml.session import GENERATIONS, PeerSession, SessionExchange

FPP = wire.floats_per_packet(1400 - wire.HEADER_LEN)
CFG = AtpConfig(completion="all_sent")


@pytest.fixture(params=["python", "native"])
def session_cores(request, monkeypatch):
    """The exchange on the reference cores and on the native ones (which then carry the datagrams)."""
    native = request.param == "native"
    if native and hostlib_core.NativeAtpSender is None:
        why = f"the native cores are not available: {hostlib_core.native_error}"
        if os.environ.get("NETAPPROX_REQUIRE_NATIVE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    monkeypatch.setattr(hostlib_core, "AtpSender", hostlib_core.NativeAtpSender if native else hostlib_core.PyAtpSender)
    monkeypatch.setattr(hostlib_core, "AtpReceiver",
                        hostlib_core.NativeAtpReceiver if native else hostlib_core.PyAtpReceiver)
    return request.param


def _vector(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _job(job_id: int, v: np.ndarray, msr: float = 1.0):
    return vector_job(job_id, v, group_of_segment=None, group_msr={}, floats_per_packet=FPP, msr=msr)


def _exchange_once(src: SessionExchange, dst: SessionExchange, job_id: int, v: np.ndarray):
    got_f = dst.receive(job_id)
    sent_f = src.send(dst.address, _job(job_id, v))
    got = got_f.result(30)
    summary = sent_f.result(30)
    vec, have = got.vector(len(v))
    assert have.all() and np.array_equal(vec, v)
    return got, summary


def test_session_carries_rtt_and_window_into_the_next_job(session_cores):
    v = _vector(20 * FPP, 1)
    with SessionExchange(config=CFG) as a, SessionExchange(config=CFG) as b:
        assert a.native == (session_cores == "native") and a.address != a.source
        for k in range(3):
            _exchange_once(a, b, 100 + k, v)
            _exchange_once(b, a, 200 + k, v)
        s = a.sessions[b.address]
        assert (s.jobs, s.completed, s.failed, s.active) == (3, 3, 0, 0)
        assert s.srtt_s is not None and s.srtt_s > 0 and s.window is not None and s.window >= 1
        # every job to the peer needed the admission round trip (hostlib admits per job)
        assert s.retries + s.zero_rtt_jobs == 3
        stats = a.session_stats()[f"{b.address[0]}:{b.address[1]}"]
        assert stats["completed"] == 3 and stats["srtt_s"] == s.srtt_s
        assert a.datagrams_sent > 0 and a.datagrams_received > 0


def test_session_job_config_starts_from_what_the_session_learned():
    base = AtpConfig(completion="all_sent", initial_window=16, burst_packets=2)
    fresh = PeerSession(("127.0.0.1", 1))
    assert fresh.job_config(base) == base  # nothing learned yet
    s = PeerSession(("127.0.0.1", 1), srtt_s=0.004, window=40.0)
    cfg = s.job_config(base)
    assert cfg.initial_rtt_s == 0.004 and cfg.initial_window == 40
    s.active = 3  # the window is shared among the jobs under way, the new one included
    assert s.job_config(base).initial_window == 10
    s.window = 1.0
    assert s.job_config(base).initial_window == base.burst_packets
    # two senders share the peer's port: each may fill half of every switch queue, its jobs share that half
    s.active = 1
    half = s.job_config(base, queue_share=0.5).queue_packets
    assert half == tuple(max(1, round(q / 4)) for q in base.queue_packets)
    paper = AtpConfig(mode="paper")
    assert s.job_config(paper).initial_window == paper.initial_window  # only the adaptive window is carried


def test_session_restarted_peer_is_readmitted_cleanly(session_cores):
    """A peer's exchange closes (its worker restarted) and a new one takes its address: the old peer's job in
    flight fails at once on reset_peer, the new peer is admitted through a RETRY like any first job, and
    jobs both ways carry their data exactly, with ids of the new generation."""
    v = _vector(30 * FPP, 2)
    with SessionExchange(config=CFG, generation=1) as a:
        b = SessionExchange(config=CFG, generation=2)
        port = b.address[1]
        try:
            _exchange_once(a, b, 10, v)
            _exchange_once(b, a, 11, v)
            stuck = a.send(b.address, _job(12, _vector(400 * FPP, 3)))  # B goes away while this is sent
        finally:
            b.close()
        assert a.reset_peer(b.address).result(10) == 1
        with pytest.raises(ExchangeError, match="reset"):
            stuck.result(10)
        s = a.sessions[b.address]
        assert s.resets == 1 and s.jobs == 0 and s.srtt_s is None  # a fresh session for the address
        b2 = SessionExchange((b.address[0], port), config=CFG, generation=3)
        try:
            assert b2.address == b.address and b2.generation != b.generation
            # the restarted worker's ids differ from its predecessor's (the hook puts the generations in them)
            _exchange_once(a, b2, (b2.generation << 29) | 10, v)
            _exchange_once(b2, a, (b2.generation << 29) | 11, v)
            s = a.sessions[b.address]
            assert (s.completed, s.failed) == (1, 0)
            assert s.retries == 1  # re-admitted: the new receiver asked for a token once
            assert b2.sessions[a.address].completed == 1
        finally:
            b2.close()


def test_session_exchange_under_loss_keeps_every_groups_bound():
    """The socket-module path (injected loss sees every datagram): approximate jobs both ways within MSR."""
    v = _vector(60 * FPP, 4)
    with SessionExchange(config=CFG, loss=0.2, seed=1) as a, SessionExchange(config=CFG, loss=0.2, seed=2) as b:
        assert not a.native
        futs = []
        for k, (src, dst) in enumerate(((a, b), (b, a), (a, b))):
            futs.append((dst.receive(300 + k), src.send(dst.address, _job(300 + k, v, msr=0.7))))
        for rfut, sfut in futs:
            got, summary = rfut.result(60), sfut.result(60)
            for g in summary.groups:
                assert g.lost <= g.total - g.required
            vec, have = got.vector(len(v))
            assert np.array_equal(vec[have], v[have])
        assert a.datagrams_dropped > 0 and b.datagrams_dropped > 0


def test_session_exchange_rejects_bad_input_and_reports_failures():
    with pytest.raises(ConfigError):
        SessionExchange(loss=1.0)
    with pytest.raises(ConfigError):
        SessionExchange(generation=GENERATIONS)
    with pytest.raises(ConfigError):
        SessionExchange(queue_share=0.0)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    blocker.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(ExchangeError, match="cannot bind"):
            SessionExchange(blocker.getsockname())
    finally:
        blocker.close()
    with SessionExchange(config=CFG) as a, SessionExchange(config=CFG) as b:
        v = _vector(3 * FPP, 5)
        first = a.send(b.address, _job(7, v))
        again = a.send(b.address, _job(7, v))  # the same job to the same peer while the first is under way
        with pytest.raises(ExchangeError, match="already being sent"):
            again.result(10)
        b.receive(7).result(30)
        first.result(30)
        w = b.receive(8)
        with pytest.raises(ExchangeError, match="already awaited"):
            b.receive(8).result(10)
        assert not w.done()
    with pytest.raises(ExchangeError, match="closed"):
        a.send(b.address, _job(9, v)).result(10)
