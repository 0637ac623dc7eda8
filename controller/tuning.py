"""The online tuner of policy mode ``adaptive``, as pure functions: what the live jobs report in, the TLR thresholds
and the approximate queues' buffers out. No I/O, no clock; ``controller.core`` calls ``tune`` every
``TuningConfig.every_epochs`` epochs and writes what it returns to every data plane (the drivers only write).

What it reads, per live job (``JobSample``, built by the core from the job's latest reports): its TLR, its
remaining work (``policy.remaining_work``), its load (the sending rates its groups report), its measured loss
and its queue. The value the cutoffs place is its TLR, moved up for a job with much less work left than the
others when ``remaining_weight`` > 0 (``placement_value``). What it decides (``Tuned``):

- **Cutoffs** T_2..T_7 (queue 1 takes everything below T_2), anchored to the configured thresholds (``base``,
  the default policy's unless configured): jobs whose values lie closer than ``split_gap`` form a group, never split, unless
  such a run of values reaches across a whole queue of ``base`` (then ``base``'s queues part it: many jobs
  spread over a wide range leave no gap between neighbours, and one group would lump them all); each
  group goes to the queue ``base`` gives its middle, groups that would share a queue are pushed apart (the
  later one a queue down), more than seven groups merge where they are closest; a cutoff keeps its ``base``
  value unless a group straddles it or two groups must be parted, and then moves into the gap next to the
  group. Then the operator's limits: every cutoff within [``min_threshold``, ``max_threshold``], ``min_gap``
  apart. New cutoffs replace the old ones only when one moves by more than ``hysteresis`` and they fit the
  jobs strictly better (``misfit``: fewer groups split or sharing a queue), so that jobs arriving, finishing
  and drifting do not rewrite cutoffs that still part them. The data planes'
  ``queue_by_tlr`` table gets them as TLR thresholds (``table_thresholds``: within [0, 1)), for the packets of
  jobs the controller has not placed yet.
- **Buffers** of queues 1..7 (where the target can change them): every queue with jobs keeps at least its
  configured k-MTU buffer; what the empty queues do not need goes to the queues with jobs in proportion to their
  share of the load, of the jobs (each sender's bursts need room) and of the loss beyond the jobs' TLRs (drops
  where they hurt), each queue within [``buffer_min``, ``buffer_max``], ``buffer_total`` in all. Rewritten
  with the cutoffs, or when they would move a quarter of the buffer.
- **The reference work** (``work_ref``): the load-weighted median remaining work of the live jobs, below which
  remaining work moves a job up (``placement_value``).

Deterministic: the same samples and state give the same result (samples are sorted, ties broken by job id).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, NamedTuple, Sequence

from netapprox.controller.config import TuningConfig
from netapprox.controller.model import (
    DEFAULT_APPROX_BUFFERS,
    DEFAULT_THRESHOLDS,
    FIRST_APPROX_QUEUE,
    NUM_QUEUES,
    check_thresholds,
)

APPROX_QUEUES = NUM_QUEUES - FIRST_APPROX_QUEUE
CUTOFFS = APPROX_QUEUES - 1
"""Thresholds the tuner places: T_2..T_7 (T_0 = 0; T_1 only bounds the table's first range)."""
VALUE_QUANTUM = 1 / 4096
"""Placement values closer than this count as the same value (never split over two queues)."""


class JobSample(NamedTuple):
    """What the tuner reads of one live job."""

    job_id: int
    tlr: float
    """Its (lowest group's) reported TLR."""
    work_bytes: float | None
    """Remaining work to its MSR (bytes, estimated: ``policy.remaining_work``), None while unknown."""
    load_bps: float
    """Sum of its groups' reported sending rates."""
    loss: float
    """The deciding group's measured loss."""
    qid: int | None = None
    """The queue the job is in now (None: not placed yet)."""


class _Placed(NamedTuple):
    job_id: int
    value: float
    load_bps: float
    tlr: float
    loss: float
    qid: int | None = None


@dataclasses.dataclass(frozen=True)
class Tuned:
    """The tuner's state: what is installed, and the reference work."""

    cutoffs: tuple[float, ...]
    """T_0..T_7 on the placement scale (``placement_value``), what the policy places jobs with: queue k takes
    values in [T_k, T_k+1), queue 1 everything below T_2 (T_0 and T_1 only keep the tuple's shape)."""
    thresholds: tuple[float, ...] = ()
    """T_0..T_7 of the data planes' ``queue_by_tlr`` table (TLR scale, [0, 1)): the cutoffs, where they lie below
    0 or above 1, brought just inside, so that a packet of a job the controller does not know yet (placed by its
    TLR alone) lands where the policy would put it. Empty: the same as ``cutoffs``."""
    buffers: tuple[int, ...] = ()
    """Buffers of queues 1..7 in effect; empty: the target's k-MTU buffers."""
    work_ref: float | None = None
    """Load-weighted median remaining work (bytes) of the live jobs at the last tuning step; None: not known."""

    def __post_init__(self) -> None:
        if not self.thresholds:
            object.__setattr__(self, "thresholds", table_thresholds(self.cutoffs))


class TuningChange(NamedTuple):
    """One tuning step that changed what is installed (the decision log's ``tuning`` event)."""

    old_cutoffs: tuple[float, ...]
    new_cutoffs: tuple[float, ...]
    new_thresholds: tuple[float, ...]
    """The ``queue_by_tlr`` thresholds written (``Tuned.thresholds``)."""
    old_buffers: tuple[int, ...]
    new_buffers: tuple[int, ...]
    work_ref: float | None
    jobs: int
    """Live jobs the step read."""
    queue_load_bps: tuple[float, ...]
    """Reported load per approximate queue (1..7) under the new thresholds."""
    queue_jobs: tuple[int, ...]
    """Jobs per approximate queue under the new thresholds."""

    def as_log(self) -> dict:
        """Fields for the decision log (rounded for reading)."""
        return {"old_cutoffs": [round(t, 5) for t in self.old_cutoffs[2:]],
                "new_cutoffs": [round(t, 5) for t in self.new_cutoffs[2:]],
                "new_thresholds": [round(t, 5) for t in self.new_thresholds],
                "old_buffers": list(self.old_buffers), "new_buffers": list(self.new_buffers),
                "work_ref_bytes": None if self.work_ref is None else round(self.work_ref),
                "jobs": self.jobs, "queue_load_bps": [round(x) for x in self.queue_load_bps],
                "queue_jobs": list(self.queue_jobs)}


def value_range(config: TuningConfig) -> tuple[float, float]:
    """The range placement values are kept in: from ``min_threshold`` to as high as still leaves room for the six
    cutoffs above it (so that however far a job's value goes, the cutoffs can put it in any queue)."""
    return config.min_threshold, config.max_threshold - (CUTOFFS - 1) * config.min_gap - 2 * VALUE_QUANTUM


def placement_value(tlr: float, work_bytes: float | None, work_ref: float | None, weight: float,
                    limits: tuple[float, float] = (-4.0, 5.0), deadband: float = 0.0,
                    demote: float = 0.0) -> float:
    """What the cutoffs place for a job: its TLR, minus ``weight`` for every halving of its remaining work below
    ``work_ref`` beyond the first ``deadband`` halvings. A job with much less left than the others moves up (a
    nearly done small job is not pushed below large ones: eq. 1 raises the TLR of a job that delivers without
    loss, which by itself would move it down as it nears its end); a job with more left keeps its TLR (it is
    never pushed into a lossier queue than its TLR asks for: a tight TLR in a lossy queue costs repairs). The
    scale goes below 0, so that jobs whose TLR has fallen to 0 (eq. 1 after heavy loss) are still ordered by
    their work. Unknown work, no reference, a zero weight, or nothing left (a job past its MSR sends surplus at
    TLR 1.0): its TLR. Within ``limits`` (``value_range``)."""
    if (weight <= 0.0 and demote <= 0.0) or work_bytes is None or work_ref is None or work_bytes <= 0.0 \
            or work_ref <= 0.0:
        value = tlr
    else:
        halvings = math.log2(work_ref / work_bytes)
        if halvings > deadband:
            value = tlr - weight * (halvings - deadband)
        elif -halvings > deadband:
            value = tlr + demote * (-halvings - deadband)
        else:
            value = tlr
    lo, hi = limits
    return lo if value < lo else hi if value > hi else value


def table_thresholds(cutoffs: Sequence[float]) -> tuple[float, ...]:
    """``Tuned.thresholds``: the cutoffs T_2..T_7 brought into (0, 1), ``VALUE_QUANTUM`` apart at least, with
    T_0 = 0 and T_1 halfway to T_2 (valid ``queue_by_tlr`` thresholds)."""
    q = VALUE_QUANTUM
    out: list[float] = []
    for k, c in enumerate(cutoffs[FIRST_APPROX_QUEUE + 1:]):  # k = 0 is T_2
        t = min(max(c, 2 * q + k * q), 1.0 - (CUTOFFS - k) * q)
        if out and t < out[-1] + q:
            t = out[-1] + q
        out.append(t)
    thresholds = (0.0, out[0] / 2, *out)
    check_thresholds(thresholds)
    return thresholds


def value_of(tlr: float, work_bytes: float | None, work_ref: float | None, config: TuningConfig) -> float:
    """``placement_value`` with ``config``'s weight and range, quantized to 1/1024 when the work moved it (so
    that a report moves a job's value only when it moves it a little, and the core re-decides the job only
    then)."""
    value = placement_value(tlr, work_bytes, work_ref, config.remaining_weight, value_range(config),
                            config.remaining_deadband, config.demote_weight)
    return value if value == tlr else round(value * 1024) / 1024


def queue_of(value: float, thresholds: Sequence[float]) -> int:
    """``model.queue_for_tlr`` for a placement value: the largest k with T_k <= value, at least 1."""
    qid = FIRST_APPROX_QUEUE
    for k in range(FIRST_APPROX_QUEUE + 1, NUM_QUEUES):
        if value >= thresholds[k]:
            qid = k
    return qid


def work_reference(samples: Iterable[JobSample]) -> float | None:
    """Load-weighted median of the known remaining work (each job weighs its load, at least 1 bit/s); None when
    no job's is known."""
    known = sorted((s.work_bytes, max(1.0, s.load_bps), s.job_id) for s in samples
                   if s.work_bytes is not None and s.work_bytes > 0.0)
    if not known:
        return None
    half = sum(w for _, w, _ in known) / 2.0
    acc = 0.0
    for work, w, _ in known:
        acc += w
        if acc >= half:
            return work
    return known[-1][0]  # pragma: no cover - acc reaches the total


def _clusters(samples: Sequence[_Placed]) -> list[tuple[float, float, float]]:
    """(low, high, load) of each distinct placement value, ascending; values within ``VALUE_QUANTUM`` merge."""
    out: list[list[float]] = []
    for s in sorted(samples, key=lambda s: (s.value, s.job_id)):
        load = max(1.0, s.load_bps)
        if out and s.value - out[-1][1] < VALUE_QUANTUM:
            out[-1][1] = s.value
            out[-1][2] += load
        else:
            out.append([s.value, s.value, load])
    return [(lo, hi, w) for lo, hi, w in out]


def _groups(clusters: list[tuple[float, float, float]], gap: float,
            base: Sequence[float] = DEFAULT_THRESHOLDS) -> list[tuple[float, float, float]]:
    """Clusters merged where they lie closer than ``gap``; a chain of them that reaches across a whole queue of
    ``base`` (two or more of its cutoffs inside) parted again by ``base``'s queues (many jobs spread over a wide
    range of values leave no gap of ``gap`` between neighbours, and one group of them would take all their
    queues' jobs into one); then the closest neighbours merged until seven remain."""
    inner = base[FIRST_APPROX_QUEUE + 1:]
    groups: list[list[float]] = []
    chain: list[tuple[float, float, float]] = []

    def close() -> None:
        lo, hi = chain[0][0], chain[-1][1]
        parted = sum(1 for t in inner if lo < t <= hi) >= 2
        start = len(groups)
        for c_lo, c_hi, load in chain:
            if len(groups) > start and (not parted or queue_of(c_lo, base) == queue_of(groups[-1][0], base)):
                groups[-1][1] = c_hi
                groups[-1][2] += load
            else:
                groups.append([c_lo, c_hi, load])
        chain.clear()

    for c in clusters:
        if chain and c[0] - chain[-1][1] >= gap:
            close()
        chain.append(c)
    if chain:
        close()
    while len(groups) > APPROX_QUEUES:
        i = min(range(len(groups) - 1), key=lambda i: (groups[i + 1][0] - groups[i][1], i))
        groups[i:i + 2] = [[groups[i][0], groups[i + 1][1], groups[i][2] + groups[i + 1][2]]]
    return [(lo, hi, w) for lo, hi, w in groups]


def misfit(samples: Sequence[_Placed], cuts: Sequence[float], config: TuningConfig,
           base: Sequence[float] = DEFAULT_THRESHOLDS) -> int:
    """How badly ``cuts`` fit the jobs at ``samples``' values: the cutoffs that fall inside a group (a group
    split over queues) plus the neighbouring groups that share a queue. The tuner rewrites the cutoffs only when
    new ones fit strictly better than those in effect."""
    groups = _groups(_clusters(samples), config.split_gap, base)
    bad = 0
    last = None
    for lo, hi, _ in groups:
        q_lo, q_hi = queue_of(lo, cuts), queue_of(hi, cuts)
        bad += q_hi - q_lo + (last == q_lo)
        last = q_hi
    return bad


def cutoffs(samples: Sequence[_Placed], config: TuningConfig,
            base: Sequence[float] = DEFAULT_THRESHOLDS) -> tuple[float, ...]:
    """T_0..T_7 for jobs placed at ``samples``' values, anchored to the configured thresholds ``base`` (see the
    module docstring), within ``config``'s limits."""
    groups = _groups(_clusters(samples), config.split_gap, base)
    if not groups:
        return _within_limits(list(base[FIRST_APPROX_QUEUE + 1:]), config)
    # each group in the queue the configured thresholds give its middle, groups that would share a queue
    # pushed apart (the later one down), all within queues 1..7
    queues: list[int] = []
    for lo, hi, _ in groups:
        q = queue_of((lo + hi) / 2, base)
        queues.append(max(q, queues[-1] + 1) if queues else q)
    m = len(groups)
    queues = [min(q, NUM_QUEUES - (m - i)) for i, q in enumerate(queues)]
    cuts: list[float] = []
    for k in range(FIRST_APPROX_QUEUE + 1, NUM_QUEUES):  # the cutoff between queue k - 1 and queue k
        below = [hi for (lo, hi, _), q in zip(groups, queues) if q < k]
        above = [lo for (lo, hi, _), q in zip(groups, queues) if q >= k]
        a = max(below) if below else -math.inf
        b = min(above) if above else math.inf
        t = base[k]
        if a < b:
            margin = min(VALUE_QUANTUM * 4, (b - a) / 4)
            t = min(max(t, a + margin), b - margin)
        cuts.append(t)
    return _within_limits(cuts, config)


def _within_limits(cuts: Sequence[float], config: TuningConfig) -> tuple[float, ...]:
    """T_2..T_7 projected into the operator's limits (each within [``min_threshold``, ``max_threshold``],
    ``min_gap`` apart), as T_0..T_7 (T_0 and T_1 below T_2)."""
    gap = config.min_gap
    out: list[float] = []
    for k, t in enumerate(cuts):  # k = 0 is T_2; a value at min_threshold stays in queue 1
        lo = config.min_threshold + VALUE_QUANTUM + k * gap
        hi = config.max_threshold - (CUTOFFS - 1 - k) * gap
        t = min(max(t, lo), hi)
        if out and t < out[-1] + gap:
            t = out[-1] + gap
        out.append(t)
    below = min(0.0, out[0] - 1.0)
    return (below, below, *out)


def _moved(old: Sequence[float], new: Sequence[float]) -> float:
    """How far the furthest cutoff T_2..T_7 moved."""
    return max(abs(a - b) for a, b in zip(old[FIRST_APPROX_QUEUE + 1:], new[FIRST_APPROX_QUEUE + 1:]))


def share_buffers(samples: Sequence[_Placed], thresholds: Sequence[float], config: TuningConfig,
                  base: Sequence[int] = DEFAULT_APPROX_BUFFERS, *,
                  current: bool = False) -> tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...]]:
    """(buffers of queues 1..7, load per queue, jobs per queue) under ``thresholds``: every queue with jobs keeps
    at least its configured buffer (``base``: the k-MTU buffers), and what the empty queues do not need (all
    but ``buffer_min`` each) goes to the queues with jobs in proportion to their share of the load, of the jobs
    and of the loss beyond TLRs, each queue within [``buffer_min``, ``buffer_max``], ``buffer_total`` in all.
    ``current``: count each job in the queue it is in (the thresholds did not change: jobs held by the
    hysteresis band stay where they are) rather than where ``thresholds`` put it."""
    load = [0.0] * APPROX_QUEUES
    jobs = [0] * APPROX_QUEUES
    excess = [0.0] * APPROX_QUEUES
    for s in samples:
        q = s.qid if current and s.qid is not None else queue_of(s.value, thresholds)
        i = min(max(q, FIRST_APPROX_QUEUE), NUM_QUEUES - 1) - FIRST_APPROX_QUEUE
        w = max(1.0, s.load_bps)
        load[i] += w
        jobs[i] += 1
        excess[i] += w * max(0.0, s.loss - s.tlr)
    weights = [0.0] * APPROX_QUEUES
    for part in (load, jobs, excess):
        total = float(sum(part))
        if total > 0:
            for i in range(APPROX_QUEUES):
                weights[i] += part[i] / total
    floor = _scaled(base, config)
    floor = [f if jobs[i] else config.buffer_min for i, f in enumerate(floor)]
    return _apportion(weights, config, floor), tuple(load), tuple(jobs)


def _scaled(base: Sequence[int], config: TuningConfig) -> list[int]:
    """The configured buffers scaled to ``buffer_total`` and within the limits (the floors of ``share_buffers``),
    never summing above ``buffer_total``."""
    total = sum(base)
    out = [min(config.buffer_max, max(config.buffer_min, b * config.buffer_total // total)) for b in base]
    i = len(out) - 1
    while sum(out) > config.buffer_total and i >= 0:  # rounding up to buffer_min: take it from the lowest
        out[i] = max(config.buffer_min, out[i] - (sum(out) - config.buffer_total))
        i -= 1
    return out


def _apportion(weights: Sequence[float], config: TuningConfig, floor: Sequence[int] | None = None) -> tuple[int, ...]:
    """Integers within [buffer_min, buffer_max], at least ``floor`` each, summing to buffer_total: what is left
    over the floors shared in proportion to ``weights`` (zero weight: nothing), largest remainders first, lower
    queue ids first on ties."""
    n = len(weights)
    lo, hi, total = config.buffer_min, config.buffer_max, config.buffer_total
    out = list(floor) if floor is not None else [lo] * n
    left = total - sum(out)
    active = [i for i in range(n) if weights[i] > 0]
    if not active:
        return tuple(out) if left == 0 else _apportion([1.0] * n, config, floor)
    while left > 0:
        open_ = [i for i in active if out[i] < hi] or [i for i in range(n) if out[i] < hi]
        wsum = sum(weights[i] for i in open_) or float(len(open_))
        shares = {i: left * ((weights[i] / wsum) if wsum and weights[i] else 1.0 / len(open_)) for i in open_}
        given = 0
        for i in open_:
            add = min(hi - out[i], int(shares[i]))
            out[i] += add
            given += add
        if given == 0:  # hand out the remainders one by one, largest first
            for i in sorted(open_, key=lambda i: (-(shares[i] - int(shares[i])), i)):
                if left - given == 0:
                    break
                if out[i] < hi:
                    out[i] += 1
                    given += 1
        left -= given
    return tuple(out)


def tune(samples: Sequence[JobSample], state: Tuned, config: TuningConfig,
         base: Sequence[float] = DEFAULT_THRESHOLDS) -> tuple[Tuned, TuningChange | None]:
    """One tuning step: the new state, and what changed (None when nothing is rewritten). No samples: nothing
    changes (the thresholds stay for the jobs to come)."""
    if not samples:
        return state, None
    ref = work_reference(samples)
    ref = state.work_ref if ref is None else ref
    placed = [_Placed(s.job_id, value_of(s.tlr, s.work_bytes, ref, config), s.load_bps, s.tlr, s.loss, s.qid)
              for s in samples]
    cuts = cutoffs(placed, config, base)
    allowed = _within_limits(state.cutoffs[FIRST_APPROX_QUEUE + 1:], config)[2:] == state.cutoffs[2:]
    if _moved(state.cutoffs, cuts) <= config.hysteresis or \
            allowed and misfit(placed, state.cutoffs, config, base) <= misfit(placed, cuts, config, base):
        cuts = state.cutoffs
    buffers, load, jobs = share_buffers(placed, cuts, config, current=cuts == state.cutoffs)
    if not config.buffers:
        buffers = state.buffers
    elif cuts == state.cutoffs and state.buffers:
        moved = sum(abs(a - b) for a, b in zip(buffers, state.buffers))
        if moved < config.buffer_total / 4:
            buffers = state.buffers
    if cuts == state.cutoffs and buffers == state.buffers:
        return dataclasses.replace(state, work_ref=ref), None
    new = Tuned(cutoffs=cuts, buffers=buffers, work_ref=ref)
    return new, TuningChange(state.cutoffs, cuts, new.thresholds, state.buffers or DEFAULT_APPROX_BUFFERS,
                             buffers or DEFAULT_APPROX_BUFFERS, ref, len(samples), load, jobs)
