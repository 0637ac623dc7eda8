"""``P4RuntimeDriver``: the NetApprox P4 program on BMv2 ``simple_switch_grpc`` and Tofino (``kind = "p4runtime"``).

The driver mirrors the P4 program: one object per P4 control owns its tables and a copy of what it installed
(``Forwarding`` <-> ``NetApproxIngress.forwarding``, ``Classification`` <-> ``NetApproxIngress.classification``,
``Ecn`` <-> ``NetApproxEgress.ecn``, ``Validation`` <-> ``NetApproxIngress.validation``). ``apply`` asks each
control for its desired entries, diffs them against the installed copies and sends all changes in one batched
Write (deletes, then modifies, then inserts). An unchanged state sends nothing.

``connect`` (also every reconnect) does what production P4Runtime controllers do (ONOS, Stratum's tests,
finsy): arbitration as primary; the pipeline's cookie is read (GetForwardingPipelineConfig, COOKIE_ONLY) and the
pipeline pushed (VERIFY_AND_COMMIT) only when it differs from ours; otherwise the switch's entries are read back
and reconciled with the desired state, so a controller restart or a lost connection writes only the difference
and keeps every route, entry and counter in place. Then per-queue buffers (BMv2 Thrift or Tofino BfRt, read
back on Tofino), the REPORT punt meter, and the last applied state. Packet-in frames come out of
``drain_packet_in`` with their ingress port.

Persistent write errors do not loop: an update the switch refuses (INVALID_ARGUMENT and the like) is reported
once and held back until the wanted entry changes (``entries_refused``); ``queue_by_job`` is capped at the table
size (the P4Info's, or the lower one where the switch said RESOURCE_EXHAUSTED): jobs beyond it get no entry, are
classified by the TLR their packets carry, and wait for room (``jobs_without_entry``, one log line when the
table fills up and one when it has room again).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.drivers import Driver
from netapprox.controller.errors import (
    ConfigError,
    ControllerError,
    P4RuntimeWriteError,
    PipelineError,
    QueueConfigError,
    UpdateError,
)
from netapprox.controller.model import NUM_QUEUES, Counters, JobRule, QueueStats, SwitchState, TableUpdates, WriteSummary
from netapprox.controller.p4runtime.bmv2_thrift import check_local_bmv2, set_queue_depths
from netapprox.controller.p4runtime.classification import Classification
from netapprox.controller.p4runtime.ecn import Ecn
from netapprox.controller.p4runtime.forwarding import Forwarding
from netapprox.controller.p4runtime.mirror import (
    ENTRY_CACHE_SIZE,
    UPDATE_ORDER,
    Change,
    TableMirror,
    batches,
    pending_changes,
)
from netapprox.controller.p4runtime.options import P4RuntimeOptions, options_from_mapping
from netapprox.controller.p4runtime.p4info import P4Info, decode
from netapprox.controller.p4runtime.session import P4RuntimeSession
from netapprox.controller.p4runtime.validation import Validation

log = logging.getLogger("netapprox.controller.p4runtime")

INSERT, MODIFY, DELETE = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE
ENQUEUED_PACKETS = "NetApproxIngress.enqueued_packets"
TRANSMITTED_PACKETS = "NetApproxEgress.transmitted_packets"
QUEUE0_GUARD_PACKETS = "NetApproxIngress.classification.queue0_guard_packets"
REPORT_METER = "NetApproxIngress.report_meter"
_UNSET = object()
HEALABLE = frozenset({"ALREADY_EXISTS", "NOT_FOUND"})
"""Update errors the next write repairs (MODIFY instead of INSERT, INSERT instead of MODIFY). Every other code
is held back until the wanted entry changes (reported once, never retried as it was)."""


def build_tofino_device_config(prog_name: str, tofino_bin: bytes, context_json: bytes) -> bytes:
    """PI/Stratum-bf packing: each of program name, tofino.bin and context.json prefixed by its length
    (little-endian int32). Stratum-bfrt wants its BfPipelineConfig instead: pass it as ``device_config``."""
    name = prog_name.encode()
    return b"".join(struct.pack("<i", len(part)) + part for part in (name, tofino_bin, context_json))


class P4RuntimeDriver(Driver):
    """A NetApprox switch over P4Runtime (BMv2 simple_switch_grpc, Tofino)."""

    def __init__(self, name: str, options: P4RuntimeOptions, *, p4info: P4Info | None = None) -> None:
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
        self._enqueued_id = self.p4info.counter_id(ENQUEUED_PACKETS)
        self._transmitted_id = self.p4info.counter_id(TRANSMITTED_PACKETS)
        self._guard_id = self.p4info.counter_id(QUEUE0_GUARD_PACKETS)
        self._report_meter_id, self._report_meter_size = self.p4info.meter(REPORT_METER)
        if options.target == "bmv2" and options.check_bmv2_version:
            check_local_bmv2(name, options.address, options.bmv2_binary)
        self._lock = threading.RLock()
        self.session = P4RuntimeSession(name, options, self.p4info)
        self._static: SwitchState | None = None  # the last asked state without queue_by_job ...
        self._jobs: dict[int, int] = {}  # ... and its queue_by_job entries
        # Jobs whose entry may differ from what is installed, oldest first (a dict as an ordered set: a job
        # changed again keeps its place in line and goes out at its newest value).
        self._dirty: dict[int, None] = {}
        self._urgent: set[int] = set()  # jobs whose loss exceeds their TLR: written first
        self._inflight: collections.deque = collections.deque()  # (future, changes, serialized batch)
        self._inflight_jobs: set[int] = set()
        self._encoded: dict[int, tuple[JobRule | None, bytes]] = {}  # job*32 + kind*8 + qid -> (rule, Update bytes)
        self._tokens = 0.0
        self._token_stamp = time.monotonic()
        self.deferred_updates = 0
        """queue_by_job updates waiting for the switch (write budget, or Writes in flight); they go out at their
        newest value."""
        self.deferred_urgent = 0
        """... of which for jobs whose loss exceeds their TLR."""
        self.write_stats = {"prioritised": 0, "coalesced": 0}
        """Cumulative: ``prioritised``: updates of losing jobs sent ahead of older waiting updates when the
        switch could not take everything; ``coalesced``: updates superseded before they were sent (never sent)."""
        self.pipeline_pushes = 0
        self.queue_config_error: str | None = None
        self.meter_config_error: str | None = None
        self.tm_client_factory: Callable[[], Any] | None = None  # tests inject a fake BfRt client
        self._tm: Any = None  # the BfRt TM client (Tofino), kept for the drop counters
        self._tm_ports: list = []
        self.entries_read_back = 0
        """Entries found on the switch at the last connect without a pipeline push (0 after a push)."""
        self.queue0_guard_packets = 0
        """Approximate packets the data plane moved out of queue 0 (as of the last ``read_counters``)."""
        self._refused: dict[tuple[str, Any], Any] = {}  # (table, key) -> the rule the switch refused
        self._job_capacity: int | None = self.classification.queue_by_job.info.size or None
        self._no_room: dict[int, None] = {}  # jobs waiting for room in queue_by_job, oldest first
        self._inflight_inserts = 0  # queue_by_job INSERTs sent and not answered yet
        self._adopted: set[int] = set()  # jobs found on the switch by a fresh controller, kept for a while
        self._adopted_until = 0.0

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "P4RuntimeDriver":
        return cls(name, options_from_mapping(name, options))

    @property
    def controls(self) -> tuple[Forwarding | Classification | Ecn | Validation, ...]:
        return (self.forwarding, self.classification, self.ecn, self.validation)

    # --- connect ---

    def connect(self) -> None:
        with self._lock:
            self.session.open()
            try:
                pushed = self._arm_pipeline()
                self._inflight.clear()  # Writes of the old session: the reconcile below covers their entries
                self._inflight_jobs.clear()
                self._inflight_inserts = 0
                self._refused.clear()  # a new session tries a refused entry once more
                if pushed:
                    for table in self._tables():
                        table.adopt([])
                    self._adopted.clear()
                    self.entries_read_back = 0
                else:
                    self._read_back()
                self._configure_queues()
                self._configure_report_meter()
                if self._static is not None:
                    self._dirty = dict.fromkeys(sorted(set(self._jobs) | set(self.classification.queue_by_job.installed)))
                    try:
                        self._write(full=True)
                    except P4RuntimeWriteError as e:
                        # The switch is up; what it refused is held back (not retried by every reconnect).
                        log.error("%s", e)
            except BaseException:
                self.session.close()
                raise
            log.info("switch %r: connected to %s as primary (election id %s)", self.name, self.options.address,
                     self.options.election_id)

    def _tables(self) -> list[TableMirror]:
        return [table for control in self.controls for table in control.tables]

    def _arm_pipeline(self) -> bool:
        """Push the pipeline unless the switch already runs it (same cookie). True when pushed: the switch's
        tables and counters are then empty. With ``push_pipeline`` off, never push; a switch without any
        pipeline is then an error (retried by the runtime)."""
        current = self.session.pipeline_cookie()
        if not self.options.push_pipeline:
            if current is None:
                raise PipelineError(f"switch {self.name!r}: runs no forwarding pipeline and push_pipeline is false "
                                    "(load the program with the tool that owns the pipeline, or set push_pipeline)")
            return False
        config = self._pipeline_config()
        if current == config.cookie.cookie:
            log.info("switch %r: runs our pipeline already (cookie %#x): not pushed", self.name, current)
            return False
        self.session.set_pipeline(config)
        self.pipeline_pushes += 1
        log.info("switch %r: pipeline pushed (cookie %#x; the switch had %s)", self.name, config.cookie.cookie,
                 f"{current:#x}" if current is not None else "none")
        return True

    def _read_back(self) -> None:
        """Take the switch's entries as the installed copy of every table (the next write diffs against them)."""
        by_table: dict[int, list] = collections.defaultdict(list)
        entries = self.session.read_table_entries()
        for entry in entries:
            by_table[entry.table_id].append(entry)
        for table in self._tables():
            found = by_table.pop(table.info.id, [])
            if table is self.classification.queue_by_job:
                self._adopt_jobs(found)
            else:
                table.adopt(found)
        if by_table:
            log.warning("switch %r: %d entries in tables this controller does not program, left alone", self.name,
                        sum(map(len, by_table.values())))
        self.entries_read_back = len(entries)
        log.info("switch %r: %d entries read back to reconcile", self.name, len(entries))

    def _adopt_jobs(self, entries: list) -> None:
        """queue_by_job entries read back, by job id (an entry whose action is not ours gets rule None: MODIFY).
        A controller that has no state yet (just started) keeps the jobs it finds for ``adopt_jobs_s``, so their
        packets keep their queue and their counters until their hosts report to it."""
        table = self.classification.queue_by_job
        table.adopt([])
        action_id = self.classification.set_queue(0, table.name).action.action_id
        for entry in entries:
            if len(entry.match) != 1 or entry.match[0].WhichOneof("field_match_type") != "exact":
                log.warning("switch %r: unexpected queue_by_job entry %s", self.name, entry)
                continue
            job = decode(entry.match[0].exact.value)
            a = entry.action.action
            qid = decode(a.params[0].value) if a.action_id == action_id and len(a.params) == 1 else None
            rule = JobRule(job, qid) if qid is not None and 0 <= qid < NUM_QUEUES and job > 0 else None
            table.installed[job] = (rule, entry)
        if self._static is None and table.installed:
            self._adopted = set(table.installed)
            self._adopted_until = time.monotonic() + self.options.adopt_jobs_s
        else:
            self._adopted = set()

    def _release_adopted(self) -> None:
        """After ``adopt_jobs_s``, adopted jobs nobody reported are deleted like any expired job."""
        if self._adopted and time.monotonic() >= self._adopted_until:
            for job in sorted(self._adopted):
                if job not in self._jobs:
                    self._dirty[job] = None
            self._adopted.clear()

    def _configure_report_meter(self) -> None:
        """Every cell of ``report_meter`` (one per ingress port) at ``report_rate_pps`` / ``report_burst``
        (cir = pir, cburst = pburst: over the rate a REPORT is dropped). Cells already right are not written."""
        opts = self.options
        want = (opts.report_rate_pps, opts.report_burst, opts.report_rate_pps, opts.report_burst)
        have: dict[int, tuple] = {}
        try:
            for entity in self.session.read([p4runtime_pb2.Entity(meter_entry=p4runtime_pb2.MeterEntry(
                    meter_id=self._report_meter_id))], "report meter"):
                c = entity.meter_entry.config
                have[entity.meter_entry.index.index] = (c.cir, c.cburst, c.pir, c.pburst)
        except ControllerError as e:
            log.info("switch %r: cannot read the report meter back (%s); writing every cell", self.name, e)
        config = p4runtime_pb2.MeterConfig(cir=want[0], cburst=want[1], pir=want[2], pburst=want[3])
        updates = [p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY, entity=p4runtime_pb2.Entity(
            meter_entry=p4runtime_pb2.MeterEntry(meter_id=self._report_meter_id, index=p4runtime_pb2.Index(index=i),
                                                 config=config)))
            for i in range(self._report_meter_size) if have.get(i) != want]
        self.meter_config_error = None
        if not updates:
            return
        try:
            self.session.write(updates)
        except P4RuntimeWriteError as e:
            self.meter_config_error = str(e)
            log.error("switch %r: REPORT punt meter not configured (reports are not rate-limited in the data "
                      "plane): %s", self.name, e)

    def _pipeline_config(self) -> p4runtime_pb2.ForwardingPipelineConfig:
        opts = self.options
        try:
            if opts.target == "bmv2":
                device = Path(opts.bmv2_json).read_bytes()
            elif opts.device_config:
                device = Path(opts.device_config).read_bytes()
            elif opts.tofino_bin and opts.tofino_context:
                device = build_tofino_device_config(opts.prog_name, Path(opts.tofino_bin).read_bytes(),
                                                    Path(opts.tofino_context).read_bytes())
            else:
                raise PipelineError(f"switch {self.name!r}: target tofino needs the option device_config, or "
                                    "tofino_bin and tofino_context (from `make p4-tna`)")
        except FileNotFoundError as e:
            raise PipelineError(f"switch {self.name!r}: pipeline artifact {e.filename!r} not found "
                                "(run `make p4`, or fix the switch options)") from None
        cookie = int.from_bytes(hashlib.sha256(self.p4info.message.SerializeToString(deterministic=True)
                                               + device).digest()[:8], "big")
        return p4runtime_pb2.ForwardingPipelineConfig(p4info=self.p4info.message, p4_device_config=device,
                                                      cookie=p4runtime_pb2.ForwardingPipelineConfig.Cookie(
                                                          cookie=cookie))

    def _configure_queues(self) -> None:
        opts = self.options
        try:
            if opts.target == "bmv2" and opts.thrift_port is not None and opts.ports:
                set_queue_depths(opts.ports, opts.buffer_packets, opts.thrift_port,
                                 host=opts.address.rsplit(":", 1)[0], cli=opts.cli)
            elif opts.target == "tofino" and (opts.bfrt_address or self.tm_client_factory) and opts.ports:
                self._configure_tofino_tm()
        except QueueConfigError as e:
            # Forwarding works without it (the queues keep the target's defaults), but NetApprox's queueing does
            # not: say so loudly, in the log, the metrics (queue_config_ok 0) and queue_config_error.
            log.error("switch %r: queue buffers and priorities NOT configured: %s", self.name, e)
            self.queue_config_error = str(e)
        else:
            self.queue_config_error = None

    def _configure_tofino_tm(self) -> None:
        """Strict priority and buffers over BfRt, read back from the hardware; the client stays open for the TM's
        drop counters (``read_counters``)."""
        from netapprox.controller.p4runtime.tofino_tm import BfrtTmClient, configure_queues

        opts = self.options
        self._close_tm()
        client = (self.tm_client_factory() if self.tm_client_factory else
                  BfrtTmClient(opts.bfrt_address, opts.prog_name, prefix=opts.tm_prefix,
                               timeout_s=opts.connect_timeout_s))
        try:
            self._tm_ports = configure_queues(client, opts.ports, opts.buffer_packets, prefix=opts.tm_prefix,
                                              cells_per_packet=opts.cells_per_packet, pool=opts.tm_pool)
        except BaseException:
            client.close()
            raise
        self._tm = client
        log.info("switch %r: Tofino TM configured and verified for ports %s", self.name, sorted(opts.ports))

    def _close_tm(self) -> None:
        if self._tm is not None:
            try:
                self._tm.close()
            except Exception as e:  # noqa: BLE001 - closing a broken session must not hide the next error
                log.debug("switch %r: closing the BfRt session: %s", self.name, e)
            self._tm = None
            self._tm_ports = []

    def _tm_drops(self) -> dict[tuple[int, int], int] | None:
        """The TM's per-queue drop counters, or None without a BfRt session (or when reading fails)."""
        if self._tm is None:
            return None
        from netapprox.controller.p4runtime.tofino_tm import queue_drops

        try:
            return queue_drops(self._tm, self._tm_ports, prefix=self.options.tm_prefix)
        except QueueConfigError as e:
            log.warning("switch %r: reading the TM drop counters failed: %s", self.name, e)
            return None

    def stats(self) -> dict[str, float]:
        """Driver-level figures for the metrics (``controller.observe``)."""
        return {"pipeline_pushes": self.pipeline_pushes, "entries_read_back": self.entries_read_back,
                "entries_refused": len(self._refused), "jobs_without_entry": len(self._no_room),
                "queue_config_ok": float(self.queue_config_error is None),
                "report_meter_ok": float(self.meter_config_error is None),
                "queue0_guard_packets": self.queue0_guard_packets}

    # --- writes ---

    def apply(self, desired: SwitchState) -> WriteSummary:
        with self._lock:
            self.session.check_up()
            self._release_adopted()
            self._set_desired(desired)
            return self._write(full=True)

    def apply_updates(self, desired: Callable[[], SwitchState], updates: TableUpdates) -> WriteSummary:
        """The epoch's changes. A static change (or the first call) diffs every table against ``desired()`` and
        writes synchronously. Otherwise only the ``queue_by_job`` entries in ``updates`` (and those still
        waiting) are compared with what is installed, and sent without waiting for the switch: at most
        ``max_inflight_writes`` Writes are outstanding; entries that do not fit wait, and are sent at their
        newest value once the switch has taken the earlier ones (so a slow switch never delays an epoch and is
        never sent stale values). Results of earlier Writes are recorded here; their errors are raised here."""
        with self._lock:
            self.session.check_up()
            self._release_adopted()
            if updates.static or self._static is None:
                self._set_desired(desired())
                self._urgent |= updates.urgent
                return self._write(full=True)
            self._take_job_updates(updates)
            errors = self._settle(block=False)
            summary = self._send_job_changes() if self._dirty else WriteSummary()
            if errors:
                raise P4RuntimeWriteError(self.name, errors, len(errors))
            return summary

    def _take_job_updates(self, updates: TableUpdates) -> None:
        """Record the epoch's queue_by_job changes as wanted and dirty (a job already waiting keeps its place)."""
        jobs, dirty = self._jobs, self._dirty
        coalesced = 0
        no_room, adopted = self._no_room, self._adopted
        for job, qid in updates.jobs.items():
            if qid is None:
                jobs.pop(job, None)
                if no_room:
                    no_room.pop(job, None)
            else:
                jobs[job] = qid
                if adopted:
                    adopted.discard(job)
            if job in dirty:
                coalesced += 1
            else:
                dirty[job] = None
        self.write_stats["coalesced"] += coalesced
        self._urgent |= updates.urgent

    def pending_writes(self) -> bool:
        """Updates wait for room in the in-flight window (``send_pending`` sends them once Writes complete)."""
        return bool(self._dirty) and bool(self._inflight)

    def send_pending(self) -> WriteSummary:
        """Between epochs: record the Writes the switch has answered and send waiting updates into the room they
        leave (so a backlog drains at the switch's pace, not one window per epoch). Raises their errors."""
        with self._lock:
            if self._static is None or not self.session.connected:
                return WriteSummary()
            errors = self._settle(block=False)
            summary = self._send_job_changes() if self._dirty else WriteSummary()
            if errors:
                raise P4RuntimeWriteError(self.name, errors, len(errors))
            return summary

    def flush(self) -> None:
        """Wait for every Write in flight and record its result (raises its errors)."""
        with self._lock:
            errors = self._settle(block=True)
            if errors:
                raise P4RuntimeWriteError(self.name, errors, len(errors))

    def _send_job_changes(self) -> WriteSummary:
        opts = self.options
        room = max(0, opts.max_inflight_writes - len(self._inflight))
        if room == 0:
            self.deferred_updates = len(self._dirty)
            self.deferred_urgent = len(self._urgent & self._dirty.keys())
            return WriteSummary()
        changes = self._job_changes(limit=room * opts.max_batch_updates)
        if not changes:
            return WriteSummary()
        updates = [c.payload for c in changes]  # queue_by_job changes are encoded directly
        dirty, inflight_jobs = self._dirty, self._inflight_jobs
        for part in batches([len(u) for u in updates], opts.max_batch_updates, opts.max_write_bytes)[:room]:
            batch = [updates[i] for i in part]
            sent = [changes[i] for i in part]
            self._inflight.append((self.session.write_future(batch), sent, batch))
            for change in sent:
                dirty.pop(change.key, None)
                inflight_jobs.add(change.key)
                self._inflight_inserts += change.kind == INSERT
        kinds = collections.Counter(c.kind for c in changes)
        return WriteSummary(inserted=kinds[p4runtime_pb2.Update.INSERT], modified=kinds[p4runtime_pb2.Update.MODIFY],
                            deleted=kinds[p4runtime_pb2.Update.DELETE])

    def _settle(self, block: bool) -> list[UpdateError]:
        """Record the results of Writes in flight, oldest first: all of them (``block``) or those done."""
        errors: list[UpdateError] = []
        while self._inflight and (block or self._inflight[0][0].done()):
            future, changes, batch = self._inflight.popleft()
            self._inflight_inserts -= sum(c.kind == INSERT for c in changes)
            errors += self._record(changes, self.session.write_result(future, batch))
        return errors

    def _record(self, changes: list[Change], result: P4RuntimeWriteError | None) -> list[UpdateError]:
        """Commit what the switch took; heal what the next write can repair (ALREADY_EXISTS, NOT_FOUND); hold
        back the rest (``_refuse``). A job whose entry is not (or no longer) what is wanted goes back to the
        dirty set, unless the switch refused it."""
        if result is None:
            self._record_accepted(changes)
            return []
        failed = {e.index: e for e in result.errors}
        errors = []
        jobs = self.classification.queue_by_job
        for position, change in enumerate(changes):
            err = failed.get(position, failed.get(-1))
            if err is None:
                change.commit()
                if self._refused:
                    self._refused.pop((change.table.name, change.key), None)
                if change.table is jobs:
                    self._urgent.discard(change.key)
                    if change.kind == DELETE and self._no_room:
                        self._make_room()
            else:
                if err.code in HEALABLE:
                    if -1 not in failed:
                        change.heal(err.code)
                else:
                    self._refuse(change, err.code)
                errors.append(UpdateError(position, err.code, err.message, err.update))
            if change.table is jobs:
                self._inflight_jobs.discard(change.key)
                installed = jobs.installed.get(change.key)
                want = self._jobs.get(change.key)
                if err is not None and err.code not in HEALABLE:
                    continue
                if err is not None or (installed[0].qid if installed and installed[0] else None) != want:
                    self._dirty[change.key] = None
        return errors

    def _record_accepted(self, changes: list[Change]) -> None:
        """``_record`` of a Write the switch took whole (the hot path: inlined ``Change.commit``)."""
        jobs_table = self.classification.queue_by_job
        installed = jobs_table.installed
        want, dirty, urgent, inflight = self._jobs, self._dirty, self._urgent, self._inflight_jobs
        for change in changes:
            if change.table is not jobs_table:
                change.commit()
                continue
            job = change.key
            if change.kind == DELETE:
                installed.pop(job, None)
                have = None
                if self._no_room:
                    self._make_room()
            else:
                installed[job] = (change.rule, change.entry)
                have = change.rule.qid
            urgent.discard(job)
            inflight.discard(job)
            if want.get(job) != have and job not in dirty:
                dirty[job] = None  # changed again while in flight: its newest value goes next
        if self._refused:
            for change in changes:
                self._refused.pop((change.table.name, change.key), None)

    # --- persistent write errors: refused entries, a full queue_by_job ---

    @staticmethod
    def _refused_value(change: Change) -> Any:
        """What was asked of a key: the queue of a job entry (None: deleted), or a rule (``"delete"``)."""
        if change.kind == DELETE:
            return None if isinstance(change.key, int) else "delete"
        return change.rule.qid if isinstance(change.rule, JobRule) else change.rule

    def _refuse(self, change: Change, code: str) -> None:
        """The switch refused ``change`` with a code no retry repairs: keep it from being sent again until what is
        wanted of its key changes (or the switch reconnects). A queue_by_job INSERT refused with
        RESOURCE_EXHAUSTED caps the table where it is instead."""
        jobs = self.classification.queue_by_job
        if code == "RESOURCE_EXHAUSTED" and change.table is jobs and change.kind == INSERT:
            have = len(jobs.installed)
            if self._job_capacity is None or have < self._job_capacity:
                log.warning("switch %r: queue_by_job refused an insert with RESOURCE_EXHAUSTED at %d entries (the "
                            "P4Info says %s): capping it there", self.name, have, jobs.info.size or "nothing")
                self._job_capacity = have
            self._no_room_add(change.key)
            return
        self._refused[(change.table.name, change.key)] = self._refused_value(change)

    def _is_refused(self, change: Change) -> bool:
        return self._refused.get((change.table.name, change.key), _UNSET) == self._refused_value(change)

    def _room_for_insert(self, planned: int) -> bool:
        """Room in queue_by_job for one more entry, with ``planned`` inserts already in this batch."""
        cap = self._job_capacity
        return cap is None or len(self.classification.queue_by_job.installed) + self._inflight_inserts + planned < cap

    def _no_room_add(self, job: int) -> None:
        if not self._no_room:
            log.warning("switch %r: queue_by_job is full (%d entries): jobs beyond it get no entry and are classified "
                        "by the TLR their packets carry until a job ends (raise QUEUE_BY_JOB_TABLE_SIZE in "
                        "p4src/shared/sizes.p4 for more)", self.name, self._job_capacity or 0)
        self._no_room[job] = None
        self._dirty.pop(job, None)

    def _make_room(self) -> None:
        """An entry was deleted: the longest-waiting job without one may have it."""
        job = next(iter(self._no_room))
        del self._no_room[job]
        self._dirty[job] = None
        if not self._no_room:
            log.info("switch %r: queue_by_job has room for every job again", self.name)

    @property
    def _desired(self) -> SwitchState | None:
        """The last state asked of this switch (re-installed on a reconnect)."""
        if self._static is None:
            return None
        return dataclasses.replace(self._static, job_rules=frozenset(JobRule(j, q) for j, q in self._jobs.items()))

    def _set_desired(self, state: SwitchState) -> None:
        if state.fifo:
            raise ConfigError(f"switch {self.name!r}: policy mode fifo needs a kernel or simulated switch; the P4 "
                              "program always classifies approximate traffic (run the baselines on kernel switches)")
        self._static = dataclasses.replace(state, job_rules=frozenset())
        self._jobs = {r.job_id: r.qid for r in state.job_rules}
        self._adopted -= set(self._jobs)
        self._no_room = {job: None for job in self._no_room if job in self._jobs}
        self._dirty = dict.fromkeys(sorted((set(self._jobs) - set(self._no_room))
                                           | set(self.classification.queue_by_job.installed)))

    def pending_changes(self, desired: SwitchState) -> list[Change]:
        """The updates ``apply(desired)`` would send, in order: deletes, modifies, inserts."""
        return pending_changes(self.controls, desired)

    def _job_changes(self, limit: int | None = None) -> list[Change]:
        """queue_by_job updates for the dirty jobs (not in flight) within the write budget and ``limit``: in the
        order they became dirty, except that when not all fit, the urgent ones (loss above TLR) go first."""
        table = self.classification.queue_by_job
        installed = table.installed
        opts = self.options
        dirty, jobs, inflight = self._dirty, self._jobs, self._inflight_jobs
        budget = len(dirty) if limit is None else min(limit, len(dirty))
        if opts.max_updates_per_s > 0:
            now = time.monotonic()
            self._tokens = min(opts.max_updates_per_s,
                               self._tokens + (now - self._token_stamp) * opts.max_updates_per_s)
            self._token_stamp = now
            budget = min(budget, int(self._tokens))
        urgent = self._urgent
        if budget >= len(dirty) - len(inflight) or not urgent:
            order = list(dirty)
        else:
            first = [job for job in dirty if job in urgent]
            order = first + [job for job in dirty if job not in urgent]
            self.write_stats["prioritised"] += min(budget, len(first))
        changes: list[Change] = []
        encoded = self._encoded
        refused, adopted, inserts = self._refused, self._adopted, 0
        for job in order:
            if job in inflight:
                continue  # sent at its newest value once the switch has answered the earlier Write
            want = jobs.get(job)
            have = installed.get(job)
            if have is not None and want is not None and have[0] is not None and have[0].qid == want:
                del dirty[job]
                continue
            if len(changes) >= budget:
                break
            if refused and refused.get((table.name, job), _UNSET) == want:
                del dirty[job]  # refused as it is; sent again once it changes
                continue
            if want is None:
                if have is None or job in adopted:  # adopted: kept until adopt_jobs_s is over
                    del dirty[job]
                    continue
                kind, want = DELETE, 0
            else:
                if have is None:
                    if not self._room_for_insert(inserts):
                        self._no_room_add(job)
                        continue
                    inserts += 1
                kind = INSERT if have is None else MODIFY
            hit = encoded.get(job * 32 + kind * 8 + want)
            if hit is None:
                hit = self._encode_job(kind, job, want)
            changes.append(Change(kind, table, job, have[0] if kind == DELETE else hit[0], None, hit[1]))
        if opts.max_updates_per_s > 0:
            self._tokens -= len(changes)
        self.deferred_updates = len(dirty) - len(changes)
        self.deferred_urgent = (len(urgent & dirty.keys()) - sum(1 for c in changes if c.key in urgent)
                                if urgent and self.deferred_updates else 0)
        return changes

    def _encode_job(self, kind: int, job: int, qid: int) -> tuple[JobRule | None, bytes]:
        """(rule, serialized Update) of a queue_by_job change, cached (a job moving between queues costs one
        encoding per queue, not one per move)."""
        encoded = self._encoded
        if len(encoded) >= ENTRY_CACHE_SIZE:
            encoded.clear()
        hit = encoded[job * 32 + kind * 8 + qid] = (None if kind == DELETE else JobRule(job, qid),
                                                    self.classification.job_update(kind, job, qid))
        return hit

    def _write(self, full: bool) -> WriteSummary:
        """Write synchronously: the static tables (``full``) and the dirty jobs, after every Write in flight."""
        errors = self._settle(block=True)
        changes = pending_changes(self.controls, self._static, skip=frozenset({self.classification.queue_by_job})) \
            if full else []
        if self._refused:
            changes = [c for c in changes if not self._is_refused(c)]
        changes += self._job_changes()
        if not changes:
            if errors:
                raise P4RuntimeWriteError(self.name, errors, len(errors))
            return WriteSummary()
        table_order = {t: i for i, t in enumerate(t for c in self.controls for t in c.tables)}
        changes.sort(key=lambda c: (UPDATE_ORDER[c.kind], table_order[c.table]))
        updates = [c.serialized() for c in changes]
        sizes = [len(u) for u in updates]
        opts = self.options
        for change in changes:
            if change.table is self.classification.queue_by_job:
                self._dirty.pop(change.key, None)
        # One Write when everything fits (deletes, modifies, inserts in that order within it); otherwise the
        # deletes complete first, so that no insert races the delete of an overlapping entry in another Write.
        if len(batches(sizes, opts.max_batch_updates, opts.max_write_bytes)) == 1:
            groups = [list(range(len(changes)))]
        else:
            split = next((i for i, c in enumerate(changes) if c.kind != p4runtime_pb2.Update.DELETE), len(changes))
            groups = [list(range(0, split)), list(range(split, len(changes)))]
        for group in groups:
            parts = [[group[i] for i in part]
                     for part in batches([sizes[i] for i in group], opts.max_batch_updates, opts.max_write_bytes)]
            results = self.session.write_pipelined([[updates[i] for i in part] for part in parts],
                                                   opts.max_inflight_writes)
            for part, result in zip(parts, results):
                for err in self._record([changes[i] for i in part], result):
                    errors.append(UpdateError(part[err.index], err.code, err.message, err.update))
        if errors:
            raise P4RuntimeWriteError(self.name, errors, len(changes))
        kinds = collections.Counter(c.kind for c in changes)
        return WriteSummary(inserted=kinds[p4runtime_pb2.Update.INSERT], modified=kinds[p4runtime_pb2.Update.MODIFY],
                            deleted=kinds[p4runtime_pb2.Update.DELETE])

    # --- reads ---

    def read_counters(self) -> Counters:
        with self._lock:
            self.session.check_up()
            entities = []
            for counter_id in (self._enqueued_id, self._transmitted_id):
                if self.options.ports:
                    for port in sorted(self.options.ports):
                        for qid in range(NUM_QUEUES):
                            entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                                counter_id=counter_id, index=p4runtime_pb2.Index(index=port * NUM_QUEUES + qid))))
                else:
                    entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                        counter_id=counter_id)))
            entities.append(p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
                table_entry=p4runtime_pb2.TableEntry(table_id=self.classification.queue_by_job.info.id))))
            entities += self.validation.counter_entities()
            entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                counter_id=self._guard_id, index=p4runtime_pb2.Index(index=0))))
            enq: dict[int, int] = {}
            tx: dict[int, tuple[int, int]] = {}
            jobs: dict[int, int] = {}
            other = []
            for entity in self.session.read(entities, "counters"):
                kind = entity.WhichOneof("entity")
                if kind == "counter_entry":
                    c = entity.counter_entry
                    if c.counter_id == self._enqueued_id:
                        enq[c.index.index] = c.data.packet_count
                    elif c.counter_id == self._transmitted_id:
                        tx[c.index.index] = (c.data.packet_count, c.data.byte_count)
                    elif c.counter_id == self._guard_id:
                        self.queue0_guard_packets = c.data.packet_count
                    else:
                        other.append(c)
                elif kind == "direct_counter_entry":
                    d = entity.direct_counter_entry
                    for m in d.table_entry.match:
                        jobs[decode(m.exact.value)] = d.data.packet_count
            tm_drops = self._tm_drops()
            queues = []
            for index in sorted(set(enq) | set(tx)):
                e_count, (t_count, t_bytes) = enq.get(index, 0), tx.get(index, (0, 0))
                port, qid = divmod(index, NUM_QUEUES)
                if not self.options.ports and e_count == 0 and t_count == 0:
                    continue
                # Tofino with BfRt: the TM's own drop counter; otherwise enqueued - transmitted.
                dropped = tm_drops[(port, qid)] if tm_drops and (port, qid) in tm_drops else max(0, e_count - t_count)
                queues.append(QueueStats(port=port, qid=qid, enqueued=e_count, transmitted=t_count,
                                         dropped=dropped, transmitted_bytes=t_bytes))
            return Counters(queues=tuple(queues), job_packets=jobs, malformed=self.validation.drops(other))

    def drain_packet_in(self) -> list[tuple[bytes, int | None]]:
        return self.session.drain_packet_in()

    def close(self) -> None:
        with self._lock:
            self.session.close()
            self._close_tm()
