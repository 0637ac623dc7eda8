"""The map->reduce stage (the paper's S2) over ATP: a map task's partial aggregates (per stratum: the moments of its
sampled rows), one ATP message each, sent to the reduce stage (:class:`Reducer`), which adds up what arrived and
reads the stratified estimate and its bound from it (:func:`combine`). Spark's port (``spark.approx_s2``) runs its
map tasks with it; this module needs neither Spark nor a JVM (docs/analytics.md, S2).
"""
from __future__ import annotations

import dataclasses
import math
import random
import struct
import threading
import time

from netapprox.analytics import estimators
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AnalyticsJob
from netapprox.hostlib.api import ReceiverEndpoint, send_job
from netapprox.hostlib.config import JobSpec, Message

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


KEY_COUNTS = struct.Struct("!iqqI")
"""A Rank's partial aggregate (one ATP message per stratum a map task holds): stratum, its population, the task's
rows of it, and how many ``KEY_COUNT`` pairs follow (each key the task saw there and how many of its rows have it;
24 + 16 per key bytes, never ``PARTIAL``'s 36). The counts travel with their ``n``: a lost message is a smaller
sample of its stratum for every key at once, as a lost moments partial is (the estimate stays unbiased)."""
KEY_COUNT = struct.Struct("!qq")


def encode_partial(stratum: int, m: estimators.Moments) -> bytes:
    return PARTIAL.pack(stratum, m.population, m.n, m.total, m.total_sq)


def decode_partial(data: bytes) -> tuple[int, estimators.Moments]:
    if len(data) != PARTIAL.size:
        raise AnalyticsError(f"a partial aggregate is {PARTIAL.size} bytes, not {len(data)}")
    h, pop, n, t, t2 = PARTIAL.unpack(data)
    if pop < 1 or not 0 <= n <= pop:
        raise AnalyticsError(f"partial aggregate of stratum {h}: {n} rows of a population of {pop}")
    if not (math.isfinite(t) and math.isfinite(t2) and t2 >= 0.0):
        raise AnalyticsError(f"partial aggregate of stratum {h}: sums {t!r}, {t2!r} are not a sample's")
    return h, estimators.Moments(pop, n, t, t2)


def encode_key_counts(stratum: int, population: int, n: int, counts: dict[int, int]) -> bytes:
    items = sorted(counts.items())
    return KEY_COUNTS.pack(stratum, population, n, len(items)) + b"".join(KEY_COUNT.pack(k, c) for k, c in items)


def decode_key_counts(data: bytes) -> tuple[int, int, int, dict[int, int]]:
    """``(stratum, population, n, {key: count})`` of a Rank's partial (one line if it cannot be one)."""
    if len(data) < KEY_COUNTS.size or (len(data) - KEY_COUNTS.size) % KEY_COUNT.size:
        raise AnalyticsError(f"a partial of key counts is {KEY_COUNTS.size} + {KEY_COUNT.size} per key bytes, "
                             f"not {len(data)}")
    h, pop, n, k = KEY_COUNTS.unpack_from(data)
    if k != (len(data) - KEY_COUNTS.size) // KEY_COUNT.size:
        raise AnalyticsError(f"partial of key counts of stratum {h}: {k} keys announced, "
                             f"{(len(data) - KEY_COUNTS.size) // KEY_COUNT.size} present")
    if pop < 1 or not 0 <= n <= pop:
        raise AnalyticsError(f"partial of key counts of stratum {h}: {n} rows of a population of {pop}")
    counts = dict(KEY_COUNT.iter_unpack(data[KEY_COUNTS.size:]))
    if len(counts) != k or any(c < 1 for c in counts.values()) or sum(counts.values()) > n:
        raise AnalyticsError(f"partial of key counts of stratum {h}: counts {counts} of {n} rows are not a sample's")
    return h, pop, n, counts


def key_partials(rows, key_column: str = "key") -> dict[int, tuple[int, int, dict[int, int]]]:
    """A map task's partials for a Rank: per stratum, ``(population, rows, {key: count})`` of its rows."""
    out: dict[int, list] = {}
    for r in rows:
        c = out.setdefault(int(r["stratum"]), [int(r["population"]), 0, {}])
        c[1] += 1
        key = int(r[key_column])
        c[2][key] = c[2].get(key, 0) + 1
    return {h: (pop, n, counts) for h, (pop, n, counts) in out.items()}


def partials(rows, column: str = "value", predicate=None) -> dict[int, estimators.Moments]:
    """A map task's partial aggregates: per stratum, the moments of ``column`` over its rows (Spark ``Row``s of the
    netapprox source, or anything with ``stratum``, ``population`` and ``column``); with ``predicate``, of the 0/1
    indicator ``predicate(row)`` instead (a Count's partials: their sum is the task's count, :func:`combine`)."""
    out: dict[int, list] = {}
    for r in rows:
        v = float(r[column]) if predicate is None else (1.0 if predicate(r) else 0.0)
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


def send_key_partials(dest: str, cells: dict[int, tuple[int, int, dict[int, int]]], *, job_id: int,
                      msr: float = S2_MSR, seed: int = 0, timeout: float = 30.0):
    """:func:`send_partials` for a Rank's partials (:func:`key_partials`): one message per stratum."""
    items = sorted(cells.items())
    random.Random(seed * 1_000_003 + job_id).shuffle(items)
    spec = JobSpec(job_id=job_id, msr=msr,
                   messages=tuple(Message(encode_key_counts(h, pop, n, c)) for h, (pop, n, c) in items))
    return send_job(dest, spec, config=AnalyticsJob.config(), timeout=timeout)


class Reducer:
    """The reduce stage's receiving end: an ATP receiver on ``bind`` (port 0: any; ``address`` says which) that
    keeps every partial aggregate of every map task's job that finishes, until :meth:`close` (``jobs[job_id]``:
    :meth:`_decode_job`'s, and the job's ``total`` messages)."""

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
            self.jobs[r.job_id] = {**self._decode_job(self._arrived.pop(r.job_id, [])), "total": r.total}

        while not self._stop.is_set():
            self._ep.serve(jobs=None, timeout=0.1, on_job=on_job, on_message=on_message)

    def _decode_job(self, messages: list[bytes]) -> dict:
        """What the reduce stage keeps of one map task's job: its moments partials and its partials of key counts
        (told apart by their size), and how many messages were neither (counted, never estimated from)."""
        good, keyed, bad = [], [], 0
        for d in messages:
            try:
                if len(d) == PARTIAL.size:
                    good.append(decode_partial(d))
                else:
                    keyed.append(decode_key_counts(d))
            except AnalyticsError:
                bad += 1
        return {"partials": good, "key_counts": keyed, "malformed": bad}

    def wait(self, job_ids, timeout: float) -> None:
        """Until every job of ``job_ids`` finished here (one line if not within ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while not set(job_ids) <= set(self.jobs):
            if time.monotonic() > deadline:
                missing = sorted(set(job_ids) - set(self.jobs))
                raise AnalyticsError(f"reduce stage {self.address}: the S2 job(s) of map task(s) "
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


S2_AGGREGATES = ("avg", "sum", "count", "rank")
"""What S2 answers: Avg and Sum from moments partials, Count from moments of a 0/1 indicator, Rank from key counts."""


def check_s2_query(aggregate: str, *, predicate=None, k=None) -> None:
    """One line for a query S2 cannot answer: an unknown aggregate, a Count without its ``predicate``, a Rank
    without its ``k`` (or ``k`` not an integer >= 1), or an argument of one aggregate given to another."""
    if aggregate not in S2_AGGREGATES:
        raise AnalyticsError(f"aggregate {aggregate!r}: avg, sum, count or rank")
    if aggregate == "count" and predicate is None:
        raise AnalyticsError("count needs predicate=: the rows to count (a Column such as F.col('value') > 5, "
                             "or a function of the row)")
    if aggregate != "count" and predicate is not None:
        raise AnalyticsError(f"predicate= is count's; {aggregate} takes none")
    if aggregate == "rank":
        if k is None:
            raise AnalyticsError("rank needs k=: how many keys (the top k by count)")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise AnalyticsError(f"rank k={k!r}: an integer >= 1")
    elif k is not None:
        raise AnalyticsError(f"k= is rank's; {aggregate} takes none")


def map_s2(rows, aggregate: str, *, column: str = "value", predicate=None, key_column: str = "key") -> dict:
    """A map task's S2 partials for ``aggregate`` (:func:`check_s2_query`'s): key counts for a Rank
    (:func:`key_partials`), moments of the 0/1 ``predicate(row)`` for a Count, of ``column`` otherwise."""
    if aggregate == "rank":
        return key_partials(rows, key_column)
    return partials(rows, column, predicate if aggregate == "count" else None)


def send_s2(dest: str, cells: dict, aggregate: str, *, job_id: int, msr: float = S2_MSR, seed: int = 0,
            timeout: float = 30.0):
    """:func:`map_s2`'s partials to the reduce stage at ``dest``, one ATP job (the sender's ``SendSummary``)."""
    send = send_key_partials if aggregate == "rank" else send_partials
    return send(dest, cells, job_id=job_id, msr=msr, seed=seed, timeout=timeout)


def reduce_s2(jobs, aggregate: str, confidence: float = 0.95, looks: int = 1, *, k: int | None = None,
              strata=None):
    """The reduce stage's answer from the map tasks' jobs as :class:`Reducer` keeps them (``Reducer.jobs[j]``):
    :func:`combine_rank` of their key counts for a Rank, :func:`combine` of their moments otherwise."""
    if aggregate == "rank":
        return combine_rank([p for j in jobs for p in j["key_counts"]], k, confidence, looks, strata=strata)
    return combine([p for j in jobs for p in j["partials"]], aggregate, confidence, looks, strata=strata)


def _check_indicators(merged: dict[int, estimators.Moments]) -> None:
    """A Count's partials are moments of 0/1 values: per stratum a whole count ``c`` of at most ``n`` rows, and the
    sum of squares equal to it (one line otherwise: they were made without ``partials(..., predicate=...)``)."""
    for h, m in sorted(merged.items()):
        c = m.total
        if not (0.0 <= c <= m.n and c == round(c) and abs(m.total_sq - c) <= 1e-9 * max(1.0, c)):
            raise AnalyticsError(f"count: the partial aggregates of stratum {h} are not of 0/1 indicators (sum {c!r}, "
                                 f"sum of squares {m.total_sq!r} over {m.n} rows): make them with a predicate")


def combine(partials_arrived, aggregate: str, confidence: float = 0.95, looks: int = 1, *,
            strata=None) -> estimators.Estimate:
    """The reduce side: the partial aggregates that arrived, ``(stratum, Moments)`` from any tasks, added up per
    stratum and read as ``spark.approx`` reads rows (``looks`` as there): ``avg``, ``sum``, or ``count`` (of partials
    of 0/1 indicators, ``partials(..., predicate=...)``: the estimator ``estimators.count`` gives from the rows).
    ``strata``: every stratum the map tasks held; one of them without any partial is one line (the estimate would
    be of part of the population)."""
    fn = {"avg": estimators.avg_from_moments, "sum": estimators.total_from_moments,
          "count": estimators.total_from_moments}.get(aggregate)
    if fn is None:
        raise AnalyticsError(f"aggregate {aggregate!r}: avg, sum or count")
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    merged = estimators.merge_moments(partials_arrived)
    if not merged:
        raise AnalyticsError("no partial aggregate arrived: nothing to estimate from")
    if aggregate == "count":
        _check_indicators(merged)
    missing = sorted(set(strata or ()) - set(merged))
    if missing:
        raise AnalyticsError(f"no partial aggregate of stratum {missing[0]} arrived ({len(missing)} strata without "
                             f"one): the estimate would be of part of the population (raise S2's MSR)")
    est = fn(merged.values(), 1.0 - (1.0 - confidence) / looks, aggregate)
    return dataclasses.replace(est, confidence=confidence)




def combine_rank(arrived, k: int, confidence: float = 0.95, looks: int = 1, *, strata=None) -> estimators.RankEstimate:
    """The reduce side of a Rank: the partials of key counts that arrived, ``(stratum, population, n, {key: count})``
    from any tasks, added up per stratum and read as ``estimators.rank`` reads the rows' keys (each key's count a
    total of its 0/1 indicator, the k reported bounds jointly at ``confidence``, Bonferroni; ``looks`` and
    ``strata`` as :func:`combine`)."""
    if not (isinstance(k, int) and k >= 1):
        raise AnalyticsError(f"rank k={k!r}: an integer >= 1")
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    merged: dict[int, list] = {}
    for h, pop, n, counts in arrived:
        m = merged.setdefault(h, [pop, 0, {}])
        if m[0] != pop:
            raise AnalyticsError(f"stratum {h}: partials of key counts of populations {m[0]} and {pop}")
        m[1] += n
        for key, c in counts.items():
            m[2][key] = m[2].get(key, 0) + c
    if not merged:
        raise AnalyticsError("no partial of key counts arrived: nothing to rank")
    missing = sorted(set(strata or ()) - set(merged))
    if missing:
        raise AnalyticsError(f"no partial of key counts of stratum {missing[0]} arrived ({len(missing)} strata without "
                             f"one): the ranking would be of part of the population (raise S2's MSR)")
    keys = sorted({key for _, _, counts in merged.values() for key in counts}, key=repr)
    if not keys:
        raise AnalyticsError("rank: the partials hold no keys")
    level = 1.0 - (1.0 - confidence) / looks
    joint = 1.0 - (1.0 - level) / min(k, len(keys))
    ranked = []
    for key in keys:
        ms = [estimators.Moments(pop, n, float(c.get(key, 0)), float(c.get(key, 0))) for pop, n, c in merged.values()]
        ranked.append((key, estimators.total_from_moments(ms, joint, f"count[{key!r}]")))
    ranked.sort(key=lambda kv: (-kv[1].value, repr(kv[0])))
    top, rest = tuple(ranked[:k]), ranked[k:]
    separated = not rest or top[-1][1].low > max(e.high for _, e in rest)
    return estimators.RankEstimate(top, confidence, separated)
