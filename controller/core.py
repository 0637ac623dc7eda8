"""The controller's epoch logic, sans I/O: reports and time in, desired switch states and decisions out.

No sockets, threads or clock (model: hostlib's sans-I/O ATP endpoints, aioquic). ``controller.runtime`` does
the I/O around it; a simulator or a test drives it directly with its own clock::

    core = ControllerCore(config)
    core.ingest(datagram, "10.0.0.1", now)        # a REPORT from a host (UDP payload)
    core.ingest_frame(frame, now)                 # a REPORT punted by a P4 switch (Ethernet frame)
    plan = core.step(now)                         # one epoch
    plan.updates["s1"]                            # what changed in s1's tables (TableUpdates)
    plan.desired["s1"]                            # the whole desired SwitchState of s1 (built on demand)
    plan.changes                                  # the policy's decisions, for the decision log

Work is proportional to change, not to size (docs/controller.md, "Scale"): a report updates its job in place
and marks the job for a new decision only when it can change one (a new job or group, the deciding group's
TLR or loss, a group that now tolerates less); a job whose loss exceeds its TLR is re-decided every epoch
(its losing streak counts epochs); silence expires groups from a heap of deadlines; each switch's
``queue_by_job`` content is a dictionary updated by the decisions, so an epoch hands every driver only the
entries that changed. The decisions are exactly those of ``policy.decide`` over all jobs (a differential test
checks it), except that a ``held`` decision is logged when a report re-decides the job, not every epoch.
Re-running ``step`` with no new reports and the same time changes nothing.
"""
from __future__ import annotations

import dataclasses
import heapq
import ipaddress
import types
from typing import Iterable, Iterator, Mapping

from netapprox.controller import policy, tuning
from netapprox.controller.config import ControllerConfig, SwitchConfig
from netapprox.controller.model import JobRule, SwitchState, TableUpdates
from netapprox.controller.reports import ReportIngest, udp_payload_from_frame
from netapprox.hostlib.wire import Report

try:
    from netapprox.controller import _decide as _native
except ImportError:  # not built (no compiler at install time): _decide_all's own loop
    _native = None

try:
    from netapprox.controller import _ingest as _native_ingest
except ImportError:  # not built: ingest_batch's own loop
    _native_ingest = None

NATIVE = _native is not None
"""True when the C decision loop (controller/_decide.c) is built: ``_decide_all`` runs it for modes ``netapprox``
without pinned jobs (``ControllerCore.native_decide``)."""
NATIVE_INGEST = _native_ingest is not None
"""True when the C report loop (controller/_ingest.c) is built: ``ingest_batch`` runs it for the reports of known
groups (``ControllerCore.native_ingest``)."""
_REASONS = ("new", "moved", "promoted", "held", "tuned")  # _decide.c's reasons, in its order


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """What one ``ControllerCore.step`` decided."""

    epoch: int
    now: float
    assignments: Mapping[int, int]
    """job id -> logical queue after this epoch (live jobs, and pinned ones)."""
    changes: tuple[policy.JobChange, ...]
    """The policy's decisions worth logging (new, moved, promoted, held, expired)."""
    updates: Mapping[str, TableUpdates]
    """switch name -> what changed in its tables this epoch."""
    desired: Mapping[str, SwitchState]
    """switch name -> the whole desired content of its tables, built on first access. Valid until the next
    ``step`` (reading it later raises)."""
    reports: tuple[Report, ...]
    """Reports accepted since the previous step, oldest first."""
    reports_dropped: int
    """Reports dropped since the previous step (all reasons; ``ControllerCore.ingest_stats`` has them by reason)."""
    tuning: tuple[tuning.TuningChange, ...] = ()
    """Mode ``adaptive``: the tuner's change of the thresholds and buffers this epoch (none, or one)."""


class _Job:
    __slots__ = ("job_id", "source", "groups", "min_tlr", "min_group", "qid", "streak", "switches", "tag_only",
                 "value")

    def __init__(self, job_id: int, source: str, switches: tuple[str, ...], tag_only: bool) -> None:
        self.job_id = job_id
        self.source = source
        self.groups: dict[int, policy.GroupReport] = {}
        self.min_tlr = 2.0
        self.min_group = -1
        self.qid: int | None = None
        self.streak = 0
        self.switches = switches
        self.tag_only = tag_only
        self.value: float | None = None  # mode adaptive: the placement value last decided with

    def refresh_min(self) -> None:
        if len(self.groups) == 1:
            (self.min_group, report), = self.groups.items()
            self.min_tlr = report.tlr
        else:
            self.min_tlr, self.min_group = policy.job_tlr(self.groups)


class _DesiredStates(Mapping[str, SwitchState]):
    """``EpochPlan.desired``: each switch's state built from the core's tables when first read."""

    def __init__(self, core: "ControllerCore", epoch: int) -> None:
        self._core = core
        self._epoch = epoch
        self._built: dict[str, SwitchState] = {}

    def __getitem__(self, name: str) -> SwitchState:
        state = self._built.get(name)
        if state is None:
            if self._core.epoch != self._epoch:
                raise RuntimeError(f"EpochPlan.desired of epoch {self._epoch} read after epoch {self._core.epoch}; "
                                   "read it before the next step")
            state = self._built[name] = self._core.desired_state(name)
        return state

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.switches)

    def __len__(self) -> int:
        return len(self._core.switches)


class ControllerCore:
    """Jobs, their latest reports and queue assignments, and every switch's tables."""

    def __init__(self, config: ControllerConfig, extra_switches: Iterable[str] = ()) -> None:
        self.config = config
        self.ingest_stats = ReportIngest(config.reports)
        switches = {s.name: s for s in config.switches}
        for name in extra_switches:
            switches.setdefault(name, SwitchConfig(name=name))
        self._jobs: dict[int, _Job] = {}
        self._sender_ports: dict[tuple[str, str], tuple[tuple, int | None]] = {}  # (switch, source) -> (routes, port)
        self._dirty: set[int] = set()
        self._losing: set[int] = set()
        self._expiry: list[tuple[float, int, int]] = []  # (deadline, job, group); stale entries are skipped
        self._assignments: dict[int, int] = {}
        self._reports: list[Report] = []
        self._dropped_mark = 0
        self._epoch = 0
        self._sources: dict[str, tuple[str, ...]] = {}
        self.native_decide = NATIVE
        """Decide in C where it can (``NATIVE``); False: always ``_decide_all``'s own loop (the differential test)."""
        self.native_ingest = NATIVE_INGEST
        """Take reports in C where it can (``NATIVE_INGEST``); False: always ``ingest_batch``'s own loop."""
        self._setup(switches)

    def _setup(self, switches: Mapping[str, SwitchConfig]) -> None:
        """(Re)build everything that follows from the configuration; every switch then gets a full apply. Mode
        ``adaptive`` starts (again) from the configured thresholds and the targets' buffers."""
        cfg = self.config.policy
        self._adaptive = cfg.mode == "adaptive"
        self._valued = policy.placed_by_value(cfg)
        self._finish_s = cfg.finish_epochs * self.config.epoch_s
        self._tuned = tuning.Tuned(cutoffs=tuple(cfg.thresholds), thresholds=tuple(cfg.thresholds))
        self._retuned = False
        self.switches: Mapping[str, SwitchConfig] = types.MappingProxyType(dict(switches))
        self._tag_only = policy.tag_only_jobs(cfg)
        self._ranked = cfg.rank_levels > 0  # job ranks: every job is left to its tags
        self._build_static()
        self._by_source = [(ipaddress.ip_network(prefix, strict=False), name) for name, sc in switches.items()
                           for prefix in sc.job_sources]
        self._everywhere = tuple(name for name, sc in switches.items() if not sc.job_sources)
        self._sources.clear()
        for job in self._jobs.values():
            job.tag_only = self._left_to_tags(job.job_id)
            job.switches = self._switches_of(job.source)
        if self._decides:
            self._assignments = {j.job_id: j.qid for j in self._jobs.values() if j.qid is not None}
        else:
            self._assignments = dict(cfg.pinned)
        self._tables: dict[str, dict[int, int]] = {}
        for name in switches:
            table = {} if cfg.mode == "fifo" else {j: q for j, q in cfg.pinned if not self._left_to_tags(j)}
            self._tables[name] = table
        if self._decides:
            for job in self._jobs.values():
                if job.qid is not None and not job.tag_only:
                    for name in job.switches:
                        self._tables[name][job.job_id] = job.qid
        self._full = set(switches)

    @property
    def _decides(self) -> bool:
        """The policy places jobs from their reports (modes ``netapprox`` and ``adaptive``)."""
        return self.config.policy.mode in ("netapprox", "adaptive")

    def _build_static(self) -> None:
        """Each switch's static tables and the placer, with the cutoffs, thresholds (and buffers) in effect."""
        cfg = dataclasses.replace(self.config.policy, thresholds=self._tuned.thresholds)
        self._placer = policy.Placer(cfg, self._tuned.cutoffs)
        self._static = {name: dataclasses.replace(policy.static_state(sc, cfg, self._tuned.buffers),
                                                  job_rules=frozenset())
                        for name, sc in self.switches.items()}

    def reconfigure(self, *, policy_config=None, switches: Iterable[SwitchConfig] = ()) -> None:
        """Take a new ``PolicyConfig`` and/or new configs of known switches (routes, class rules, job sources);
        the next ``step`` plans with them and hands every switch its whole state."""
        if policy_config is not None:
            self.config = dataclasses.replace(self.config, policy=policy_config)
        changed = dict(self.switches)
        for sc in switches:
            if sc.name not in changed:
                raise KeyError(f"no switch named {sc.name!r}")
            changed[sc.name] = sc
        self._setup(changed)
        self._dirty.update(self._jobs)

    # --- state ---------------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Epochs stepped so far."""
        return self._epoch

    @property
    def assignments(self) -> Mapping[int, int]:
        """job id -> logical queue, as of the last step (read-only view)."""
        return types.MappingProxyType(self._assignments)

    @property
    def tuned(self) -> tuning.Tuned:
        """The thresholds (and, mode ``adaptive``, buffers and reference work) in effect."""
        return self._tuned

    @property
    def jobs(self) -> Mapping[int, Mapping[int, policy.GroupReport]]:
        """job id -> group id -> latest accepted report (read-only view)."""
        return {job_id: types.MappingProxyType(job.groups) for job_id, job in self._jobs.items()}

    def desired_state(self, switch: str) -> SwitchState:
        """The whole desired content of ``switch``'s tables now."""
        return dataclasses.replace(self._static[switch], job_rules=frozenset(
            JobRule(job_id=j, qid=q) for j, q in self._tables[switch].items()))

    # --- reports -------------------------------------------------------------------------------------------

    def ingest(self, datagram: bytes | Report | str, source: str, now: float) -> Report | None:
        """Validate and record one REPORT datagram from host ``source`` (its address: the rate-limit key and,
        with ``SwitchConfig.job_sources``, what says which switches carry the job). Returns the report, or None
        if it was dropped (counted by reason in ``ingest_stats``). Never raises on bad input. ``datagram`` may
        be what ``reports.receive_batch`` made of a datagram (its report, or why it is malformed)."""
        report = self.ingest_stats.receive(datagram, source, now)
        if report is None:
            return None
        job = self._jobs.get(report.job_id)
        if job is None:
            job = self._jobs[report.job_id] = _Job(report.job_id, source, self._switches_of(source),
                                                   self._left_to_tags(report.job_id))
        group_id = report.group_id
        old = job.groups.get(group_id)
        new = job.groups[group_id] = policy.next_group_report(old, now, report.tlr, report.loss,
                                                              report.rate_kbps * 1000.0, report.msr, report.total,
                                                              report.delivered, report.lost)
        if old is None:
            heapq.heappush(self._expiry, (now + self.config.policy.job_timeout_s, report.job_id, group_id))
            self._dirty.add(report.job_id)
        elif group_id == job.min_group:
            if report.tlr != old.tlr or report.loss != old.loss:
                self._dirty.add(report.job_id)
            elif self._valued and job.value is not None and self._value_moved(job, old, new):
                self._dirty.add(report.job_id)  # its remaining work moved it
        elif (report.tlr, group_id) < (job.min_tlr, job.min_group):
            self._dirty.add(report.job_id)
        elif self._valued and job.value is not None and self._value_moved(job, old, new):
            self._dirty.add(report.job_id)
        self._reports.append(report)
        return report

    def _value_moved(self, job: _Job, old: policy.GroupReport, new: policy.GroupReport) -> bool:
        """Whether a group's new report moved its job's placement value away from the one it was decided with.
        Mode ``netapprox``'s value reads only the groups' rates, remaining messages and costs per message
        (``policy.finishing``), so a report that changed none of them cannot move it and is not tested again
        (the common case, once per report)."""
        if (not self._adaptive and old.rate_bps == new.rate_bps and old.remaining == new.remaining
                and old.message_bytes == new.message_bytes):
            return False
        return self._value(job, job.min_tlr) != job.value

    def _value(self, job: _Job, tlr: float) -> float:
        """The job's placement value now (``policy.job_value``; modes that place by value). Mode ``netapprox``:
        the same, without its calls (a TLR is never below ``FINISH_VALUE``)."""
        if self._adaptive:
            return policy.job_value(job.groups, tlr, self._tuned.work_ref, self.config.policy, self.config.epoch_s)
        return policy.FINISH_VALUE if policy.finishing(job.groups, self._finish_s) else tlr

    def ingest_batch(self, batch: Iterable[tuple[str, bytes | Report | str]], now: float) -> int:
        """``ingest`` each (source, report or reason) of ``reports.receive_batch``; returns how many
        were accepted. In C (controller/_ingest.c) when it is built: the same checks and bookkeeping for the
        reports of groups already known, ``ingest`` for the rest, in order."""
        if self.native_ingest and type(now) is float:
            stats, config = self.ingest_stats, self.ingest_stats.config
            return _native_ingest.ingest(batch, now, (
                self._jobs, stats, stats._last_seq, stats._buckets, stats.dropped, self._dirty, self._reports,
                policy._REQUIRED, policy._required, policy.GroupReport, Report, float(config.rate_per_host),
                float(config.burst), self._valued, self._adaptive, self.ingest, self._value_moved))
        ingest = self.ingest
        accepted = 0
        for source, item in batch:
            if ingest(item, source, now) is not None:
                accepted += 1
        return accepted

    def ingest_frame(self, frame: bytes, now: float, *, switch: str | None = None,
                     ingress_port: int | None = None) -> Report | None:
        """A packet-in frame (Ethernet/IPv4/UDP carrying a REPORT): ``ingest`` its payload, keyed by the IPv4
        source. Frames that are not IPv4/UDP are counted as ``not_udp``. With the ``switch`` that punted it and
        its ``ingress_port`` (the packet-in metadata), a report is accepted only from the port the switch routes
        its source address to, where its sender lives (``wrong_port`` otherwise, also when no route covers it)."""
        parsed = udp_payload_from_frame(frame)
        if parsed is None:
            self.ingest_stats.dropped["not_udp"] += 1
            return None
        if switch is not None and ingress_port is not None and self.sender_port(switch, parsed[1]) != ingress_port:
            self.ingest_stats.dropped["wrong_port"] += 1
            return None
        return self.ingest(parsed[0], parsed[1], now)

    def sender_port(self, switch: str, source: str) -> int | None:
        """The port ``switch``'s routes send ``source`` to (longest prefix), or None. Cached per source while the
        switch's routes stay the same."""
        config = self.switches.get(switch)
        routes = config.routes if config is not None else ()
        cached = self._sender_ports.get((switch, source))
        if cached is not None and cached[0] is routes:
            return cached[1]
        try:
            addr = ipaddress.IPv4Address(source)
        except ValueError:
            return None
        best: tuple[int, int] | None = None
        for route in routes:
            net = ipaddress.IPv4Network(f"{route.prefix}/{route.prefix_len}", strict=False)
            if addr in net and (best is None or route.prefix_len > best[0]):
                best = (route.prefix_len, route.port)
        port = best[1] if best else None
        if len(self._sender_ports) >= 65536:
            self._sender_ports.clear()
        self._sender_ports[(switch, source)] = (routes, port)
        return port

    def _left_to_tags(self, job_id: int) -> bool:
        """Whether the tags a job's packets carry place it (no queue_by_job entry): a job of a CadentFlow
        declaration, or any job when the policy ranks jobs (``rank_levels``)."""
        return self._ranked or job_id in self._tag_only

    def _switches_of(self, source: str) -> tuple[str, ...]:
        """The switches that carry jobs reported from ``source``: those whose ``job_sources`` hold it, plus
        every switch without ``job_sources``."""
        found = self._sources.get(source)
        if found is None:
            try:
                addr = ipaddress.ip_address(source)
                hits = {name for net, name in self._by_source if addr in net}
            except ValueError:
                hits = set()
            found = tuple(name for name in self.switches if name in hits or name in self._everywhere)
            if len(self._sources) < 65536:
                self._sources[source] = found
        return found

    # --- the epoch -----------------------------------------------------------------------------------------

    def step(self, now: float) -> EpochPlan:
        """One epoch: expire silent groups and jobs, re-decide the jobs whose inputs changed (and every losing
        job), and return what changed in every switch's tables."""
        self._epoch += 1
        cfg = self.config.policy
        deltas: dict[str, dict[int, int | None]] = {name: {} for name in self.switches}
        urgent: set[int] = set()
        changes: list[policy.JobChange] = []
        expired = self._expire(now)
        tuned: tuple[tuning.TuningChange, ...] = ()
        if self._adaptive and self._epoch % cfg.tuning.every_epochs == 0:
            tuned = self._tune(expired, now)
        if self._decides:
            if self._retuned:
                todo = sorted(set(self._jobs).difference(expired))
            else:
                todo = sorted((self._dirty | self._losing).difference(expired))
            self._decide_all(todo, dict(cfg.pinned), deltas, changes, urgent, retuned=self._retuned)
            self._retuned = False
            for job_id in sorted(expired):
                old = self._assignments.pop(job_id, None)
                if old is not None:
                    changes.append(policy.JobChange(job_id, "expired", old, None))
                self._drop_entries(job_id, expired[job_id], deltas)
        else:
            for job_id in self._dirty:
                if job_id in self._jobs:
                    self._jobs[job_id].refresh_min()
        self._dirty.clear()
        updates = {name: TableUpdates(static=name in self._full, jobs=types.MappingProxyType(deltas[name]),
                                      urgent=frozenset(urgent & deltas[name].keys()))
                   for name in self.switches}
        self._full.clear()
        reports, self._reports = tuple(self._reports), []
        dropped_total = sum(self.ingest_stats.dropped.values())
        dropped, self._dropped_mark = dropped_total - self._dropped_mark, dropped_total
        return EpochPlan(epoch=self._epoch, now=now, assignments=types.MappingProxyType(dict(self._assignments)),
                         changes=tuple(changes), updates=types.MappingProxyType(updates),
                         desired=_DesiredStates(self, self._epoch), reports=reports, reports_dropped=dropped,
                         tuning=tuned)

    def _tune(self, expired: Mapping[int, tuple[str, ...]], now: float) -> tuple[tuning.TuningChange, ...]:
        """Mode ``adaptive``: one tuning step over the live jobs. When it changes the thresholds or buffers,
        every switch gets its whole state and every job is placed afresh in this epoch."""
        cfg = self.config.policy
        jobs = {j: job.groups for j, job in self._jobs.items() if j not in expired and job.groups}
        exclude = set(jobs) if self._ranked else set(self._tag_only) | {j for j, _ in cfg.pinned}
        samples = policy.tuning_samples(jobs, exclude, now, self.config.epoch_s, self._assignments)
        new, change = tuning.tune(samples, self._tuned, cfg.tuning, cfg.thresholds)
        work_moved = new.work_ref != self._tuned.work_ref
        self._tuned = new
        if change is not None:  # new thresholds or buffers: every switch's tables, every job placed afresh
            self._build_static()
            self._full = set(self.switches)
            self._retuned = True
            return (change,)
        if work_moved:  # every job's value moved a little: re-decide them all (with hysteresis)
            self._dirty.update(jobs)
        return ()

    def decide_arrivals(self) -> tuple[tuple[policy.JobChange, ...], Mapping[str, TableUpdates]]:
        """Decide now the jobs whose new reports changed their inputs and who are not losing (between epochs,
        so that a report reaches the switches within milliseconds, not at the next epoch boundary). Losing
        jobs, expiry and promotion wait for ``step``: a losing streak counts epochs. Returns the decisions and
        each switch's updates (empty when nothing changed). Mode ``netapprox`` only."""
        cfg = self.config.policy
        if not self._decides or not self._dirty:
            return (), {}
        pinned = dict(cfg.pinned)
        deltas: dict[str, dict[int, int | None]] = {name: {} for name in self.switches}
        changes: list[policy.JobChange] = []
        for job_id in sorted(self._dirty):
            job = self._jobs.get(job_id)
            if job is None or job_id in self._losing:
                continue
            job.refresh_min()
            if job.groups[job.min_group].loss > job.min_tlr + cfg.loss_margin:
                continue  # it starts losing: its streak starts at the epoch
            self._dirty.discard(job_id)
            change = self._decide(job, pinned, cfg)
            if change is not None:
                changes.append(change)
                if change.new_qid != change.old_qid:
                    self._set_queue(job, change.new_qid, deltas)
        updates = {name: TableUpdates(static=False, jobs=types.MappingProxyType(d)) for name, d in deltas.items() if d}
        return tuple(changes), updates

    def _expire(self, now: float) -> dict[int, tuple[str, ...]]:
        """Forget groups silent for ``job_timeout_s`` (the test is ``policy.decide``'s: ``now - last_seen <
        timeout`` is live); returns the jobs left without a group (job id -> its switches)."""
        timeout = self.config.policy.job_timeout_s
        horizon = now + 1e-9 * max(1.0, abs(now))  # rounding: the exact test below decides
        heap, again, expired = self._expiry, [], {}
        while heap and heap[0][0] <= horizon:
            _, job_id, group_id = heapq.heappop(heap)
            job = self._jobs.get(job_id)
            report = job.groups.get(group_id) if job is not None else None
            if report is None:
                continue  # the group (or job) is already gone
            if now - report.last_seen < timeout:
                again.append((report.last_seen + timeout, job_id, group_id))
                continue
            del job.groups[group_id]
            self.ingest_stats.forget_group(job_id, group_id)
            if job.groups:
                self._dirty.add(job_id)
            else:
                del self._jobs[job_id]
                self._losing.discard(job_id)
                self.ingest_stats.forget_job(job_id)
                expired[job_id] = job.switches
        for entry in again:
            heapq.heappush(heap, entry)
        return expired

    def _decide_all(self, job_ids: list[int], pinned: Mapping[int, int], deltas: dict[str, dict[int, int | None]],
                    changes: list[policy.JobChange], urgent: set[int], retuned: bool = False) -> None:
        """``_decide`` and ``_set_queue`` for each of ``job_ids`` (live jobs), inlined: this loop runs for every
        job that changed, each epoch. Losing and promoted jobs go to ``urgent``. ``retuned``: the thresholds
        just changed, every job is placed afresh."""
        if self.native_decide and not pinned and not self._adaptive:  # the same loop in C (controller/_decide.c)
            upper, bands, margin, promote_after = self._placer.params()
            params = (upper, bands, margin, promote_after, retuned and self._valued, self._valued, self._finish_s,
                      policy.FINISH_VALUE, _REASONS, policy.JobChange)  # a retune acts on placement by value only
            _native.decide(job_ids, self._jobs, self._losing, urgent, self._assignments, self._tables, deltas, changes,
                           params)
            return
        jobs, losing, assignments, tables = self._jobs, self._losing, self._assignments, self._tables
        place, margin = self._placer.place, self.config.policy.loss_margin
        new_change, job_change = tuple.__new__, policy.JobChange  # a JobChange without its __new__'s defaults
        valued = self._valued
        finishing, finish_s, finish_value = policy.finishing, self._finish_s, policy.FINISH_VALUE
        by_finishing = valued and not self._adaptive  # mode netapprox's value, inlined (``_value``)
        for job_id in job_ids:
            job = jobs[job_id]
            groups = job.groups
            if len(groups) == 1:
                for group_id, report in groups.items():
                    tlr = report.tlr
            else:
                tlr, group_id = policy.job_tlr(groups)
                report = groups[group_id]
            job.min_tlr, job.min_group = tlr, group_id
            if job_id in pinned:
                change = self._decide(job, pinned, self.config.policy)
                if change is not None:
                    changes.append(change)
                    if change.new_qid != change.old_qid:
                        self._set_queue(job, change.new_qid, deltas)
                continue
            loss = report.loss
            old = job.qid
            if by_finishing:
                job.value = value = finish_value if finishing(groups, finish_s) else tlr
                new, reason, job.streak = place(tlr, loss, old, job.streak, value, retuned)
            elif valued:
                job.value = value = self._value(job, tlr)
                new, reason, job.streak = place(tlr, loss, old, job.streak, value, retuned)
            else:
                new, reason, job.streak = place(tlr, loss, old, job.streak)
            if loss > tlr + margin:  # losing: its streak moves every epoch, so decide it every epoch
                losing.add(job_id)
                urgent.add(job_id)
            elif job_id in losing:
                losing.discard(job_id)
            job.qid = new
            assignments[job_id] = new
            if reason is None:
                continue
            changes.append(new_change(job_change, (job_id, reason, old, new, tlr, group_id, loss)))
            if reason == "promoted":
                urgent.add(job_id)
            if new != old and not job.tag_only:
                for name in job.switches:
                    table = tables[name]
                    if table.get(job_id) != new:
                        table[job_id] = new
                        deltas[name][job_id] = new

    def _decide(self, job: _Job, pinned: Mapping[int, int], cfg) -> policy.JobChange | None:
        """``policy.decide`` for one live job (its groups are live: ``_expire`` ran)."""
        tlr, group_id = job.min_tlr, job.min_group
        loss = job.groups[group_id].loss
        old = job.qid
        if job.job_id in pinned:
            new = pinned[job.job_id]
            reason = "new" if old is None else ("moved" if old != new else None)
            job.streak = 0
            self._losing.discard(job.job_id)
        else:
            value = None
            if self._valued:
                job.value = value = self._value(job, tlr)
            new, reason, job.streak = self._placer.place(tlr, loss, old, job.streak, value)
            if loss > tlr + cfg.loss_margin:  # losing: its streak moves every epoch, so decide it every epoch
                self._losing.add(job.job_id)
            else:
                self._losing.discard(job.job_id)
        job.qid = new
        self._assignments[job.job_id] = new
        if reason is None:
            return None
        return policy.JobChange(job.job_id, reason, old, new, tlr, group_id, loss)

    def _set_queue(self, job: _Job, qid: int, deltas: dict[str, dict[int, int | None]]) -> None:
        if job.tag_only:
            return
        for name in job.switches:
            table = self._tables[name]
            if table.get(job.job_id) != qid:
                table[job.job_id] = qid
                deltas[name][job.job_id] = qid

    def _drop_entries(self, job_id: int, switches: tuple[str, ...], deltas: dict[str, dict[int, int | None]]) -> None:
        pin = dict(self.config.policy.pinned).get(job_id)
        for name in switches:
            table = self._tables[name]
            if job_id not in table:
                continue
            if pin is not None and not self._left_to_tags(job_id):
                if table[job_id] != pin:
                    table[job_id] = deltas[name][job_id] = pin
            else:
                del table[job_id]
                deltas[name][job_id] = None
