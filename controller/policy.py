"""The queue policy, as pure functions: reports in, table contents out. No I/O, no clock (``now`` is an argument).

- ``decide``: one epoch's job -> queue assignment. A job's TLR is the *lowest* TLR over its live groups (the
  most conservative: the group that tolerates the least loss decides, so no group is pushed into a queue
  lossier than it asked for); the mapping is ``controller.model.queue_for_tlr``. Hysteresis: a job keeps its
  queue until its TLR is more than ``PolicyConfig.hysteresis`` outside that queue's range. Losing jobs move
  up (the NetApprox paper's Fig. 10): a job whose measured loss stays above its TLR for
  ``promote_after_epochs`` epochs moves one queue up (toward queue 1), and while it loses, its TLR alone never
  moves it further down. Groups that stop reporting for ``job_timeout_s`` are forgotten; a job without
  groups expires and loses its ``queue_by_job`` entry. ``PolicyConfig.pinned`` jobs keep their queue.
- ``tag_rules``: CadentFlow declarations -> ``queue_by_tag`` rules.
- ``static_state`` / ``switch_state``: a switch's full desired ``SwitchState``, for each ``PolicyConfig.mode``
  (``netapprox``: the above; ``adaptive``: the above with the thresholds (and buffers) the tuner keeps
  re-deriving, ``controller.tuning``, and each job placed by its TLR shifted by its remaining work
  (``remaining_work``, ``tuning.placement_value``); ``static``: TLR thresholds and pins only; ``fifo``: a
  network-oblivious switch, every packet in queue 0).
"""
from __future__ import annotations

import bisect
import dataclasses
import types
from typing import Iterable, Mapping, NamedTuple

from netapprox.controller.config import CadentFlow, PolicyConfig, SwitchConfig
from netapprox.controller.tuning import JobSample, value_of
from netapprox.hostlib.config import required_messages
from netapprox.controller.model import (
    FIRST_APPROX_QUEUE,
    NON_APPROX_QUEUE,
    NUM_QUEUES,
    EcnRule,
    JobRule,
    SwitchState,
    TagRule,
    default_tlr_rules,
    queue_for_tlr,
    queue_range,
)


class GroupReport(NamedTuple):
    """The latest accepted report of one (job, group). (A tuple: one is made per report, at line rate.)"""

    tlr: float
    last_seen: float
    loss: float = 0.0
    """Loss the sender measured over its last reporting interval (``hostlib.wire.Report.loss``)."""
    rate_bps: float = 0.0
    """The sender's rate when it reported (metrics; mode ``adaptive``: the group's load)."""
    remaining: int = 0
    """Messages the group still needs for its MSR: ceil(MSR x N) - delivered (0 when met)."""
    resolved: int = 0
    """Messages delivered or given up as lost so far."""
    unresolved_bytes: float = 0.0
    """Bytes sent (estimated from the reported rates: each rate times the time to the next report) since a
    message was last resolved."""
    message_bytes: float | None = None
    """What a resolved message costs the group in bytes sent: the bytes sent between resolutions over the
    messages they resolved, averaged over the recent ones (weight 1/4 to the newest), so that it follows the
    sizes MRDF is at (smallest first). None until a message is resolved."""
    interval: float | None = None
    """Time between the group's accepted reports, averaged (weight 1/4 to the newest); None after one report.
    A group silent for a few intervals has most likely finished (a sender sends no report when it completes)."""


MESSAGE_BYTES_GAIN = 0.25
"""Weight of the newest sample in ``GroupReport.message_bytes`` and ``GroupReport.interval``."""
QUIET_INTERVALS = 4.0
"""A group that has not reported for this many of its report intervals no longer loads a queue for the tuner."""


_REQUIRED: dict[tuple[float, int], int] = {}
_REQUIRED_MAX = 4096


def _required(msr: float, total: int) -> int:
    """``required_messages`` memoised: a group reports the same MSR and N every time, and the float rounding
    in it cost ~10 % of the report loop. At most ``_REQUIRED_MAX`` entries (forged reports with ever new
    values only empty it)."""
    key = (msr, total)
    r = _REQUIRED.get(key)
    if r is None:
        if len(_REQUIRED) >= _REQUIRED_MAX:
            _REQUIRED.clear()
        r = _REQUIRED[key] = required_messages(msr, total)
    return r


_as_report = tuple.__new__  # a GroupReport from all its fields, without the NamedTuple constructor's call


def next_group_report(old: GroupReport | None, now: float, tlr: float, loss: float, rate_bps: float, msr: float,
                      total: int, delivered: int, lost: int) -> GroupReport:
    """A group's ``GroupReport`` after a new report (``old``: the one before, or None): the report's fields, and
    the bytes-per-message estimate moved by the bytes the previous rate sent since the previous report. (Once
    per accepted report: written for speed, fields unpacked by position.)"""
    required = _REQUIRED.get((msr, total))
    if required is None:
        required = _required(msr, total)
    remaining = required - delivered
    if remaining < 0:
        remaining = 0
    resolved = delivered + lost
    if old is None:
        return _as_report(GroupReport, (tlr, now, loss, rate_bps, remaining, resolved, 0.0, None, None))
    _tlr, last_seen, _loss, old_rate, _remaining, old_resolved, pending, per_message, interval = old
    gap = now - last_seen
    if gap < 0.0:
        gap = 0.0
    pending += old_rate * gap / 8.0
    done = resolved - old_resolved
    if done > 0:
        sample = pending / done
        per_message = sample if per_message is None else per_message + MESSAGE_BYTES_GAIN * (sample - per_message)
        pending = 0.0
    interval = gap if interval is None else interval + MESSAGE_BYTES_GAIN * (gap - interval)
    return _as_report(GroupReport, (tlr, now, loss, rate_bps, remaining, resolved, pending, per_message, interval))


def remaining_work(groups: Mapping[int, GroupReport]) -> float | None:
    """Bytes a job still has to send for its MSR, estimated: each group's remaining messages times what a
    message has lately cost it (MRDF's idea, across jobs). None while no group knows its cost per message; 0 when
    every group met its MSR. (The sending rates the reports carry are the senders' own figures; hostlib's
    adaptive sender reports its window in full-size packets, which overstates the bytes of small messages.)"""
    remaining = 0
    work = 0.0
    known = [r.message_bytes for r in groups.values() if r.message_bytes is not None]
    fallback = sum(known) / len(known) if known else None
    for r in groups.values():
        if r.remaining:
            per = r.message_bytes if r.message_bytes is not None else fallback
            if per is None:
                return None
            remaining += r.remaining
            work += r.remaining * per
    return work if remaining else 0.0


class JobChange(NamedTuple):
    """One policy decision worth logging. ``reason``: ``new`` (first assignment), ``moved`` (queue changed by
    the TLR, or in mode ``adaptive`` by the placement value), ``promoted`` (moved up because its loss stayed
    above its TLR), ``held`` (the TLR points at another queue but stays within the hysteresis band, or the job is
    losing and may not move down), ``tuned`` (re-placed because the tuner changed the thresholds), ``expired``."""

    job_id: int
    reason: str
    old_qid: int | None
    new_qid: int | None
    tlr: float | None = None
    group_id: int | None = None  # the group whose (lowest) TLR decided
    loss: float | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """Result of one ``decide`` call."""

    assignments: Mapping[int, int]  # job id -> logical queue, live jobs only
    changes: tuple[JobChange, ...]
    live: Mapping[int, Mapping[int, GroupReport]]  # the input jobs minus expired groups and jobs
    losing: Mapping[int, int] = dataclasses.field(default_factory=dict)  # job -> consecutive epochs loss > TLR


def hold_or_move(tlr: float, current: int | None, config: PolicyConfig,
                 thresholds: tuple[float, ...] | None = None) -> int:
    """Queue for ``tlr`` (or a placement value) given the job's current queue, with hysteresis; ``thresholds``:
    instead of ``config.thresholds`` (mode ``adaptive``: the tuner's cutoffs)."""
    thresholds = config.thresholds if thresholds is None else thresholds
    target = queue_for_tlr(tlr, thresholds)
    if current is None or target == current or not FIRST_APPROX_QUEUE <= current < NUM_QUEUES:
        return target
    lo, hi = queue_range(current, thresholds)
    if lo - config.hysteresis <= tlr < hi + config.hysteresis:
        return current
    return target


def job_tlr(groups: Mapping[int, GroupReport]) -> tuple[float, int]:
    """(lowest TLR, its group id) over a job's groups: the most conservative group decides."""
    group_id, report = min(groups.items(), key=lambda item: (item[1].tlr, item[0]))
    return report.tlr, group_id


FINISH_VALUE = 0.0
"""What a finishing job is placed as (``job_value``): below every T_1, so the first approximate queue."""


def finishing(groups: Mapping[int, GroupReport], within_s: float) -> bool:
    """The job would have what its MSR needs within ``within_s`` at the rate its groups report: its remaining
    work (``remaining_work``, known once a message has been resolved) is more than nothing and at most that
    rate times ``within_s``."""
    if within_s <= 0.0:
        return False
    # remaining_work and the rate in one pass (the core asks for every job it decides, at line rate)
    rate = work = known_sum = 0.0
    known = remaining = unknown = 0
    for r in groups.values():
        rate += r.rate_bps
        cost = r.message_bytes
        if cost is not None:
            known_sum += cost
            known += 1
            if r.remaining:
                work += r.remaining * cost
                remaining += r.remaining
        elif r.remaining:
            unknown += r.remaining
    if not known:
        return False  # no message resolved yet: the work is not known
    if unknown:
        work += unknown * (known_sum / known)
        remaining += unknown
    return remaining > 0 and work * 8.0 <= rate * within_s


def placed_by_value(config: PolicyConfig) -> bool:
    """Jobs are placed by ``job_value`` rather than by their TLR alone: mode ``adaptive``, or mode ``netapprox``
    with ``finish_epochs`` > 0."""
    return config.mode == "adaptive" or (config.mode == "netapprox" and config.finish_epochs > 0.0)


def job_value(groups: Mapping[int, GroupReport], tlr: float, work_ref: float | None, config: PolicyConfig,
              epoch_s: float) -> float:
    """The value the thresholds (mode ``adaptive``: the cutoffs) place for a job with these groups and (lowest)
    TLR: mode ``adaptive``, the TLR shifted by the job's remaining work (``tuning.value_of``), and
    ``FINISH_VALUE`` if its remaining work is at most ``tuning.finish_ref`` of ``work_ref``; then, if it is
    ``finishing`` within ``config.finish_epochs`` epochs, ``FINISH_VALUE``. Other modes: the TLR."""
    if config.mode == "adaptive":
        work = remaining_work(groups)
        value = value_of(tlr, work, work_ref, config.tuning)
        ref = config.tuning.finish_ref
        if ref > 0.0 and work_ref and work and work <= ref * work_ref:
            return min(value, FINISH_VALUE)
    elif config.mode == "netapprox":
        value = tlr
    else:
        return tlr
    if config.finish_epochs > 0.0 and finishing(groups, config.finish_epochs * epoch_s):
        return min(value, FINISH_VALUE)
    return value


def quiet(report: GroupReport, now: float, epoch_s: float) -> bool:
    """The group has gone quiet: no report for ``QUIET_INTERVALS`` of its report intervals (and an epoch)."""
    interval = report.interval if report.interval is not None else epoch_s
    return now - report.last_seen > max(epoch_s, QUIET_INTERVALS * interval)


def tuning_samples(jobs: Mapping[int, Mapping[int, GroupReport]], exclude: Iterable[int] = (),
                   now: float = 0.0, epoch_s: float = float("inf"),
                   queues: Mapping[int, int] | None = None) -> list[JobSample]:
    """What the tuner reads of the live ``jobs`` (job id -> group id -> report), by job id: the groups that have
    not gone quiet (``quiet``: a finished sender stops reporting; it stays placed until ``job_timeout_s`` but no
    longer loads a queue), of the jobs that still need messages for their MSR, except ``exclude`` (pinned and
    tag-only jobs, whose queue the cutoffs do not decide). ``queues``: job id -> the queue it is in now."""
    skip = set(exclude)
    queues = queues or {}
    out = []
    for job_id in sorted(jobs):
        if job_id in skip:
            continue
        groups = {g: r for g, r in jobs[job_id].items() if not quiet(r, now, epoch_s)}
        if not groups or not any(r.remaining for r in groups.values()):
            continue
        tlr, group_id = job_tlr(groups)
        out.append(JobSample(job_id, tlr, remaining_work(groups), sum(r.rate_bps for r in groups.values()),
                             groups[group_id].loss, queues.get(job_id)))
    return out


def decide(jobs: Mapping[int, Mapping[int, GroupReport]], previous: Mapping[int, int], now: float,
           config: PolicyConfig, losing: Mapping[int, int] | None = None, *,
           values: Mapping[int, float] | None = None, cutoffs: tuple[float, ...] | None = None,
           retuned: bool = False, epoch_s: float = 0.0) -> Decision:
    """Assign every live job a queue. ``jobs``: job id -> group id -> latest report; ``previous``: last epoch's
    assignments; ``losing``: last epoch's ``Decision.losing``. Mode ``adaptive``: ``values`` (job id -> what is
    placed instead of its TLR, ``tuning.value_of``), ``cutoffs`` (the tuner's, instead of ``config.thresholds``)
    and ``retuned`` (the cutoffs have just changed: every unpinned job is placed afresh, without hysteresis,
    reason ``tuned``, except that a losing job never moves down). Without ``values``, each job's ``job_value``
    (without a reference work) with ``epoch_s``, the controller's epoch (0: no job is ``finishing``).
    Deterministic: the same inputs give the same ``Decision``."""
    losing = losing or {}
    valued = values is None and placed_by_value(config) and epoch_s > 0.0
    values = values or {}
    pinned = dict(config.pinned)
    live: dict[int, Mapping[int, GroupReport]] = {}
    assignments: dict[int, int] = {}
    streaks: dict[int, int] = {}
    changes: list[JobChange] = []
    for job_id in sorted(jobs):
        groups = {g: r for g, r in jobs[job_id].items() if now - r.last_seen < config.job_timeout_s}
        if not groups:
            continue
        live[job_id] = types.MappingProxyType(groups)
        tlr, group_id = job_tlr(groups)
        loss = groups[group_id].loss
        old = previous.get(job_id)
        if job_id in pinned:
            new, reason = pinned[job_id], "new" if old is None else ("moved" if old != pinned[job_id] else None)
        else:
            value = job_value(groups, tlr, None, config, epoch_s) if valued else values.get(job_id, tlr)
            new, reason = _place(job_id, tlr, loss, old, losing, streaks, config, value, retuned, cutoffs)
        assignments[job_id] = new
        if reason is not None:
            changes.append(JobChange(job_id, reason, old, new, tlr, group_id, loss))
    for job_id in sorted(set(previous) - set(assignments)):
        changes.append(JobChange(job_id, "expired", previous[job_id], None))
    return Decision(types.MappingProxyType(assignments), tuple(changes), types.MappingProxyType(live),
                    types.MappingProxyType(streaks))


def _place(job_id: int, tlr: float, loss: float, old: int | None, losing: Mapping[int, int],
           streaks: dict[int, int], config: PolicyConfig, value: float | None = None,
           retuned: bool = False, cutoffs: tuple[float, ...] | None = None) -> tuple[int, str | None]:
    """(queue, change reason or None) for one unpinned job; records its losing streak in ``streaks``. ``value``:
    what ``cutoffs`` (default ``config.thresholds``) place (default: the TLR); the losing test is on the TLR."""
    value = tlr if value is None else value
    thresholds = config.thresholds if cutoffs is None else cutoffs
    if old is None:
        return queue_for_tlr(value, thresholds), "new"
    if retuned:
        new = queue_for_tlr(value, thresholds)
        if loss > tlr + config.loss_margin:
            streaks[job_id] = losing.get(job_id, 0) + 1
            new = min(new, old)  # a losing job never moves down (nor loses its promotion) on a retune either
        return new, "tuned" if new != old else None
    if loss > tlr + config.loss_margin:
        streak = losing.get(job_id, 0) + 1
        if streak >= config.promote_after_epochs and old > FIRST_APPROX_QUEUE:
            return old - 1, "promoted"  # the streak restarts in the new queue
        streaks[job_id] = streak
        new = min(hold_or_move(value, old, config, thresholds), old)  # a losing job never moves down
    else:
        new = hold_or_move(value, old, config, thresholds)
    if new != old:
        return new, "moved"
    if queue_for_tlr(value, thresholds) != old:
        return old, "held"
    return old, None


def _urgency(flow, objective: str) -> tuple:
    if objective == "deadline":
        return (flow.deadline_us[1], flow.priority[0])
    if objective == "weight":
        return (-flow.weight, flow.priority[0])
    return (flow.priority[0], flow.deadline_us[1])


class Placer:
    """``_place`` for one job at a time, with the configuration's thresholds and hysteresis bands worked out once
    (the incremental core decides thousands of jobs an epoch with it). Same decisions as ``_place``:
    tests/controller/test_core.py checks the core against ``decide`` epoch by epoch."""

    __slots__ = ("_upper", "_bands", "_margin", "_promote_after", "_thresholds")

    def __init__(self, config: PolicyConfig, cutoffs: tuple[float, ...] | None = None) -> None:
        """``cutoffs``: place with these instead of ``config.thresholds`` (mode ``adaptive``: the tuner's)."""
        self._thresholds = tuple(config.thresholds if cutoffs is None else cutoffs)
        self._upper = self._thresholds[FIRST_APPROX_QUEUE:]  # T_1 .. T_7, increasing (validated)
        self._bands = {q: (lo - config.hysteresis, hi + config.hysteresis)
                       for q in range(FIRST_APPROX_QUEUE, NUM_QUEUES)
                       for lo, hi in (queue_range(q, self._thresholds),)}
        self._margin = config.loss_margin
        self._promote_after = config.promote_after_epochs

    def params(self) -> tuple[tuple[float, ...], dict[int, tuple[float, float]], float, int]:
        """(T_1 .. T_7, queue -> hysteresis band, loss margin, promotion streak): what the C decision loop
        (controller/_decide.c) places with."""
        return self._upper, self._bands, self._margin, self._promote_after

    def queue_for(self, tlr: float) -> int:
        """``queue_for_tlr`` (the largest k with T_k <= tlr, at least 1)."""
        return max(FIRST_APPROX_QUEUE, bisect.bisect_right(self._upper, tlr))

    def place(self, tlr: float, loss: float, old: int | None, streak: int, value: float | None = None,
              retuned: bool = False) -> tuple[int, str | None, int]:
        """(queue, change reason or None, losing streak after this epoch) for one unpinned job whose streak was
        ``streak``; ``value`` and ``retuned`` as in ``_place``."""
        key = tlr if value is None else value
        target = max(FIRST_APPROX_QUEUE, bisect.bisect_right(self._upper, key))
        if old is None:
            return target, "new", 0
        if retuned:
            if loss > tlr + self._margin:
                streak += 1
                target = min(target, old)  # a losing job never moves down on a retune either
            else:
                streak = 0
            return target, "tuned" if target != old else None, streak
        band = self._bands.get(old)  # the bands hold the placed value; the losing test is on the TLR
        if loss > tlr + self._margin:
            streak += 1
            if streak >= self._promote_after and old > FIRST_APPROX_QUEUE:
                return old - 1, "promoted", 0
            new = old if band is not None and band[0] <= key < band[1] else target
            new = min(new, old)  # a losing job never moves down
        else:
            streak = 0
            new = old if target == old or band is not None and band[0] <= key < band[1] else target
        if new != old:
            return new, "moved", streak
        if target != old:
            return old, "held", streak
        return old, None, streak


def tag_rules(cadentflows: tuple[CadentFlow, ...]) -> frozenset[TagRule]:
    """queue_by_tag rules for CadentFlow declarations.

    Within one declaration, flows are ordered by the objective (``priority``: lowest priority tag first;
    ``deadline``: tightest deadline slack first; ``weight``: heaviest first). The most urgent distinct key gets
    queue 1, the next queue 2, ... (more than 7 distinct keys are spread evenly over 1..7). ``queue`` in a
    flow pins it. Ranks (P4Runtime priority, larger wins) are unique and favour more urgent queues, so where
    tag ranges overlap the more urgent rule wins."""
    placed: list[tuple[int, int, int, object]] = []  # (qid, decl index, flow index, flow)
    for d, cf in enumerate(cadentflows):
        keys = sorted({_urgency(f, cf.objective) for f in cf.flows if f.queue is None})
        n = len(keys)
        for i, f in enumerate(cf.flows):
            if f.queue is not None:
                qid = f.queue
            else:
                pos = keys.index(_urgency(f, cf.objective))
                span = NUM_QUEUES - FIRST_APPROX_QUEUE
                qid = FIRST_APPROX_QUEUE + (pos if n <= span else pos * span // n)
            placed.append((qid, d, i, f))
    placed.sort(key=lambda p: (p[0], p[1], p[2]))
    rules = []
    for idx, (qid, _d, _i, f) in enumerate(placed):
        rules.append(TagRule(rank=len(placed) - idx, priority_lo=f.priority[0], priority_hi=f.priority[1],
                             deadline_lo_us=f.deadline_us[0], deadline_hi_us=f.deadline_us[1], qid=qid))
    return frozenset(rules)


def rank_rules(levels: int) -> tuple[TagRule, ...]:
    """queue_by_tag rules of the job ranks (``PolicyConfig.rank_levels``): priority r -> queue 1 + r, any
    deadline, ranks 1..``levels`` (below every CadentFlow rule, which ``static_state`` lifts above them)."""
    return tuple(TagRule(rank=levels - r, priority_lo=r, priority_hi=r, deadline_lo_us=0,
                         deadline_hi_us=(1 << 32) - 1, qid=FIRST_APPROX_QUEUE + r) for r in range(levels))


def all_tag_rules(config: PolicyConfig) -> frozenset[TagRule]:
    """The CadentFlow declarations' rules above the job ranks' rules."""
    ranks = rank_rules(config.rank_levels)
    return frozenset(dataclasses.replace(r, rank=r.rank + len(ranks)) for r in tag_rules(config.cadentflows)
                     ) | frozenset(ranks)


def fifo_state(switch: SwitchConfig, config: PolicyConfig) -> SwitchState:
    """A network-oblivious switch: every packet in queue 0 (whose buffer is then the port's whole buffer),
    routes and ECMP groups kept (every packet by flow hash), queue 0's ECN marking kept."""
    return SwitchState(routes=frozenset(switch.routes), fifo=True, ecmp_routes=frozenset(switch.ecmp_routes),
                       spray=False,
                       ecn_rules=frozenset({EcnRule(qid=NON_APPROX_QUEUE, depth_pkts=config.ecn_threshold_pkts)}))


def static_state(switch: SwitchConfig, config: PolicyConfig, buffers: tuple[int, ...] = ()) -> SwitchState:
    """Everything but the report-driven ``queue_by_job`` entries: routes, class rules, CadentFlow tag rules, TLR
    thresholds, ECN of queue 0, and ``buffers`` as the approximate queues' buffers (the tuner's; empty: the
    target's own) (``mode = "fifo"``: ``fifo_state``)."""
    if config.mode == "fifo":
        return fifo_state(switch, config)
    return SwitchState(
        routes=frozenset(switch.routes),
        ecmp_routes=frozenset(switch.ecmp_routes),
        spray=config.spray,
        class_rules=frozenset(switch.class_rules),
        tag_rules=all_tag_rules(config),
        tlr_rules=default_tlr_rules(config.thresholds) if config.install_tlr_rules else frozenset(),
        ecn_rules=frozenset({EcnRule(qid=0, depth_pkts=config.ecn_threshold_pkts)}),
        queue_buffers=tuple(buffers),
    )


def tag_only_jobs(config: PolicyConfig) -> frozenset[int]:
    """Jobs declared in a CadentFlow: their tags decide, so they get no queue_by_job entry."""
    return frozenset(j for cf in config.cadentflows for j in cf.jobs)


def switch_state(static: SwitchState, assignments: Mapping[int, int],
                 exclude: frozenset[int] = frozenset()) -> SwitchState:
    """``static`` plus one queue_by_job rule per assigned job (except ``exclude``)."""
    return dataclasses.replace(static, job_rules=frozenset(
        JobRule(job_id=j, qid=q) for j, q in assignments.items() if j not in exclude))
