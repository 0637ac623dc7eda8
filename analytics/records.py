"""S2 moving records: the map->reduce stage as a ReduceByKey shuffle of the rows themselves over ATP, where S2
samples again. Each map task sends its rows (one ATP message per row, one ATP group per stratum) to the reduce
stage at the MSR per stratum that the reducer's bound needs (:func:`plan_msr`, from S1's sample), and the reducer
estimates from the records that arrived (:func:`combine_records`). S1's sample then S2's: a two-phase sample,
whose estimator and variance are in docs/analytics.md (S2 moving records). This module needs neither Spark nor a
JVM; ``spark.approx_s2(..., shuffle="records")`` runs its map tasks with it.
"""
from __future__ import annotations

import dataclasses
import math
import random
import struct

from netapprox.analytics import accuracy, estimators
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AnalyticsJob
from netapprox.analytics.partials import Reducer
from netapprox.hostlib.api import send_job
from netapprox.hostlib.config import AtpConfig, JobSpec, Message

RECORD = struct.Struct("!iqdq")
"""One record on the wire (one ATP message): stratum, its population, the value and the key, then the rest of the
row's bytes (28 bytes and the rest). A Count's records carry its 0/1 indicator as the value."""

RUN_FRACTION = 0.02
"""A map task sends each stratum's records in runs of this share of its rows, the strata taking turns by progress
(as S1 does, docs/analytics.md, Unbiased samples: one announce range per run)."""


@dataclasses.dataclass(frozen=True)
class Record:
    stratum: int
    population: int
    value: float
    key: int
    extra: bytes = b""


def encode_record(r: Record) -> bytes:
    return RECORD.pack(r.stratum, r.population, r.value, r.key) + r.extra


def decode_record(data: bytes) -> Record:
    if len(data) < RECORD.size:
        raise AnalyticsError(f"a record is at least {RECORD.size} bytes, not {len(data)}")
    h, pop, value, key = RECORD.unpack_from(data)
    if pop < 1 or not math.isfinite(value):
        raise AnalyticsError(f"record of stratum {h}: population {pop}, value {value!r} are not a row's")
    return Record(h, pop, value, key, bytes(data[RECORD.size:]))


def map_records(rows, aggregate: str, *, column: str = "value", predicate=None, key_column: str = "key",
                extra_column: str | None = None) -> list[Record]:
    """A map task's rows as records: the value of ``column`` (a Count: the 0/1 ``predicate(row)``), the key of
    ``key_column``, and ``extra_column``'s bytes (none by default: a Spark row's record is its 28 bytes)."""
    out = []
    for r in rows:
        if aggregate == "count":
            v = 1.0 if predicate(r) else 0.0
        else:
            v = 0.0 if aggregate == "rank" else float(r[column])
        key = int(r[key_column]) if aggregate == "rank" else 0
        out.append(Record(int(r["stratum"]), int(r["population"]), v, key,
                          bytes(r[extra_column]) if extra_column else b""))
    return out


def _need(cells, aggregate: str, e_max: float, level: float, k: int | None) -> float | None:
    """The sampling fraction of every stratum's population at which the bound holds, read from S1's sample
    (moments per stratum; a Rank: key counts, the largest need of its top ``k`` keys at the Bonferroni level)."""
    if aggregate != "rank":
        return accuracy.needed_fraction_moments(list(cells.values()), e_max, level)
    counts: dict[int, float] = {}
    for pop, n, c in cells.values():
        for key, x in c.items():
            counts[key] = counts.get(key, 0.0) + pop * x / n
    top = sorted(counts, key=lambda key: (-counts[key], repr(key)))[:k]
    joint = 1.0 - (1.0 - level) / max(1, len(top))
    needs = [accuracy.needed_fraction_moments(
        [estimators.Moments(pop, n, float(c.get(key, 0)), float(c.get(key, 0))) for pop, n, c in cells.values()],
        e_max, joint) for key in top]
    return None if not needs or None in needs else max(needs)


def merge_cells(parts, aggregate: str) -> dict:
    """The map tasks' S2 partials (:func:`partials.map_s2`, one dict per task) added up per stratum: S1's whole
    sample as :func:`plan_msr` reads it (``Moments``; a Rank's ``(population, n, {key: count})``)."""
    if aggregate != "rank":
        return estimators.merge_moments(p for cells in parts for p in cells.items())
    out: dict[int, tuple[int, int, dict[int, int]]] = {}
    for cells in parts:
        for h, (pop, n, counts) in cells.items():
            _, n0, c0 = out.get(h, (pop, 0, {}))
            out[h] = (pop, n0 + n, {key: c0.get(key, 0) + counts.get(key, 0) for key in {*c0, *counts}})
    return out


def plan_msr(cells, aggregate: str, e_max: float, confidence: float = 0.95, looks: int = 1, *,
             k: int | None = None) -> dict[int, float]:
    """S2's MSR per stratum: the share of S1's sample of it (``n_h`` rows) that the reducer's bound needs.
    ``cells``: S1's sample as the map tasks' partials merged (``{stratum: Moments}``, a Rank's ``{stratum:
    (population, n, {key: count})}``, :func:`partials.map_s2`). The needed fraction ``f`` of every population
    (:func:`accuracy.needed_fraction_moments` at the looks' level, times ``MARGIN``, at least ``MIN_MSR``) asks
    ``ceil(f N_h)`` rows, at least two; a stratum whose sample holds fewer is sent whole (MSR 1), and every
    stratum is when the sample cannot tell (:func:`accuracy.needed_fraction` is ``None``)."""
    accuracy.check_e_max(e_max)
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    f = _need(cells, aggregate, e_max, 1.0 - (1.0 - confidence) / looks, k)
    out = {}
    for h, cell in cells.items():
        pop, n = (cell[0], cell[1]) if aggregate == "rank" else (cell.population, cell.n)
        if f is None or n <= estimators.MIN_SAMPLE_PER_STRATUM:
            out[h] = 1.0
            continue
        want = max(estimators.MIN_SAMPLE_PER_STRATUM, math.ceil(accuracy.msr_from_fraction(f) * pop))
        out[h] = min(1.0, want / n)
    return out


def records_job(records: list[Record], msr: dict[int, float], *, job_id: int, seed: int = 0) -> JobSpec:
    """One map task's records as an ATP job: one message per record, its stratum's ATP group at ``msr[stratum]``,
    each stratum's records in a random order seeded by ``seed`` and ``job_id`` (what is sent last of a stratum, or
    never, is a random subset of it), in runs of ``RUN_FRACTION`` of it taking turns by progress."""
    rng = random.Random(seed * 1_000_003 + job_id)
    by: dict[int, list[Record]] = {}
    for r in records:
        by.setdefault(r.stratum, []).append(r)
    runs = []
    for h in sorted(by):
        rs = by[h]
        rng.shuffle(rs)
        size = max(1, math.ceil(RUN_FRACTION * len(rs)))
        for at in range(0, len(rs), size):
            runs.append(((at + size / 2) / len(rs), rng.random(), rs[at:at + size]))
    runs.sort(key=lambda run: run[:2])
    missing = sorted(set(by) - set(msr))
    if missing:
        raise AnalyticsError(f"no S2 MSR for stratum {missing[0]} (plan_msr covers the strata of S1's sample)")
    messages = tuple(Message(encode_record(r), group_id=r.stratum) for _, _, rs in runs for r in rs)
    return JobSpec(job_id, messages, msr=1.0, group_msr={h: msr[h] for h in by})


def send_records(dest: str, records: list[Record], msr: dict[int, float], *, job_id: int, seed: int = 0,
                 timeout: float = 30.0, config: AtpConfig = AtpConfig()):
    """:func:`records_job` to the reduce stage at ``dest`` (MRDF off, ``AnalyticsJob.config``); the sender's
    ``SendSummary``."""
    spec = records_job(records, msr, job_id=job_id, seed=seed)
    return send_job(dest, spec, config=AnalyticsJob.config(config), timeout=timeout)


class RecordReducer(Reducer):
    """:class:`Reducer` for records: keeps every map task's job's records (``jobs[j]["records"]``), a message that
    is not one counted in ``malformed``, never estimated from."""

    def _decode_job(self, messages: list[bytes]) -> dict:
        good, bad = [], 0
        for d in messages:
            try:
                good.append(decode_record(d))
            except AnalyticsError:
                bad += 1
        return {"records": good, "malformed": bad}


def combine_records(records, aggregate: str, confidence: float = 0.95, looks: int = 1, *, k: int | None = None,
                    strata=None):
    """The reducer's answer from the records that arrived: per stratum, the records are a simple random sample of
    its population (S2's of S1's, each random within the stratum), read by the stratified estimators
    (``estimators.avg``, ``total``, ``count`` of 0/1 values, ``rank`` of the keys) at ``1 - (1 - confidence) /
    looks``; ``strata`` as :func:`partials.combine` (a stratum none of whose records arrived is one line)."""
    if not (isinstance(looks, int) and looks >= 1):
        raise AnalyticsError(f"looks={looks!r}: an integer >= 1")
    by: dict[int, list[Record]] = {}
    for r in records:
        rs = by.setdefault(r.stratum, [])
        if rs and rs[0].population != r.population:
            raise AnalyticsError(f"stratum {r.stratum}: records of populations {rs[0].population} and {r.population}")
        rs.append(r)
    if not by:
        raise AnalyticsError("no record arrived: nothing to estimate from")
    missing = sorted(set(strata or ()) - set(by))
    if missing:
        raise AnalyticsError(f"no record of stratum {missing[0]} arrived ({len(missing)} strata without one): the "
                             f"estimate would be of part of the population (raise S2's MSR)")
    level = 1.0 - (1.0 - confidence) / looks
    if aggregate == "rank":
        est = estimators.rank([(rs[0].population, [r.key for r in rs]) for _, rs in sorted(by.items())], k, level)
        return dataclasses.replace(est, confidence=confidence)
    fn = {"avg": estimators.avg, "sum": estimators.total, "count": estimators.count}.get(aggregate)
    if fn is None:
        raise AnalyticsError(f"aggregate {aggregate!r}: avg, sum, count or rank")
    est = fn([estimators.Stratum(rs[0].population, tuple(r.value for r in rs)) for _, rs in sorted(by.items())],
             level, aggregate)
    return dataclasses.replace(est, confidence=confidence)
