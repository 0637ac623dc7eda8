"""Estimators over a stratified sample without replacement, each with its error bound (standard sampling theory).

The population is split into strata ``h`` of known size ``N_h`` (a job's groups, and within a group its message
size classes: docs/analytics.md, Unbiased samples); ``n_h`` of a stratum's rows arrived, a simple random sample of
it. With ``W_h = N_h / N``, ``f_h = n_h / N_h`` and ``s_h^2`` the sample variance of the stratum:

- mean: ``ybar_st = sum W_h ybar_h``, ``Var = sum W_h^2 (1 - f_h) s_h^2 / n_h`` (finite-population correction
  ``1 - f_h``: a stratum that arrived whole adds nothing);
- total: ``N ybar_st``, ``Var = N^2 Var(ybar_st)``;
- count of rows that satisfy a predicate: the total of its 0/1 indicator;
- top-k rank: the count of every key, its bound at a Bonferroni level ``1 - (1 - c) / k`` so the k bounds hold
  together at confidence ``c``.

The bound is the CLT interval ``estimate +- z sqrt(Var)`` with ``z`` the normal quantile at the confidence; the
relative error is its half-width over ``|estimate|``. A stratum with fewer than two rows in the sample (and not
all of its rows) has no variance estimate: the estimator raises :class:`AnalyticsError` saying which.
"""
from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import Callable, Hashable, Iterable, Mapping, Sequence

from netapprox.analytics.errors import AnalyticsError

MIN_SAMPLE_PER_STRATUM = 2
"""Rows a stratum needs in the sample for a variance estimate (unless the whole stratum arrived)."""


def z_of(confidence: float) -> float:
    """Two-sided normal quantile: 1.96 at 0.95."""
    if not 0.0 < confidence < 1.0:
        raise AnalyticsError(f"confidence {confidence!r}: must be in (0, 1), e.g. 0.95")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


@dataclasses.dataclass(frozen=True)
class Stratum:
    """What arrived of one stratum: its population size and the values of the rows in the sample."""

    population: int
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.values, tuple):
            object.__setattr__(self, "values", tuple(self.values))
        if len(self.values) > self.population:
            raise AnalyticsError(f"a stratum of {self.population} rows cannot have {len(self.values)} in its sample")

    @property
    def n(self) -> int:
        return len(self.values)

    def mean_var(self) -> tuple[float, float]:
        """(sample mean, variance of the sample mean with the finite-population correction)."""
        n, big_n = self.n, self.population
        if n == big_n and n > 0:
            return math.fsum(self.values) / n, 0.0
        if n < MIN_SAMPLE_PER_STRATUM:
            raise _too_few(n, big_n)
        mean = math.fsum(self.values) / n
        s2 = math.fsum((v - mean) ** 2 for v in self.values) / (n - 1)
        return mean, (1.0 - n / big_n) * s2 / n


def _too_few(n: int, big_n: int) -> AnalyticsError:
    return AnalyticsError(f"a stratum of {big_n} rows has {n} in the sample; a bound needs at least "
                   f"{MIN_SAMPLE_PER_STRATUM} (raise its MSR)")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One aggregate's answer and its error at ``confidence``."""

    name: str
    value: float
    half_width: float
    confidence: float
    sample: int
    population: int

    @property
    def low(self) -> float:
        return self.value - self.half_width

    @property
    def high(self) -> float:
        return self.value + self.half_width

    @property
    def relative_error(self) -> float:
        """Half-width over |estimate| (0 for an exact answer; inf for an estimate of 0 with a non-zero bound)."""
        if self.half_width == 0.0:
            return 0.0
        return self.half_width / abs(self.value) if self.value else math.inf

    def covers(self, truth: float) -> bool:
        return self.low <= truth <= self.high

    def as_dict(self) -> dict:
        return {"name": self.name, "estimate": self.value, "half_width": self.half_width,
                "relative_error": self.relative_error, "confidence": self.confidence,
                "sample": self.sample, "population": self.population}


def _strata(strata: Iterable[Stratum]) -> list[Stratum]:
    out = list(strata)
    if not out:
        raise AnalyticsError("no strata: nothing to estimate from")
    if sum(s.population for s in out) <= 0:
        raise AnalyticsError("the strata hold no rows")
    return [s for s in out if s.population > 0]


def stratified_mean(strata: Iterable[Stratum]) -> tuple[float, float]:
    """(``ybar_st``, its variance) over strata that make up one population."""
    ss = _strata(strata)
    big_n = sum(s.population for s in ss)
    mean = var = 0.0
    for s in ss:
        m, v = s.mean_var()
        w = s.population / big_n
        mean += w * m
        var += w * w * v
    return mean, var


def avg(strata: Iterable[Stratum], confidence: float = 0.95, name: str = "avg") -> Estimate:
    """The population mean."""
    ss = _strata(strata)
    mean, var = stratified_mean(ss)
    return Estimate(name, mean, z_of(confidence) * math.sqrt(var), confidence, sum(s.n for s in ss),
                    sum(s.population for s in ss))


def total(strata: Iterable[Stratum], confidence: float = 0.95, name: str = "sum") -> Estimate:
    """The population total (``N`` times the mean: the population sizes are known)."""
    ss = _strata(strata)
    big_n = sum(s.population for s in ss)
    mean, var = stratified_mean(ss)
    return Estimate(name, big_n * mean, z_of(confidence) * big_n * math.sqrt(var), confidence,
                    sum(s.n for s in ss), big_n)


def count(strata: Iterable[Stratum], confidence: float = 0.95, name: str = "count") -> Estimate:
    """The number of rows whose value is 1 (strata of 0/1 indicators: :func:`indicator_strata`)."""
    ss = _strata(strata)
    for s in ss:
        if any(v not in (0.0, 1.0) for v in s.values):
            raise AnalyticsError(f"{name}: count takes 0/1 indicator values (use indicator_strata)")
    return total(ss, confidence, name)


def indicator_strata(rows_per_stratum: Sequence[tuple[int, Sequence]], predicate: Callable) -> list[Stratum]:
    """Strata of 0/1 values from (population, rows) pairs: 1 where ``predicate(row)`` holds."""
    return [Stratum(big_n, tuple(1.0 if predicate(r) else 0.0 for r in rows)) for big_n, rows in rows_per_stratum]


@dataclasses.dataclass(frozen=True)
class RankEstimate:
    """The top-k keys by estimated count, each with its count's bound; the k bounds hold together."""

    top: tuple[tuple[Hashable, Estimate], ...]
    confidence: float
    separated: bool
    """The k-th key's lower bound is above the (k+1)-th key's upper bound: the top-k set itself is certain at
    this confidence (the order within it may not be)."""

    @property
    def relative_error(self) -> float:
        return max((e.relative_error for _, e in self.top), default=0.0)

    def keys(self) -> list[Hashable]:
        return [k for k, _ in self.top]

    def covers(self, truth: Mapping[Hashable, float]) -> bool:
        """Every reported key's true count lies within its bound."""
        return all(e.covers(truth.get(k, 0.0)) for k, e in self.top)

    def as_dict(self) -> dict:
        return {"confidence": self.confidence, "separated": self.separated, "relative_error": self.relative_error,
                "top": [{"key": k, **e.as_dict()} for k, e in self.top]}


def rank(keys_per_stratum: Sequence[tuple[int, Sequence[Hashable]]], k: int, confidence: float = 0.95
         ) -> RankEstimate:
    """Top-``k`` keys by count from (population, sampled keys) per stratum."""
    if k < 1:
        raise AnalyticsError(f"rank k={k}: must be >= 1")
    ss = [(big_n, list(keys)) for big_n, keys in keys_per_stratum if big_n > 0]
    if not ss:
        raise AnalyticsError("rank: no rows to rank")
    seen = sorted({key for _, keys in ss for key in keys}, key=repr)
    if not seen:
        raise AnalyticsError("rank: the sample holds no keys")
    joint = 1.0 - (1.0 - confidence) / min(k, len(seen))  # Bonferroni over the k reported keys
    counts = []
    for key in seen:
        strata = [Stratum(big_n, tuple(1.0 if x == key else 0.0 for x in keys)) for big_n, keys in ss]
        counts.append((key, total(strata, joint, f"count[{key!r}]")))
    counts.sort(key=lambda kv: (-kv[1].value, repr(kv[0])))
    top = tuple(counts[:k])
    rest = counts[k:]
    separated = not rest or top[-1][1].low > max(e.high for _, e in rest)
    return RankEstimate(top, confidence, separated)


@dataclasses.dataclass(frozen=True)
class Moments:
    """What a map task tells the reduce stage of one stratum's rows it holds (a partial aggregate): the stratum's
    population size and the count, sum and sum of squares of its sampled values there. Moments of one stratum
    from several tasks add up (:func:`merge_moments`)."""

    population: int
    n: int
    total: float
    total_sq: float


def merge_moments(parts: Iterable[tuple[int, Moments]]) -> dict[int, Moments]:
    """``(stratum, Moments)`` from any number of tasks, added up per stratum (the populations must agree)."""
    out: dict[int, Moments] = {}
    for h, m in parts:
        if h in out:
            o = out[h]
            if o.population != m.population:
                raise AnalyticsError(f"stratum {h}: partial aggregates of populations {o.population} and "
                                     f"{m.population}")
            m = Moments(o.population, o.n + m.n, o.total + m.total, o.total_sq + m.total_sq)
        out[h] = m
    return out


def avg_from_moments(strata: Iterable[Moments], confidence: float = 0.95, name: str = "avg") -> Estimate:
    """:func:`avg` from each stratum's moments instead of its values (the same estimator; the reduce stage of a
    map/reduce job sees only partial aggregates)."""
    ss = list(strata)
    if not ss:
        raise AnalyticsError("no strata: nothing to estimate from")
    big_n = sum(m.population for m in ss)
    mean = var = 0.0
    for m in ss:
        if m.n < 1:
            raise AnalyticsError(f"a stratum of {m.population} rows has none in the sample")
        if m.n < m.population and m.n < MIN_SAMPLE_PER_STRATUM:
            raise _too_few(m.n, m.population)
        ybar = m.total / m.n
        s2 = 0.0 if m.n < 2 else max(0.0, (m.total_sq - m.n * ybar * ybar) / (m.n - 1))
        mean += m.population / big_n * ybar
        var += (m.population / big_n) ** 2 * (1.0 - m.n / m.population) * s2 / m.n
    return Estimate(name, mean, z_of(confidence) * math.sqrt(var), confidence, sum(m.n for m in ss), big_n)


def total_from_moments(strata: Iterable[Moments], confidence: float = 0.95, name: str = "sum") -> Estimate:
    """:func:`total` from moments: ``N`` times :func:`avg_from_moments`."""
    ss = list(strata)
    e = avg_from_moments(ss, confidence, name)
    big_n = e.population
    return Estimate(name, big_n * e.value, big_n * e.half_width, confidence, e.sample, big_n)
