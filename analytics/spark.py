"""The Spark port: the input stage (the paper's S1), rows sent over ATP (UDP) arriving in a Spark DataFrame through
Spark 4's Python Data Source API, and the map->reduce stage (S2), each map task's partial aggregates sent over ATP
to the reduce stage (:func:`approx_s2`); an aggregate over the DataFrame comes back with its error bound.

The user writes ordinary DataFrame code and the error bound: the sending side states ``e_max`` (it sets the
initial MSR of every stratum, :class:`netapprox.analytics.AnalyticsJob`); the source's rows carry the stratum and
its population size, so :func:`approx` gives the stratified estimate and its bound (docs/analytics.md, Spark).

Needs ``pyspark`` (the ``spark`` extra) and a JVM (``tools/setup-system.sh``); importing this module without them
raises ImportError.
"""
from __future__ import annotations

import dataclasses
import random
import struct
import threading
import time
from collections.abc import Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from netapprox.analytics import accuracy, estimators
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import LIVE_LOOKS, AnalyticsJob, Query, Result, Row
from netapprox.hostlib.api import ReceiverEndpoint, send_job
from netapprox.hostlib.config import AtpConfig, JobSpec, Message
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


# --- S2: the map->reduce stage over ATP -----------------------------------------------------------------------------

PARTIAL = struct.Struct("!iqqdd")
"""One partial aggregate on the wire (one ATP message): stratum, its population, and the count, sum and sum of
squares of the stratum's sampled values the map task holds (36 bytes)."""

S2_MSR = 1.0
"""S2's MSR by default: every partial aggregate (docs/analytics.md, S2). A partial stands for all of one map task's
rows of a stratum, so losing one takes ``1 / maps`` of that stratum's sample at once, after S1 delivered just
enough rows for the bound; and they are tiny (36 bytes each, a few packets a task), so a repair costs a round
trip and no rate. A lower MSR is allowed: the estimate is then read from the partials that arrived (a lost one is
a smaller sample of its stratum, so the bound widens), which stays unbiased because each task's partials go in a
seeded random order and each task holds a random share of every stratum's rows (``repartition``)."""


def encode_partial(stratum: int, m: estimators.Moments) -> bytes:
    return PARTIAL.pack(stratum, m.population, m.n, m.total, m.total_sq)


def decode_partial(data: bytes) -> tuple[int, estimators.Moments]:
    if len(data) != PARTIAL.size:
        raise AnalyticsError(f"a partial aggregate is {PARTIAL.size} bytes, not {len(data)}")
    h, pop, n, t, t2 = PARTIAL.unpack(data)
    if pop < 1 or not 0 <= n <= pop:
        raise AnalyticsError(f"partial aggregate of stratum {h}: {n} rows of a population of {pop}")
    return h, estimators.Moments(pop, n, t, t2)


def partials(rows, column: str = "value") -> dict[int, estimators.Moments]:
    """A map task's partial aggregates: per stratum, the moments of ``column`` over its rows (Spark ``Row``s of the
    netapprox source, or anything with ``stratum``, ``population`` and ``column``)."""
    out: dict[int, list] = {}
    for r in rows:
        v = float(r[column])
        c = out.setdefault(int(r["stratum"]), [int(r["population"]), 0, 0.0, 0.0])
        c[1] += 1
        c[2] += v
        c[3] += v * v
    return {h: estimators.Moments(*c) for h, c in out.items()}


def send_partials(dest: str, cells: dict[int, estimators.Moments], *, job_id: int, msr: float = S2_MSR,
                  seed: int = 0, timeout: float = 30.0):
    """One map task's partial aggregates to the reduce stage at ``dest``: one ATP job, one message per stratum, in
    a random order seeded by ``seed`` and ``job_id`` (MRDF off); the sender's ``SendSummary``."""
    items = sorted(cells.items())
    random.Random(seed * 1_000_003 + job_id).shuffle(items)
    spec = JobSpec(job_id=job_id, messages=tuple(Message(encode_partial(h, m)) for h, m in items), msr=msr)
    return send_job(dest, spec, config=AnalyticsJob.config(), timeout=timeout)


class Reducer:
    """The reduce stage's receiving end: an ATP receiver on ``bind`` (port 0: any; ``address`` says which) that
    keeps every partial aggregate of every map task's job that finishes, until :meth:`close`."""

    def __init__(self, bind: str = "127.0.0.1:0") -> None:
        host, _, port = bind.rpartition(":")
        if port == "0":  # any free port (the receiver's own parser wants one named)
            import socket
            with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((host.strip("[]"), 0))
                bind = f"{host}:{s.getsockname()[1]}"
        self._ep = ReceiverEndpoint(bind, config=AnalyticsJob.config())
        self.address = f"{self._ep.bound[0]}:{self._ep.bound[1]}"
        self.jobs: dict[int, dict] = {}
        self._arrived: dict[int, list[bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        def on_message(ev):
            self._arrived.setdefault(ev.job_id, []).append(ev.data)

        def on_job(r):
            good, bad = [], 0
            for d in self._arrived.pop(r.job_id, []):
                try:
                    good.append(decode_partial(d))
                except AnalyticsError:  # not a partial aggregate: counted, never estimated from
                    bad += 1
            self.jobs[r.job_id] = {"partials": good, "total": r.total, "malformed": bad}

        while not self._stop.is_set():
            self._ep.serve(jobs=None, timeout=0.1, on_job=on_job, on_message=on_message)

    def wait(self, job_ids, timeout: float) -> None:
        """Until every job of ``job_ids`` finished here (one line if not within ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while not set(job_ids) <= set(self.jobs):
            if time.monotonic() > deadline:
                missing = sorted(set(job_ids) - set(self.jobs))
                raise AnalyticsError(f"reduce stage {self.address}: the partial aggregates of map task(s) "
                                     f"{missing} did not arrive within {timeout:g} s")
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ep.close()

    def __enter__(self) -> "Reducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class S2Result:
    """:func:`approx_s2`'s answer: the estimate, and what S2 moved (per map task: partials sent and arrived)."""

    estimate: estimators.Estimate
    maps: int
    partials_sent: int
    partials_arrived: int
    s2_seconds: float
    """From the first map task's start to the last partial at the reducer (the map tasks' S2 jobs)."""


def combine(partials_arrived, aggregate: str, confidence: float = 0.95, looks: int = 1) -> estimators.Estimate:
    """The reduce side: the partial aggregates that arrived, ``(stratum, Moments)`` from any tasks, added up per
    stratum and read as :func:`approx` reads rows (``looks`` as there)."""
    fn = {"avg": estimators.avg_from_moments, "sum": estimators.total_from_moments}.get(aggregate)
    if fn is None:
        raise AnalyticsError(f"aggregate {aggregate!r}: avg or sum")
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    merged = estimators.merge_moments(partials_arrived)
    if not merged:
        raise AnalyticsError("no partial aggregate arrived: nothing to estimate from")
    est = fn(merged.values(), 1.0 - (1.0 - confidence) / looks, aggregate)
    return dataclasses.replace(est, confidence=confidence)


def approx_s2(df, aggregate: str, e_max: float, *, maps: int = 2, confidence: float = 0.95, column: str = "value",
              looks: int = 1, msr: float = S2_MSR, bind: str = "127.0.0.1:0", seed: int = 0,
              timeout: float = 30.0) -> S2Result:
    """:func:`approx` as a map/reduce job whose S2 goes over ATP: ``df`` (the netapprox source's rows) is split at
    random into ``maps`` map tasks (``repartition``), each computes its partial aggregates (:func:`partials`) and
    sends them to the reduce stage on the driver (:class:`Reducer` on ``bind``) as one ATP job at ``msr``
    (:func:`send_partials`); the reducer's estimate is read from the partials that arrived (:func:`combine`)."""
    accuracy.check_e_max(e_max)
    if aggregate not in ("avg", "sum"):
        raise AnalyticsError(f"aggregate {aggregate!r}: avg or sum")
    if not (isinstance(maps, int) and maps >= 1):
        raise AnalyticsError(f"maps={maps!r}: an integer >= 1")
    if not 0.0 < msr <= 1.0:
        raise AnalyticsError(f"S2's MSR {msr!r} must be in (0, 1]")
    with Reducer(bind) as reducer:
        dest = reducer.address

        def map_task(index, it):
            cells = partials(it, column)
            if not cells:
                return iter([])
            t = time.time()
            summary = send_partials(dest, cells, job_id=index + 1, msr=msr, seed=seed, timeout=timeout)
            return iter([(index + 1, len(cells), t, summary.jct_s)])

        sent = df.select("stratum", "population", column).repartition(maps).rdd.mapPartitionsWithIndex(
            map_task).collect()
        if not sent:
            raise AnalyticsError("no rows arrived: nothing to estimate from")
        reducer.wait([j for j, *_ in sent], timeout)
        arrived = [p for j, *_ in sent for p in reducer.jobs[j]["partials"]]
        start = min(t for _, _, t, _ in sent)
        s2 = max(t + jct for _, _, t, jct in sent) - start
    est = combine(arrived, aggregate, confidence, looks)
    return S2Result(est, len(sent), sum(n for _, n, _, _ in sent), len(arrived), s2)
