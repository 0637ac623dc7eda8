"""The analytics job adjusts its MSR while it runs (AtpSender.set_msr) and ends as soon as every bound holds."""
from __future__ import annotations

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
