"""SimDriver: programs a simulated NetApprox switch (ns-3, ``controller.sim.switch.SimSwitch``); kind ``sim``.

The controller's one runtime drives it in simulated time (``Runtime(config, drivers={name: SimDriver(...)},
background_connect=False)`` and ``runtime.epoch(now)`` from a simulator event), so the simulated switches get
their ``SwitchState`` from the same policy and epoch loop as BMv2, Tofino and the kernel switch.

- ``connect()`` re-installs the last applied state (a new simulated switch starts empty).
- ``apply(state)`` diffs ``state`` against its installed copy: when anything but ``queue_by_job`` changed, the
  ordered tables and ECN thresholds are rewritten (one write per entry) and the ports get the state's
  ``queue_buffers`` (the tuner's shares of the approximate queues' buffer, mode ``adaptive``); ``queue_by_job``
  entries are inserted, modified or deleted one by one. An unchanged state writes nothing.
- ``apply_updates`` writes an epoch's ``queue_by_job`` changes directly (no full diff).
- ``read_counters()``: per (port, logical queue) packets classified, transmitted (and bytes), dropped, and
  the backlog now.

Writes take effect at once in simulated time (no control-channel latency is modelled; docs/simulation.md).
``routes`` do not apply: the simulated network routes by ECMP (experiments/sim/topology.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from netapprox.controller.drivers import Driver
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import NUM_QUEUES, Counters, QueueStats, SwitchState, TableUpdates, WriteSummary
from netapprox.controller.sim.switch import SimSwitch, write_job, write_static


def _static(state: SwitchState) -> SwitchState:
    return dataclasses.replace(state, routes=frozenset(), job_rules=frozenset())


class SimDriver(Driver):
    """The ``sim`` kind: one simulated switch."""

    def __init__(self, name: str, switch: SimSwitch) -> None:
        self.name = name
        self.switch = switch
        self._static: SwitchState | None = None
        self._jobs: dict[int, int] = {}

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "SimDriver":
        """``options["switch"]``: the ``SimSwitch`` (simulated switches exist only inside a simulation, which
        builds its drivers itself; a TOML file cannot name one)."""
        switch = options.get("switch")
        if not isinstance(switch, SimSwitch):
            raise ConfigError(f"switch {name!r}: kind 'sim' needs option 'switch', a controller.sim.switch.SimSwitch "
                              "made by the simulation (experiments/sim builds these drivers)")
        return cls(name, switch)

    def connect(self) -> None:
        if self._static is not None:
            write_static(self.switch.tables, self._static)
            self.switch.set_queue_buffers(self._static.queue_buffers)
        for job, qid in self._jobs.items():
            write_job(self.switch.tables, job, qid)

    def apply(self, desired: SwitchState) -> WriteSummary:
        inserted = modified = deleted = 0
        static = _static(desired)
        if static != self._static:
            old = self._static or SwitchState()
            write_static(self.switch.tables, static)
            self.switch.set_queue_buffers(static.queue_buffers)
            for kind in ("class_rules", "tag_rules", "tlr_rules", "ecn_rules"):
                before, after = getattr(old, kind), getattr(static, kind)
                inserted += len(after - before)
                deleted += len(before - after)
            self._static = static
        wanted = {r.job_id: r.qid for r in desired.job_rules}
        for job in [j for j in self._jobs if j not in wanted]:
            write_job(self.switch.tables, job, None)
            del self._jobs[job]
            deleted += 1
        for job, qid in wanted.items():
            old_q = self._jobs.get(job)
            if old_q == qid:
                continue
            write_job(self.switch.tables, job, qid)
            self._jobs[job] = qid
            if old_q is None:
                inserted += 1
            else:
                modified += 1
        return WriteSummary(inserted=inserted, modified=modified, deleted=deleted)

    def apply_updates(self, desired: Callable[[], SwitchState], updates: TableUpdates) -> WriteSummary:
        if updates.static or self._static is None:
            return self.apply(desired())
        inserted = modified = deleted = 0
        for job, qid in updates.jobs.items():
            old_q = self._jobs.get(job)
            if qid is None:
                if old_q is not None:
                    write_job(self.switch.tables, job, None)
                    del self._jobs[job]
                    deleted += 1
                continue
            if old_q == qid:
                continue
            write_job(self.switch.tables, job, qid)
            self._jobs[job] = qid
            inserted += old_q is None
            modified += old_q is not None
        return WriteSummary(inserted=inserted, modified=modified, deleted=deleted)

    def read_counters(self) -> Counters:
        stats = []
        bad_version = 0
        for port, qd in sorted(self.switch.ports.items()):
            bad_version += int(qd.BadVersion())
            for q in range(NUM_QUEUES):
                c = qd.Counters(q)
                stats.append(QueueStats(port=port, qid=q, enqueued=int(c.enqueued), transmitted=int(c.transmitted),
                                        dropped=int(c.dropped), transmitted_bytes=int(c.transmittedBytes),
                                        backlog=int(qd.Backlog(q))))
        return Counters(queues=tuple(stats), malformed={"bad_version": bad_version} if bad_version else {})

    def close(self) -> None:
        pass  # the simulation owns the switch
