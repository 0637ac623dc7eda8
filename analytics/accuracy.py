"""From an error bound to an MSR: the paper's initial heuristic, and the sampling fraction a running estimate says
a bound needs (docs/analytics.md, How the MSR follows the bound).

Initial MSR (paper §6: "MSR = 0.9 for e_max = 10%"): ``1 - e_max``, at least ``MIN_MSR``. It is deliberately
generous: nothing is known of the data yet, and the running estimate lowers it.

Needed fraction: with proportional allocation (one fraction ``f`` for every stratum of the bound) the variance of
the stratified mean is ``(1 - f) / f * A`` with ``A = sum W_h^2 s_h^2 / N_h``; the bound holds when
``z^2 (1 - f) / f * A <= (e_max * ybar)^2 = z^2 B``, i.e. ``f >= A / (A + B)``. The running ``s_h`` and ``ybar``
stand in for the population's, times ``MARGIN`` for the noise in them.
"""
from __future__ import annotations

import math
from typing import Sequence

from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import MIN_SAMPLE_PER_STRATUM, Moments, Stratum, z_of

MIN_MSR = 0.05
"""No bound sets an MSR below this: a few rows of every stratum always arrive to estimate from."""
MARGIN = 1.15
"""The needed fraction is raised by this factor: the running variance is itself an estimate."""
MIN_GROUP_ROWS = 30
"""Rows a group (or a job) needs for a CLT bound; smaller ones are refused with a one-line error."""


def check_e_max(e_max: object, where: str = "e_max") -> float:
    if isinstance(e_max, bool) or not isinstance(e_max, (int, float)) or not 0.0 < e_max < 1.0:
        raise AnalyticsError(f"{where} {e_max!r}: must be in (0, 1), a relative error such as 0.05 for 5%")
    return float(e_max)


def initial_msr(e_max: float) -> float:
    """The paper's heuristic: ``1 - e_max`` (0.9 for 10 %), at least ``MIN_MSR``."""
    return max(MIN_MSR, 1.0 - check_e_max(e_max))


def needed_fraction(strata: Sequence[Stratum], e_max: float, confidence: float) -> float | None:
    """The sampling fraction (same in every stratum) at which the mean over ``strata`` meets ``e_max``, or ``None``
    when the sample cannot tell yet (a stratum with fewer than two rows, or a mean of zero)."""
    def mean_var(s: Stratum) -> tuple[float, float]:
        m = math.fsum(s.values) / s.n
        return m, (math.fsum((v - m) ** 2 for v in s.values) / (s.n - 1) if s.n > 1 else 0.0)
    return _needed_fraction(strata, mean_var, e_max, confidence)


def needed_fraction_moments(strata: Sequence[Moments], e_max: float, confidence: float) -> float | None:
    """:func:`needed_fraction` from each stratum's moments (count, sum, sum of squares of its sampled values):
    the same fraction in O(strata), for a caller that keeps the moments as rows arrive (the live MSR)."""
    def mean_var(s: Moments) -> tuple[float, float]:
        m = s.total / s.n
        return m, (max(0.0, (s.total_sq - s.n * m * m) / (s.n - 1)) if s.n > 1 else 0.0)
    return _needed_fraction(strata, mean_var, e_max, confidence)


def _needed_fraction(strata, mean_var, e_max: float, confidence: float) -> float | None:
    """Both forms of :func:`needed_fraction`: ``mean_var(stratum)`` gives a stratum's sample mean and variance."""
    ss = [s for s in strata if s.population > 0]
    big_n = sum(s.population for s in ss)
    if not ss or any(s.n < MIN_SAMPLE_PER_STRATUM and s.n < s.population for s in ss):
        return None
    a = 0.0
    mean = 0.0
    for s in ss:
        m, s2 = mean_var(s)
        w = s.population / big_n
        mean += w * m
        a += w * w * s2 / s.population
    if mean == 0.0:
        return None
    b = (e_max * mean / z_of(confidence)) ** 2
    return a / (a + b) if a > 0 else 0.0


def msr_from_fraction(fraction: float) -> float:
    """The MSR to ask ATP for, from a needed fraction: with ``MARGIN``, within [``MIN_MSR``, 1]."""
    return min(1.0, max(MIN_MSR, fraction * MARGIN))
