"""The multi-job adapter (hostlib.exchange.AtpExchange) over loopback, on both cores: concurrent jobs each way
(DATA arriving on one socket, the acknowledgements of what it sends on another), futures for what is sent and
what arrives (before or after it is asked for), and its errors. tests/hostlib/test_hostlib_sessions.py checks
its sessions; tests/ml runs it under injected loss with float-vector jobs."""
from __future__ import annotations

import pytest

from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.errors import AtpError, ExchangeError
from netapprox.hostlib.exchange import AtpExchange, ReceivedJob

pytestmark = pytest.mark.usefixtures("cores")

CONFIG = AtpConfig(max_rate_bps=200e6, idle_timeout_s=5.0)


def test_jobs_cross_both_ways_at_once_and_arrive_whole():
    a, b = AtpExchange(config=CONFIG), AtpExchange(config=CONFIG)
    try:
        jobs = {11: (a, b, JobSpec.uniform(11, messages=50, size=1000, msr=1.0)),
                12: (b, a, JobSpec.uniform(12, messages=30, size=3000, msr=1.0)),
                13: (a, b, JobSpec.uniform(13, messages=40, size=200, msr=1.0))}
        early = b.receive(11)  # asked for before it is sent
        sent = {j: src.send(dst.address, job) for j, (src, dst, job) in jobs.items()}
        for j, (src, dst, job) in jobs.items():
            summary = sent[j].result(30)
            assert summary.receiver_confirmed and summary.msr_met() and not summary.lost_ids
            got = early.result(30) if j == 11 else dst.receive(j).result(30)  # 12, 13: asked for after
            assert isinstance(got, ReceivedJob) and got.job_id == j and got.lost_ids == ()
            assert got.messages == {i: m.data for i, m in enumerate(job.messages)}
            assert got.peer[:2] == src.source  # jobs leave from the exchange's second socket
        assert a.datagrams_dropped == b.datagrams_dropped == 0
        assert a.datagrams_received > 0 and b.datagrams_sent > 0
    finally:
        a.close()
        b.close()


def test_its_errors_name_the_job():
    ex = AtpExchange(config=CONFIG)
    try:
        first = ex.receive(5)
        with pytest.raises(ExchangeError, match="job 5 is already awaited"):
            ex.receive(5).result(5)
        assert not first.done()
    finally:
        ex.close()
    with pytest.raises(ExchangeError, match="closed") as err:
        ex.send(("127.0.0.1", 9), JobSpec.uniform(1, messages=1, size=10, msr=1.0)).result(5)
    assert isinstance(err.value, AtpError)  # one hierarchy: hostlib.errors
    with pytest.raises(ExchangeError, match="closed"):
        first.result(5)
