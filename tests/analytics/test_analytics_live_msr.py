"""The analytics job adjusts its MSR while it runs (AtpSender.set_msr) and ends as soon as every bound holds."""
from __future__ import annotations

import pytest

from netapprox.analytics import AnalyticsJob, Query, correlated_rows, link
from netapprox.hostlib.config import AtpConfig

CONFIG = AtpConfig(surplus=False, max_rate_bps=100e6)


def _run(adapt: bool, e_max: float):
    job = AnalyticsJob(correlated_rows(20000, seed=1), [Query("avg", e_max, per_group=True)], seed=1)
    return job.run(adapt=adapt, config=CONFIG, forward=link.LossyPath(loss=0.05, rate_bps=100e6, seed=1))


def test_analytics_live_msr_ends_the_job_once_every_bound_holds():
    fixed, live = _run(False, 0.05), _run(True, 0.05)
    assert fixed.all_met and live.all_met
    assert all(a.error <= a.e_max for a in live.answers)
    # the initial MSR (0.95) would deliver 95 %; following the estimate needs a fraction of it
    assert fixed.received >= 0.95 * fixed.total and live.received < 0.3 * live.total
    assert live.jct_s < 0.5 * fixed.jct_s
    assert max(m for m in dict(live.msr).values() if m < 1.0) < 0.5  # lowered while it ran


def test_analytics_live_msr_raises_a_too_low_start():
    job = AnalyticsJob(correlated_rows(20000, seed=2), [Query("avg", 0.02)], seed=2)
    r = job.run(msr=0.02, adapt=True, config=CONFIG, forward=link.LossyPath(loss=0.05, rate_bps=100e6, seed=2))
    assert r.all_met and r.answer("avg").error <= 0.02
    assert r.received > 0.1 * r.total  # 2 % of the rows cannot bound the mean within 2 %: the MSR went up


def _port() -> int:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_analytics_send_over_udp_follows_the_estimate_of_what_was_acknowledged():
    """AnalyticsJob.send: the same live MSR over hostlib's UDP sender (loopback), from the paper's heuristic down
    to what the acknowledged rows say the bound needs; the answer is within e_max and the receiver has its rows."""
    import threading

    from netapprox.hostlib import api
    rows = correlated_rows(6000, seed=4)
    job = AnalyticsJob(rows, [Query("avg", 0.05)], seed=4)
    dest = f"127.0.0.1:{_port()}"
    got: dict = {}
    with api.ReceiverEndpoint(dest, config=AnalyticsJob.config()) as ep:
        t = threading.Thread(target=lambda: got.update(r=ep.serve(jobs=1, timeout=30)[0]))
        t.start()
        res = job.send(dest, config=AtpConfig(max_rate_bps=50e6), timeout=30)
        t.join(30)
    assert res.all_met and res.looks >= 1 and res.answer("avg").error <= 0.05
    started = job.initial_msr()
    assert all(m < started[g] for g, m in res.msr if started[g] < 1.0)  # lowered while it ran
    assert res.received < 0.5 * len(rows) and res.summary.msr_met
    assert res.received <= got["r"].delivered  # the answer's rows are rows the receiver has


def test_analytics_job_file_round_trip_and_bad_file(tmp_path):
    import pytest

    from netapprox.analytics import AnalyticsError
    job = AnalyticsJob(correlated_rows(500, seed=6), [Query("avg", 0.1, per_group=True)], seed=6, job_id=9)
    job.save(tmp_path / "j.job")
    again = AnalyticsJob.load(tmp_path / "j.job")
    assert again.rows == job.rows and again.order == job.order and again.queries == job.queries
    assert again.job_spec() == job.job_spec()
    (tmp_path / "bad.job").write_bytes(b"not a job")
    with pytest.raises(AnalyticsError, match="not an analytics job file"):
        AnalyticsJob.load(tmp_path / "bad.job")


def test_analytics_needed_msr_from_running_moments_is_the_one_from_the_values():
    """The live MSR keeps each stratum's moments as rows arrive and reads Avg's and Sum's need from them: the same
    MSRs as from the values, thin strata merged alike (a sample of 3 % leaves some strata with one row or none)."""
    import random

    from netapprox.analytics.job import _LiveMsr
    rows = correlated_rows(6000, seed=2)
    for q in (Query("avg", 0.05, per_group=True), Query("sum", 0.02)):
        job = AnalyticsJob(rows, [q], seed=2)
        spec = job.job_spec(1.0)
        live = _LiveMsr(job, spec)
        received: dict[int, bytes] = {}
        compared = 0
        ids = list(range(len(rows)))
        random.Random(3).shuffle(ids)
        for take in (180, 600, 2400):  # grows as a running job's acknowledged rows do
            for i in ids[len(received):take]:
                received[i] = spec.messages[i].data
            samples = live._samples(received)
            moments = {g: tuple(m) for g, m in live._moments.items()}
            by_values = job.needed_msr(received, looks=4)
            by_moments = job.needed_msr(received, looks=4, samples=samples, moments=moments)
            assert (by_values is None) == (by_moments is None)
            if by_values is not None:
                assert by_moments == {g: pytest.approx(v, rel=1e-9) for g, v in by_values.items()}
                compared += 1
        assert compared >= 2
