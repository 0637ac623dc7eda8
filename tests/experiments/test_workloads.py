"""Workload generators: shapes match their sources, the same seed gives the same workload."""
from __future__ import annotations

import math

import numpy as np
import pytest

from netapprox.experiments import workloads as w

N = 200_000


def test_generalized_pareto_matches_closed_form():
    rng = np.random.default_rng(1)
    x = w.FBKV_VALUE_SIZE.sample(rng, N)
    assert np.mean(x) == pytest.approx(w.FBKV_VALUE_SIZE.mean(), rel=0.03)
    for p in (0.25, 0.5, 0.9, 0.99):
        assert np.quantile(x, p) == pytest.approx(w.FBKV_VALUE_SIZE.quantile(p), rel=0.03)
    # Atikoglu et al.: the ETC value-size mean is sigma/(1-k) = 329 bytes for these parameters.
    assert w.FBKV_VALUE_SIZE.mean() == pytest.approx(329.1, abs=0.5)


def test_gev_key_sizes_match_closed_form():
    rng = np.random.default_rng(2)
    x = w.FBKV_KEY_SIZE.sample(rng, N)
    assert np.mean(x) == pytest.approx(w.FBKV_KEY_SIZE.mean(), rel=0.01)
    assert np.median(x) == pytest.approx(w.FBKV_KEY_SIZE.quantile(0.5), rel=0.01)


def test_empirical_cdf_web_search_mean_and_quantiles():
    # The thesis (papers/003) quotes 1.7 MB as the mean web-search flow; the table's mean is 1.67 MB.
    assert w.WEB_SEARCH_SIZE.mean() == pytest.approx(1.666e6, rel=0.01)
    rng = np.random.default_rng(3)
    x = w.WEB_SEARCH_SIZE.sample(rng, N)
    assert np.mean(x) == pytest.approx(w.WEB_SEARCH_SIZE.mean(), rel=0.03)
    assert np.quantile(x, 0.15) == pytest.approx(6 * 1460, rel=0.01)
    assert np.quantile(x, 0.53) == pytest.approx(53 * 1460, rel=0.05)
    assert np.quantile(x, 0.9) == pytest.approx(3333 * 1460, rel=0.05)
    assert x.max() <= 20000 * 1460


def test_empirical_cdf_hadoop_median_and_cdf_roundtrip():
    assert w.FBHD_SIZE.quantile(0.5) == pytest.approx(700)
    assert w.FBHD_SIZE.mean() == pytest.approx(120_420, rel=0.01)
    for x in (150, 700, 40_000, 500_000):
        assert w.FBHD_SIZE.quantile(w.FBHD_SIZE.cdf(x)) == pytest.approx(x, rel=1e-6)


def test_empirical_cdf_rejects_bad_points():
    with pytest.raises(ValueError):
        w.EmpiricalCdf(((0, 0.1), (10, 1.0)))
    with pytest.raises(ValueError):
        w.EmpiricalCdf(((10, 0.0), (5, 1.0)))


def test_poisson_arrivals_rate_and_exponential_gaps():
    rng = np.random.default_rng(4)
    t = w.poisson_arrivals(rng, 1000.0, 50.0)
    assert len(t) == pytest.approx(50_000, rel=0.03)
    gaps = np.diff(t)
    assert np.mean(gaps) == pytest.approx(1e-3, rel=0.03)
    # exponential: coefficient of variation 1
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)
    assert t.min() >= 0 and t.max() < 50.0


def test_bursty_arrivals_keep_the_mean_rate_and_arrive_only_in_bursts():
    """Four bursts a duration, each the first third of its period at three times the rate: the same number of
    arrivals as the Poisson process of the mean rate, none outside a burst; a bad duty is one clear error."""
    rng = np.random.default_rng(4)
    t = w.bursty_arrivals(rng, 1000.0, 40.0)
    assert len(t) == pytest.approx(40_000, rel=0.03)
    period = 40.0 / 4
    assert np.all(np.mod(t, period) < period / 3) and t.min() >= 0 and t.max() < 40.0
    for i in range(4):  # every burst carries a quarter of them
        assert np.sum((t >= i * period) & (t < (i + 1) * period)) == pytest.approx(10_000, rel=0.05)
    with pytest.raises(ValueError, match="duty"):
        w.bursty_arrivals(rng, 1000.0, 40.0, duty=0.0)


def test_fbkv_jobs_are_small_fbhd_jobs_large():
    kv = w.make_job("fbkv", seed=7, n=2000)
    hd = w.make_job("fbhd", seed=7, n=2000)
    assert np.mean(kv.sizes) == pytest.approx(w.FBKV_VALUE_SIZE.mean() + w.FBKV_KEY_SIZE.mean(), rel=0.15)
    assert np.mean(hd.sizes) > 20 * np.mean(kv.sizes)
    assert all(t == 0.0 for t in kv.ready_s)


@pytest.mark.parametrize("kind", ["fbkv", "fbhd"])
def test_ready_times_offer_the_requested_load(kind):
    job = w.make_job(kind, seed=11, n=5000, offered_bps=10e6, max_size=200_000)
    span = job.ready_s[-1]
    offered = sum(job.sizes[:-1]) * 8 / span
    assert offered == pytest.approx(10e6, rel=0.02)
    assert list(job.ready_s) == sorted(job.ready_s) and job.ready_s[0] == 0.0


def test_fbkv_gaps_keep_the_trace_shape():
    # Generalized Pareto with k=0.155: coefficient of variation 1/sqrt(1-2k) = 1.20, burstier than Poisson.
    job = w.make_job("fbkv", seed=5, n=100_000, offered_bps=1e6)
    gaps = np.diff(job.ready_s)
    cv = np.std(gaps) / np.mean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(1 - 2 * 0.154971), rel=0.08)


def test_same_seed_same_job_other_seed_other_job():
    a = w.make_job("fbhd", seed=3, n=100, offered_bps=5e6)
    b = w.make_job("fbhd", seed=3, n=100, offered_bps=5e6)
    c = w.make_job("fbhd", seed=4, n=100, offered_bps=5e6)
    assert a == b
    assert a != c
    assert w.JobWorkload.from_dict(a.to_dict()).sizes == a.sizes


def test_fbhd_cap_applies():
    job = w.make_job("fbhd", seed=1, n=5000, max_size=100_000)
    assert max(job.sizes) == 100_000


def test_unknown_workload_is_rejected():
    with pytest.raises(ValueError, match="fbkv"):
        w.make_job("nope", seed=1, n=3)


def test_web_search_flows_offer_the_load_and_scale_sizes():
    flows = w.web_search_flows(9, load=0.3, link_bps=40e6, duration_s=2000.0, senders=[0, 1, 2],
                               receivers=[3], size_scale=10.0)
    offered = sum(f.size for f in flows) * 8 / 2000.0
    assert offered == pytest.approx(0.3 * 40e6, rel=0.15)  # heavy tail: loose tolerance
    assert all(f.src in (0, 1, 2) and f.dst == 3 for f in flows)
    assert all(abs(f.size - f.trace_size / 10.0) <= 1 for f in flows)
    classes = {f.size_class for f in flows}
    assert classes == {"small", "medium", "large"}
    again = w.web_search_flows(9, load=0.3, link_bps=40e6, duration_s=2000.0, senders=[0, 1, 2],
                               receivers=[3], size_scale=10.0)
    assert again == flows


def test_pick_receivers_never_picks_self():
    m = w.pick_receivers(1, senders=range(6), hosts=range(6))
    assert all(m[s] != s for s in m)
    assert m == w.pick_receivers(1, senders=range(6), hosts=range(6))


def test_shift_workload_bursty_arrivals_are_the_same_jobs_in_bursts():
    """exp_shift's second arrival pattern: about as many jobs per phase as the Poisson one (the same mean load),
    every start inside a burst of its phase; the Poisson pattern is the default; an unknown one is an error."""
    from types import SimpleNamespace

    from netapprox.experiments import figures as F
    from netapprox.experiments.emulated import Scale
    backend = SimpleNamespace(scale=Scale(), hosts=list(range(8)))
    kw = dict(phase_s=3.0, load=0.3, receivers=1, msrs=(0.5, 0.7, 0.9))
    plain = F.shift_workload(backend, 5, **kw)
    assert plain == F.shift_workload(backend, 5, arrivals="poisson", **kw)
    jobs, _, phase_of = F.shift_workload(backend, 5, arrivals="bursty", **kw)
    period = 3.0 / 4
    assert all((j.start_s % 3.0) % period < period / 3 + 1e-9 for j in jobs)
    for name, _, _ in F.SHIFT_PHASES:
        n_plain = sum(1 for p, _ in plain[2].values() if p == name)
        n_bursty = sum(1 for p, _ in phase_of.values() if p == name)
        assert abs(n_bursty - n_plain) <= 3 * math.sqrt(n_plain) + 3, (name, n_plain, n_bursty)
    with pytest.raises(ValueError, match="arrivals"):
        F.shift_workload(backend, 5, arrivals="diurnal", **kw)
