"""The queue policy, as pure functions: reports in, table contents out. No I/O, no clock (``now`` is an argument).

- ``queue_for_tlr``: TLR in [T_k, T_k+1) -> queue k; below T_1 -> queue 1 (approximate traffic never uses
  queue 0). Same mapping as ``controller.model.default_tlr_rules`` installs in ``queue_by_tlr``.
- ``decide``: one epoch's job -> queue assignment. A job's TLR is the *lowest* TLR over its live groups (the
  most conservative: the group that tolerates the least loss decides, so no group is pushed into a queue
  lossier than it asked for). Hysteresis: a job keeps its queue until its TLR is more than
  ``PolicyConfig.hysteresis`` outside that queue's range. Groups that stop reporting for ``job_timeout_s``
  are forgotten; a job without groups expires and loses its ``queue_by_job`` entry.
- ``tag_rules``: CadentFlow declarations -> ``queue_by_tag`` rules.
- ``static_state`` / ``switch_state``: a switch's full desired ``SwitchState``.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Mapping

from netapprox.controller.config import CadentFlow, PolicyConfig, SwitchConfig
from netapprox.controller.model import (
    NUM_QUEUES,
    EcnRule,
    JobRule,
    SwitchState,
    TagRule,
    default_tlr_rules,
)

FIRST_APPROX_QUEUE = 1


@dataclasses.dataclass(frozen=True)
class GroupReport:
    """The latest accepted report of one (job, group)."""

    tlr: float
    last_seen: float


@dataclasses.dataclass(frozen=True)
class JobChange:
    """One policy decision worth logging. ``reason``: ``new`` (first assignment), ``moved`` (queue changed),
    ``held`` (the TLR points at another queue but stays within the hysteresis band), ``expired``."""

    job_id: int
    reason: str
    old_qid: int | None
    new_qid: int | None
    tlr: float | None = None
    group_id: int | None = None  # the group whose (lowest) TLR decided


@dataclasses.dataclass(frozen=True)
class Decision:
    """Result of one ``decide`` call."""

    assignments: Mapping[int, int]  # job id -> logical queue, live jobs only
    changes: tuple[JobChange, ...]
    live: Mapping[int, Mapping[int, GroupReport]]  # the input jobs minus expired groups and jobs


def queue_for_tlr(tlr: float, thresholds: tuple[float, ...]) -> int:
    """The queue whose TLR range holds ``tlr``: the largest k with T_k <= tlr, at least 1."""
    qid = FIRST_APPROX_QUEUE
    for k in range(FIRST_APPROX_QUEUE, NUM_QUEUES):
        if tlr >= thresholds[k]:
            qid = k
    return qid


def queue_range(qid: int, thresholds: tuple[float, ...]) -> tuple[float, float]:
    """[lo, hi) of TLRs that ``queue_for_tlr`` maps to ``qid`` (queue 1 starts at 0, queue 7 ends above 1)."""
    lo = 0.0 if qid == FIRST_APPROX_QUEUE else thresholds[qid]
    hi = thresholds[qid + 1] if qid + 1 < NUM_QUEUES else float("inf")
    return lo, hi


def hold_or_move(tlr: float, current: int | None, config: PolicyConfig) -> int:
    """Queue for ``tlr`` given the job's current queue, with hysteresis."""
    target = queue_for_tlr(tlr, config.thresholds)
    if current is None or target == current or not FIRST_APPROX_QUEUE <= current < NUM_QUEUES:
        return target
    lo, hi = queue_range(current, config.thresholds)
    if lo - config.hysteresis <= tlr < hi + config.hysteresis:
        return current
    return target


def job_tlr(groups: Mapping[int, GroupReport]) -> tuple[float, int]:
    """(lowest TLR, its group id) over a job's groups: the most conservative group decides."""
    group_id, report = min(groups.items(), key=lambda item: (item[1].tlr, item[0]))
    return report.tlr, group_id


def decide(jobs: Mapping[int, Mapping[int, GroupReport]], previous: Mapping[int, int], now: float,
           config: PolicyConfig) -> Decision:
    """Assign every live job a queue. ``jobs``: job id -> group id -> latest report; ``previous``: last epoch's
    assignments. Deterministic: the same inputs give the same ``Decision``."""
    live: dict[int, Mapping[int, GroupReport]] = {}
    assignments: dict[int, int] = {}
    changes: list[JobChange] = []
    for job_id in sorted(jobs):
        groups = {g: r for g, r in jobs[job_id].items() if now - r.last_seen < config.job_timeout_s}
        if not groups:
            continue
        live[job_id] = types.MappingProxyType(groups)
        tlr, group_id = job_tlr(groups)
        old = previous.get(job_id)
        new = hold_or_move(tlr, old, config)
        assignments[job_id] = new
        if old is None:
            changes.append(JobChange(job_id, "new", None, new, tlr, group_id))
        elif new != old:
            changes.append(JobChange(job_id, "moved", old, new, tlr, group_id))
        elif queue_for_tlr(tlr, config.thresholds) != old:
            changes.append(JobChange(job_id, "held", old, old, tlr, group_id))
    for job_id in sorted(set(previous) - set(assignments)):
        changes.append(JobChange(job_id, "expired", previous[job_id], None))
    return Decision(types.MappingProxyType(assignments), tuple(changes), types.MappingProxyType(live))


def _urgency(flow, objective: str) -> tuple:
    if objective == "deadline":
        return (flow.deadline_us[1], flow.priority[0])
    if objective == "weight":
        return (-flow.weight, flow.priority[0])
    return (flow.priority[0], flow.deadline_us[1])


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


def static_state(switch: SwitchConfig, config: PolicyConfig) -> SwitchState:
    """Everything but ``queue_by_job``: routes, class rules, CadentFlow tag rules, TLR thresholds, ECN of queue 0."""
    return SwitchState(
        routes=frozenset(switch.routes),
        class_rules=frozenset(switch.class_rules),
        tag_rules=tag_rules(config.cadentflows),
        tlr_rules=default_tlr_rules(config.thresholds) if config.install_tlr_rules else frozenset(),
        ecn_rules=frozenset({EcnRule(qid=0, depth_pkts=config.ecn_threshold_pkts)}),
    )


def tag_only_jobs(config: PolicyConfig) -> frozenset[int]:
    """Jobs declared in a CadentFlow: their tags decide, so they get no queue_by_job entry."""
    return frozenset(j for cf in config.cadentflows for j in cf.jobs)


def switch_state(static: SwitchState, assignments: Mapping[int, int],
                 exclude: frozenset[int] = frozenset()) -> SwitchState:
    """``static`` plus one queue_by_job rule per assigned job (except ``exclude``)."""
    return dataclasses.replace(static, job_rules=frozenset(
        JobRule(job_id=j, qid=q) for j, q in assignments.items() if j not in exclude))
