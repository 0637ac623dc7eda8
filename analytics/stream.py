"""Streaming windows over ATP: a stream of rows cut into count- or time-based windows, each window one ATP job
(the paper §6: "a NetApprox job for streaming frameworks is the data to be sent in a window").

The framework must tell ATP a window's size N, and the MSR its ``e_max`` asks for, before the window's job starts;
a time-based window's N is not known until the window closes. So (docs/analytics.md, Streaming):

- :class:`WindowSizer` estimates a window's N, overall and per group, from the windows before it: a time-based
  window from the arrival rate of each group (an exponentially weighted mean over the earlier windows), a
  count-based window from its count and the groups' shares of the earlier windows.
- :class:`StreamPlanner` turns that N and the previous window's sample into the window's MSR: the sampling
  fraction at which the previous window's values would meet ``e_max`` in a population of the estimated size
  (``accuracy.needed_fraction``, times ``accuracy.MARGIN``). The first window, with nothing before it, starts at the
  paper's heuristic ``1 - e_max``.
- :func:`run_windows` runs a stream of windows through one transport (the simulated link, or hostlib over UDP:
  :func:`send_windows`), planning each window from the ones before it, and answers every window with its bound.

A window too small for its bound is answered with a note saying so (never a loop); a stream whose rows are out of
time order, a window length or count that is not positive, a time-based first window with nothing to estimate
its N from: one :class:`AnalyticsError` line.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

from netapprox.analytics import accuracy
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import Estimate, Stratum
from netapprox.analytics.job import AnalyticsJob, Bounded, Query, Row

ALPHA = 0.5
"""Weight of the latest window in the sizer's exponentially weighted means (rates, shares)."""


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of a stream: its rows in arrival order, and its span in stream time (seconds)."""

    index: int
    rows: tuple[Row, ...]
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    def counts(self) -> dict[int, int]:
        """Rows per group."""
        out: dict[int, int] = {}
        for r in self.rows:
            out[r.group] = out.get(r.group, 0) + 1
        return out


def _check_times(rows: Sequence[Row], times: Sequence[float]) -> None:
    if len(rows) != len(times):
        raise AnalyticsError(f"{len(rows)} rows but {len(times)} arrival times")
    for i in range(1, len(times)):
        if times[i] < times[i - 1]:
            raise AnalyticsError(f"row {i} arrives at {times[i]:g} s, before row {i - 1} ({times[i - 1]:g} s): "
                                 "a stream's rows must be in arrival order")


def count_windows(rows: Sequence[Row], count: int, times: Sequence[float] | None = None) -> list[Window]:
    """Windows of ``count`` rows each (a last, shorter one is dropped: it has not closed); ``times``: each row's
    arrival (s), by default its position."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise AnalyticsError(f"window count {count!r}: rows per window, an integer >= 1")
    times = list(range(len(rows))) if times is None else list(times)
    _check_times(rows, times)
    out = []
    for k in range(len(rows) // count):
        a, b = k * count, (k + 1) * count
        out.append(Window(k, tuple(rows[a:b]), float(times[a]), float(times[b - 1])))
    return out


def time_windows(rows: Sequence[Row], times: Sequence[float], seconds: float, *, start: float | None = None
                 ) -> list[Window]:
    """Windows of ``seconds`` of stream time from ``start`` (by default the first row's time): window ``k`` holds
    the rows that arrived in ``[start + k s, start + (k + 1) s)``; empty windows are kept (their N is 0)."""
    if not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise AnalyticsError(f"window length {seconds!r}: seconds, > 0")
    _check_times(rows, times)
    if not rows:
        return []
    t0 = float(times[0] if start is None else start)
    if times[0] < t0:
        raise AnalyticsError(f"the first row arrives at {times[0]:g} s, before the stream's start {t0:g} s")
    n = int((times[-1] - t0) // seconds) + 1
    buckets: list[list[Row]] = [[] for _ in range(n)]
    for r, t in zip(rows, times):
        buckets[int((t - t0) // seconds)].append(r)
    return [Window(k, tuple(b), t0 + k * seconds, t0 + (k + 1) * seconds) for k, b in enumerate(buckets)]


@dataclasses.dataclass(frozen=True)
class SizeEstimate:
    """A window's N before it closes: overall and per group (``groups`` empty when nothing is known of them)."""

    total: float
    groups: Mapping[int, float]
    windows: int
    """Earlier windows it was estimated from (0: the first window's declared size)."""


class WindowSizer:
    """A window's N from the windows before it (the paper §6: "estimate the total size of the data in a window
    based on statistics collected from previous windows, e.g. data arrival rate").

    ``kind="time"``: windows of ``size`` seconds; each group's arrival rate is an exponentially weighted mean
    (weight ``alpha`` on the latest window) of its rate in the earlier windows, and its N the rate times ``size``.
    The first window has no earlier one: its N is ``first`` if given, else :meth:`estimate` raises.
    ``kind="count"``: windows of ``size`` rows; N is ``size``, and each group's share the weighted mean of its
    share in the earlier windows."""

    def __init__(self, kind: str, size: float, *, alpha: float = ALPHA, first: float | None = None) -> None:
        if kind not in ("time", "count"):
            raise AnalyticsError(f"window kind {kind!r}: 'time' or 'count'")
        if not (isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0 and math.isfinite(size)):
            raise AnalyticsError(f"window size {size!r}: " + ("seconds, > 0" if kind == "time" else "rows, >= 1"))
        if not 0.0 < alpha <= 1.0:
            raise AnalyticsError(f"alpha {alpha!r}: the latest window's weight, in (0, 1]")
        self.kind, self.size, self.alpha, self.first = kind, float(size), alpha, first
        self._level: dict[int, float] = {}
        """Per group: rate (rows/s) for time windows, share of the window for count windows."""
        self.windows = 0

    def observe(self, counts: Mapping[int, int], duration: float | None = None) -> None:
        """A window closed with ``counts`` rows per group over ``duration`` seconds (time windows: by default the
        window length)."""
        total = sum(counts.values())
        if self.kind == "time":
            d = self.size if duration is None else float(duration)
            if d <= 0:
                raise AnalyticsError(f"window duration {duration!r}: seconds, > 0")
            now = {g: c / d for g, c in counts.items()}
        elif total == 0:
            return  # an empty count window says nothing of the shares
        else:
            now = {g: c / total for g, c in counts.items()}
        if self.windows == 0:
            self._level = dict(now)
        else:
            for g in set(self._level) | set(now):
                self._level[g] = (1 - self.alpha) * self._level.get(g, 0.0) + self.alpha * now.get(g, 0.0)
        self.windows += 1

    def estimate(self) -> SizeEstimate:
        """The next window's N."""
        if self.kind == "count":
            groups = {g: self.size * s for g, s in self._level.items()}
            return SizeEstimate(self.size, groups, self.windows)
        if self.windows == 0:
            if self.first is None:
                raise AnalyticsError("the first time window has no earlier window to estimate its N from: give "
                                     "WindowSizer(first=N), the rows it is expected to hold")
            return SizeEstimate(float(self.first), {}, 0)
        groups = {g: r * self.size for g, r in self._level.items()}
        return SizeEstimate(math.fsum(groups.values()), groups, self.windows)


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """What a window's job is told before it starts: its estimated N and its MSR, and where the MSR came from."""

    index: int
    size: SizeEstimate
    msr: float
    basis: str
    """``heuristic`` (1 - e_max: nothing known yet) or ``previous window`` (its sample, at the estimated N)."""


@dataclasses.dataclass(frozen=True)
class WindowAnswer(Bounded):
    """A window's answer: the plan it ran with, its true N, the rows that arrived, the estimate with its bound
    (``None`` with a ``note`` when the window cannot support one)."""

    plan: WindowPlan
    rows: int
    received: int
    estimate: Estimate | None
    e_max: float
    note: str = ""
    jct_s: float | None = None
    truth: float | None = None

    @property
    def size_error(self) -> float:
        """Relative error of the estimated N against the window's true N."""
        return abs(self.plan.size.total - self.rows) / self.rows if self.rows else math.inf

    def as_dict(self) -> dict:
        return {"window": self.plan.index, "rows": self.rows, "n_estimated": self.plan.size.total,
                "msr": self.plan.msr, "basis": self.plan.basis, "received": self.received,
                "estimate": self.estimate.value if self.estimate else None,
                "error": self.error if math.isfinite(self.error) else None, "e_max": self.e_max, "met": self.met,
                "truth": self.truth, "jct_s": self.jct_s, "note": self.note}


class StreamPlanner:
    """Per window of a stream, the MSR of its job (module docstring): the previous window's sample, rescaled to
    the window's estimated N, and the fraction at which it meets the query's ``e_max``."""

    def __init__(self, query: Query, sizer: WindowSizer) -> None:
        if query.aggregate not in ("avg", "sum"):
            raise AnalyticsError(f"a window's {query.aggregate!r}: the streaming windows answer avg or sum")
        self.query, self.sizer = query, sizer
        self.index = 0
        self._previous: list[Stratum] | None = None

    def plan(self) -> WindowPlan:
        size = self.sizer.estimate()
        q = self.query
        if self._previous is None:
            return WindowPlan(self.index, size, accuracy.initial_msr(q.e_max), "heuristic")
        old = sum(s.population for s in self._previous)
        scale = size.total / old if old else 1.0
        strata = [Stratum(max(s.n, round(s.population * scale)), s.values) for s in self._previous]
        f = accuracy.needed_fraction(strata, q.e_max, q.confidence)
        if f is None:
            return WindowPlan(self.index, size, accuracy.initial_msr(q.e_max), "heuristic")
        return WindowPlan(self.index, size, accuracy.msr_from_fraction(f), "previous window")

    def observe(self, window: Window, sample: Sequence[Stratum] | None) -> None:
        """The window closed: its counts to the sizer, its sample (strata of values, ``None``: none usable) for
        the next window's plan."""
        self.sizer.observe(window.counts(), window.duration if self.sizer.kind == "time" else None)
        if sample:
            self._previous = list(sample)
        self.index += 1


Transport = Callable[[AnalyticsJob, float], tuple[Mapping[int, bytes], "float | None", int]]
"""Sends a window's job starting at an MSR; returns the sample its answer is read from (messages by id), the job's
JCT, and the number of looks the answer is read at (1 at a fixed MSR; ``_LiveMsr.LOOKS`` when the MSR followed the
window's own running estimate and the job stopped at one of its looks)."""


def window_job(window: Window, query: Query, *, seed: int = 0, job_id: int | None = None,
               max_payload: int | None = None) -> AnalyticsJob:
    """The window's ATP job; a window too small for the bound is one :class:`AnalyticsError` line."""
    kw = {} if max_payload is None else {"max_payload": max_payload}
    try:
        return AnalyticsJob(window.rows, [query], seed=seed + window.index,
                            job_id=job_id if job_id is not None else window.index + 1, **kw)
    except AnalyticsError as err:
        if len(window.rows) < accuracy.MIN_GROUP_ROWS:
            raise AnalyticsError(f"window {window.index} has {len(window.rows)} rows; a bound of e_max "
                                 f"{query.e_max:g} needs at least {accuracy.MIN_GROUP_ROWS} (a longer window, or no "
                                 "bound on it)") from None
        raise AnalyticsError(f"window {window.index}: {err}") from None


def run_windows(windows: Sequence[Window], query: Query, send: Transport, *, sizer: WindowSizer,
                seed: int = 0, max_payload: int | None = None) -> list[WindowAnswer]:
    """Every window through ``send`` in order, each planned from the windows before it (:class:`StreamPlanner`);
    a window that cannot support its bound is answered with a note and the stream goes on."""
    planner = StreamPlanner(query, sizer)
    out = []
    for w in windows:
        plan = planner.plan()
        try:
            job = window_job(w, query, seed=seed, max_payload=max_payload)
        except AnalyticsError as err:
            out.append(WindowAnswer(plan, len(w.rows), 0, None, query.e_max, str(err)))
            planner.observe(w, None)
            continue
        received, jct, looks = send(job, plan.msr)
        a = job.estimate(received, looks=looks).answers[0]
        truth = job.truth(query)
        out.append(WindowAnswer(plan, len(w.rows), len(received), a.estimate, query.e_max, a.note, jct,
                                truth if isinstance(truth, float) else None))
        planner.observe(w, job.sample_strata(query, received))
    return out


def simulated(config=None, *, loss: float = 0.01, rate_bps: float = 20e6, seed: int = 1, adapt: bool = False
              ) -> Transport:
    """A :data:`Transport` over the simulated lossy link (:mod:`netapprox.analytics.link`), no surplus. ``adapt``:
    each window starts at its planned MSR and the MSR follows the window's own running estimate, the job ending at
    the first look at which the bound holds (``AnalyticsJob.live_msr``)."""
    from netapprox.analytics import link
    from netapprox.hostlib.config import AtpConfig
    base = config or AtpConfig(surplus=False, max_rate_bps=rate_bps)

    def send(job: AnalyticsJob, msr: float):
        spec = job.job_spec(msr)
        live = job.live_msr(spec) if adapt else None
        t = link.run(spec, job.config(base), on_step=live.step if live is not None else None,
                     forward=link.LossyPath(loss=loss, rate_bps=rate_bps, queue_packets=64, seed=seed + job.job_id))
        if t.failure is not None:
            raise AnalyticsError(f"window job {job.job_id} failed: {t.failure}")
        if live is None:
            return t.received, t.summary.jct_s, 1
        return (live.stopped_at if live.stopped_at is not None else t.received), t.summary.jct_s, live.LOOKS
    return send


def over_udp(dest: str, *, timeout: float = 30.0, wait_s: float = 10.0, adapt: bool = False) -> Transport:
    """A :data:`Transport` over hostlib (UDP) to an ATP receiver at ``dest`` (e.g. the Spark stream source), at the
    planned MSR: the rows that arrived are every row but the sender's ``lost_ids``. ``adapt``: the window starts at
    its planned MSR and the MSR follows the estimate from the rows the receiver acknowledged, the job ending at the
    first look at which the bound holds (as ``AnalyticsJob.send``); the sample is that look's (the receiver also
    has the rows in flight then: read its answer at ``_LiveMsr.LOOKS`` looks)."""
    import time

    from netapprox.hostlib import events
    from netapprox.hostlib.api import send_job
    from netapprox.hostlib.errors import PeerUnreachableError

    def send(job: AnalyticsJob, msr: float):
        spec = job.job_spec(msr)
        live = job.live_msr(spec) if adapt else None
        acked: dict[int, bytes] = {}

        def on_event(ev) -> None:
            if isinstance(ev, events.MessageAcked):
                acked[ev.msg_id] = spec.messages[ev.msg_id].data

        kw = {} if live is None else {"on_event": on_event,
                                      "on_step": lambda now, sender: live.step(now, sender, acked)}
        deadline = time.monotonic() + wait_s
        while True:
            try:
                s = send_job(dest, spec, config=AnalyticsJob.config(), timeout=timeout, **kw)
                break
            except PeerUnreachableError:
                if time.monotonic() > deadline:
                    raise AnalyticsError(f"no netapprox source listening at {dest} within {wait_s:g} s") from None
                time.sleep(0.05)
        if live is not None:
            return (live.stopped_at if live.stopped_at is not None else acked), s.jct_s, live.LOOKS
        lost = set(s.lost_ids)
        return {i: spec.messages[i].data for i in range(len(spec.messages)) if i not in lost}, s.jct_s, 1
    return send


def send_windows(dest: str, windows: Sequence[Window], query: Query, *, sizer: WindowSizer, seed: int = 0,
                 timeout: float = 30.0, wait_s: float = 10.0, adapt: bool = False) -> list[WindowAnswer]:
    """Send a stream's windows to the netapprox source at ``dest`` (``spark.readStream.format("netapprox")``), one
    ATP job per window, each starting at the MSR planned from the windows before it (``adapt``: then following the
    window's own estimate, :func:`over_udp`); the sender's view of each answer."""
    return run_windows(windows, query, over_udp(dest, timeout=timeout, wait_s=wait_s, adapt=adapt), sizer=sizer,
                       seed=seed)
