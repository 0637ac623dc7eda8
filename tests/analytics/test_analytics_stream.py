"""Streaming windows (analytics/stream.py): windows cut by count and by time, a window's N estimated from the
windows before it, each window's MSR planned from the previous window's sample, a stream run over the simulated
link, and the bad input of a stream (docs/analytics.md, Streaming)."""
from __future__ import annotations

import random

import pytest

from netapprox.analytics import AnalyticsError, Query, Row, correlated_rows
from netapprox.analytics import stream


def _poisson_times(rates: list[float], seconds: float, seed: int) -> list[float]:
    """Arrival times of a Poisson stream whose rate is ``rates[k]`` rows/s in window ``k`` of ``seconds``."""
    rng = random.Random(seed)
    out = []
    for k, rate in enumerate(rates):
        t = k * seconds
        while True:
            t += rng.expovariate(rate)
            if t >= (k + 1) * seconds:
                break
            out.append(t)
    return out


def test_stream_windows_by_count_and_by_time():
    rows = [Row(float(i), group=i % 3) for i in range(25)]
    w = stream.count_windows(rows, 10)
    assert [len(x.rows) for x in w] == [10, 10]  # the last 5 have not closed a window
    assert w[1].rows[0].value == 10.0 and w[1].counts() == {0: 3, 1: 4, 2: 3}
    times = [0.5, 1.0, 1.9, 4.2, 4.3, 9.9]
    t = stream.time_windows([Row(float(i)) for i in range(6)], times, 2.0, start=0.0)
    assert [len(x.rows) for x in t] == [3, 0, 2, 0, 1]  # empty windows are kept: their N is 0
    assert (t[2].start, t[2].end, t[2].duration) == (4.0, 6.0, 2.0)


def test_stream_time_window_n_follows_the_arrival_rate():
    seconds = 10.0
    rates = [50.0] * 6 + [150.0] * 6
    times = _poisson_times(rates, seconds, seed=4)
    rows = [Row(1.0, group=int(random.Random(i).random() < 0.25)) for i in range(len(times))]
    windows = stream.time_windows(rows, times, seconds, start=0.0)
    sizer = stream.WindowSizer("time", seconds, first=400)
    est = []
    for w in windows:
        est.append(sizer.estimate())
        sizer.observe(w.counts())
    assert est[0].total == 400 and est[0].windows == 0  # the first window: its declared N
    true = [len(w.rows) for w in windows]
    for k in (3, 4, 5):  # a steady rate: within 20 % (Poisson noise of ~500 rows is ~5 %)
        assert abs(est[k].total - true[k]) / true[k] < 0.2
        assert abs(est[k].groups[1] / est[k].total - 0.25) < 0.08
    assert est[6].total < 0.5 * true[6]  # the window after a step is estimated from before it ...
    assert abs(est[10].total - true[10]) / true[10] < 0.2  # ... and a few windows later it has followed


def test_stream_count_window_n_is_its_count_and_groups_their_share():
    rows = [Row(1.0, group=0 if i % 4 else 1) for i in range(400)]
    sizer = stream.WindowSizer("count", 100)
    first = sizer.estimate()
    assert first.total == 100 and first.groups == {}
    for w in stream.count_windows(rows, 100):
        sizer.observe(w.counts())
    e = sizer.estimate()
    assert e.total == 100 and e.groups == pytest.approx({0: 75.0, 1: 25.0})


def test_stream_planner_plans_from_the_previous_window_and_its_estimated_n():
    q = Query("avg", 0.05)
    rows = correlated_rows(4000, seed=2)
    first, second = stream.count_windows(rows, 2000)
    sizer = stream.WindowSizer("count", 2000)
    planner = stream.StreamPlanner(q, sizer)
    p0 = planner.plan()
    assert p0.basis == "heuristic" and p0.msr == pytest.approx(0.95)
    job = stream.window_job(first, q)
    received = {i: m.data for i, m in enumerate(job.job_spec(1.0).messages) if i % 3 == 0}
    planner.observe(first, job.sample_strata(q, received))
    p1 = planner.plan()
    assert p1.basis == "previous window" and 0.05 <= p1.msr < 0.6
    # The same sample planning a window estimated twice as large: about the same rows, so a lower MSR.
    big = stream.StreamPlanner(q, stream.WindowSizer("count", 4000))
    big.observe(second, job.sample_strata(q, received))
    assert big.plan().msr < p1.msr * 0.75


def test_stream_run_windows_over_the_simulated_link():
    q = Query("avg", 0.05)
    rows = correlated_rows(12_000, seed=7)
    windows = stream.count_windows(rows, 2000)
    out = stream.run_windows(windows, q, stream.simulated(seed=7), sizer=stream.WindowSizer("count", 2000), seed=7)
    assert [a.plan.basis for a in out] == ["heuristic"] + ["previous window"] * 5
    assert all(a.received < 0.7 * a.rows for a in out[1:])  # planned windows send a sample, not the window
    assert out[0].received > 0.9 * out[0].rows
    met = [a for a in out if a.met]
    assert len(met) >= 4, [a.as_dict() for a in out]
    for a in out:
        assert abs(a.estimate.value - a.truth) <= 1.5 * a.estimate.half_width  # one draw each; coverage: estimators


def test_stream_windows_with_the_live_msr_meet_every_bound_from_fewer_rows():
    """Each window starts at its planned MSR and the MSR follows the window's own estimate (``adapt``): every
    window's bound holds (read at the looks' level), and the first window no longer sends 95 % of its rows."""
    q = Query("avg", 0.05)
    windows = stream.count_windows(correlated_rows(12_000, seed=7), 2000)
    fixed = stream.run_windows(windows, q, stream.simulated(seed=7), sizer=stream.WindowSizer("count", 2000), seed=7)
    live = stream.run_windows(windows, q, stream.simulated(seed=7, adapt=True), sizer=stream.WindowSizer("count", 2000),
                              seed=7)
    assert all(a.met for a in live), [a.as_dict() for a in live]
    assert not all(a.met for a in fixed)  # the same windows at their planned MSR: one misses (above)
    assert live[0].received < 0.5 * fixed[0].received
    assert sum(a.received for a in live) < sum(a.received for a in fixed)
    for a in live:
        assert abs(a.estimate.value - a.truth) <= 1.5 * a.estimate.half_width


def test_stream_window_too_small_for_its_bound_is_answered_with_a_note():
    q = Query("avg", 0.05)
    rows = correlated_rows(300, seed=1)
    times = [float(i) for i in range(200)] + [200.0 + 0.5 * i for i in range(12)] + [300.0 + i for i in range(88)]
    windows = stream.time_windows(rows, times, 100.0, start=0.0)
    assert [len(w.rows) for w in windows] == [100, 100, 12, 88]
    out = stream.run_windows(windows, q, stream.simulated(seed=1), sizer=stream.WindowSizer("time", 100.0, first=100))
    assert out[2].estimate is None and not out[2].met
    assert out[2].note == "window 2 has 12 rows; a bound of e_max 0.05 needs at least 30 (a longer window, or no " \
                          "bound on it)"
    assert out[3].estimate is not None  # the stream went on


def test_stream_bad_input_is_one_line():
    with pytest.raises(AnalyticsError, match="row 1 arrives at 1 s, before row 0"):
        stream.time_windows([Row(1.0), Row(2.0)], [5.0, 1.0], 1.0)
    with pytest.raises(AnalyticsError, match="window length 0"):
        stream.time_windows([Row(1.0)], [0.0], 0)
    with pytest.raises(AnalyticsError, match="window count 0"):
        stream.count_windows([Row(1.0)], 0)
    with pytest.raises(AnalyticsError, match="2 rows but 1 arrival times"):
        stream.time_windows([Row(1.0), Row(2.0)], [0.0], 1.0)
    with pytest.raises(AnalyticsError, match="no earlier window to estimate its N from"):
        stream.WindowSizer("time", 60.0).estimate()
    with pytest.raises(AnalyticsError, match="'time' or 'count'"):
        stream.WindowSizer("session", 60.0)
    with pytest.raises(AnalyticsError, match="answer avg or sum"):
        stream.StreamPlanner(Query("rank", 0.1), stream.WindowSizer("count", 100))



def test_stream_windows_over_udp_with_the_live_msr():
    """Count windows over loopback to a plain ATP receiver, each starting at its planned MSR and then following its
    own estimate: every window's bound holds and the receiver has at least the rows of the look that stopped it."""
    import socket

    from netapprox.analytics import AnalyticsJob
    from support.processes import counting_receiver
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        dest = f"127.0.0.1:{s.getsockname()[1]}"
    got: dict[int, int] = {}
    t = counting_receiver(dest, 3, AnalyticsJob.config(), got)
    rows = correlated_rows(6000, seed=11)
    out = stream.send_windows(dest, stream.count_windows(rows, 2000), Query("avg", 0.05), seed=11,
                              sizer=stream.WindowSizer("count", 2000), wait_s=30, adapt=True)
    t.join(60)
    assert all(a.met for a in out), [a.as_dict() for a in out]
    assert out[0].received < 0.9 * 2000  # the heuristic's 0.95 was lowered while the first window ran
    for k, a in enumerate(out):
        assert got[k + 1] >= a.received
