"""Many ATP jobs at once over one UDP socket: the transport under the DistributedDataParallel hook.

A training worker sends a few jobs per bucket per iteration (one to every peer) and receives as many, all at
the same time. ``AtpExchange`` drives hostlib's sans-I/O cores for all of them from one thread and one socket
(hostlib/api.py runs one job per socket): every ``AtpSender`` it was given plus one ``AtpReceiver`` that
serves every job arriving at the socket. Incoming DATA goes to the receiver; ACK, DONE and RETRY (the
receiver's admission token) go to the sender of their job id. Callers get ``concurrent.futures.Future``s:
:meth:`send` resolves to the job's ``SendSummary``, :meth:`receive` to the :class:`ReceivedJob` with that id
(whenever it arrives, before or after the call).

``loss`` drops that fraction of every datagram this exchange sends (seeded), the injected loss of the tests
and of the loopback experiments; on a real or emulated network it stays 0.

No torch here: tests and tools use it on its own.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import errno
import logging
import random
import select
import socket
import struct
import threading
import time
from typing import Any, Callable

import numpy as np

from netapprox.hostlib import events, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec, Message, Tags
from netapprox.hostlib.core import AtpReceiver, AtpSender  # the native cores when built (hostlib/core.py)
from netapprox.hostlib.receiver import GroupResult
from netapprox.hostlib.sender import SendSummary

log = logging.getLogger(__name__)

Address = tuple[str, int]
_RECV_BATCH = 256
_SHORT_WAIT_S = 0.001
_JOB_ID_AT = wire.OFFSETS["job_id"]
_RANGE = struct.Struct("!II")
_KEEP_UNCLAIMED_S = 120.0


class ExchangeError(RuntimeError):
    """A job could not be sent or received; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class ReceivedJob:
    """One job as this worker's receiver saw it."""

    job_id: int
    peer: Any
    total: int
    vector_len: int | None
    groups: tuple[GroupResult, ...]
    lost_ids: tuple[int, ...]
    messages: dict[int, bytes]
    packets: int = 0
    """DATA packets that arrived (duplicates included)."""
    first_packet_at: float | None = None
    finished_at: float | None = None

    def vector(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The float32 vector of ``length`` values with lost ranges zero-filled, and a boolean mask of the
        values that arrived. Ranges outside ``length`` are ignored."""
        values = np.zeros(length, dtype=np.float32)
        have = np.zeros(length, dtype=bool)
        for payload in self.messages.values():
            if len(payload) < _RANGE.size:
                continue
            first, count = _RANGE.unpack_from(payload)
            if len(payload) != _RANGE.size + 4 * count or first >= length:
                continue
            stop = min(length, first + count)
            values[first:stop] = np.frombuffer(payload, dtype=">f4", count=stop - first, offset=_RANGE.size)
            have[first:stop] = True
        return values, have


def vector_job(job_id: int, values: np.ndarray, *, group_of_segment: np.ndarray | None, group_msr: dict[int, float],
               floats_per_packet: int, tags: Tags | None = None, msr: float = 1.0, rotate: int = 0) -> JobSpec:
    """A float-vector job whose segment ``i`` (``floats_per_packet`` values, one packet) is in group
    ``group_of_segment[i]``; payloads are hostlib's range-indexed float packets
    (``wire.encode_float_range``). Messages are ordered by group, most demanding MSR first, so every group's
    message ids are one contiguous range (a short job announce). ``rotate`` (e.g. the iteration) shifts where
    each group's segments start, so the messages a sender that stops at its MSR leaves unsent are not the same
    values every time."""
    vals = np.ascontiguousarray(values, dtype=np.float32).ravel()
    n = len(vals)
    if n == 0:
        raise ConfigError("a vector job needs at least one value")
    segs = -(-n // floats_per_packet)
    groups = np.zeros(segs, dtype=np.uint16) if group_of_segment is None else np.asarray(group_of_segment)
    if len(groups) != segs:
        raise ConfigError(f"{len(groups)} group ids for {segs} segments")
    big = vals.astype(">f4")
    shift = int(rotate * 0.6180339887 * segs) % segs if rotate else 0
    order = sorted(range(segs), key=lambda s: (-group_msr.get(int(groups[s]), msr), int(groups[s]),
                                               (s - shift) % segs))
    msgs = []
    for s in order:
        lo = s * floats_per_packet
        hi = min(n, lo + floats_per_packet)
        msgs.append(Message(_RANGE.pack(lo, hi - lo) + big[lo:hi].tobytes(), int(groups[s])))
    present = {int(g) for g in np.unique(groups)}
    return JobSpec(job_id=job_id, messages=tuple(msgs), msr=msr,
                   group_msr={g: m for g, m in group_msr.items() if g in present}, tags=tags, vector_len=n)


class _Waiter:
    __slots__ = ("future", "messages")

    def __init__(self) -> None:
        self.future: concurrent.futures.Future | None = None
        self.messages: dict[int, bytes] = {}


class AtpExchange:
    """One UDP socket, one I/O thread, any number of concurrent ATP jobs each way. Close it when done."""

    def __init__(self, bind: Address = ("127.0.0.1", 0), *, config: AtpConfig = AtpConfig(), loss: float = 0.0,
                 seed: int | None = None, report_to: Address | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"injected loss {loss}: must be in [0, 1)")
        self.config = config
        # Many short jobs: finished ones are remembered only long enough to answer a repeated FIN, and the
        # receiver tracks many at once (a few per bucket per peer per iteration), many from one peer host (all
        # of them when the workers share a host), so one host may hold every slot.
        slots = max(config.max_jobs, 4096)
        rx_config = dataclasses.replace(config, max_jobs=slots, max_jobs_per_source=slots,
                                        finished_linger_s=min(config.finished_linger_s, 2.0))
        self.clock = clock
        self.loss = loss
        self._rng = random.Random(seed)
        self.report_to = report_to
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            self.sock.bind(bind)
        except OSError as err:
            self.sock.close()
            raise ExchangeError(f"cannot bind the ATP socket to {bind[0]}:{bind[1]}: {err.strerror}") from None
        self.address: Address = self.sock.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._lock = threading.Lock()
        self._commands: collections.deque[tuple[Callable[[float], None], concurrent.futures.Future]] = \
            collections.deque()
        self._receiver = AtpReceiver(config=rx_config, now=clock())
        self._senders: dict[tuple[int, Address], tuple[AtpSender, concurrent.futures.Future, Address]] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._finished: dict[int, tuple[float, ReceivedJob | Exception]] = {}
        self._closed = False
        self.datagrams_sent = 0
        self.datagrams_dropped = 0
        self.datagrams_received = 0
        self._thread = threading.Thread(target=self._run, name=f"atp-exchange-{self.address[1]}", daemon=True)
        self._thread.start()

    # -- public API (any thread) ------------------------------------------------------------------------

    def send(self, dest: Address, job: JobSpec) -> concurrent.futures.Future:
        """Start sending ``job`` to the exchange (or ATP receiver) at ``dest``; resolves to its SendSummary."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        dest = (str(dest[0]), int(dest[1]))
        key = (job.job_id, dest)

        def start(now: float) -> None:
            if key in self._senders:
                fut.set_exception(ExchangeError(f"job {job.job_id} to {dest[0]}:{dest[1]} is already being sent"))
                return
            try:
                sender = AtpSender(job, config=self.config, peer=dest, now=now)
            except ConfigError as err:
                fut.set_exception(err)
                return
            self._senders[key] = (sender, fut, dest)

        self._submit(start, fut)
        return fut

    def receive(self, job_id: int) -> concurrent.futures.Future:
        """A future for the job ``job_id`` arriving at this exchange (already finished or still to come)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def claim(now: float) -> None:
            done = self._finished.pop(job_id, None)
            if done is not None:
                _resolve(fut, done[1])
                return
            w = self._waiters.setdefault(job_id, _Waiter())
            if w.future is not None:
                fut.set_exception(ExchangeError(f"job {job_id} is already awaited"))
                return
            w.future = fut

        self._submit(claim, fut)
        return fut

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        self._thread.join(5.0)
        self.sock.close()
        self._wake_r.close()
        self._wake_w.close()

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
        for _sender, fut, _dest in self._senders.values():
            if not fut.done():
                fut.set_exception(err)
        self._senders.clear()
        for w in self._waiters.values():
            if w.future is not None and not w.future.done():
                w.future.set_exception(err)
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
            for command, _fut in commands:
                command(now)
            for key in list(self._senders):
                self._pump_sender(key, now)
            self._transmit(rx.datagrams_to_send(now))
            self._drain_receiver(now)
            timer = self._next_timer()
            self._wait(timer)
            now = self.clock()
            self._read(now)
            now = self.clock()
            for sender, _fut, _dest in list(self._senders.values()):
                t = sender.get_timer()
                if t is not None and t <= now:
                    sender.handle_timer(now)
            t = rx.get_timer()
            if t is not None and t <= now:
                rx.handle_timer(now)
            self._expire_unclaimed(now)

    def _pump_sender(self, key: tuple[int, Address], now: float) -> None:
        sender, fut, _dest = self._senders[key]
        job_id = key[0]
        self._transmit(sender.datagrams_to_send(now))
        while (ev := sender.next_event()) is not None:
            if isinstance(ev, events.ReportReady) and self.report_to is not None:
                self._transmit([(ev.report.encode(self.config.report_key), self.report_to)])
            elif isinstance(ev, events.JobCompleted):
                self._senders.pop(key, None)
                if not fut.done():
                    fut.set_result(ev.summary)
            elif isinstance(ev, events.JobFailed):
                self._senders.pop(key, None)
                if not fut.done():
                    fut.set_exception(ExchangeError(f"job {job_id}: {ev.reason}"))

    def _drain_receiver(self, now: float) -> None:
        rx = self._receiver
        self._transmit(rx.datagrams_to_send(now))
        while (ev := rx.next_event()) is not None:
            if isinstance(ev, events.MessageReceived):
                self._waiters.setdefault(ev.job_id, _Waiter()).messages[ev.msg_id] = ev.data
            elif isinstance(ev, events.JobFinished):
                r = ev.result
                w = self._waiters.pop(r.job_id, None) or _Waiter()
                self._finish(r.job_id, ReceivedJob(job_id=r.job_id, peer=r.peer, total=r.total,
                                                   vector_len=r.vector_len, groups=r.groups, lost_ids=r.lost_ids,
                                                   messages=w.messages), w, now)
            elif isinstance(ev, events.JobAbandoned):
                w = self._waiters.pop(ev.job_id, None) or _Waiter()
                why = (f"went silent for {self._receiver.config.idle_timeout_s:g} s" if ev.reason == "idle" else
                       f"lost its job slot to a new job ({ev.reason})")
                self._finish(ev.job_id, ExchangeError(
                    f"job {ev.job_id} {why} before its FIN ({ev.delivered} messages delivered)"), w, now)
            elif isinstance(ev, events.JobRejected):
                w = self._waiters.pop(ev.job_id, None) or _Waiter()
                self._finish(ev.job_id, ExchangeError(f"job {ev.job_id} rejected: {ev.reason}"), w, now)

    def _finish(self, job_id: int, outcome: "ReceivedJob | Exception", w: _Waiter, now: float) -> None:
        if w.future is not None:
            _resolve(w.future, outcome)
        else:
            self._finished[job_id] = (now, outcome)

    def _expire_unclaimed(self, now: float) -> None:
        if self._finished:
            for job_id in [j for j, (t, _o) in self._finished.items() if now - t > _KEEP_UNCLAIMED_S]:
                del self._finished[job_id]

    def _next_timer(self) -> float | None:
        times = [t for t in (s.get_timer() for s, _f, _d in self._senders.values()) if t is not None]
        t = self._receiver.get_timer()
        if t is not None:
            times.append(t)
        return min(times) if times else None

    def _wait(self, until: float | None) -> None:
        timeout = 0.5 if until is None else min(0.5, until - self.clock())
        if timeout <= 0:
            return
        if timeout <= _SHORT_WAIT_S:
            time.sleep(timeout)
            return
        r, _w, _x = select.select([self.sock, self._wake_r], [], [], timeout)
        if self._wake_r in r:
            try:
                while self._wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

    def _read(self, now: float) -> None:
        rx = self._receiver
        for _ in range(_RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                continue
            self.datagrams_received += 1
            if len(data) < wire.HEADER_LEN:
                rx.receive_datagram(data, addr, now)  # counted as malformed there
                continue
            ptype = data[0] & 0x0F
            if ptype == wire.PacketType.DATA:
                rx.receive_datagram(data, addr, now)
            elif ptype in (wire.PacketType.ACK, wire.PacketType.DONE, wire.PacketType.RETRY):
                (job_id,) = struct.unpack_from("!I", data, _JOB_ID_AT)
                entry = self._senders.get((job_id, addr[:2]))
                if entry is not None:
                    entry[0].receive_datagram(data, addr, now)

    def _transmit(self, datagrams) -> None:
        for data, addr in datagrams:
            if self.loss and self._rng.random() < self.loss:
                self.datagrams_dropped += 1
                continue
            try:
                self.sock.sendto(data, addr)
                self.datagrams_sent += 1
            except (BlockingIOError, ConnectionRefusedError):
                pass
            except OSError as err:
                if err.errno not in (errno.ENOBUFS, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPERM):
                    raise


def _resolve(fut: concurrent.futures.Future, outcome: "ReceivedJob | Exception") -> None:
    if fut.done():
        return
    if isinstance(outcome, Exception):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


def summary_group_loss(summary: SendSummary) -> dict[int, dict[str, float]]:
    """Per group of a finished job: MSR, messages, lost, and whether the loss stayed within 1 - MSR."""
    return {g.group_id: {"msr": g.msr, "total": g.total, "lost": g.lost, "within_bound": g.lost <= g.total - g.required}
            for g in summary.groups}
