"""``P4RuntimeDriver``: the NetApprox P4 program on BMv2 ``simple_switch_grpc`` and Tofino (``kind = "p4runtime"``).

The driver mirrors the P4 program and puts together the parts of one switch, each an object of its own (as
finsy keeps its ``Switch`` apart from what writes through it):

- the controls (``forwarding``, ``classification``, ``ecn``, ``validation``): one object per P4 control, owning
  its tables and a copy of what it installed (``Forwarding`` <-> ``NetApproxIngress.forwarding``, ...);
- ``connection`` (``connection.SwitchConnection``): the session (channel, StreamChannel, arbitration), the
  pipeline (cookie, push) and the reconcile (the switch's entries read back as the installed copies);
- ``writes`` (``write_queue.WriteQueue``): every Write, the whole state in one batch and the flow-controlled
  ``queue_by_job`` queue, with the refused entries and the table room;
- ``tm`` (``tm.TrafficManager``): per-queue buffers (BMv2 Thrift, Tofino BfRt) and the REPORT punt meter;
- ``counters`` (``counters.CounterReader``): per-queue, per-job, drop and guard counters in one Read.

``connect`` (also every reconnect): the connection opens and arbitrates; as primary the switch is armed: the
pipeline (cookie, push), the tables reconciled with what the switch holds, the traffic manager configured and the
last applied state written again (only the difference). ``apply`` / ``apply_updates`` hand the desired state or
an epoch's job moves to the write queue. Packet-in frames come out of ``drain_packet_in`` with their ingress port.

In a replica set (option ``replica``, docs/controller.md "Running two controllers") the driver of a backup keeps
its connection and writes nothing. When the switch makes it primary (``is_primary``), its next write arms the
switch as ``connect`` does, reading the tables back and adopting what is there, and writes its own desired state
as the difference; when another replica takes over, it steps down and forgets what it had asked (a Write the
switch refused on the way, PERMISSION_DENIED, is the step-down, not an error).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping

from netapprox.controller.drivers import Driver
from netapprox.controller.errors import ConfigError, NotPrimaryError, P4RuntimeWriteError
from netapprox.controller.model import Counters, SwitchState, TableUpdates, WriteSummary
from netapprox.controller.p4runtime.bmv2_thrift import check_local_bmv2
from netapprox.controller.p4runtime.arbitration import rank_of
from netapprox.controller.p4runtime.classification import Classification
from netapprox.controller.p4runtime.connection import SwitchConnection
from netapprox.controller.p4runtime.counters import CounterReader
from netapprox.controller.p4runtime.ecn import Ecn
from netapprox.controller.p4runtime.forwarding import Forwarding
from netapprox.controller.p4runtime.mirror import Change, TableMirror, pending_changes
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.p4runtime.session import P4RuntimeSession
from netapprox.controller.p4runtime.tm import TrafficManager
from netapprox.controller.p4runtime.validation import Validation
from netapprox.controller.p4runtime.write_queue import WriteQueue

log = logging.getLogger("netapprox.controller.p4runtime")


class P4RuntimeDriver(Driver):
    """A NetApprox switch over P4Runtime (BMv2 simple_switch_grpc, Tofino)."""

    OPTIONS = "p4runtime"

    def __init__(self, name: str, options: P4RuntimeOptions, *, p4info: P4Info | None = None,
                 session: P4RuntimeSession | None = None) -> None:
        """``session``: a stand-in for the gRPC session (the benchmark's switch that takes every Write at once);
        by default one to ``options.address``."""
        self.name = name
        self.options = options
        try:
            self.p4info = p4info or P4Info.load(options.p4info)
        except FileNotFoundError:
            raise ConfigError(f"switch {name!r}: P4Info {options.p4info!r} not found (run `make p4`, or set the "
                              "switch option p4info)") from None
        tofino = options.target == "tofino"
        self.forwarding = Forwarding(self.p4info)
        self.classification = Classification(self.p4info)
        self.ecn = Ecn(self.p4info, depth_unit=options.cells_per_packet if tofino else 1)
        self.validation = Validation(self.p4info)
        if options.target == "bmv2" and options.check_bmv2_version:
            check_local_bmv2(name, options.address, options.bmv2_binary)
        self._lock = threading.RLock()
        self.connection = SwitchConnection(name, options, self.p4info, session)
        self.session = self.connection.session
        self.writes = WriteQueue(name, options, self.session, self.controls, self.classification)
        self.tm = TrafficManager(name, options, self.p4info, self.session)
        self.counters = CounterReader(self.p4info, self.session, options.ports, self.classification,
                                      self.validation, self.tm.drops)
        self._armed_term: int | None = None  # the arbitration term in which this driver armed the switch
        self._tm_pending = False  # a takeover configures the traffic manager after its first write

    @property
    def controls(self) -> tuple[Forwarding | Classification | Ecn | Validation, ...]:
        return (self.forwarding, self.classification, self.ecn, self.validation)

    def _tables(self) -> list[TableMirror]:
        return [table for control in self.controls for table in control.tables]

    # --- connect ---

    def connect(self) -> None:
        with self._lock:
            self._armed_term = None
            self.connection.open()
            try:
                if self.connection.primary:
                    self._arm(rewrite=True)
            except BaseException:
                self.connection.close()
                raise
            log.info("switch %r: connected to %s as %s (election id %s)", self.name, self.options.address,
                     "primary" if self._armed_term is not None else "a backup", self.session.election)

    def _arm(self, rewrite: bool) -> None:
        """As primary: the pipeline, the tables reconciled with what the switch holds, and (``rewrite``, on a
        connect) the traffic manager and the last asked state written again; without, the caller writes the
        desired state next and the traffic manager is configured after it (a takeover writes first)."""
        term = self.session.arbitration.terms
        pushed = self.connection.arm_pipeline()
        self.writes.new_session()
        jobs = self.connection.reconcile(pushed, self._tables(), self.classification.queue_by_job)
        self.writes.adopt_jobs(jobs)
        self._tm_pending = not rewrite
        if rewrite:
            self.tm.configure()
            try:
                self.writes.rewrite()
            except P4RuntimeWriteError as e:
                # The switch is up; what it refused is held back (not retried by every reconnect).
                log.error("%s", e)
        self._armed_term = term

    def is_primary(self) -> bool:
        """The switch accepts this controller's Writes now (raises SwitchUnavailable when it is gone)."""
        self.session.check_up()
        return self.connection.primary

    def _writable(self) -> bool:
        """Whether to write now: as a backup, no (a primary that became one steps down); as a primary not armed
        yet (the switch has just made it primary: a takeover), after arming the switch."""
        arbitration = self.session.arbitration
        if not arbitration.primary:
            if self._armed_term is not None:
                self._step_down()
            return False
        if self._armed_term != arbitration.terms:
            if self._armed_term is not None:
                self.writes.forget()  # primary again since: what it asked in its earlier term is stale
            log.info("switch %r: taking over as primary (election id %s): reading the tables back", self.name,
                     self.session.election)
            self._arm(rewrite=False)  # the caller writes the desired state next
        return True

    def _step_down(self) -> None:
        log.info("switch %r: another controller is primary now (replica %d): stepping down", self.name,
                 rank_of(self.session.arbitration.primary_id))
        self._armed_term = None
        self.writes.forget()
        self.tm.close()  # the BfRt session too: the new primary opens its own

    # --- writes ---

    def _set_desired(self, state: SwitchState) -> None:
        if state.fifo:
            raise ConfigError(f"switch {self.name!r}: policy mode fifo needs a kernel or simulated switch; the P4 "
                              "program always classifies approximate traffic (run the baselines on kernel switches)")
        self.writes.set_desired(state)

    def _as_primary(self, write: Callable[[], WriteSummary]) -> WriteSummary:
        """``write()`` while this controller is the switch's primary (after arming it, the first time in a
        term); nothing as a backup. A Write refused because another controller took over is the step-down."""
        with self._lock:
            self.session.check_up()
            try:
                if not self._writable():
                    return WriteSummary()
                summary = write()
                if self._tm_pending:
                    self._tm_pending = False
                    self.tm.configure()
                return summary
            except NotPrimaryError:
                self._step_down()
                return WriteSummary()

    def apply(self, desired: SwitchState) -> WriteSummary:
        def write() -> WriteSummary:
            self.writes.release_adopted()
            self._set_desired(desired)
            return self.writes.write(full=True)
        return self._as_primary(write)

    def apply_updates(self, desired: Callable[[], SwitchState], updates: TableUpdates) -> WriteSummary:
        """The epoch's changes. A static change (or the first call) diffs every table against ``desired()`` and
        writes synchronously. Otherwise only the ``queue_by_job`` entries in ``updates`` (and those still
        waiting) are compared with what is installed, and sent without waiting for the switch: at most
        ``max_inflight_writes`` Writes are outstanding; entries that do not fit wait, and are sent at their
        newest value once the switch has taken the earlier ones (so a slow switch never delays an epoch and is
        never sent stale values). Results of earlier Writes are recorded here; their errors are raised here."""
        def write() -> WriteSummary:
            self.writes.release_adopted()
            if updates.static or self.writes.static is None:
                self._set_desired(desired())
                self.writes.urge(updates.urgent)
                return self.writes.write(full=True)
            return self.writes.apply_jobs(updates)
        return self._as_primary(write)

    def pending_writes(self) -> bool:
        """Updates wait for room in the in-flight window (``send_pending`` sends them once Writes complete)."""
        return self._armed_term == self.session.arbitration.terms and self.writes.pending()

    def send_pending(self) -> WriteSummary:
        """Between epochs: record the Writes the switch has answered and send waiting updates into the room they
        leave (so a backlog drains at the switch's pace, not one window per epoch). Raises their errors."""
        with self._lock:
            if self.writes.static is None or not self.session.connected or self._armed_term is None:
                return WriteSummary()
            return self._as_primary(self.writes.send)

    def flush(self) -> None:
        """Wait for every Write in flight and record its result (raises its errors)."""
        with self._lock:
            self.writes.flush()

    def pending_changes(self, desired: SwitchState) -> list[Change]:
        """The updates ``apply(desired)`` would send, in order: deletes, modifies, inserts."""
        return pending_changes(self.controls, desired)

    @property
    def deferred_updates(self) -> int:
        return self.writes.deferred_updates

    @property
    def deferred_urgent(self) -> int:
        return self.writes.deferred_urgent

    @property
    def write_stats(self) -> Mapping[str, int]:
        return self.writes.write_stats

    # --- reads and status ---

    def read_counters(self) -> Counters:
        with self._lock:
            self.session.check_up()
            return self.counters.read()

    def drain_packet_in(self) -> list[tuple[bytes, int | None]]:
        return self.session.drain_packet_in()

    @property
    def entries_read_back(self) -> int:
        """Entries found on the switch at the last connect without a pipeline push (0 after a push)."""
        return self.connection.entries_read_back

    @property
    def queue_config_error(self) -> str | None:
        return self.tm.queue_config_error

    def stats(self) -> dict[str, float]:
        """Driver-level figures for the metrics (``controller.observe``)."""
        arbitration = self.session.arbitration
        return {"pipeline_pushes": self.connection.pipeline_pushes, "entries_read_back": self.entries_read_back,
                "entries_refused": self.writes.entries_refused, "jobs_without_entry": self.writes.jobs_without_entry,
                "queue_config_ok": float(self.tm.queue_config_error is None),
                "report_meter_ok": float(self.tm.meter_config_error is None),
                "queue0_guard_packets": self.counters.queue0_guard_packets,
                "primary": float(self.connection.primary), "primary_replica": rank_of(arbitration.primary_id),
                "primary_changes": arbitration.changes, "primary_since_seconds": arbitration.since,
                "primary_vacancies": arbitration.vacancies}

    def close(self) -> None:
        with self._lock:
            self.connection.close()
            self.tm.close()
