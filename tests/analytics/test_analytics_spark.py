"""The Spark port's input stage: rows sent over ATP (UDP, loopback) read through ``spark.read.format("netapprox")``
into a local Spark session, and the DataFrame's average with its bound. One SparkSession for the module."""
from __future__ import annotations

import shutil
import socket
import threading
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the 'spark' extra; make setup installs it)")
if shutil.which("java") is None:
    pytest.skip("no JVM on PATH (tools/setup-system.sh installs openjdk-17-jre-headless)", allow_module_level=True)

from netapprox.analytics import AnalyticsError, AnalyticsJob, Query, correlated_rows  # noqa: E402
from netapprox.analytics import spark as nspark  # noqa: E402
from support.ports import udp_port_bound  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    s = nspark.session(app="netapprox-test")
    yield s
    s.stop()


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send_in_background(dest: str, rows, e_max: float, seed: int) -> tuple[threading.Thread, dict]:
    """``nspark.send_rows`` on a thread of its own once the source has bound ``dest``'s port (the port ``_port``
    released could otherwise go to the sender's own socket first); its summary (or the error it raised) lands in
    the dict."""
    out: dict = {}
    port = int(dest.rsplit(":", 1)[1])

    def send():
        try:
            deadline = time.monotonic() + 60
            while not udp_port_bound(port) and time.monotonic() < deadline:
                time.sleep(0.01)
            out["summary"] = nspark.send_rows(dest, rows, e_max, seed=seed, wait_s=60)
        except Exception as err:  # noqa: BLE001 - surfaced by the caller's assertion
            out["error"] = err

    t = threading.Thread(target=send)
    t.start()
    return t, out


def test_spark_batch_source_reads_an_atp_job_and_bounds_its_average(spark):
    rows = correlated_rows(4000, seed=3)
    e_max = 0.05
    dest = f"127.0.0.1:{_port()}"
    t, out = _send_in_background(dest, rows, e_max, seed=3)
    df = spark.read.format("netapprox").option("bind", dest).option("timeout", "30").load()
    df = df.cache()
    n = df.count()
    t.join(60)
    assert "error" not in out, out.get("error")
    est = nspark.approx(df, "avg", e_max, looks=nspark.LOOKS)
    df.unpersist()
    truth = sum(r.value for r in rows) / len(rows)
    sent = out["summary"]  # the sender's answer: its MSR followed the estimate of what the source acknowledged
    assert sent.all_met and sent.answer("avg").error <= e_max  # at a look, or at ATP's completion (docs)
    assert sent.received <= n <= len(rows)  # the source has what the sender's answer was read from, and more
    plan = AnalyticsJob(rows, [Query("avg", e_max)], seed=3)
    started = plan.initial_msr()
    assert any(m < started[g] for g, m in dict(sent.msr).items())  # lowered from the paper's heuristic while it ran
    assert est.relative_error <= e_max
    assert abs(est.value - truth) <= est.half_width * 1.5 + 1e-9 * abs(truth)  # one draw; coverage: estimators


def test_spark_source_that_never_arrives_times_out_with_one_line(spark):
    df = spark.read.format("netapprox").option("bind", f"127.0.0.1:{_port()}").option("timeout", "1").load()
    with pytest.raises(Exception) as info:
        df.collect()
    assert "no ATP job arrived within 1 s" in str(info.value)


def test_spark_approx_rejects_e_max_outside_0_1(spark):
    df = spark.createDataFrame([(1.0, 0, 0, 1, 10)], nspark.SCHEMA)
    with pytest.raises(AnalyticsError, match=r"must be in \(0, 1\)"):
        nspark.approx(df, "avg", 1.5)


def test_spark_stream_windows_each_planned_from_the_ones_before(spark):
    """A count-windowed stream sent as one ATP job per window, each at the MSR planned from the windows before
    it (analytics.stream); Spark's micro-batches are the windows, each answered with its bound."""
    from netapprox.analytics import Query, stream
    dest = f"127.0.0.1:{_port()}"
    windows: list = []
    q = (spark.readStream.format("netapprox").option("bind", dest).load().writeStream
         .foreachBatch(lambda df, _: windows.append((df.count(), nspark.approx(df, "avg", 0.1)))
                       if not df.isEmpty() else None)
         .trigger(processingTime="200 milliseconds").start())
    try:
        rows = correlated_rows(3000, seed=5)
        sent = stream.send_windows(dest, stream.count_windows(rows, 1000), Query("avg", 0.1), seed=5,
                                   sizer=stream.WindowSizer("count", 1000), wait_s=60)
        for _ in range(300):
            if len(windows) >= 3:
                break
            q.awaitTermination(0.2)
    finally:
        q.stop()
    assert [a.plan.basis for a in sent] == ["heuristic", "previous window", "previous window"]
    assert len(windows) == 3, windows
    for (n, est), a, k in zip(windows, sent, range(3)):
        assert n == a.received  # one window per micro-batch: what its job delivered
        truth = sum(r.value for r in rows[1000 * k:1000 * (k + 1)]) / 1000
        assert abs(est.value - truth) <= est.half_width * 1.5 + 1e-9


def test_spark_stream_source_that_never_arrives_fails_with_one_line(spark):
    q = (spark.readStream.format("netapprox").option("bind", f"127.0.0.1:{_port()}").option("timeout", "1").load()
         .writeStream.foreachBatch(lambda df, _: None).trigger(processingTime="200 milliseconds").start())
    try:
        with pytest.raises(Exception) as info:
            q.awaitTermination(60)
    finally:
        q.stop()
    assert "no ATP job arrived within 1 s" in str(info.value)


def test_spark_s2_partials_over_atp_give_the_s1_answer_exactly(spark):
    """S2 over ATP: the source's rows split into three map tasks, each task's partial aggregates sent to the
    reduce stage as one ATP job at S2's MSR 1; the reducer's estimate is the one read from the rows themselves."""
    rows = correlated_rows(3000, seed=4)
    e_max = 0.05
    dest = f"127.0.0.1:{_port()}"
    t, out = _send_in_background(dest, rows, e_max, seed=4)
    df = spark.read.format("netapprox").option("bind", dest).option("timeout", "30").load().cache()
    df.count()
    t.join(60)
    assert "error" not in out, out.get("error")
    s1 = nspark.approx(df, "avg", e_max, looks=nspark.LOOKS)
    s2 = nspark.approx_s2(df, "avg", e_max, maps=3, looks=nspark.LOOKS, seed=4)
    total = nspark.approx_s2(df, "sum", e_max, maps=2, looks=nspark.LOOKS, seed=4)
    cells = df.groupBy("stratum").count().count()
    df.unpersist()
    assert s2.maps == 3 and s2.partials_arrived == s2.partials_sent >= cells  # every task holds some strata
    assert s2.estimate.sample == s1.sample and s2.estimate.population == s1.population == len(rows)
    assert s2.estimate.value == pytest.approx(s1.value, rel=1e-12)
    assert s2.estimate.half_width == pytest.approx(s1.half_width, rel=1e-9)
    assert total.estimate.value == pytest.approx(len(rows) * s1.value, rel=1e-12)
    assert s2.estimate.relative_error <= e_max


def test_spark_s2_rejects_bad_arguments_in_one_line(spark):
    df = spark.createDataFrame([(1.0, 0, 0, 1, 10)], nspark.SCHEMA)
    with pytest.raises(AnalyticsError, match=r"must be in \(0, 1\)"):
        nspark.approx_s2(df, "avg", 0.0)
    with pytest.raises(AnalyticsError, match="maps=0"):
        nspark.approx_s2(df, "avg", 0.05, maps=0)
    with pytest.raises(AnalyticsError, match="S2's MSR"):
        nspark.approx_s2(df, "avg", 0.05, msr=1.5)
    with pytest.raises(AnalyticsError, match="avg, sum, count or rank"):
        nspark.approx_s2(df, "median", 0.05)
    with pytest.raises(AnalyticsError, match="count needs predicate="):
        nspark.approx_s2(df, "count", 0.05)
    with pytest.raises(AnalyticsError, match="a Column .* or a function of the row"):
        nspark.approx_s2(df, "count", 0.05, predicate=5)
    with pytest.raises(AnalyticsError, match="rank needs k="):
        nspark.approx_s2(df, "rank", 0.05)
    with pytest.raises(AnalyticsError, match="rank k=0"):
        nspark.approx_s2(df, "rank", 0.05, k=0)
    with pytest.raises(AnalyticsError, match="shuffle='rows': partials or records"):
        nspark.approx_s2(df, "avg", 0.05, shuffle="rows")


def _sampled_df(spark, seed: int):
    """A DataFrame as the netapprox source gives one: 30 % of each of two groups' rows of ``correlated_rows``,
    each row with its stratum (the group) and the stratum's size at the sender."""
    import random
    rows = correlated_rows(2000, seed=seed)
    rng = random.Random(seed)
    out = []
    for g in (0, 1):
        mine = [r for r in rows if r.group == g]
        out += [(r.value, r.key, r.group, g, len(mine)) for r in rng.sample(mine, int(0.3 * len(mine)))]
    return spark.createDataFrame(out, nspark.SCHEMA), out


def test_spark_s2_count_and_rank_over_atp_give_the_rows_own_answers(spark):
    """Count (a Column predicate, a SQL condition and a Python function) and Rank through ``approx_s2``: the map
    tasks' partials over ATP give the estimate read from the DataFrame's rows themselves."""
    from pyspark.sql import functions as F

    from netapprox.analytics import estimators
    df, rows = _sampled_df(spark, 8)
    by = {h: [r for r in rows if r[3] == h] for h in (0, 1)}
    strata = [(by[h][0][4], by[h]) for h in (0, 1)]
    direct = estimators.count(estimators.indicator_strata(strata, lambda r: r[0] > 4.0))
    by_column = nspark.approx_s2(df, "count", 0.1, maps=2, predicate=F.col("value") > 4.0, seed=1)
    by_function = nspark.approx_s2(df, "count", 0.1, maps=3, predicate=lambda r: r.value > 4.0, seed=2)
    by_sql = nspark.approx_s2(df, "count", 0.1, maps=2, predicate="value > 4.0", seed=4)
    ranked = nspark.approx_s2(df, "rank", 0.2, maps=2, k=3, seed=3)
    expected = estimators.rank([(pop, [r[1] for r in rs]) for pop, rs in strata], 3)
    assert 0 < direct.value < 2000
    for got in (by_column, by_function, by_sql):
        assert got.partials_arrived == got.partials_sent >= 2
        assert got.estimate.value == pytest.approx(direct.value, rel=1e-12)
        assert got.estimate.half_width == pytest.approx(direct.half_width, rel=1e-9)
    assert ranked.estimate.keys() == expected.keys()
    for (_, a), (_, b) in zip(ranked.estimate.top, expected.top):
        assert a.value == pytest.approx(b.value, rel=1e-12) and a.half_width == pytest.approx(b.half_width, rel=1e-9)


def test_spark_s2_records_over_atp_sample_s1s_rows_at_the_planned_msr(spark):
    """``shuffle="records"``: the map tasks send the rows themselves over ATP, each stratum at the MSR the
    reducer's bound needs of S1's sample (below 1 here: S2 samples again); the reducer's estimate is read from the
    records that arrived, at least that MSR of them, its bound within ``e_max``."""
    from netapprox.hostlib import wire
    from netapprox.hostlib.config import required_messages
    df, rows = _sampled_df(spark, 9)
    s1 = nspark.approx(df, "avg", 0.1)
    got = nspark.approx_s2(df, "avg", 0.1, maps=2, shuffle="records", seed=5)
    count = nspark.approx_s2(df, "count", 0.2, maps=2, predicate="value > 4.0", shuffle="records", seed=6)
    assert got.shuffle == "records" and got.partials_sent == len(rows) == count.partials_sent
    plan = dict(got.msr)
    assert set(plan) == {0, 1} and all(0.0 < m < 1.0 for m in plan.values())
    on_wire = [wire.q15_to_tlr(wire.tlr_to_q15(m)) for m in plan.values()]  # the MSR both ends agree on
    assert got.partials_arrived >= sum(required_messages(m, 300) for m in on_wire)
    assert got.estimate.sample == got.partials_arrived and got.estimate.population == 2000
    assert got.estimate.relative_error <= 0.1 and count.estimate.relative_error <= 0.2
    if got.partials_arrived == len(rows):  # loopback delivered every record: S1's sample, S1's estimate
        assert got.estimate.value == pytest.approx(s1.value, rel=1e-12)
    assert abs(got.estimate.value - s1.value) <= got.estimate.half_width
