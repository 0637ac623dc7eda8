"""Many ATP jobs at once, to and from a few peers, one after another: a multi-job adapter beside the blocking API
(api.py, one job per socket) and asyncio (aio.py). PyTorch's DistributedDataParallel hook (docs/ml.md) runs on it.

A training worker sends a few jobs per bucket per iteration to every peer and receives as many, thousands of jobs
to the same few peers. ``AtpExchange`` drives hostlib's sans-I/O cores (``hostlib.core``: the native ones when
built) for all of them from one thread: every ``AtpSender`` it was given plus one ``AtpReceiver`` that serves every
job arriving at its address. Callers get ``concurrent.futures.Future``s: :meth:`AtpExchange.send` resolves to the
job's ``SendSummary`` once the receiver's DONE confirms it, :meth:`AtpExchange.receive` to the
:class:`ReceivedJob` with that id at the sender's FIN (whenever it arrives, before or after the call), so a
caller that needs only the data does not wait for the DONE's round trip.

- **A session per peer outlives its jobs** (QUIC's model: what a connection learned is kept for the next one).
  :class:`PeerSession` keeps the peer's smoothed RTT and the window its last job ended with; every new job to
  that peer starts from them (``initial_rtt_s``, ``initial_window`` shared among the jobs under way to the peer)
  instead of the defaults, and its window stops at its share of the peer's switch queues (``queue_share``: the
  peer's port is shared with its other senders). Admission stays the receiver's (hostlib/admission.py): the
  session counts the jobs that needed the RETRY round trip (``retries``) and those that started without one
  (``zero_rtt_jobs``).
- **A restarted peer is re-admitted cleanly.** Each exchange draws a ``generation`` when it starts; callers put it
  in their job ids (the DDP hook does), so a restarted worker's jobs never meet what its peers remember of its
  predecessor's. :meth:`AtpExchange.reset_peer` forgets a peer that went away: its jobs fail at once instead of
  after ``idle_timeout_s``, its session starts over, and the first job to its successor is admitted through a
  RETRY like any first job.
- **The native cores carry the datagrams.** Two sockets: DATA arrives on ``address`` (the one peers send to) and
  goes to the receiver with ``receive_from`` (recvmmsg, GRO), which answers with ``transmit``; senders send from
  ``source`` with ``transmit`` (sendmmsg, GSO), and only what comes back there (ACKs, coalesced up to 16
  packets per ACK, DONEs, RETRYs) is read into Python, to find the sender of its job id. Messages are collected
  in the receiver (``collect_messages``) and handed over once per job. Without the native cores, or with
  injected ``loss`` (which must see every datagram), the same loop runs through the socket module.

``loss`` drops that fraction of every datagram this exchange sends (seeded), the injected loss of the tests and
of the loopback experiments; on a real or emulated network it stays 0.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import random
import socket
import struct
import threading
import time
from typing import Any, Callable, Sequence

from netapprox.hostlib import core, events, link, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec
from netapprox.hostlib.errors import ExchangeError
from netapprox.hostlib.receiver import GroupResult
from netapprox.hostlib.reporting import ReportSink
from netapprox.hostlib.udp import recv_all, send_all, wait

log = logging.getLogger(__name__)

Address = tuple[str, int]
_JOB_ID = struct.Struct("!I")
_JOB_ID_AT = wire.OFFSETS["job_id"]
_KEEP_UNCLAIMED_S = 120.0
_LONGEST_WAIT_S = 0.2
GENERATIONS = 8
"""Generations an exchange draws from (3 bits of the DDP hook's job ids)."""


@dataclasses.dataclass(frozen=True)
class ReceivedJob:
    """One job as this exchange's receiver saw it."""

    job_id: int
    peer: Any
    total: int
    vector_len: int | None
    groups: tuple[GroupResult, ...]
    lost_ids: tuple[int, ...]
    messages: dict[int, bytes]


@dataclasses.dataclass
class PeerSession:
    """What this exchange knows about one peer's receiver, kept from one job to the next."""

    address: Address
    srtt_s: float | None = None
    """Smoothed RTT of the last job that measured one."""
    window: float | None = None
    """Packets in flight the last job's window allowed when it completed (``adaptive`` mode)."""
    active: int = 0
    """Jobs under way to this peer."""
    jobs: int = 0
    """Jobs started to this peer."""
    completed: int = 0
    failed: int = 0
    retries: int = 0
    """Jobs that needed an admission round trip (a RETRY arrived for them)."""
    zero_rtt_jobs: int = 0
    """Completed jobs that needed no RETRY."""
    resets: int = 0
    """Times :meth:`AtpExchange.reset_peer` started this session over."""
    address_token: bytes | None = None
    """The address-validation token of the peer's last NEW_TOKEN: the next job's announce presents it, so the peer
    admits it at once even under pressure."""

    def job_config(self, base: AtpConfig, queue_share: float = 1.0) -> AtpConfig:
        """``base`` with what this session learned: the RTT, and its last window shared among the jobs under
        way (the new one included), never below ``burst_packets``. ``queue_share``: the part of each switch
        queue this host may fill at the peer's port (it shares them with the peer's other senders); the jobs
        under way to the peer share it too."""
        changes: dict[str, Any] = {}
        share = queue_share / (self.active + 1)
        if share < 1.0:
            changes["queue_packets"] = tuple(max(1, round(q * share)) for q in base.queue_packets)
        if self.srtt_s is not None and self.srtt_s > 0:
            changes["initial_rtt_s"] = self.srtt_s
        if self.window is not None and base.mode == "adaptive":
            window = self.window / (self.active + 1)
            changes["initial_window"] = int(max(base.burst_packets, min(base.max_window, window)))
        return dataclasses.replace(base, **changes) if changes else base

    def as_dict(self) -> dict[str, Any]:
        return {"address": list(self.address), "srtt_s": self.srtt_s, "window": self.window, "jobs": self.jobs,
                "completed": self.completed, "failed": self.failed, "retries": self.retries,
                "zero_rtt_jobs": self.zero_rtt_jobs, "resets": self.resets}


class _Job:
    __slots__ = ("sender", "future", "session", "retried")

    def __init__(self, sender: Any, future: concurrent.futures.Future, session: PeerSession) -> None:
        self.sender = sender
        self.future = future
        self.session = session
        self.retried = False


def _udp(bind: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.bind(bind)
    except OSError as err:
        sock.close()
        raise ExchangeError(f"cannot bind UDP {bind[0]}:{bind[1]}: {err.strerror}") from None
    return sock


class AtpExchange:
    """Two UDP sockets, one I/O thread, a session per peer, any number of concurrent ATP jobs each way.

    ``bind`` is the address peers send to (``address``); jobs are sent from a second socket on the same host
    (``source``). Close it when done."""

    def __init__(self, bind: Address = ("127.0.0.1", 0), *, config: AtpConfig = AtpConfig(), loss: float = 0.0,
                 seed: int | None = None,
                 report_to: "str | Address | Sequence[str | Address] | None" = None, generation: int | None = None,
                 queue_share: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"injected loss {loss}: must be in [0, 1)")
        if generation is not None and not 0 <= generation < GENERATIONS:
            raise ConfigError(f"generation {generation}: must be 0..{GENERATIONS - 1}")
        if not 0.0 < queue_share <= 1.0:
            raise ConfigError(f"queue_share {queue_share}: must be in (0, 1]")
        self.config = config
        self.queue_share = queue_share
        # Many short jobs: finished ones are remembered only long enough to answer a repeated FIN, and the
        # receiver tracks many at once (a few per bucket per peer per iteration), many from one peer host (all
        # of them when the workers share a host), so one host may hold every slot.
        slots = max(config.max_jobs, 4096)
        rx_config = dataclasses.replace(config, max_jobs=slots, max_jobs_per_source=slots,
                                        finished_linger_s=min(config.finished_linger_s, 2.0))
        self.clock = clock
        self.loss = loss
        self._rng = random.Random(seed)
        self.reports = ReportSink(report_to, config.report_key)
        """Where the senders' REPORTs go (``report_to``: a controller, or each replica of a set; signed with
        ``config.report_key``); they leave on the sending socket."""
        self.generation = generation if generation is not None else os.urandom(1)[0] % GENERATIONS
        self.rx = _udp(bind)
        try:
            self.tx = _udp((bind[0], 0))
        except BaseException:
            self.rx.close()
            raise
        self.address: Address = self.rx.getsockname()[:2]
        self.source: Address = self.tx.getsockname()[:2]
        self._receiver = core.AtpReceiver(config=rx_config, now=clock(), collect_messages=True)
        self.native = loss == 0.0 and core.is_native(self._receiver) and clock is time.monotonic
        if self.native:
            core.enable_gro(self.rx)
            core.enable_gro(self.tx)
        self._rx_fd, self._tx_fd = self.rx.fileno(), self.tx.fileno()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._lock = threading.Lock()
        self._commands: collections.deque[tuple[Callable[[float], None], concurrent.futures.Future]] = \
            collections.deque()
        self.sessions: dict[Address, PeerSession] = {}
        self._jobs: dict[tuple[int, Address], _Job] = {}
        self._waiters: dict[int, concurrent.futures.Future] = {}
        self._finished: dict[int, tuple[float, ReceivedJob | Exception]] = {}
        self._closed = False
        self.datagrams_sent = 0
        self.datagrams_dropped = 0
        self.datagrams_received = 0
        self._thread = threading.Thread(target=self._run, name=f"atp-exchange-{self.address[1]}", daemon=True)
        self._thread.start()

    # -- public API (any thread) ------------------------------------------------------------------------

    def send(self, dest: Address, job: JobSpec) -> concurrent.futures.Future:
        """Start sending ``job`` to the exchange (or ATP receiver) at ``dest`` in that peer's session; resolves
        to the job's SendSummary once the receiver's DONE confirms it (or ``fin_timeout_s`` after the job
        completed without one). R_max ``None``: the rate of the link towards ``dest`` (hostlib/link.py)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        dest = (str(dest[0]), int(dest[1]))
        key = (job.job_id, dest)

        def start(now: float) -> None:
            if key in self._jobs:
                fut.set_exception(ExchangeError(f"job {job.job_id} to {dest[0]}:{dest[1]} is already being sent"))
                return
            session = self.sessions.get(dest)
            if session is None:
                session = self.sessions[dest] = PeerSession(dest)
            try:
                config, _ = link.resolve_rate(session.job_config(self.config, self.queue_share), dest)
                sender = core.AtpSender(job, config=config, peer=dest, now=now, message_events=False,
                                        address_token=session.address_token)
            except ConfigError as err:
                fut.set_exception(err)
                return
            session.active += 1
            session.jobs += 1
            self._jobs[key] = _Job(sender, fut, session)

        self._submit(start, fut)
        return fut

    def receive(self, job_id: int) -> concurrent.futures.Future:
        """A future for the job ``job_id`` arriving at this exchange (already finished or still to come); it
        resolves at the sender's FIN."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def claim(now: float) -> None:
            done = self._finished.pop(job_id, None)
            if done is not None:
                _resolve(fut, done[1])
            elif job_id in self._waiters:
                fut.set_exception(ExchangeError(f"job {job_id} is already awaited"))
            else:
                self._waiters[job_id] = fut

        self._submit(claim, fut)
        return fut

    def reset_peer(self, dest: Address) -> concurrent.futures.Future:
        """Forget the peer at ``dest`` (it restarted or left): jobs to it fail now, its session starts over.
        Resolves to the number of jobs failed."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        dest = (str(dest[0]), int(dest[1]))

        def reset(now: float) -> None:
            failed = 0
            for key in [k for k in self._jobs if k[1] == dest]:
                job = self._jobs.pop(key)
                failed += 1
                if not job.future.done():
                    job.future.set_exception(ExchangeError(f"job {key[0]}: the session with {dest[0]}:{dest[1]} "
                                                           "was reset"))
            old = self.sessions.pop(dest, None)
            if old is not None:
                self.sessions[dest] = PeerSession(dest, resets=old.resets + 1)
            fut.set_result(failed)

        self._submit(reset, fut)
        return fut

    def session_stats(self) -> dict[str, dict[str, Any]]:
        """Per peer (``host:port``), what its session counted (a snapshot; any thread)."""
        return {f"{a[0]}:{a[1]}": s.as_dict() for a, s in list(self.sessions.items())}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        self._thread.join(5.0)
        for s in (self.rx, self.tx, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self) -> "AtpExchange":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the I/O thread -----------------------------------------------------------------------------------

    def _submit(self, command: Callable[[float], None], fut: concurrent.futures.Future) -> None:
        with self._lock:
            if self._closed:
                fut.set_exception(ExchangeError("the ATP exchange is closed"))
                return
            self._commands.append((command, fut))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run(self) -> None:
        try:
            with core.precise_timers(self.native):
                self._loop()
        except BaseException as exc:  # report to every waiting caller, never die silently
            log.exception("ATP exchange stopped")
            self._fail_all(ExchangeError(f"the ATP exchange thread stopped: {exc!r}"))
            raise
        self._fail_all(ExchangeError("the ATP exchange is closed"))

    def _fail_all(self, err: Exception) -> None:
        with self._lock:
            self._closed = True
            commands = list(self._commands)
            self._commands.clear()
        for _command, fut in commands:
            if not fut.done():
                fut.set_exception(err)
        for job in self._jobs.values():
            if not job.future.done():
                job.future.set_exception(err)
        self._jobs.clear()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self._waiters.clear()

    def _loop(self) -> None:
        rx = self._receiver
        while True:
            with self._lock:
                if self._closed:
                    return
                commands = list(self._commands)
                self._commands.clear()
            now = self.clock()
            for command, fut in commands:
                try:
                    command(now)
                except Exception as exc:  # a command's own failure goes to its caller
                    if not fut.done():
                        fut.set_exception(exc)
            for key in list(self._jobs):
                self._pump(key, now)
            self._send_receiver(now)
            self._drain_receiver(now)
            if self._wake_r in wait([self.rx, self.tx, self._wake_r], self._next_timer(), self.clock,
                                    cap=_LONGEST_WAIT_S):
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
            now = self.clock()
            self._read(now)
            now = self.clock()
            for job in list(self._jobs.values()):
                t = job.sender.get_timer()
                if t is not None and t <= now:
                    job.sender.handle_timer(now)
            t = rx.get_timer()
            if t is not None and t <= now:
                rx.handle_timer(now)
            self._expire_unclaimed(now)

    def _pump(self, key: tuple[int, Address], now: float) -> None:
        job = self._jobs[key]
        sender = job.sender
        if self.native:
            self.datagrams_sent += sender.transmit(self._tx_fd, now)
        else:
            self._transmit(self.tx, sender.datagrams_to_send(now))
        while (ev := sender.next_event()) is not None:
            if isinstance(ev, events.ReportReady):
                self._transmit(self.tx, self.reports.datagrams(ev))
            elif isinstance(ev, (events.JobCompleted, events.JobFailed)):
                self._jobs.pop(key, None)
                self._settle(job, ev, key)

    def _settle(self, job: _Job, ev: Any, key: tuple[int, Address]) -> None:
        s = job.session
        s.active = max(0, s.active - 1)
        if job.sender.new_token is not None:
            s.address_token = job.sender.new_token
        if isinstance(ev, events.JobCompleted):
            s.completed += 1
            s.zero_rtt_jobs += not job.retried
            if ev.summary.srtt_s > 0:
                s.srtt_s = ev.summary.srtt_s
            w = getattr(job.sender, "window", None)
            if w is not None:
                s.window = float(w.window)
            if not job.future.done():
                job.future.set_result(ev.summary)
        else:
            s.failed += 1
            if not job.future.done():
                job_id, (host, port) = key
                job.future.set_exception(ExchangeError(f"job {job_id} to {host}:{port}: {ev.reason}"))

    def _send_receiver(self, now: float) -> None:
        if self.native:
            self.datagrams_sent += self._receiver.transmit(self._rx_fd, now)
        else:
            self._transmit(self.rx, self._receiver.datagrams_to_send(now))

    def _drain_receiver(self, now: float) -> None:
        rx = self._receiver
        while (ev := rx.next_event()) is not None:
            if isinstance(ev, events.JobFinished):
                r = ev.result
                self._finish(r.job_id, ReceivedJob(job_id=r.job_id, peer=r.peer, total=r.total,
                                                   vector_len=r.vector_len, groups=r.groups, lost_ids=r.lost_ids,
                                                   messages=rx.take_messages(r.job_id)), now)
            elif isinstance(ev, events.JobAbandoned):
                rx.take_messages(ev.job_id)
                why = (f"went silent for {rx.config.idle_timeout_s:g} s" if ev.reason == "idle" else
                       f"lost its job slot to a new job ({ev.reason})")
                self._finish(ev.job_id, ExchangeError(
                    f"job {ev.job_id} {why} before its FIN ({ev.delivered} messages delivered)"), now)
            elif isinstance(ev, events.JobRejected):
                rx.take_messages(ev.job_id)
                self._finish(ev.job_id, ExchangeError(f"job {ev.job_id} rejected: {ev.reason}"), now)
        self._send_receiver(now)  # the DONEs these events came with

    def _finish(self, job_id: int, outcome: "ReceivedJob | Exception", now: float) -> None:
        fut = self._waiters.pop(job_id, None)
        if fut is not None:
            _resolve(fut, outcome)
        else:
            self._finished[job_id] = (now, outcome)

    def _expire_unclaimed(self, now: float) -> None:
        if self._finished:
            for job_id in [j for j, (t, _o) in self._finished.items() if now - t > _KEEP_UNCLAIMED_S]:
                del self._finished[job_id]

    def _next_timer(self) -> float | None:
        times = [t for t in (j.sender.get_timer() for j in self._jobs.values()) if t is not None]
        t = self._receiver.get_timer()
        if t is not None:
            times.append(t)
        return min(times) if times else None

    def _read(self, now: float) -> None:
        if self.native:
            self.datagrams_received += self._receiver.receive_from(self._rx_fd, now)
            for data, addr, _ce in core._native.recv_batch(self._tx_fd, 4):
                self._to_sender(data, addr, now)
            return
        rx = self._receiver

        def to_receiver(data: bytes, addr: Any) -> None:
            self.datagrams_received += 1
            rx.receive_datagram(data, addr, now)

        recv_all(self.rx, to_receiver)
        recv_all(self.tx, lambda data, addr: self._to_sender(data, addr, now))

    def _to_sender(self, data: bytes, addr: Any, now: float) -> None:
        """An ACK, GRANT, DONE or RETRY to the sender of its job id and peer; anything else is ignored here."""
        self.datagrams_received += 1
        if len(data) < wire.HEADER_LEN:
            return
        (job_id,) = _JOB_ID.unpack_from(data, _JOB_ID_AT)
        job = self._jobs.get((job_id, addr[:2]))
        if job is None:
            return
        if data[0] & 0x0F == wire.PacketType.RETRY and not job.retried:
            job.retried = True
            job.session.retries += 1
        job.sender.receive_datagram(data, addr, now)

    def _transmit(self, sock: socket.socket, datagrams) -> None:
        if self.loss:
            kept = []
            for d in datagrams:
                if self._rng.random() < self.loss:
                    self.datagrams_dropped += 1
                else:
                    kept.append(d)
            datagrams = kept
        self.datagrams_sent += send_all(sock, datagrams)


def _resolve(fut: concurrent.futures.Future, outcome: "ReceivedJob | Exception") -> None:
    if fut.done():
        return
    if isinstance(outcome, Exception):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
