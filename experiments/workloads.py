"""Seeded workload generators: FBKV and FBHD approximate jobs, web-search background flows, Poisson arrivals.

Every generator takes a ``numpy.random.Generator`` (or a seed) and nothing else random, so a run is
reproduced by its seed. Sizes are bytes of application payload, times are seconds from the start of
the job. docs/experiments.md lists the sources and parameters; the short version:

FBKV (key-value, small jobs)
    Atikoglu et al., "Workload Analysis of a Large-Scale Key-Value Store", SIGMETRICS 2012, ETC pool
    (the pool the paper models analytically, §5):

    - key size: generalized extreme value, location 30.7984, scale 8.20449, shape 0.078688 (bytes);
    - value size: generalized Pareto, location 0, scale 214.476, shape 0.348238 (bytes);
    - request inter-arrival gap: generalized Pareto, location 0, scale 16.0292 µs, shape 0.154971.

    One FBKV message is one key-value item (key + value bytes). Item sizes are capped at
    ``FBKV_MAX_ITEM`` (memcached's default 1 MiB item limit).

FBHD (Hadoop, large jobs)
    Roy et al., "Inside the Social Network's (Datacenter) Network", SIGCOMM 2015, Hadoop cluster flow
    sizes, as the piecewise-linear CDF used by the HPCC simulator (``FbHdp_distribution.txt``, Li et al.,
    SIGCOMM 2019). Mean 120 KB, 50% below 700 B, tail to 10 MB. The trace has no published inter-arrival
    model; FBHD messages arrive as a Poisson process.

Web-search background flows
    The DCTCP web-search flow-size CDF (Alizadeh et al., SIGCOMM 2010) in the tabulation used by pFabric
    (Alizadeh et al., SIGCOMM 2013; ``CDF_search.tcl``): sizes in 1460-byte packets, mean ~1.67 MB.
    The DDNN-priority thesis (papers/003) uses the same CDF with Poisson flow arrivals.

Scaling. The traces come from 10-40 Gbit/s networks; these experiments run at tens of Mbit/s on two
cores. Shapes are kept; *time* is scaled: inter-arrival gaps keep the trace's distribution shape but are
rescaled so the offered load of the job (mean size / mean gap) is a chosen fraction of the link rate.
Background flow sizes may be divided by ``size_scale`` (documented in each experiment's JSON).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Sequence

import numpy as np

from netapprox.experiments.jobs import LARGE_FLOW_BYTES, SMALL_FLOW_BYTES, Flow, JobWorkload  # noqa: F401 - re-exported

MTU_PAYLOAD = 1460
"""Bytes of TCP payload per 1500-byte packet; the unit of the pFabric web-search table."""

FBKV_MAX_ITEM = 1 << 20


def rng_for(seed: int | np.random.Generator) -> np.random.Generator:
    """A PCG64 generator for ``seed`` (or ``seed`` itself when it already is a generator)."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(int(seed))


# --------------------------------------------------------------------------------------------------
# Distributions


@dataclasses.dataclass(frozen=True)
class GeneralizedPareto:
    """Generalized Pareto distribution, CDF 1 - (1 + k (x - theta) / sigma) ** (-1 / k), for 0 <= k < 1."""

    sigma: float
    k: float
    theta: float = 0.0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        u = 1.0 - rng.random(size)  # in (0, 1]
        if self.k == 0.0:
            return self.theta - self.sigma * np.log(u)
        return self.theta + self.sigma * (u ** (-self.k) - 1.0) / self.k

    def mean(self) -> float:
        return self.theta + self.sigma / (1.0 - self.k)

    def quantile(self, p: float) -> float:
        if self.k == 0.0:
            return self.theta - self.sigma * math.log(1.0 - p)
        return self.theta + self.sigma * ((1.0 - p) ** (-self.k) - 1.0) / self.k


@dataclasses.dataclass(frozen=True)
class GeneralizedExtremeValue:
    """GEV distribution, CDF exp(-(1 + k (x - mu) / sigma) ** (-1 / k)), k != 0."""

    mu: float
    sigma: float
    k: float

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        u = 1.0 - rng.random(size)  # (0, 1]
        u = np.clip(u, 1e-300, 1.0 - 1e-16)
        return self.mu + self.sigma * ((-np.log(u)) ** (-self.k) - 1.0) / self.k

    def mean(self) -> float:
        return self.mu + self.sigma * (math.gamma(1.0 - self.k) - 1.0) / self.k

    def quantile(self, p: float) -> float:
        return self.mu + self.sigma * ((-math.log(p)) ** (-self.k) - 1.0) / self.k


@dataclasses.dataclass(frozen=True)
class EmpiricalCdf:
    """A piecewise-linear CDF given as (value, cumulative probability) points, probabilities from 0 to 1.

    Sampling is inverse-transform with linear interpolation between points, as ns-2's
    ``EmpiricalRandomVariable`` (pFabric) and HPCC's ``traffic_gen.py`` do.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        values = [v for v, _ in self.points]
        probs = [p for _, p in self.points]
        if len(self.points) < 2 or probs[0] != 0.0 or probs[-1] != 1.0:
            raise ValueError("an empirical CDF needs at least two points, from probability 0 to 1")
        if values != sorted(values) or probs != sorted(probs):
            raise ValueError("CDF points must be non-decreasing in value and probability")

    @property
    def values(self) -> np.ndarray:
        return np.array([v for v, _ in self.points], dtype=float)

    @property
    def probs(self) -> np.ndarray:
        return np.array([p for _, p in self.points], dtype=float)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.interp(rng.random(size), self.probs, self.values)

    def quantile(self, p: float) -> float:
        return float(np.interp(p, self.probs, self.values))

    def cdf(self, x: float) -> float:
        values, probs = self.values, self.probs
        if x <= values[0]:
            return 0.0
        if x >= values[-1]:
            return 1.0
        # the last point with value <= x (flat steps take the highest probability)
        i = bisect.bisect_right(list(values), x) - 1
        if values[i + 1] == values[i]:
            return float(probs[i + 1])
        return float(probs[i] + (probs[i + 1] - probs[i]) * (x - values[i]) / (values[i + 1] - values[i]))

    def mean(self) -> float:
        v, p = self.values, self.probs
        return float(np.sum((p[1:] - p[:-1]) * (v[1:] + v[:-1]) / 2.0))

    def scaled(self, factor: float) -> "EmpiricalCdf":
        """The same shape with every value multiplied by ``factor``."""
        return EmpiricalCdf(tuple((v * factor, p) for v, p in self.points))


# Atikoglu et al. 2012, ETC pool (Table/§5 of the paper).
FBKV_KEY_SIZE = GeneralizedExtremeValue(mu=30.7984, sigma=8.20449, k=0.078688)
FBKV_VALUE_SIZE = GeneralizedPareto(sigma=214.476, k=0.348238)
FBKV_GAP_US = GeneralizedPareto(sigma=16.0292, k=0.154971)

# Roy et al. 2015, Hadoop flow sizes (bytes), as tabulated in HPCC's FbHdp_distribution.txt.
FBHD_SIZE = EmpiricalCdf((
    (0, 0.0), (100, 0.01), (200, 0.02), (300, 0.05), (350, 0.15), (400, 0.20), (500, 0.30),
    (600, 0.40), (700, 0.50), (1000, 0.60), (2000, 0.67), (7000, 0.70), (30000, 0.72),
    (50000, 0.82), (80000, 0.87), (120000, 0.90), (300000, 0.95), (1000000, 0.975),
    (2000000, 0.99), (10000000, 1.0),
))

# DCTCP web search, pFabric's CDF_search.tcl: (size in 1460-byte packets, CDF).
_WEB_SEARCH_PACKETS = (
    (6, 0.0), (6, 0.15), (13, 0.20), (19, 0.30), (33, 0.40), (53, 0.53), (133, 0.60),
    (667, 0.70), (1333, 0.80), (3333, 0.90), (6667, 0.97), (20000, 1.0),
)
WEB_SEARCH_SIZE = EmpiricalCdf(tuple((pkts * MTU_PAYLOAD, p) for pkts, p in _WEB_SEARCH_PACKETS))



# --------------------------------------------------------------------------------------------------
# Arrival processes


def poisson_arrivals(rng: np.random.Generator, rate_per_s: float, duration_s: float) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate_per_s`` in [0, duration_s)."""
    if rate_per_s <= 0 or duration_s <= 0:
        return np.zeros(0)
    expected = rate_per_s * duration_s
    n = int(expected + 10 * math.sqrt(expected) + 10)
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    while times[-1] < duration_s:  # practically never: more than 10 sigma
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, n))
        times = np.concatenate([times, more])
    return times[times < duration_s]


def bursty_arrivals(rng: np.random.Generator, rate_per_s: float, duration_s: float, *, bursts: int = 4,
                    duty: float = 1 / 3) -> np.ndarray:
    """Arrival times in [0, duration_s) of an on-off process with the mean rate ``rate_per_s``: the time split
    into ``bursts`` equal periods, each with Poisson arrivals at ``rate_per_s / duty`` during its first ``duty``
    and none in the rest (so a load of 0.3 arrives as bursts at 0.9)."""
    if not 0.0 < duty <= 1.0 or bursts < 1:
        raise ValueError(f"bursty_arrivals: duty must be in (0, 1] and bursts >= 1, got {duty}, {bursts}")
    period = duration_s / bursts
    parts = [i * period + poisson_arrivals(rng, rate_per_s / duty, duty * period) for i in range(bursts)]
    return np.concatenate(parts) if parts else np.zeros(0)


def scaled_gaps(gaps: np.ndarray, mean_gap_s: float) -> np.ndarray:
    """Rescale ``gaps`` (any unit) so their sample mean is ``mean_gap_s``; keeps the shape."""
    m = float(np.mean(gaps)) if len(gaps) else 0.0
    if m <= 0:
        return np.full(len(gaps), mean_gap_s)
    return gaps * (mean_gap_s / m)


# --------------------------------------------------------------------------------------------------
# Approximate jobs


def fbkv_sizes(rng: np.random.Generator, n: int, max_size: int = FBKV_MAX_ITEM) -> np.ndarray:
    """FBKV item sizes: key (GEV) + value (generalized Pareto) bytes, at least 1, at most ``max_size``."""
    keys = np.maximum(FBKV_KEY_SIZE.sample(rng, n), 1.0)
    values = np.maximum(FBKV_VALUE_SIZE.sample(rng, n), 0.0)
    return np.clip(np.rint(keys + values), 1, max_size).astype(np.int64)


def fbhd_sizes(rng: np.random.Generator, n: int, max_size: int | None = None) -> np.ndarray:
    """FBHD message sizes from the Hadoop CDF, at least 1 byte, capped at ``max_size`` when given."""
    sizes = np.maximum(np.rint(FBHD_SIZE.sample(rng, n)), 1)
    if max_size is not None:
        sizes = np.minimum(sizes, max_size)
    return sizes.astype(np.int64)


def _ready_times(kind: str, rng: np.random.Generator, sizes: np.ndarray, offered_bps: float | None) -> np.ndarray:
    n = len(sizes)
    if offered_bps is None or n == 0:
        return np.zeros(n)
    mean_gap_s = float(np.mean(sizes)) * 8.0 / offered_bps
    if kind == "fbkv":
        gaps = FBKV_GAP_US.sample(rng, n)
    else:
        gaps = rng.exponential(1.0, n)
    gaps = scaled_gaps(gaps, mean_gap_s)
    # The first message is ready at time 0; message i after the sum of the first i gaps.
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def make_job(kind: str, seed: int, n: int, *, offered_bps: float | None = None,
             max_size: int | None = None) -> JobWorkload:
    """An FBKV or FBHD job of ``n`` messages.

    ``offered_bps``: the rate at which the application produces data (mean size * 8 / mean gap).
    ``None`` makes every message ready at time 0 (a bulk job: the network alone decides the JCT).
    ``max_size``: cap on a message's size (FBKV default 1 MiB; FBHD default no cap).
    """
    if n < 1:
        raise ValueError("a job has at least one message")
    rng = rng_for(seed)
    if kind == "fbkv":
        sizes = fbkv_sizes(rng, n, max_size or FBKV_MAX_ITEM)
    elif kind == "fbhd":
        sizes = fbhd_sizes(rng, n, max_size)
    else:
        raise ValueError(f"unknown workload {kind!r}; expected 'fbkv' or 'fbhd'")
    ready = _ready_times(kind, rng, sizes, offered_bps)
    return JobWorkload(kind=kind, seed=int(seed), sizes=tuple(int(s) for s in sizes),
                       ready_s=tuple(float(t) for t in ready))


# --------------------------------------------------------------------------------------------------
# Background flows


def web_search_flows(seed: int | np.random.Generator, *, load: float, link_bps: float, duration_s: float,
                     senders: Sequence[int], receivers: Sequence[int], size_scale: float = 1.0,
                     min_size: int = 1) -> list[Flow]:
    """Poisson web-search flows offering ``load`` x ``link_bps`` (after scaling) for ``duration_s``.

    Each flow picks a sender and a different receiver uniformly. ``size_scale`` divides every size
    (the arrival rate is computed from the scaled mean, so the offered load stays ``load``).
    """
    if not 0 < load:
        raise ValueError("load must be positive")
    if size_scale < 1.0:
        raise ValueError("size_scale divides sizes; use >= 1")
    rng = rng_for(seed)
    mean_bytes = WEB_SEARCH_SIZE.mean() / size_scale
    rate = load * link_bps / (8.0 * mean_bytes)
    starts = poisson_arrivals(rng, rate, duration_s)
    trace_sizes = np.rint(WEB_SEARCH_SIZE.sample(rng, len(starts))).astype(np.int64)
    flows = []
    for t, size in zip(starts, trace_sizes):
        src = int(rng.choice(senders))
        choices = [r for r in receivers if r != src]
        if not choices:
            raise ValueError("every flow needs a receiver other than its sender")
        dst = int(rng.choice(choices))
        flows.append(Flow(start_s=float(t), src=src, dst=dst,
                          size=max(min_size, int(round(size / size_scale))), trace_size=int(size)))
    return flows


def pick_receivers(seed: int | np.random.Generator, senders: Sequence[int], hosts: Sequence[int]) -> dict[int, int]:
    """All-to-all pattern: each sender picks a receiver uniformly among the other hosts."""
    rng = rng_for(seed)
    out = {}
    for s in senders:
        choices = [h for h in hosts if h != s]
        out[int(s)] = int(rng.choice(choices))
    return out
