"""The Spark port: the input stage (the paper's S1), rows sent over ATP (UDP) arriving in a Spark DataFrame through
Spark 4's Python Data Source API, and the map->reduce stage (S2), each map task's partial aggregates or its rows
(records, sampled again) sent over ATP to the reduce stage (:func:`approx_s2`); an aggregate over the DataFrame
comes back with its error bound.

The user writes ordinary DataFrame code and the error bound: the sending side states ``e_max`` (it sets the
initial MSR of every stratum, :class:`netapprox.analytics.AnalyticsJob`); the source's rows carry the stratum and
its population size, so :func:`approx` gives the stratified estimate and its bound (docs/analytics.md, Spark).

Needs ``pyspark`` (the ``spark`` extra) and a JVM (``tools/setup-system.sh``); importing this module without them
raises ImportError.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from netapprox.analytics import accuracy, estimators, records
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import LIVE_LOOKS, AnalyticsJob, Query, Result, Row
from netapprox.analytics.partials import (PARTIAL, S2_MSR, Reducer, check_s2_query, combine,  # noqa: F401
                                          decode_partial, encode_partial, map_s2, partials, reduce_s2, send_partials,
                                          send_s2)
from netapprox.hostlib.api import ReceiverEndpoint
from netapprox.hostlib.errors import PeerUnreachableError, ReceiveTimeout

FORMAT = "netapprox"
SCHEMA = StructType([
    StructField("value", DoubleType(), False),
    StructField("key", LongType(), False),
    StructField("group", IntegerType(), False),
    StructField("stratum", IntegerType(), False),
    StructField("population", LongType(), False),
])
"""A row as it arrived, with the ATP group (stratum) it was sent in and that stratum's size at the sender."""


LOOKS = LIVE_LOOKS
"""A sender that follows its estimate (``send_rows(adapt=True)``) stops at one of at most this many looks: read its
rows with ``approx(..., looks=LOOKS)`` so the bound covers at its confidence whichever look stopped it."""


def send_rows(dest: str, rows: Sequence[Row], e_max: float, *, aggregate: str = "avg", confidence: float = 0.95,
              job_id: int = 1, seed: int = 0, timeout: float = 30.0, wait_s: float = 10.0, adapt: bool = True
              ) -> Result:
    """Send ``rows`` to the source listening at ``dest`` as one ATP job, starting at the MSR that ``e_max`` asks for
    (:meth:`AnalyticsJob.initial_msr`) and, with ``adapt``, following the running estimate of what the source
    acknowledged until the bound holds (:meth:`AnalyticsJob.send`); waits up to ``wait_s`` for the source to bind
    its port. The sender's answer (its ``summary``: the ATP job's)."""
    job = AnalyticsJob(rows, [Query(aggregate, e_max, confidence)], job_id=job_id, seed=seed)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return job.send(dest, adapt=adapt, timeout=timeout)
        except PeerUnreachableError:
            if time.monotonic() > deadline:
                raise AnalyticsError(f"no netapprox source listening at {dest} within {wait_s:g} s") from None
            time.sleep(0.05)


class _Partition(InputPartition):
    def __init__(self, bind: str) -> None:
        super().__init__(bind)
        self.bind = bind


class _Reader(DataSourceReader):
    def __init__(self, bind: str, timeout: float) -> None:
        self.bind = bind
        self.timeout = timeout

    def partitions(self):
        return [_Partition(self.bind)]

    def read(self, partition):
        arrived: list[tuple[int, bytes]] = []
        try:
            with ReceiverEndpoint(partition.bind, config=AnalyticsJob.config(), accept_jobs=1) as ep:
                (r,) = ep.serve(jobs=1, timeout=self.timeout,
                                on_message=lambda ev: arrived.append((ev.group_id, ev.data)))
        except ReceiveTimeout:
            raise AnalyticsError(f"netapprox source {partition.bind}: no ATP job arrived within "
                                 f"{self.timeout:g} s") from None
        sizes = {g.group_id: g.total for g in r.groups}
        for stratum, data in arrived:
            row = Row.decode(data)
            yield (row.value, row.key, row.group, stratum, sizes[stratum])


class NetApproxSource(DataSource):
    """``spark.read.format("netapprox").option("bind", "127.0.0.1:7700").load()``: the rows of one ATP job
    received on ``bind`` (option ``timeout``, seconds, default 30)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        bind = self.options.get("bind")
        if not bind:
            raise AnalyticsError('the netapprox source needs option("bind", "HOST:PORT")')
        try:
            timeout = float(self.options.get("timeout", "30"))
        except ValueError:
            raise AnalyticsError(f"timeout {self.options.get('timeout')!r}: seconds, e.g. 30") from None
        return _Reader(bind, timeout)

    def simpleStreamReader(self, schema):
        bind = self.options.get("bind")
        if not bind:
            raise AnalyticsError('the netapprox source needs option("bind", "HOST:PORT")')
        timeout = self.options.get("timeout")
        try:
            timeout = None if timeout is None else float(timeout)
        except ValueError:
            raise AnalyticsError(f"timeout {timeout!r}: seconds, e.g. 30") from None
        return _StreamReader(bind, timeout)


class _StreamReader(SimpleDataSourceStreamReader):
    """Structured streaming: one ATP job per window (a count- or time-based window of the sender's rows,
    :mod:`netapprox.analytics.stream`); a receiver thread on ``bind`` keeps every job that finished, and each
    micro-batch is the next one of them (one window). With ``timeout``, a query that has seen no job that long after
    it started fails with one line."""

    def __init__(self, bind: str, timeout: float | None = None) -> None:
        self.bind = bind
        self.timeout = timeout
        self._since = None
        self.jobs: list[list[tuple]] = []
        self._ep = None
        self._arrived: dict[int, list[tuple[int, bytes]]] = {}
        self._stop = self._thread = None  # made in _start: Spark pickles the reader before it runs

    def _start(self) -> None:
        """Bind on first use (Spark builds a reader to plan the query as well as the one that runs it)."""
        if self._ep is None:
            import threading
            self._ep = ReceiverEndpoint(self.bind, config=AnalyticsJob.config())
            self._stop = threading.Event()
            self._since = time.monotonic()
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        def on_message(ev):
            self._arrived.setdefault(ev.job_id, []).append((ev.group_id, ev.data))

        def on_job(r):
            sizes = {g.group_id: g.total for g in r.groups}
            rows = []
            for stratum, data in self._arrived.pop(r.job_id, []):
                row = Row.decode(data)
                rows.append((row.value, row.key, row.group, stratum, sizes[stratum]))
            self.jobs.append(rows)

        while not self._stop.is_set():
            self._ep.serve(jobs=None, timeout=0.2, on_job=on_job, on_message=on_message)

    def initialOffset(self):
        self._start()
        return {"jobs": 0}

    def read(self, start):
        self._start()
        if (not self.jobs and self.timeout is not None and time.monotonic() - self._since > self.timeout):
            raise AnalyticsError(f"netapprox source {self.bind}: no ATP job arrived within {self.timeout:g} s")
        end = min(len(self.jobs), start["jobs"] + 1)
        return iter([r for j in self.jobs[start["jobs"]:end] for r in j]), {"jobs": end}

    def readBetweenOffsets(self, start, end):
        return iter([r for j in self.jobs[start["jobs"]:end["jobs"]] for r in j])

    def stop(self) -> None:
        self._stop.set()
        if self._ep is not None:
            self._thread.join(5)
            self._ep.close()


def register(spark) -> None:
    """Make ``format("netapprox")`` known to ``spark`` (its Python workers must import ``netapprox``: run them
    on this interpreter, ``spark.pyspark.python`` = ``sys.executable``, as :func:`session` does)."""
    spark.dataSource.register(NetApproxSource)


def session(master: str = "local[1]", app: str = "netapprox"):
    """A SparkSession whose Python workers run this interpreter, with the netapprox source registered; the caller
    stops it (``.stop()``)."""
    import os
    import sys

    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the data source's planner workers read only this
    s = (SparkSession.builder.master(master).appName(app).config("spark.pyspark.python", sys.executable)
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(s)
    return s


def approx(df, aggregate: str, e_max: float, *, confidence: float = 0.95, column: str = "value", looks: int = 1
           ) -> estimators.Estimate:
    """``aggregate`` (``avg`` or ``sum``) of ``column`` over a DataFrame read from the netapprox source, with its
    bound at ``confidence`` from the strata the rows arrived in. ``looks``: the sender stopped at one of at most
    this many looks (``LOOKS`` for ``send_rows(adapt=True)``): the interval is read at ``1 - (1 - confidence) /
    looks`` and reported at ``confidence``."""
    accuracy.check_e_max(e_max)
    fn = {"avg": estimators.avg, "sum": estimators.total}.get(aggregate)
    if fn is None:
        raise AnalyticsError(f"aggregate {aggregate!r}: avg or sum")
    from pyspark.sql import functions as F
    cells = (df.groupBy("stratum").agg(F.first("population").alias("population"),
                                      F.collect_list(column).alias("values")).collect())
    if not cells:
        raise AnalyticsError("no rows arrived: nothing to estimate from")
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    level = 1.0 - (1.0 - confidence) / looks
    est = fn([estimators.Stratum(int(c["population"]), tuple(c["values"])) for c in cells], level, aggregate)
    return dataclasses.replace(est, confidence=confidence)


# --- S2: the map->reduce stage over ATP (netapprox.analytics.partials) -------------------------------------------

@dataclasses.dataclass(frozen=True)
class S2Result:
    """:func:`approx_s2`'s answer: the estimate (a ``RankEstimate`` for ``rank``), and what S2 moved (per map task:
    its messages sent and arrived, partial aggregates or, ``shuffle="records"``, records)."""

    estimate: estimators.Estimate | estimators.RankEstimate
    maps: int
    partials_sent: int
    partials_arrived: int
    s2_seconds: float
    """From the first map task's start to the last message at the reducer (the map tasks' S2 jobs)."""
    shuffle: str = "partials"
    msr: tuple[tuple[int, float], ...] = ()
    """``shuffle="records"``: S2's MSR per stratum, ``(stratum, msr)`` (:func:`records.plan_msr`)."""


HIT = "_netapprox_hit"
"""The 0/1 column a Count's Column predicate becomes before the map tasks (null counts as not satisfied)."""


def _is_hit(row) -> bool:
    return row[HIT] == 1


def _s2_input(df, aggregate: str, column: str, predicate, key_column: str):
    """``df`` narrowed to what the map tasks read, and the predicate they apply to each row (a Count)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F
    if aggregate == "rank":
        return df.select("stratum", "population", key_column), None
    if aggregate != "count":
        return df.select("stratum", "population", column), None
    if isinstance(predicate, str):
        predicate = F.expr(predicate)
    if isinstance(predicate, Column):
        return df.select("stratum", "population", F.when(predicate, 1).otherwise(0).alias(HIT)), _is_hit
    if callable(predicate):
        return df, predicate
    raise AnalyticsError(f"predicate={predicate!r}: a Column (F.col('value') > 5), a SQL condition ('value > 5') "
                         f"or a function of the row")


def _plan_records(narrowed, aggregate: str, e_max: float, confidence: float, looks: int, k, msr, map_kw: dict
                  ) -> dict[int, float]:
    """S2's MSR per stratum for ``shuffle="records"``: what the reducer's bound needs of S1's sample, read from the
    tasks' partials added up on the driver (:func:`records.plan_msr`), or ``msr`` for every stratum if given."""
    parts = narrowed.rdd.mapPartitions(lambda it: [map_s2(it, aggregate, **map_kw)]).collect()
    cells = records.merge_cells(parts, aggregate)
    if not cells:
        raise AnalyticsError("no rows arrived: nothing to estimate from")
    if msr is not None:
        return {h: float(msr) for h in cells}
    return records.plan_msr(cells, aggregate, e_max, confidence, looks, k=k)


def approx_s2(df, aggregate: str, e_max: float, *, maps: int = 2, confidence: float = 0.95, column: str = "value",
              predicate=None, k: int | None = None, key_column: str = "key", looks: int = 1,
              shuffle: str = "partials", msr: float | None = None, bind: str = "127.0.0.1:0", seed: int = 0,
              timeout: float = 30.0) -> S2Result:
    """:func:`approx` as a map/reduce job whose S2 goes over ATP: ``df`` (the netapprox source's rows) is split at
    random into ``maps`` map tasks (``repartition``), each sends to the reduce stage on the driver (on ``bind``) one
    ATP job of its partial aggregates (``shuffle="partials"``: :func:`map_s2`, :func:`send_s2`, at ``msr``,
    ``S2_MSR`` by default; read by :func:`reduce_s2`) or of its rows (``"records"``: :func:`records.send_records`,
    each stratum at the MSR the reducer's bound needs of S1's sample, :func:`records.plan_msr`, or ``msr`` for
    all; read by :func:`records.combine_records`). docs/analytics.md, S2.

    ``aggregate``: ``avg`` or ``sum`` of ``column``; ``count`` of the rows that satisfy ``predicate``, what
    ``df.filter`` takes (a Column, ``F.col("value") > 5``, or a SQL condition, ``"value > 5"``; null counts as
    false) or a function of the row (``lambda r: r.value > 5``, run in the map tasks); ``rank``, the top ``k`` keys
    of ``key_column`` by count."""
    accuracy.check_e_max(e_max)
    check_s2_query(aggregate, predicate=predicate, k=k)
    if not (isinstance(maps, int) and maps >= 1):
        raise AnalyticsError(f"maps={maps!r}: an integer >= 1")
    if shuffle not in ("partials", "records"):
        raise AnalyticsError(f"shuffle={shuffle!r}: partials or records")
    if msr is not None and not 0.0 < msr <= 1.0:
        raise AnalyticsError(f"S2's MSR {msr!r} must be in (0, 1]")
    narrowed, row_predicate = _s2_input(df, aggregate, column, predicate, key_column)
    map_kw = dict(column=column, predicate=row_predicate, key_column=key_column)
    plan = None if shuffle == "partials" else _plan_records(narrowed, aggregate, e_max, confidence, looks, k, msr,
                                                            map_kw)
    msr = S2_MSR if msr is None else msr
    with (Reducer if plan is None else records.RecordReducer)(bind) as reducer:
        dest = reducer.address

        def map_task(index, it):
            cells = map_s2(it, aggregate, **map_kw) if plan is None else records.map_records(it, aggregate, **map_kw)
            if not cells:
                return iter([])
            t = time.time()
            if plan is None:
                summary = send_s2(dest, cells, aggregate, job_id=index + 1, msr=msr, seed=seed, timeout=timeout)
            else:
                summary = records.send_records(dest, cells, plan, job_id=index + 1, seed=seed, timeout=timeout)
            return iter([(index + 1, len(cells), t, summary.jct_s)])

        sent = narrowed.repartition(maps).rdd.mapPartitionsWithIndex(map_task).collect()
        if not sent:
            raise AnalyticsError("no rows arrived: nothing to estimate from")
        reducer.wait([j for j, *_ in sent], timeout)
        jobs = [reducer.jobs[j] for j, *_ in sent]
        if plan is not None:
            strata = set(plan)
        else:
            strata = None if msr >= 1.0 else {r[0] for r in df.select("stratum").distinct().collect()}
        start = min(t for _, _, t, _ in sent)
        s2 = max(t + jct for _, _, t, jct in sent) - start
    return _s2_answer(jobs, sent, s2, aggregate, confidence, looks, k, strata, plan)


def _s2_answer(jobs, sent, s2_seconds, aggregate, confidence, looks, k, strata, plan) -> S2Result:
    """The reducer's estimate from the map tasks' jobs, and what they moved."""
    if plan is None:
        est = reduce_s2(jobs, aggregate, confidence, looks, k=k, strata=strata)
        arrived = sum(len(j["key_counts" if aggregate == "rank" else "partials"]) for j in jobs)
    else:
        got = [r for j in jobs for r in j["records"]]
        est = records.combine_records(got, aggregate, confidence, looks, k=k, strata=strata)
        arrived = len(got)
    return S2Result(est, len(sent), sum(n for _, n, _, _ in sent), arrived, s2_seconds,
                    "partials" if plan is None else "records", tuple(sorted((plan or {}).items())))
