"""The estimators and their bounds against exact answers (netapprox.analytics.estimators, docs/analytics.md), the
MSR heuristics (accuracy.py) and the job's one-line errors on bad input."""
from __future__ import annotations

import math
import random

import pytest

from netapprox.analytics import (AnalyticsError, AnalyticsJob, Query, Row, Stratum, accuracy, avg, correlated_rows,
                                 count, estimators, rank, total)


def test_estimator_avg_of_one_stratum_is_the_textbook_interval():
    # 4 of 10 rows: mean 2.5, s^2 = 5/3, Var = (1 - 4/10) * s^2 / 4 = 0.25, half-width 1.96 * 0.5
    e = avg([Stratum(10, (1.0, 2.0, 3.0, 4.0))])
    assert e.value == pytest.approx(2.5)
    assert e.half_width == pytest.approx(estimators.z_of(0.95) * 0.5)
    assert e.relative_error == pytest.approx(e.half_width / 2.5)
    assert (e.sample, e.population) == (4, 10)


def test_estimator_census_has_no_error_and_fpc_shrinks_the_bound():
    rows = tuple(float(v) for v in range(1, 21))
    assert avg([Stratum(20, rows)]).half_width == 0.0
    assert total([Stratum(20, rows)]).value == pytest.approx(210.0)
    half = avg([Stratum(40, rows)]).half_width
    infinite = avg([Stratum(10 ** 9, rows)]).half_width
    assert half == pytest.approx(infinite * math.sqrt(1 - 20 / 40), rel=1e-6)


def test_estimator_stratified_weights_strata_by_population():
    # stratum A (90 rows, mean 1), stratum B (10 rows, mean 11): the population mean is 2, not the sample's 6
    a, b = Stratum(90, (0.5, 1.5) * 5), Stratum(10, (10.0, 12.0) * 5)
    e = avg([a, b])
    assert e.value == pytest.approx(2.0)
    # B arrived whole (no variance); A: s^2 = 10 * 0.25 / 9, FPC 1 - 10/90, n 10
    var = 0.9 ** 2 * (1 - 10 / 90) * (10 * 0.25 / 9) / 10
    assert e.half_width == pytest.approx(estimators.z_of(0.95) * math.sqrt(var))
    assert total([a, b]).value == pytest.approx(200.0)


def test_estimator_count_and_rank():
    strata = [Stratum(100, (1.0, 0.0, 1.0, 1.0, 0.0) * 4)]
    assert count(strata).value == pytest.approx(60.0)
    with pytest.raises(AnalyticsError, match="0/1"):
        count([Stratum(100, (2.0, 0.0))])
    r = rank([(100, ["a"] * 10 + ["b"] * 6 + ["c"] * 4)], k=2)
    assert r.keys() == ["a", "b"]
    assert r.top[0][1].value == pytest.approx(50.0)
    # Bonferroni: each of the 2 bounds at 97.5 %
    assert r.top[0][1].confidence == pytest.approx(0.975)
    assert r.covers({"a": 50.0, "b": 30.0}) and not r.covers({"a": 50.0, "b": 80.0})


def test_estimator_refuses_a_stratum_it_cannot_bound():
    with pytest.raises(AnalyticsError, match="has 1 in the sample; a bound needs at least 2"):
        avg([Stratum(50, (1.0,))])
    with pytest.raises(AnalyticsError, match="confidence"):
        avg([Stratum(50, (1.0, 2.0))], confidence=1.5)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.1", True])
def test_analytics_e_max_outside_0_1_is_refused(bad):
    with pytest.raises(AnalyticsError, match=r"must be in \(0, 1\)"):
        Query("avg", bad)


def test_analytics_bad_queries_and_groups_say_why():
    rows = correlated_rows(200, seed=1, groups=2) + [Row(1.0, group=7)] * 5
    with pytest.raises(AnalyticsError, match="group 7 has 5 rows; a bound of e_max 0.05 needs at least 30"):
        AnalyticsJob(rows, [Query("avg", 0.05, per_group=True)])
    with pytest.raises(AnalyticsError, match="group 9 has a bound but no rows"):
        AnalyticsJob(rows, [Query("avg", 0.05, group_e_max={9: 0.1})])
    with pytest.raises(AnalyticsError, match="count needs a predicate"):
        Query("count", 0.1)
    with pytest.raises(AnalyticsError, match="one of avg, sum, count, rank"):
        Query("median", 0.1)
    with pytest.raises(AnalyticsError, match="the job has 10 rows"):
        AnalyticsJob(rows[:10], [Query("avg", 0.1)])
    with pytest.raises(AnalyticsError, match="no queries"):
        AnalyticsJob(rows, [])


def test_analytics_initial_msr_is_the_papers_heuristic():
    assert accuracy.initial_msr(0.10) == pytest.approx(0.9)
    assert accuracy.initial_msr(0.01) == pytest.approx(0.99)
    assert accuracy.initial_msr(0.99) == accuracy.MIN_MSR
    job = AnalyticsJob(correlated_rows(2000, seed=3), [Query("avg", 0.10), Query("sum", 0.02, per_group=True)])
    msr = job.initial_msr()
    assert all(v == pytest.approx(0.98) or s.whole for s, v in zip(job.strata, msr.values()))


def test_analytics_needed_fraction_meets_the_bound_it_was_computed_for():
    """Sampling at the fraction needed_fraction() returns gives a relative error close to e_max: over many
    draws the mean half-width is within 10 % of e_max * mean."""
    rng = random.Random(5)
    pop = [rng.lognormvariate(1.0, 0.7) for _ in range(20000)]
    f = accuracy.needed_fraction([Stratum(len(pop), tuple(pop))], 0.02, 0.95)
    n = round(f * len(pop))
    errs = [avg([Stratum(len(pop), tuple(rng.sample(pop, n)))]).relative_error for _ in range(30)]
    assert sum(errs) / len(errs) == pytest.approx(0.02, rel=0.1)
    assert accuracy.msr_from_fraction(f) == pytest.approx(f * accuracy.MARGIN)


def test_analytics_strata_are_group_by_packet_count_and_rare_sizes_go_whole():
    job = AnalyticsJob(correlated_rows(2000, seed=2), [Query("avg", 0.05)], max_payload=224)
    seen = set()
    for s in job.strata:
        assert len({job.rows[i].group for i in s.rows}) == 1
        assert {job._packets[i] for i in s.rows} == {s.packets}
        assert s.whole == (len(s.rows) < 20)
        seen.update(s.rows)
    assert seen == set(range(2000)) and any(s.whole for s in job.strata) and len(job.strata) >= 4
    spec = job.job_spec(0.3)
    for s in job.strata:
        assert spec.msr_of(s.atp_group) == (1.0 if s.whole else 0.3)
    # message ids are a random order of the rows, decoded back to the same rows
    assert sorted(job.order) == list(range(2000)) and job.order != sorted(job.order)
    assert Row.decode(spec.messages[0].data) == job.rows[job.order[0]]
