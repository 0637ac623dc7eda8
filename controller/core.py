"""The controller's epoch logic, sans I/O: reports and time in, desired switch states and decisions out.

No sockets, threads or clock (model: hostlib's sans-I/O ATP endpoints, aioquic). ``controller.runtime`` does
the I/O around it; a simulator or a test drives it directly with its own clock::

    core = ControllerCore(config)
    core.ingest(datagram, "10.0.0.1", now)        # a REPORT from a host (UDP payload)
    core.ingest_frame(frame, now)                 # a REPORT punted by a P4 switch (Ethernet frame)
    plan = core.step(now)                         # one epoch
    plan.desired["s1"]                            # the SwitchState every driver should apply
    plan.changes                                  # the policy's decisions, for the decision log

Re-running ``step`` with no new reports and the same time changes nothing (the same ``desired`` values).
"""
from __future__ import annotations

import dataclasses
import types
from typing import Iterable, Mapping

from netapprox.controller import policy
from netapprox.controller.config import ControllerConfig, SwitchConfig
from netapprox.controller.model import SwitchState
from netapprox.controller.reports import ReportIngest, udp_payload_from_frame
from netapprox.hostlib.wire import Report


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """What one ``ControllerCore.step`` decided."""

    epoch: int
    now: float
    assignments: Mapping[int, int]
    """job id -> logical queue after this epoch (live jobs, and pinned ones)."""
    changes: tuple[policy.JobChange, ...]
    """The policy's decisions worth logging (new, moved, promoted, held, expired)."""
    desired: Mapping[str, SwitchState]
    """switch name -> the whole desired content of its tables."""
    reports: tuple[Report, ...]
    """Reports accepted since the previous step, oldest first."""
    reports_dropped: int
    """Reports dropped since the previous step (all reasons; ``ControllerCore.ingest_stats`` has them by reason)."""


class ControllerCore:
    """Jobs, their latest reports and queue assignments, and every switch's static tables."""

    def __init__(self, config: ControllerConfig, extra_switches: Iterable[str] = ()) -> None:
        self.config = config
        self.ingest_stats = ReportIngest(config.reports)
        switches = {s.name: s for s in config.switches}
        for name in extra_switches:
            switches.setdefault(name, SwitchConfig(name=name))
        self.switches: Mapping[str, SwitchConfig] = types.MappingProxyType(switches)
        self._static = {name: policy.static_state(sc, config.policy) for name, sc in switches.items()}
        self._tag_only = policy.tag_only_jobs(config.policy)
        self._jobs: dict[int, dict[int, policy.GroupReport]] = {}
        self._losing: Mapping[int, int] = {}
        self._assignments: Mapping[int, int] = types.MappingProxyType({})
        self._reports: list[Report] = []
        self._dropped_mark = 0
        self._epoch = 0

    def reconfigure(self, *, policy_config=None, switches: Iterable[SwitchConfig] = ()) -> None:
        """Take a new ``PolicyConfig`` and/or new configs of known switches (routes, class rules); the next
        ``step`` plans with them."""
        if policy_config is not None:
            self.config = dataclasses.replace(self.config, policy=policy_config)
        changed = dict(self.switches)
        for sc in switches:
            if sc.name not in changed:
                raise KeyError(f"no switch named {sc.name!r}")
            changed[sc.name] = sc
        self.switches = types.MappingProxyType(changed)
        self._static = {name: policy.static_state(sc, self.config.policy) for name, sc in changed.items()}
        self._tag_only = policy.tag_only_jobs(self.config.policy)

    @property
    def epoch(self) -> int:
        """Epochs stepped so far."""
        return self._epoch

    @property
    def assignments(self) -> Mapping[int, int]:
        """job id -> logical queue, as of the last step."""
        return self._assignments

    @property
    def jobs(self) -> Mapping[int, Mapping[int, policy.GroupReport]]:
        """job id -> group id -> latest accepted report (read-only view; live until the next step)."""
        return types.MappingProxyType(self._jobs)

    def ingest(self, datagram: bytes, source: str, now: float) -> Report | None:
        """Validate and record one REPORT datagram from host ``source`` (its address: the rate-limit key).
        Returns the report, or None if it was dropped (counted by reason in ``ingest_stats``). Never raises on
        bad input."""
        report = self.ingest_stats.receive(datagram, source, now)
        if report is not None:
            self._jobs.setdefault(report.job_id, {})[report.group_id] = policy.GroupReport(
                report.tlr, now, report.loss, report.rate_kbps * 1000.0)
            self._reports.append(report)
        return report

    def ingest_frame(self, frame: bytes, now: float) -> Report | None:
        """A packet-in frame (Ethernet/IPv4/UDP carrying a REPORT): ``ingest`` its payload, keyed by the IPv4
        source. Frames that are not IPv4/UDP are counted as ``not_udp``."""
        parsed = udp_payload_from_frame(frame)
        if parsed is None:
            self.ingest_stats.dropped["not_udp"] += 1
            return None
        return self.ingest(parsed[0], parsed[1], now)

    def step(self, now: float) -> EpochPlan:
        """One epoch: decide every job's queue from the reports so far, expire silent ones, and return every
        switch's desired state."""
        self._epoch += 1
        cfg = self.config.policy
        if cfg.mode == "netapprox":
            decision = policy.decide(self._jobs, self._assignments, now, cfg, self._losing)
            assignments, changes, self._losing = decision.assignments, decision.changes, decision.losing
            live = decision.live
        else:  # static and fifo switches do not follow reports; the reports are still tracked (metrics)
            live = {j: {g: r for g, r in groups.items() if now - r.last_seen < cfg.job_timeout_s}
                    for j, groups in self._jobs.items()}
            live = {j: g for j, g in live.items() if g}
            assignments, changes = types.MappingProxyType(dict(cfg.pinned)), ()
        for job_id in set(self._jobs) - set(live):
            self.ingest_stats.forget_job(job_id)
        for job_id, groups in live.items():
            for g in set(self._jobs[job_id]) - set(groups):
                self.ingest_stats.forget_group(job_id, g)
        self._jobs = {j: dict(g) for j, g in live.items()}
        self._assignments = assignments
        job_rules = {} if cfg.mode == "fifo" else {**dict(cfg.pinned), **assignments}
        desired = {name: policy.switch_state(static, job_rules, self._tag_only)
                   for name, static in self._static.items()}
        reports, self._reports = tuple(self._reports), []
        dropped_total = sum(self.ingest_stats.dropped.values())
        dropped, self._dropped_mark = dropped_total - self._dropped_mark, dropped_total
        return EpochPlan(epoch=self._epoch, now=now, assignments=assignments, changes=changes,
                         desired=types.MappingProxyType(desired), reports=reports, reports_dropped=dropped)
