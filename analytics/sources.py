"""Several sources, one estimate: a job whose rows are split over ``S`` sources (the paper's Fig. 15 input, Kafka
brokers each holding partitions of the data, sending to the Spark workers at once), each source one ATP job into
the worker, and one answer with one bound over every row that arrived (docs/analytics.md, Several sources).

- **The estimate.** Every source's job has its own strata (group x packet count x size class, :mod:`.job`); over
  all sources the strata are source x stratum, each of known size ``N_kh`` with ``n_kh`` rows arrived, a simple
  random sample of it. The combined answer is the stratified estimator over all of them (Cochran ch. 5: Avg
  ``sum W_kh ybar_kh``, its variance ``sum W_kh^2 (1 - f_kh) s_kh^2 / n_kh``; Sum, Count and Rank as one job's),
  read at the level of the sources' looks.
- **The MSR split.** The combined variance is the sum of the sources' parts, ``Var = sum_k W_k^2 V_k`` (``W_k``
  the source's share of the bound's rows, ``V_k`` the variance of its own estimate). Each source gets a share of
  the variance the bound allows in proportion to its rows: ``W_k^2 V_k <= W_k (e_max ybar / z)^2``, that is a
  relative bound of its own, ``e_k = e_max / sqrt(W_k)`` (``e_max sqrt(S)`` for equal parts). The shares add up to
  the bound (``sum W_k = 1``), and for sources alike (random partitions: their means and variances are the
  population's up to sampling noise) it is the split that needs the fewest rows: minimising ``sum n_k`` subject to
  ``sum W_k^2 S^2 / n_k <= B`` gives ``n_k`` proportional to ``W_k`` (proportional allocation, Cochran 5.5), at which
  ``W_k^2 V_k`` is proportional to ``W_k``. Each source's job then follows its own running estimate at ``e_k`` (the live MSR of one job) and
  ends when its share holds; the job ends when every source's has, which is when the combined bound holds (up to
  the sources' means differing). No control channel from the worker to the sources is needed.
  Sources that hold *different* data (``alike=False``: a topic partitioned by key, where a Rank's key lives in
  one source) get ``e_k = e_max`` each: if every source's half-width is within ``e_max`` of its own answer
  (non-negative values), the combined one is within ``e_max`` of the combined answer whatever the sources hold
  (``sqrt(sum a_k^2) <= sum a_k``), at the price of more rows. The share of alike sources would miss the bound
  there: a key held by one source of 38 % of the rows gets a bound ``1 / sqrt(W_k)`` = 1.6x too loose (measured: 72
  of 200 jobs met every bound).

``SourcesJob(parts, queries)`` takes the parts as given (a source's partition), ``split(rows, S, seed)`` makes
random ones; ``run`` sends every source's job over its own simulated link (:mod:`.link`), ``estimate`` answers
from the sources' samples.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Mapping, Sequence

from netapprox.analytics import accuracy, estimators, link
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import Stratum
from netapprox.analytics.job import LIVE_LOOKS, AnalyticsJob, Answer, Query, Result, Row, truth_of
from netapprox.hostlib.config import AtpConfig

PAPER_SOURCES = 3
"""The paper's lab cluster has three Kafka brokers, the data sources of Fig. 15 (§7.2)."""
MAX_SOURCE_E_MAX = 0.99
"""A source's share of a bound is never looser than this relative error (a bound must be below 1)."""


def check_sources(sources: object) -> int:
    if isinstance(sources, bool) or not isinstance(sources, int) or sources < 1:
        raise AnalyticsError(f"sources {sources!r}: must be an integer >= 1")
    return sources


def split(rows: Sequence[Row], sources: int, seed: int = 0) -> list[list[Row]]:
    """``rows`` split at random over ``sources`` parts of (nearly) equal size, as a producer spreads records over a
    topic's partitions; fixed by ``seed``."""
    check_sources(sources)
    if len(rows) < sources:
        raise AnalyticsError(f"{len(rows)} rows cannot be split over {sources} sources: every source needs rows")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [[rows[i] for i in sorted(order[k::sources])] for k in range(sources)]


@dataclasses.dataclass(frozen=True)
class SourcesResult:
    result: Result
    """The combined answers, from every source's sample (``jct_s``: the last source's end)."""
    sources: tuple[Result, ...]
    """Each source's own answers, at its share of the bounds."""
    samples: tuple[Mapping[int, bytes], ...] = dataclasses.field(default=(), compare=False, repr=False)
    """Per source, the messages its answer was read from."""

    def as_dict(self) -> dict:
        return {**self.result.as_dict(), "sources": [r.as_dict() for r in self.sources]}


class SourcesJob:
    """One analytics job over several sources (the module docstring): ``parts[k]`` is source ``k``'s rows; the
    source's ATP job has id ``job_id + k``."""

    def __init__(self, parts: Sequence[Sequence[Row]], queries: Sequence[Query], *, seed: int = 0, job_id: int = 1,
                 max_payload: int = AtpConfig().max_payload, alike: bool = True) -> None:
        if not queries:
            raise AnalyticsError("no queries: state at least one aggregate and its e_max")
        check_sources(len(parts))
        for k, part in enumerate(parts):
            if not part:
                raise AnalyticsError(f"source {k} has no rows: every source needs rows (drop it, or split the rows "
                                     f"over fewer sources)")
        self.parts = [list(p) for p in parts]
        self.alike = alike
        """The parts are random partitions of the data (:func:`split`): each source a share of the combined variance
        in proportion to its rows; ``False``: each source meets every bound on its own."""
        self.queries = tuple(queries)
        self.rows = [r for p in self.parts for r in p]
        sizes: dict[int, int] = {}
        for r in self.rows:
            sizes[r.group] = sizes.get(r.group, 0) + 1
        self.groups = sorted(sizes)
        self._check_groups(sizes)
        self.jobs: list[AnalyticsJob] = []
        for k, part in enumerate(self.parts):
            try:
                self.jobs.append(AnalyticsJob(part, self.source_queries(k), job_id=job_id + k,
                                              seed=seed * 1009 + k, max_payload=max_payload))
            except AnalyticsError as err:
                raise AnalyticsError(f"source {k}: {err}") from None

    def _check_groups(self, sizes: Mapping[int, int]) -> None:
        for q in self.queries:
            for g, _ in q.group_e_max:
                if g not in sizes:
                    raise AnalyticsError(f"{q.name}: group {g} has a bound but no rows")
            for g, e in q.bounds(self.groups):
                if g is not None and sizes[g] < accuracy.MIN_GROUP_ROWS:
                    raise AnalyticsError(f"{q.name}: group {g} has {sizes[g]} rows; a bound of e_max {e:g} needs "
                                         f"at least {accuracy.MIN_GROUP_ROWS}")

    def share(self, k: int, group: int | None, e_max: float) -> float:
        """Source ``k``'s relative bound for a bound ``e_max`` over ``group`` (``None``: all rows): its share of the
        combined variance in proportion to its rows of it, ``e_max / sqrt(W_k)``; ``e_max`` itself when the sources
        are not :attr:`alike`."""
        if not self.alike:
            return e_max
        held = [sum(1 for r in p if group is None or r.group == group) for p in self.parts]
        return min(MAX_SOURCE_E_MAX, e_max / math.sqrt(held[k] / sum(held)))

    def source_queries(self, k: int) -> list[Query]:
        """Source ``k``'s queries: every bound at the source's share (:meth:`share`), for the groups it holds."""
        own = {r.group for r in self.parts[k]}
        out = []
        for q in self.queries:
            groups = {g: self.share(k, g, e) for g, e in q.bounds(self.groups) if g is not None and g in own}
            out.append(dataclasses.replace(q, e_max=self.share(k, None, q.e_max), per_group=False,
                                           group_e_max=tuple(sorted(groups.items()))))
        return out

    def estimate(self, samples: Sequence[Mapping[int, bytes]], *, looks: int = 1,
                 jct_s: float | None = None) -> Result:
        """Every query's answers over all sources from ``samples[k]``, the messages of source ``k``'s job that
        arrived, stratified by source x stratum, each bound at ``1 - (1 - confidence) / looks``."""
        if len(samples) != len(self.jobs):
            raise AnalyticsError(f"{len(samples)} samples for {len(self.jobs)} sources: one per source")
        answers = []
        for q in self.queries:
            for g, e in q.bounds(self.groups):
                try:
                    answers.append(Answer(q, g, e, self._estimate(q, g, samples, looks)))
                except AnalyticsError as err:
                    answers.append(Answer(q, g, e, None, str(err)))
        return Result(tuple(answers), sum(len(s) for s in samples), len(self.rows), jct_s)

    def _estimate(self, q: Query, group: int | None, samples: Sequence[Mapping[int, bytes]], looks: int):
        level = 1.0 - (1.0 - q.confidence) / looks
        cells: list[tuple[int, list[Row]]] = []
        for job, sample in zip(self.jobs, samples):
            cells += job.post_strata(group, sample)
        if q.aggregate == "rank":
            est = estimators.rank([(n, [r.key for r in rows]) for n, rows in cells], q.k, level)
            return dataclasses.replace(est, confidence=q.confidence)
        if q.aggregate == "count":
            strata = [Stratum(n, tuple(1.0 if r.value > q.above else 0.0 for r in rows)) for n, rows in cells]
        else:
            strata = [Stratum(n, tuple(r.value for r in rows)) for n, rows in cells]
        fn = {"avg": estimators.avg, "sum": estimators.total, "count": estimators.count}[q.aggregate]
        return dataclasses.replace(fn(strata, level, q.name), confidence=q.confidence)

    def truth(self, q: Query, group: int | None = None):
        """The exact answer over every source's rows."""
        return truth_of(self.rows, q, group)

    def run(self, *, config: AtpConfig = AtpConfig(), adapt: bool = True,
            forward: Callable[[int], link.LossyPath] | None = None,
            reverse: Callable[[int], link.LossyPath] | None = None) -> SourcesResult:
        """Every source's job over its own simulated link (``forward(k)``, ``reverse(k)``: source ``k``'s paths), in
        virtual time, from the paper's initial MSR; with ``adapt`` each follows its running estimate at its share of
        the bounds and ends once its share holds. The combined answer from every source's sample (that of its
        stopping look), at the looks' level; its JCT the last source's (the sources start together)."""
        own, samples = [], []
        for k, job in enumerate(self.jobs):
            spec = job.job_spec()
            live = job.live_msr(spec) if adapt else None
            t = link.run(spec, job.config(config), forward=forward(k) if forward else None,
                         reverse=reverse(k) if reverse else None, on_step=live.step if live is not None else None)
            if t.failure is not None:
                raise AnalyticsError(f"source {k}: job {job.job_id} failed: {t.failure}")
            final = {g["group_id"]: g["msr"] for g in t.summary.as_dict()["groups"]}
            if live is not None:
                own.append(dataclasses.replace(live.result(t.received, jct_s=t.summary.jct_s, msr=final),
                                               looks=live.looks))
                samples.append(live.stopped_at if live.stopped_at is not None else t.received)
            else:
                own.append(job.estimate(t.received, jct_s=t.summary.jct_s, msr=final))
                samples.append(t.received)
        jct = max(r.jct_s for r in own)
        combined = self.estimate(samples, looks=LIVE_LOOKS if adapt else 1, jct_s=jct)
        return SourcesResult(combined, tuple(own), tuple(samples))
