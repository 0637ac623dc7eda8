"""The epoch loop: reports in, policy, one batched write per switch, counters out.

``Controller`` is the in-process controller the demo embeds::

    ctl = Controller(config)            # opens the UDP report socket and the metrics endpoint (if enabled)
    result = ctl.step()                 # one epoch (tests call this with their own ``now``)
    ctl.run(stop_event)                 # epochs every config.epoch_s until stop_event is set
    ctl.ingest_report(datagram, "10.0.0.1")
    ctl.close()

Switches that are down are reconnected with exponential backoff in a background thread, so one dead switch
never stalls the others' epochs; ``Driver.connect`` re-pushes the pipeline and re-installs state.
"""
from __future__ import annotations

import dataclasses
import logging
import select
import socket
import threading
import time
import types
from typing import Callable, Mapping

from netapprox.controller import policy
from netapprox.controller.config import ControllerConfig, SwitchConfig
from netapprox.controller.drivers import build_driver
from netapprox.controller.errors import ControllerError, P4RuntimeWriteError
from netapprox.controller.model import Counters, Driver, SwitchState, SwitchUnavailable, WriteSummary
from netapprox.controller.observe import DecisionLog, MetricsServer, MetricsText
from netapprox.controller.reports import ReportIngest, udp_payload_from_frame
from netapprox.hostlib.wire import Report

log = logging.getLogger("controller")

MAX_DATAGRAM = 2048


@dataclasses.dataclass(frozen=True)
class EpochResult:
    """What one ``Controller.step`` did."""

    epoch: int
    now: float
    assignments: Mapping[int, int]  # job -> queue after this epoch
    changes: tuple[policy.JobChange, ...]
    writes: Mapping[str, WriteSummary]  # switch -> what apply() changed (switches that were up)
    errors: Mapping[str, str]  # switch -> error of this epoch (down, write failed)
    counters: Mapping[str, Counters]  # switch -> counters read this epoch
    reports_accepted: int  # during this epoch
    reports_dropped: int  # during this epoch
    duration_s: float  # processing time of this step


class _Switch:
    """One switch's session state (the driver does the protocol)."""

    def __init__(self, config: SwitchConfig, driver: Driver, static: SwitchState, initial_backoff: float) -> None:
        self.config = config
        self.driver = driver
        self.static = static
        self.up = False
        self.connecting = False
        self.ever_connected = False
        self.next_attempt = 0.0
        self.backoff = initial_backoff
        self.reconnects = 0
        self.last_error = ""
        self.inserted = self.modified = self.deleted = self.write_errors = 0
        self.counters: Counters | None = None


class Controller:
    """The control plane for a set of switches. Thread-safe: ``ingest_report`` may be called from any thread
    while ``run`` executes epochs."""

    def __init__(self, config: ControllerConfig, drivers: Mapping[str, Driver] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._ingest = ReportIngest(config.reports)
        self._jobs: dict[int, dict[int, policy.GroupReport]] = {}
        self._assignments: Mapping[int, int] = types.MappingProxyType({})
        self._tag_only = policy.tag_only_jobs(config.policy)
        self._epoch = 0
        self._accepted_mark = self._dropped_mark = 0
        self._last_step_s = 0.0
        self._closed = False
        self.decision_log = DecisionLog(config.decision_log)
        drivers = dict(drivers or {})
        switch_configs = {s.name: s for s in config.switches}
        for name in drivers:
            switch_configs.setdefault(name, SwitchConfig(name=name))
        self._switches: dict[str, _Switch] = {}
        self._sock: socket.socket | None = None
        self._metrics: MetricsServer | None = None
        try:
            for name, sc in switch_configs.items():
                driver = drivers[name] if name in drivers else build_driver(sc)
                self._switches[name] = _Switch(sc, driver, policy.static_state(sc, config.policy),
                                               config.reconnect_initial_s)
            if config.reports.port >= 0:
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._sock.bind((config.reports.bind, config.reports.port))
                self._sock.setblocking(False)
            if config.metrics_port >= 0:
                self._metrics = MetricsServer(config.metrics_bind, config.metrics_port, self.metrics_text)
        except BaseException:
            self.close()
            raise

    # --- public API -----------------------------------------------------------------------------------

    @property
    def report_address(self) -> tuple[str, int] | None:
        """(host, port) of the UDP report socket, or None when it is disabled."""
        return self._sock.getsockname()[:2] if self._sock is not None else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return self._metrics.address if self._metrics is not None else None

    @property
    def epochs(self) -> int:
        """Epochs run so far."""
        return self._epoch

    @property
    def assignments(self) -> Mapping[int, int]:
        """job id -> logical queue, as of the last epoch."""
        return self._assignments

    def switch_up(self, name: str) -> bool:
        return self._switches[name].up

    def ingest_report(self, data: bytes, source: str, now: float | None = None) -> Report | None:
        """Validate and record one REPORT datagram from host ``source``. Returns the report, or None if it was
        dropped (counted by reason in the metrics). Never raises on bad input."""
        now = self._clock() if now is None else now
        with self._lock:
            report = self._ingest.receive(data, source, now)
            if report is not None:
                self._jobs.setdefault(report.job_id, {})[report.group_id] = policy.GroupReport(report.tlr, now)
        return report

    def step(self, now: float | None = None) -> EpochResult:
        """Run one epoch: drain reports, decide, write the difference to every switch that is up, read counters."""
        t0 = time.perf_counter()
        now = self._clock() if now is None else now
        with self._lock:
            self._drain_socket(now)
            self._epoch += 1
            epoch = self._epoch
        self._maybe_connect(self._clock())  # connection timing is wall time even when ``now`` is virtual
        for sw in self._switches.values():
            if sw.up:
                for frame in self._drain_packet_in(sw):
                    parsed = udp_payload_from_frame(frame)
                    if parsed is None:
                        with self._lock:
                            self._ingest.dropped["not_udp"] += 1
                        continue
                    self.ingest_report(parsed[0], parsed[1], now)
        with self._lock:
            decision = policy.decide(self._jobs, self._assignments, now, self.config.policy)
            for job_id in set(self._jobs) - set(decision.live):
                self._ingest.forget_job(job_id)
            for job_id, groups in decision.live.items():
                for g in set(self._jobs[job_id]) - set(groups):
                    self._ingest.forget_group(job_id, g)
            self._jobs = {j: dict(g) for j, g in decision.live.items()}
            self._assignments = decision.assignments
            accepted = self._ingest.accepted - self._accepted_mark
            dropped = sum(self._ingest.dropped.values()) - self._dropped_mark
            self._accepted_mark, self._dropped_mark = self._ingest.accepted, sum(self._ingest.dropped.values())
        for change in decision.changes:
            self.decision_log.write("job", epoch=epoch, job=change.job_id, reason=change.reason,
                                    old_queue=change.old_qid, new_queue=change.new_qid, tlr=change.tlr,
                                    group=change.group_id)
        writes: dict[str, WriteSummary] = {}
        errors: dict[str, str] = {}
        counters: dict[str, Counters] = {}
        read_now = self.config.counters_every > 0 and epoch % self.config.counters_every == 0
        for name, sw in self._switches.items():
            if not sw.up:
                errors[name] = f"down: {sw.last_error}" if sw.last_error else "down"
                continue
            desired = policy.switch_state(sw.static, decision.assignments, self._tag_only)
            try:
                summary = sw.driver.apply(desired)
                writes[name] = summary
                sw.inserted += summary.inserted
                sw.modified += summary.modified
                sw.deleted += summary.deleted
                if summary.writes:
                    self.decision_log.write("write", epoch=epoch, switch=name, inserted=summary.inserted,
                                            modified=summary.modified, deleted=summary.deleted)
                if read_now:
                    sw.counters = counters[name] = sw.driver.read_counters()
            except SwitchUnavailable as e:
                self._mark_down(sw, self._clock(), str(e))
                errors[name] = str(e)
            except P4RuntimeWriteError as e:
                sw.write_errors += len(e.errors)
                errors[name] = str(e)
                log.error("%s", e)
                self.decision_log.write("write_error", epoch=epoch, switch=name, errors=[str(x) for x in e.errors])
            except ControllerError as e:
                errors[name] = str(e)
                log.error("switch %r: %s", name, e)
            except Exception as e:  # noqa: BLE001 - unknown driver failure: re-arm the switch, keep the loop
                log.exception("switch %r: driver failed", name)
                self._mark_down(sw, self._clock(), f"{type(e).__name__}: {e}")
                errors[name] = str(e)
        duration = time.perf_counter() - t0
        self._last_step_s = duration
        return EpochResult(epoch=epoch, now=now, assignments=decision.assignments, changes=decision.changes,
                           writes=types.MappingProxyType(writes), errors=types.MappingProxyType(errors),
                           counters=types.MappingProxyType(counters), reports_accepted=accepted,
                           reports_dropped=dropped, duration_s=duration)

    def run(self, stop: threading.Event) -> None:
        """Run epochs every ``config.epoch_s`` until ``stop`` is set. Reports arriving on the UDP socket are
        ingested as they arrive; writes happen at epoch boundaries."""
        epoch_s = self.config.epoch_s
        deadline = self._clock()
        while not stop.is_set():
            self.step()
            deadline += epoch_s
            now = self._clock()
            if deadline < now:  # overran: skip the missed epochs rather than bursting
                deadline = now
            while not stop.is_set():
                timeout = deadline - self._clock()
                if timeout <= 0:
                    break
                if self._sock is None:
                    stop.wait(min(timeout, 0.05))
                    continue
                readable, _, _ = select.select([self._sock], [], [], min(timeout, 0.05))
                if readable:
                    with self._lock:
                        self._drain_socket(self._clock())

    def wait_until_up(self, timeout: float, names: tuple[str, ...] | None = None) -> bool:
        """Step the connection machinery until the named (default: all) switches are up, or ``timeout``."""
        end = time.monotonic() + timeout
        names = names or tuple(self._switches)
        while time.monotonic() < end:
            self._maybe_connect(self._clock())
            if all(self._switches[n].up for n in names):
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Stop the sockets and threads and close every driver. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._metrics is not None:
            self._metrics.close()
        if self._sock is not None:
            self._sock.close()
        for sw in self._switches.values():
            deadline = time.monotonic() + 10
            while sw.connecting and time.monotonic() < deadline:
                time.sleep(0.01)
            try:
                sw.driver.close()
            except Exception as e:  # noqa: BLE001 - close the others anyway
                log.warning("closing switch %r: %s", sw.config.name, e)
        self.decision_log.close()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- metrics --------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """The Prometheus exposition served on ``/metrics``."""
        m = MetricsText()
        with self._lock:
            m.add("netapprox_epochs_total", "counter", "Epochs run.", self._epoch)
            m.add("netapprox_epoch_processing_seconds", "gauge", "Processing time of the last epoch.",
                  float(self._last_step_s))
            m.add("netapprox_reports_accepted_total", "counter", "Host reports accepted.", self._ingest.accepted)
            for reason, n in sorted(self._ingest.dropped.items()):
                m.add("netapprox_reports_dropped_total", "counter", "Host reports dropped, by reason.", n,
                      reason=reason)
            m.add("netapprox_jobs", "gauge", "Jobs with a live report.", len(self._assignments))
            for job, qid in sorted(self._assignments.items()):
                m.add("netapprox_job_queue", "gauge", "Logical queue assigned to the job.", qid, job=job)
        for name, sw in self._switches.items():
            m.add("netapprox_switch_up", "gauge", "1 if the controller is connected to the switch.", int(sw.up),
                  switch=name)
            m.add("netapprox_switch_reconnects_total", "counter", "Successful reconnections after a loss.",
                  sw.reconnects, switch=name)
            for op, n in (("insert", sw.inserted), ("modify", sw.modified), ("delete", sw.deleted)):
                m.add("netapprox_table_updates_total", "counter",
                      "Table updates written by epochs (re-installs after a reconnect not included).", n,
                      switch=name, op=op)
            m.add("netapprox_write_errors_total", "counter", "Failed table updates.", sw.write_errors, switch=name)
            c = sw.counters
            if c is None:
                continue
            for q in c.queues:
                labels = dict(switch=name, port=q.port, queue=q.qid)
                m.add("netapprox_queue_enqueued_packets", "counter", "Packets classified into the queue.",
                      q.enqueued, **labels)
                m.add("netapprox_queue_transmitted_packets", "counter", "Packets that left the queue.",
                      q.transmitted, **labels)
                m.add("netapprox_queue_dropped_packets", "counter", "Tail drops (enqueued - transmitted).",
                      q.dropped, **labels)
            for job, n in sorted(c.job_packets.items()):
                m.add("netapprox_job_packets", "counter", "Packets that hit the job's queue_by_job entry.", n,
                      switch=name, job=job)
        return m.render()

    # --- internals ------------------------------------------------------------------------------------

    def _drain_socket(self, now: float) -> None:
        if self._sock is None:
            return
        while True:
            try:
                data, addr = self._sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. ICMP errors surfacing on the socket
                log.debug("report socket: %s", e)
                return
            report = self.ingest_report(data, addr[0], now)
            if report is None:
                log.debug("dropped report from %s", addr[0])

    def _drain_packet_in(self, sw: _Switch) -> list[bytes]:
        try:
            return sw.driver.drain_packet_in()
        except SwitchUnavailable as e:
            self._mark_down(sw, self._clock(), str(e))
            return []

    def _mark_down(self, sw: _Switch, now: float, why: str) -> None:
        if sw.up:
            log.warning("switch %r lost: %s; reconnecting in %.2fs", sw.config.name, why, sw.backoff)
            self.decision_log.write("switch_down", switch=sw.config.name, error=why)
        sw.up = False
        sw.last_error = why
        sw.next_attempt = now + sw.backoff

    def _maybe_connect(self, now: float) -> None:
        for sw in self._switches.values():
            if sw.up or sw.connecting or now < sw.next_attempt or self._closed:
                continue
            sw.connecting = True
            threading.Thread(target=self._connect, args=(sw,), name=f"connect-{sw.config.name}",
                             daemon=True).start()

    def _connect(self, sw: _Switch) -> None:
        name = sw.config.name
        try:
            sw.driver.connect()
        except Exception as e:  # noqa: BLE001 - any failure means: try again later
            sw.last_error = str(e)
            sw.next_attempt = self._clock() + sw.backoff
            log.warning("switch %r: connect failed: %s; next attempt in %.2fs", name, e, sw.backoff)
            self.decision_log.write("connect_failed", switch=name, error=str(e), retry_s=sw.backoff)
            sw.backoff = min(sw.backoff * 2, self.config.reconnect_max_s)
        else:
            if sw.ever_connected:
                sw.reconnects += 1
            log.info("switch %r %s: pipeline pushed, state re-installed", name,
                     "reconnected" if sw.ever_connected else "connected")
            self.decision_log.write("switch_up", switch=name, reconnect=sw.ever_connected)
            sw.ever_connected = True
            sw.backoff = self.config.reconnect_initial_s
            sw.last_error = ""
            sw.up = True
        finally:
            sw.connecting = False
