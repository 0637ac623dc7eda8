"""The controller's one runtime: the I/O around ``controller.core`` (sockets, packet-in, drivers, reconnects,
metrics, the decision log), used by the CLI, the demo, the experiments, the benchmark and the simulator alike.

    runtime = Runtime(config, on_epoch=callback)   # opens the report socket and the metrics endpoint
    runtime.connect(timeout_s=30)                  # every switch up (or False)
    runtime.start()                                # epochs every config.epoch_s in a thread ...
    runtime.run(stop_event)                        # ... or in this thread until stop_event is set
    result = runtime.epoch(now)                    # ... or one epoch at a time, e.g. in simulated time
    runtime.close()                                # sockets, threads, drivers: everything it started

Each epoch: drain the report socket and every switch's packet-in into the core, ``core.step``, apply each
switch's desired state through its driver (switches that are down are skipped and reconnected with
exponential backoff in a background thread, so one dead switch never stalls the others), read counters
every ``config.counters_every`` epochs, log decisions, then call ``on_epoch(EpochResult)``. Connection timing
always runs on the wall clock, even when ``epoch(now)`` is given a virtual time.

In a replica set (``config.replica``) every replica runs all of this on the same reports; a switch for which
this replica is a backup (``Driver.is_primary`` False) gets no writes and no counter reads, and when the switch
makes it primary its next epoch hands the driver the whole desired state (a takeover: the driver reconciles
with what the switch holds). Each change is logged and in the decision log (``primary`` / ``backup``).
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import select
import socket
import threading
import time
import types
from typing import Any, Callable, Mapping, TypeVar

from prometheus_client import generate_latest

from netapprox.controller.config import ControllerConfig, check_report_listener
from netapprox.controller.core import ControllerCore, EpochPlan
from netapprox.controller.drivers import Driver, build_driver
from netapprox.controller.errors import BindError, ControllerError, SwitchUnavailable, WriteError
from netapprox.controller.model import Counters, TableUpdates, WriteSummary
from netapprox.controller.observe import DecisionLog, Metrics
from netapprox.controller.reports import RECV_BATCH, receive_batch
from netapprox.hostlib.wire import Report

log = logging.getLogger("netapprox.controller")
T = TypeVar("T")

SO_RCVBUFFORCE = 33  # Linux; not in the socket module
GC_FULL_EVERY_S = 10.0
DRAIN_LIMIT = 1024
"""Reports taken from the socket per drain, at most (about 5 ms of work): the loop checks its epoch deadline
between drains."""
WRITE_POLL_S = 0.001
"""How often the loop checks, between epochs, whether the switch has answered a Write while updates wait."""


@dataclasses.dataclass(frozen=True)
class EpochResult:
    """What one epoch did: the core's plan plus what the drivers made of it."""

    plan: EpochPlan
    writes: Mapping[str, WriteSummary]
    """switch -> what ``apply`` changed (switches that were up)."""
    errors: Mapping[str, str]
    """switch -> error of this epoch (down, write failed)."""
    counters: Mapping[str, Counters]
    """switch -> counters read this epoch (every ``counters_every`` epochs)."""
    duration_s: float
    """Processing time of the epoch (wall clock)."""

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def now(self) -> float:
        return self.plan.now

    @property
    def assignments(self) -> Mapping[int, int]:
        return self.plan.assignments

    @property
    def changes(self):
        return self.plan.changes

    @property
    def reports(self) -> tuple[Report, ...]:
        return self.plan.reports

    @property
    def reports_accepted(self) -> int:
        return len(self.plan.reports)


def _grow_receive_buffer(sock: socket.socket, size: int) -> None:
    """SO_RCVBUFFORCE when allowed (root), else SO_RCVBUF (capped by net.core.rmem_max)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        except OSError as e:
            log.debug("report socket: cannot grow its receive buffer: %s", e)


class _Switch:
    """One switch's connection state (the driver does the protocol)."""

    def __init__(self, name: str, driver: Driver, initial_backoff: float) -> None:
        self.name = name
        self.driver = driver
        self.up = False
        self.connecting = False
        self.ever_connected = False
        self.next_attempt = 0.0
        self.backoff = initial_backoff
        self.reconnects = 0
        self.last_error = ""
        self.needs_full = True  # a (re)connected switch missed the updates of the epochs before: whole state
        self.primary: bool | None = None  # this controller may write to it (None: not looked at since connect)
        self.vacancies = 0  # times the switch said its primary had gone, as of the last epoch (replicas)
        self.updates = {"insert": 0, "modify": 0, "delete": 0}
        self.write_errors = 0
        self.counters: Counters | None = None
        self.failure = ""  # why the last driver call failed (``Runtime._call``)

    def count(self, summary: WriteSummary) -> None:
        self.updates["insert"] += summary.inserted
        self.updates["modify"] += summary.modified
        self.updates["delete"] += summary.deleted


class Runtime:
    """The control plane for a set of switches. ``ingest`` may be called from any thread."""

    def __init__(self, config: ControllerConfig, drivers: Mapping[str, Driver] | None = None, *,
                 on_epoch: Callable[[EpochResult], None] | None = None,
                 report_socket: socket.socket | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 connect_clock: Callable[[], float] = time.monotonic,
                 background_connect: bool = True) -> None:
        """``drivers``: switch name -> driver, for switches whose driver the caller made (the others are built
        from ``config.switches``). ``report_socket``: an already bound UDP socket to read reports from (e.g.
        one opened inside a host's network namespace), instead of binding ``config.reports``; the runtime
        closes it. ``clock``: the time ``epoch()`` uses when it is not given one. ``connect_clock``: the time
        reconnect backoff runs on. ``background_connect``: connect switches in a thread each (so a slow switch
        never stalls an epoch); off, ``epoch`` and ``connect`` connect inline (tests with a virtual clock,
        simulators)."""
        self.config = config
        self.on_epoch = on_epoch
        self.on_arrivals: Callable[[int, tuple, Mapping[str, WriteSummary]], None] | None = None
        """Called with (epoch, job changes, writes per switch) when reports between epochs changed a job's queue
        (``decide_arrivals``); the CLI's ``--dry-run`` prints them."""
        self._clock = clock
        self._connect_clock = connect_clock
        self._background_connect = background_connect
        self._lock = threading.RLock()
        drivers = dict(drivers or {})
        self.core = ControllerCore(config, extra_switches=drivers)
        self.decision_log = DecisionLog(config.decision_log)
        self._switches: dict[str, _Switch] = {}
        self._sock: socket.socket | None = report_socket
        self._metrics: Metrics | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._last_full_gc = time.perf_counter()
        try:
            for name, sc in self.core.switches.items():
                driver = drivers[name] if name in drivers else build_driver(sc, replica=config.replica)
                self._switches[name] = _Switch(name, driver, config.reconnect_initial_s)
            if self._sock is None and config.reports.port >= 0:
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    self._sock.bind((config.reports.bind, config.reports.port))
                except OSError as e:
                    raise BindError(f"cannot bind UDP {config.reports.bind}:{config.reports.port} (reports): "
                                          f"{e.strerror}") from None
            if self._sock is not None:
                check_report_listener(*self._sock.getsockname()[:2], config.reports)
                self._sock.setblocking(False)
                _grow_receive_buffer(self._sock, config.reports.rcvbuf_bytes)
            self._metrics = Metrics(self)
            if config.metrics_port >= 0:
                try:
                    self._metrics.serve(config.metrics_bind, config.metrics_port)
                except OSError as e:
                    raise BindError(f"cannot bind TCP {config.metrics_bind}:{config.metrics_port} (metrics): "
                                          f"{e.strerror}") from None
        except BaseException:
            self.close()
            raise

    # --- addresses and state -----------------------------------------------------------------------------

    @property
    def report_address(self) -> tuple[str, int] | None:
        """(host, port) of the UDP report socket, or None when there is none."""
        return self._sock.getsockname()[:2] if self._sock is not None else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return self._metrics.address if self._metrics is not None else None

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    @property
    def epochs(self) -> int:
        return self.core.epoch

    @property
    def assignments(self) -> Mapping[int, int]:
        """job id -> logical queue, as of the last epoch."""
        return self.core.assignments

    def never_connected(self) -> dict[str, str]:
        """Switches that have not been connected once since the runtime started -> their last connect error."""
        return {n: sw.last_error for n, sw in self._switches.items() if not sw.ever_connected}

    def driver(self, name: str) -> Driver:
        return self._switches[name].driver

    def switch_up(self, name: str) -> bool:
        return self._switches[name].up

    def reconfigure(self, *, policy_config=None, switches=()) -> None:
        """A new ``PolicyConfig`` and/or new ``SwitchConfig``s of known switches (static entries); the next
        epoch applies them."""
        with self._lock:
            self.core.reconfigure(policy_config=policy_config, switches=switches)

    # --- reports ---------------------------------------------------------------------------------------

    def ingest(self, datagram: bytes, source: str, now: float | None = None) -> Report | None:
        """Validate and record one REPORT datagram from host ``source``. None if dropped (counted by reason)."""
        with self._lock:
            return self.core.ingest(datagram, source, self._clock() if now is None else now)

    def _drain_socket(self, now: float, limit: int = DRAIN_LIMIT) -> int:
        """Ingest the datagrams waiting on the report socket, in batches (``reports.receive_batch``: recvmmsg and
        C decoding when the helper is built), at most about ``limit`` of them, so that reports arriving faster
        than they can be taken never hold up an epoch (the rest wait in the socket's buffer). Returns how many
        were read."""
        if self._sock is None:
            return 0
        key = self.config.reports.key
        total = 0
        while total < limit:
            try:
                batch = receive_batch(self._sock, key)
            except OSError as e:  # e.g. ICMP errors surfacing on the socket
                log.debug("report socket: %s", e)
                return total
            if batch:
                with self._lock:
                    self.core.ingest_batch(batch, now)
                total += len(batch)
            if len(batch) < RECV_BATCH:
                return total

    # --- connections -------------------------------------------------------------------------------------

    def connect(self, timeout_s: float, names: tuple[str, ...] | None = None) -> bool:
        """Run the connection machinery until the named (default: all) switches are up, or ``timeout_s``.
        With ``background_connect`` off, one attempt per switch that is due (no waiting)."""
        names = names or tuple(self._switches)
        end = time.monotonic() + timeout_s
        while True:
            self._maybe_connect()
            if all(self._switches[n].up for n in names):
                return True
            if not self._background_connect or time.monotonic() >= end:
                return False
            time.sleep(0.005)

    def _maybe_connect(self) -> None:
        now = self._connect_clock()
        for sw in self._switches.values():
            if sw.up or sw.connecting or now < sw.next_attempt or self._closed:
                continue
            sw.connecting = True
            if self._background_connect:
                threading.Thread(target=self._connect, args=(sw,), name=f"connect-{sw.name}", daemon=True).start()
            else:
                self._connect(sw)

    def _connect(self, sw: _Switch) -> None:
        try:
            sw.driver.connect()
        except Exception as e:  # noqa: BLE001 - any failure means: try again later
            sw.last_error = str(e)
            sw.next_attempt = self._connect_clock() + sw.backoff
            log.warning("switch %r: connect failed: %s; next attempt in %.2fs", sw.name, e, sw.backoff)
            self.decision_log.write("connect_failed", switch=sw.name, error=str(e), retry_s=sw.backoff)
            sw.backoff = min(sw.backoff * 2, self.config.reconnect_max_s)
        else:
            if sw.ever_connected:
                sw.reconnects += 1
            log.info("switch %r %s", sw.name, "reconnected" if sw.ever_connected else "connected")
            self.decision_log.write("switch_up", switch=sw.name, reconnect=sw.ever_connected)
            sw.ever_connected = True
            sw.needs_full = True
            sw.primary = None
            sw.backoff = self.config.reconnect_initial_s
            sw.last_error = ""
            sw.up = True
        finally:
            sw.connecting = False

    def _mark_down(self, sw: _Switch, why: str) -> None:
        if sw.up:
            log.warning("switch %r lost: %s; reconnecting in %.2fs", sw.name, why, sw.backoff)
            self.decision_log.write("switch_down", switch=sw.name, error=why)
        sw.up = False
        sw.last_error = why
        sw.next_attempt = self._connect_clock() + sw.backoff

    # --- epochs --------------------------------------------------------------------------------------------

    def epoch(self, now: float | None = None) -> EpochResult:
        """Run one epoch at time ``now`` (default: the runtime's clock) and return what it did."""
        t0 = time.perf_counter()
        now = self._clock() if now is None else now
        self._maybe_connect()
        self._drain_socket(now)
        for sw in self._switches.values():
            if not sw.up:
                continue
            frames = self._call(sw, lambda d: d.drain_packet_in())
            if not frames:
                continue
            with self._lock:
                for frame, port in frames:
                    self.core.ingest_frame(frame, now, switch=sw.name, ingress_port=port)
        with self._lock:
            plan = self.core.step(now)
        if self.decision_log.enabled:
            for change in plan.changes:
                self.decision_log.write("job", epoch=plan.epoch, job=change.job_id, reason=change.reason,
                                        old_queue=change.old_qid, new_queue=change.new_qid, tlr=change.tlr,
                                        loss=change.loss, group=change.group_id)
            for tuned in plan.tuning:  # mode adaptive: the tuner's new thresholds and buffers
                self.decision_log.write("tuning", epoch=plan.epoch, **tuned.as_log())
        writes: dict[str, WriteSummary] = {}
        errors: dict[str, str] = {}
        counters: dict[str, Counters] = {}
        every = self.config.counters_every
        read_now = every > 0 and plan.epoch % every == 0
        for name, sw in self._switches.items():
            if not sw.up:
                errors[name] = f"down: {sw.last_error}" if sw.last_error else "down"
                continue
            primary = self._follow_primary(sw)
            if not primary:
                if primary is None:
                    errors[name] = sw.failure
                continue  # a backup: another controller writes to this switch
            updates = plan.updates[name]
            if sw.needs_full:
                updates = TableUpdates(static=True, jobs=updates.jobs, urgent=updates.urgent)
            summary = self._write(sw, lambda d, name=name, updates=updates: d.apply_updates(
                lambda: plan.desired[name], updates))
            if summary is None:
                errors[name] = sw.failure
                continue
            sw.needs_full = False
            writes[name] = summary
            if summary.writes:
                self.decision_log.write("write", epoch=plan.epoch, switch=name, inserted=summary.inserted,
                                        modified=summary.modified, deleted=summary.deleted)
            if read_now:
                read = self._call(sw, lambda d: d.read_counters())
                if read is None:
                    errors[name] = sw.failure
                else:
                    sw.counters = counters[name] = read
        duration = time.perf_counter() - t0
        self._metrics.epoch_seconds.observe(duration)
        result = EpochResult(plan=plan, writes=types.MappingProxyType(writes), errors=types.MappingProxyType(errors),
                             counters=types.MappingProxyType(counters), duration_s=duration)
        if self.on_epoch is not None:
            self.on_epoch(result)
        return result

    def collect_garbage(self) -> float:
        """Python's cyclic garbage collection, run where ``run`` has idle time between epochs instead of
        wherever an allocation happens to trigger it (a full collection over 10,000 jobs' objects takes tens of
        milliseconds, which would land inside epochs): the young generation every call, everything every
        ``GC_FULL_EVERY_S``. Returns the seconds it took."""
        t0 = time.perf_counter()
        if t0 - self._last_full_gc >= GC_FULL_EVERY_S:
            gc.collect()
            self._last_full_gc = time.perf_counter()
        else:
            gc.collect(0)
        return time.perf_counter() - t0

    def decide_arrivals(self) -> Mapping[str, WriteSummary]:
        """Between epochs: decide the jobs whose new reports changed their queue (``ControllerCore.decide_arrivals``)
        and write those entries now, to the switches that are up (the others get them with their whole state
        when they are back). Returns what was written per switch."""
        with self._lock:
            changes, updates = self.core.decide_arrivals()
        for change in changes:
            self.decision_log.write("job", epoch=self.core.epoch, job=change.job_id, reason=change.reason,
                                    old_queue=change.old_qid, new_queue=change.new_qid, tlr=change.tlr,
                                    loss=change.loss, group=change.group_id, between_epochs=True)
        writes: dict[str, WriteSummary] = {}
        for name, update in updates.items():
            sw = self._switches[name]
            if not sw.up or sw.needs_full or not sw.primary:
                continue
            summary = self._write(sw, lambda d, name=name, update=update: d.apply_updates(
                lambda: self.core.desired_state(name), update))
            if summary is not None:
                writes[name] = summary
        if changes and self.on_arrivals is not None:
            self.on_arrivals(self.core.epoch, changes, types.MappingProxyType(writes))
        return writes

    def _pump_writes(self) -> bool:
        """Between epochs: let each driver that holds updates back for its in-flight window send them as the
        switch answers (``send_pending``), so a backlog drains at the switch's pace. True while any still wait."""
        waiting = False
        for sw in self._switches.values():
            if not sw.up or sw.needs_full or not sw.primary or not sw.driver.pending_writes():
                continue
            self._write(sw, lambda d: d.send_pending())
            waiting = waiting or (sw.up and sw.driver.pending_writes())
        return waiting

    def _follow_primary(self, sw: _Switch) -> bool | None:
        """Whether this controller may write to the switch now (``Driver.is_primary``; None: the switch is gone).
        A change is logged; to primary (a takeover), the next write is the whole desired state."""
        if self.config.replica:
            self._note_vacancy(sw)
        primary = self._call(sw, lambda d: d.is_primary())
        if primary is None or primary == sw.primary:
            return primary
        if sw.primary is not None or not primary:  # not the first look at a switch this controller just armed
            log.warning("switch %r: this controller is %s now", sw.name, "primary" if primary else "a backup")
            self.decision_log.write("primary" if primary else "backup", epoch=self.core.epoch, switch=sw.name)
        sw.primary = primary
        if primary:
            sw.needs_full = True
        return primary

    def _note_vacancy(self, sw: _Switch) -> None:
        """Replicas: log the epoch at which this controller learns that the switch's primary has gone (the
        decision log's ``primary_lost``: a crash detected, where a takeover starts in this controller's epochs;
        docs/controller.md, "Running two controllers")."""
        vacancies = self._call(sw, lambda d: d.stats().get("primary_vacancies", 0))
        if vacancies and vacancies > sw.vacancies:
            sw.vacancies = int(vacancies)
            log.warning("switch %r: its primary has gone (epoch %d)", sw.name, self.core.epoch)
            self.decision_log.write("primary_lost", epoch=self.core.epoch, switch=sw.name)

    # --- calling drivers ----------------------------------------------------------------------------------

    def _call(self, sw: _Switch, call: Callable[[Driver], T]) -> T | None:
        """``call(sw.driver)``, the one place where a driver's failure is handled: the switch is gone
        (``SwitchUnavailable``, or any exception that is not a ``ControllerError``: the loop never dies of a
        driver error) -> marked down and reconnected; some updates refused (``WriteError``) -> counted and
        logged; any other ``ControllerError`` -> logged. Returns None on failure, ``sw.failure`` says why."""
        try:
            return call(sw.driver)
        except SwitchUnavailable as e:
            self._mark_down(sw, str(e))
            sw.failure = str(e)
        except WriteError as e:
            sw.write_errors += len(e.errors)
            sw.failure = str(e)
            log.error("%s", e)
            self.decision_log.write("write_error", epoch=self.core.epoch, switch=sw.name,
                                    errors=[str(x) for x in e.errors])
        except ControllerError as e:
            sw.failure = str(e)
            log.error("switch %r: %s", sw.name, e)
        except Exception as e:  # noqa: BLE001 - unknown driver failure: re-arm the switch, keep the loop
            log.exception("switch %r: driver failed", sw.name)
            self._mark_down(sw, f"{type(e).__name__}: {e}")
            sw.failure = str(e)
        return None

    def _write(self, sw: _Switch, call: Callable[[Driver], WriteSummary]) -> WriteSummary | None:
        """``_call`` of a write; what it wrote is counted."""
        summary = self._call(sw, call)
        if summary is not None:
            sw.count(summary)
        return summary

    def run(self, stop: threading.Event) -> None:
        """Epochs every ``config.epoch_s`` (wall clock) until ``stop`` is set. Reports arriving on the socket are
        ingested as they arrive; writes happen at epoch boundaries. An overrun skips the missed epochs. Garbage
        collection runs in the idle time after each epoch (``collect_garbage``), not inside epochs."""
        epoch_s = self.config.epoch_s
        deadline = time.monotonic()
        automatic = gc.isenabled()
        gc.disable()
        try:
            self._run(stop, epoch_s, deadline)
        finally:
            if automatic:
                gc.enable()

    def _run(self, stop: threading.Event, epoch_s: float, deadline: float) -> None:
        while not stop.is_set():
            self.epoch()
            deadline += epoch_s
            if deadline < time.monotonic():
                deadline = time.monotonic()
            self.collect_garbage()
            while not stop.is_set():
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                waiting = self._pump_writes()
                wait = min(timeout, WRITE_POLL_S if waiting else 0.05)
                if self._sock is None:
                    stop.wait(wait)
                    continue
                readable, _, _ = select.select([self._sock], [], [], wait)
                if readable:
                    self._drain_socket(self._clock())  # bounded: the deadline is checked again soon
                    if self.config.decide_on_arrival:
                        self.decide_arrivals()

    def start(self) -> None:
        """``run`` in a background thread until ``stop()`` or ``close()``."""
        if self._thread is not None:
            raise ControllerError("the runtime is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_logged, name="controller", daemon=True)
        self._thread.start()

    def _run_logged(self) -> None:
        try:
            self.run(self._stop)
        except Exception:  # noqa: BLE001 - a background loop must say why it died
            log.exception("controller epoch loop stopped")

    def stop(self) -> None:
        """Stop the background loop started by ``start`` (returns when it has stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def close(self) -> None:
        """Stop the loop, the sockets, the metrics server and every driver. Idempotent."""
        if self._closed:
            return
        self.stop()
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
                log.warning("closing switch %r: %s", sw.name, e)
        self.decision_log.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- observation ----------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """The Prometheus exposition ``/metrics`` serves (also without a metrics port)."""
        return generate_latest(self._metrics.registry).decode()

    def snapshot(self) -> dict[str, Any]:
        """Counters and per-job state for metrics (consistent under the lock)."""
        with self._lock:
            stats = self.core.ingest_stats
            jobs = {}
            for job, groups in self.core.jobs.items():
                gid, rep = min(groups.items(), key=lambda item: (item[1].tlr, item[0]))
                jobs[job] = {"queue": self.core.assignments.get(job), "tlr": rep.tlr, "loss": rep.loss,
                             "rate_bps": rep.rate_bps}
            snap = {"epochs": self.core.epoch, "reports_accepted": stats.accepted,
                    "reports_dropped": dict(stats.dropped), "jobs": jobs}
        snap["switches"] = {n: {"up": sw.up, "reconnects": sw.reconnects, **sw.updates,
                                "write_errors": sw.write_errors, "counters": sw.counters,
                                "backlog": sw.driver.deferred_updates,
                                "backlog_urgent": sw.driver.deferred_urgent,
                                "write_stats": dict(sw.driver.write_stats),
                                "stats": dict(sw.driver.stats())}
                            for n, sw in self._switches.items()}
        return snap
