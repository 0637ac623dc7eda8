"""Blocking API for scripts: ``send_job`` and ``receive_job`` over UDP sockets.

The socket loop runs in the calling thread and waits with ``select.select``, whose timeout has microsecond
resolution (asyncio's epoll wait rounds to milliseconds), with the thread's timer slack at 1 ns while a sender
runs (``core.precise_timers``). The cores come from ``hostlib.core``: with the native ones the loop itself runs
in C (``run``) and datagrams go between the socket and the state machine batched (``transmit``/``receive_from``:
UDP GSO and GRO, sendmmsg/recvmmsg); with the reference, through the socket module one datagram at a time.
Measured numbers: docs/hostlib.md.
"""
from __future__ import annotations

import array
import collections
import dataclasses
import errno
import json
import os
import threading
import time
from typing import Any, Callable, Sequence

from netapprox.hostlib import core, events, link, wire
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.errors import (  # noqa: F401 - hostlib's errors, importable from here too
    AtpError,
    BindError,
    JobAbandonedError,
    JobFailedError,
    JobRejectedError,
    PeerUnreachableError,
    ReceiveTimeout,
)
from netapprox.hostlib.receiver import AtpReceiver, GroupResult, JobResult
from netapprox.hostlib.sender import SendSummary
from netapprox.hostlib.reporting import ReportSink, report_addresses  # noqa: F401 - report_addresses: here too
from netapprox.hostlib.udp import Address, SocketIO, open_socket, parse_address, wait  # noqa: F401 - parse_address too
from netapprox.hostlib.vector import assemble

_RUN_SLICE_S = 0.5  # longest a native core's run() keeps the loop in C without an event


SUMMARY_LIST_MAX = 4096
"""Id lists and ranges a summary (``ReceiveResult.as_dict``, ``atp-recv --json``) writes out at most."""


@dataclasses.dataclass(frozen=True)
class ReceiveResult:
    """One job as the receiver saw it: every delivered message, and the ids of the lost ones."""

    job_id: int
    peer: Any
    total: int
    lost_id_ranges: tuple[tuple[int, int], ...]
    """The message ids not delivered, as ascending ranges ``(first, end)`` (at most one more range than
    messages delivered, whatever N the job declared)."""
    groups: tuple[GroupResult, ...]
    messages: dict[int, bytes]
    vector_len: int | None
    elapsed_s: float
    """First packet to FIN."""
    packets: int
    duplicates: int
    malformed: dict[str, int]
    """Receiver-wide (all jobs so far): datagrams that were not well-formed ATP, by reason."""
    dropped: dict[str, int]
    """Receiver-wide: well-formed datagrams dropped unacknowledged, by reason (docs/hostlib.md)."""
    admission: dict[str, int] = dataclasses.field(default_factory=dict)
    """Receiver-wide: RETRYs sent, jobs admitted, jobs that lost their slot (``AtpReceiver.admission``)."""
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    """Receiver memory: ``used``, ``peak`` and ``budget`` bytes (``AtpReceiver.memory``)."""
    grants: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Receiver-wide, when it grants: ``budget`` (packets in flight towards it over all its jobs:
    ``AtpConfig.grant_window_packets``, or one bandwidth-delay product at its ``max_rate_bps`` and
    ``initial_rtt_s``, or, not told its rate, at the rate its DATA arrives: 0 before the first estimate) and
    ``rate_bps`` (that rate; ``None`` before the estimate or with a fixed budget); empty when it does not."""

    @property
    def delivered(self) -> int:
        return len(self.messages)

    @property
    def lost(self) -> int:
        return sum(end - first for first, end in self.lost_id_ranges)

    @property
    def lost_ids(self) -> tuple[int, ...]:
        """Every lost id (``lost`` of them: prefer ``lost_id_ranges`` when N may be large)."""
        return tuple(wire.range_ids(self.lost_id_ranges))

    @property
    def vector(self) -> array.array | None:
        """Float-vector jobs: the vector with lost ranges zero-filled (``None`` for other jobs)."""
        if self.vector_len is None:
            return None
        return assemble(self.vector_len, self.messages.values())[0]

    @property
    def lost_ranges(self) -> list[tuple[int, int]]:
        """Float-vector jobs: the missing index ranges, ``(start, stop)`` half-open."""
        if self.vector_len is None:
            return []
        return assemble(self.vector_len, self.messages.values())[1]

    def as_dict(self, max_list: int = SUMMARY_LIST_MAX) -> dict[str, Any]:
        """A summary of bounded size: ``lost_ids`` only when at most ``max_list`` messages were lost,
        ``lost_id_ranges`` (the first ``max_list`` ranges; ``lost_id_ranges_truncated`` says when there are more)."""
        lost = self.lost
        d: dict[str, Any] = {
            "job_id": self.job_id, "peer": list(self.peer) if isinstance(self.peer, tuple) else self.peer,
            "total": self.total, "delivered": self.delivered, "lost": lost,
            "lost_id_ranges": [list(r) for r in self.lost_id_ranges[:max_list]],
            "elapsed_s": round(self.elapsed_s, 6), "packets": self.packets,
            "duplicates": self.duplicates, "malformed": dict(self.malformed), "dropped": dict(self.dropped),
            "admission": dict(self.admission), "memory": dict(self.memory), "grants": dict(self.grants),
            "groups": [{"group_id": g.group_id, "msr": g.msr, "total": g.total, "delivered": g.delivered,
                        "lost": g.lost, "measured_loss": round(g.lost / g.total, 6) if g.total else 0.0}
                       for g in self.groups],
        }
        if len(self.lost_id_ranges) > max_list:
            d["lost_id_ranges_truncated"] = True
        if lost <= max_list:
            d["lost_ids"] = list(self.lost_ids)
        if self.vector_len is not None:
            ranges = self.lost_ranges
            d["vector_len"] = self.vector_len
            d["lost_ranges"] = [list(r) for r in ranges[:max_list]]
            if len(ranges) > max_list:
                d["lost_ranges_truncated"] = True
        return d


class TimelineWriter:
    """The sender's timeline: each ``EpochEnded.as_dict()`` as a JSON line to a path, a text file or a callable
    (``timeline`` of ``send_job``; ``None``: nowhere)."""

    def __init__(self, timeline: Any) -> None:
        self._own = None
        self._write: Callable[[dict], None] | None = None
        if timeline is None:
            return
        if callable(timeline):
            self._write = timeline
        elif hasattr(timeline, "write"):
            self._write = lambda d: timeline.write(json.dumps(d) + "\n")
        else:
            self._own = open(os.fspath(timeline), "w", encoding="utf-8", buffering=1)  # others tail it live
            own = self._own
            self._write = lambda d: own.write(json.dumps(d) + "\n")

    def __call__(self, line: dict) -> None:
        if self._write is not None:
            self._write(line)

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


def send_job(dest: "str | Address", job: JobSpec, *, config: AtpConfig = AtpConfig(),
             report_to: "str | Address | Sequence[str | Address] | None" = None, timeline: Any = None,
             bind: "str | Address | None" = None,
             timeout: float | None = None, on_event: Callable[[events.Event], None] | None = None,
             on_step: Callable[[float, Any], None] | None = None,
             clock: Callable[[], float] = time.monotonic) -> SendSummary:
    """Send ``job`` to the ATP receiver at ``dest`` and return the summary once the job is closed.

    ``report_to``: controller address for per-epoch REPORTs, or a list of them, all of one address family
    (each gets every REPORT; port 7601 if omitted; signed with ``config.report_key``). ``timeline``: a path, a
    text file or a callable; gets one JSON object per epoch per group (:meth:`hostlib.events.EpochEnded.as_dict`).
    ``bind``: local address for the data socket. ``timeout``: overall limit in seconds. ``on_step(now, sender)``:
    called with the sender core after every pass of the loop whose events were handled, while the job runs (the
    owner may change the live job there, ``AtpSender.set_msr``: the analytics job's MSR follows its running
    estimate). Raises :class:`JobFailedError` when the sender gives up.
    """
    dest_addr = parse_address(dest)
    sock, peer = open_socket(dest_addr, bind=False)
    reports = ReportSink(report_to, config.report_key)
    writer = TimelineWriter(timeline)
    sender = presented = None
    try:
        if bind is not None:
            local = parse_address(bind, 0, any_port=True)
            try:
                sock.bind(local)
            except OSError as err:
                raise BindError(f"cannot bind UDP {local[0]}:{local[1]}: {err.strerror}") from None
        try:  # connected: an ICMP port unreachable from the destination is reported to us (PeerUnreachableError)
            sock.connect(peer)
        except OSError as err:
            raise AtpError(f"cannot reach UDP {dest_addr[0]}:{dest_addr[1]}: {err.strerror}") from None
        reports.open()
        start = clock()
        deadline = None if timeout is None else start + timeout
        config, _ = link.resolve_rate(config, peer)
        presented = ADDRESS_TOKENS.get(peer)
        sender = core.AtpSender(job, config=config, peer=peer, now=start, message_events=on_event is not None,
                                address_token=presented)
        io = SocketIO(sock, sender)
        in_c = io.native and clock is time.monotonic  # the native core runs this loop itself (sender.run)
        with core.precise_timers(io.native):
            while True:
                now = clock()
                if in_c:
                    sender.run(io.fd, now + _RUN_SLICE_S if deadline is None else min(now + _RUN_SLICE_S, deadline))
                    now = clock()
                else:
                    io.send(now)
                while (ev := sender.next_event()) is not None:
                    reports.send(ev)  # a REPORT, to each controller; any other event: nothing
                    if isinstance(ev, events.EpochEnded):
                        writer(ev.as_dict())
                    elif isinstance(ev, events.JobFailed):
                        raise JobFailedError(f"job {job.job_id} to {dest_addr[0]}:{dest_addr[1]}: {ev.reason}")
                    if on_event is not None:
                        on_event(ev)
                if sender.summary is not None:
                    return sender.summary
                if on_step is not None:
                    on_step(now, sender)
                if io.refused and not sender.recovery.has_rtt_sample:
                    # nothing was ever acknowledged and the destination says no one listens: fail now, not
                    # after --idle-timeout (a refusal after the receiver answered is a lost datagram, as before)
                    raise PeerUnreachableError(f"cannot reach UDP {dest_addr[0]}:{dest_addr[1]}: "
                                               f"{os.strerror(errno.ECONNREFUSED)} (ICMP port unreachable)")
                if deadline is not None and now >= deadline:
                    raise JobFailedError(f"job {job.job_id} not finished after {timeout:g} s (timeout)")
                if in_c:
                    continue
                timer = sender.get_timer()
                if deadline is not None:
                    timer = deadline if timer is None else min(timer, deadline)
                wait([sock], timer, clock, cap=0.5)
                now = clock()
                if io.receive(now):
                    timer = sender.get_timer()
                if timer is not None and timer <= now:
                    sender.handle_timer(now)
    finally:
        if sender is not None:
            ADDRESS_TOKENS.update(peer, presented, sender)
        writer.close()
        sock.close()
        reports.close()


class AddressTokenStore:
    """The address-validation tokens this process was given (NEW_TOKEN), one per receiver address (the newest), so
    that its next job to that receiver is admitted at once even under pressure (QUIC clients keep NEW_TOKEN tokens
    the same way). At most ``limit`` receivers, the least recently used forgotten first; thread-safe."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._tokens: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, peer: Address) -> bytes | None:
        with self._lock:
            key = tuple(peer[:2])
            token = self._tokens.get(key)
            if token is not None:
                self._tokens.move_to_end(key)
            return token

    def update(self, peer: Address, presented: bytes | None, sender: Any) -> None:
        """After a job to ``peer`` that presented ``presented``: keep the token its NEW_TOKEN carried, or forget the
        one presented if the receiver refused it (it answered with a RETRY and gave no new one)."""
        key = tuple(peer[:2])
        with self._lock:
            if sender.new_token is not None:
                self._tokens[key] = sender.new_token
                self._tokens.move_to_end(key)
                while len(self._tokens) > self.limit:
                    self._tokens.popitem(last=False)
            elif presented is not None and sender.retries_received and self._tokens.get(key) == presented:
                del self._tokens[key]

    def clear(self) -> None:
        with self._lock:
            self._tokens.clear()


ADDRESS_TOKENS = AddressTokenStore()
"""This process's address-validation tokens (``send_job`` and ``aio.send_job_async`` use and refresh them)."""


class ReceiverEndpoint:
    """A bound ATP receiver socket plus its sans-I/O core; ``serve`` runs it until told to stop."""

    def __init__(self, bind: "str | Address | int", *, config: AtpConfig = AtpConfig(),
                 accept_jobs: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.address = parse_address(bind)
        self.sock, self.bound = open_socket(self.address, bind=True)
        self.bound = self.sock.getsockname()[:2]
        self.clock = clock
        self.config = config
        self.core = core.AtpReceiver(config=config, now=clock(), accept_jobs=accept_jobs)
        self._messages: dict[int, dict[int, bytes]] = {}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "ReceiverEndpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _result(self, r: JobResult) -> ReceiveResult:
        msgs = self._messages.pop(r.job_id, {})
        msgs.update(self.core.take_messages(r.job_id))
        return receive_result(r, msgs, self.core)

    def serve(self, *, jobs: int | None = None, timeout: float | None = None, linger_s: float = 0.2,
              on_job: Callable[[ReceiveResult], None] | None = None,
              on_message: Callable[[events.MessageReceived], None] | None = None,
              on_event: Callable[[events.Event], None] | None = None) -> list[ReceiveResult]:
        """Serve until ``jobs`` jobs finished (``None``: until ``timeout``), then keep answering
        repeated FINs for ``linger_s``. Raises :class:`ReceiveTimeout` if ``timeout`` passes first
        while ``jobs`` is set; abandoned jobs raise :class:`JobAbandonedError` when ``jobs`` is set.
        Returns the finished jobs; with ``jobs=None`` and an ``on_job`` callback they are handed to it
        and not kept (a long-running server would otherwise hold every job it ever received)."""
        rx = self.core
        rx.collect_messages = on_message is None  # whole messages without an event each
        io = SocketIO(self.sock, rx, ecn=True)
        in_c = io.native and self.clock is time.monotonic  # the native core runs the socket loop (rx.run)
        results: list[ReceiveResult] = []
        start = self.clock()
        deadline = None if timeout is None else start + timeout
        linger_until: float | None = None
        finished = 0
        while True:
            now = self.clock()
            if in_c:
                limit = now + _RUN_SLICE_S
                for t in (deadline, linger_until):
                    if t is not None:
                        limit = min(limit, t)
                rx.run(io.fd, limit)
                now = self.clock()
            else:
                io.send(now)
            while (ev := rx.next_event()) is not None:
                if isinstance(ev, events.MessageReceived):
                    if on_message is not None:
                        on_message(ev)
                    else:
                        self._messages.setdefault(ev.job_id, {})[ev.msg_id] = ev.data
                elif isinstance(ev, events.JobFinished):
                    res = self._result(ev.result)
                    finished += 1
                    if jobs is not None or on_job is None:
                        results.append(res)
                    if on_job is not None:
                        on_job(res)
                elif isinstance(ev, events.JobRejected):
                    self._messages.pop(ev.job_id, None)
                    rx.take_messages(ev.job_id)
                    if jobs is not None:
                        raise _with_partial(JobRejectedError(f"job {ev.job_id} rejected: {ev.reason}"), results)
                elif isinstance(ev, events.JobAbandoned):
                    self._messages.pop(ev.job_id, None)
                    rx.take_messages(ev.job_id)
                    if jobs is not None:
                        why = (f"went silent for {self.config.idle_timeout_s:g} s" if ev.reason == "idle" else
                               f"lost its job slot to a new job ({ev.reason})")
                        raise _with_partial(JobAbandonedError(
                            f"job {ev.job_id} {why} before finishing ({ev.delivered} messages delivered)"), results)
                if on_event is not None:
                    on_event(ev)
            if jobs is not None and finished >= jobs and linger_until is None:
                rx.accept_jobs = rx.jobs_seen  # take no new job while lingering
                linger_until = now + linger_s
            if linger_until is not None and now >= linger_until:
                return results
            if deadline is not None and now >= deadline:
                if jobs is not None and len(results) < jobs:
                    raise _with_partial(ReceiveTimeout(
                        f"{len(results)} of {jobs} job(s) finished on {self.bound[0]}:{self.bound[1]} within "
                        f"{timeout:g} s ({rx.datagrams} datagrams received)"), results)
                return results
            if in_c:
                continue
            timer = rx.get_timer()
            for t in (deadline, linger_until):
                if t is not None:
                    timer = t if timer is None else min(timer, t)
            wait([self.sock], timer, self.clock, cap=0.5)
            now = self.clock()
            io.receive(now)
            t = rx.get_timer()
            if t is not None and t <= self.clock():
                rx.handle_timer(self.clock())


def receive_result(r: JobResult, messages: dict[int, bytes], core: AtpReceiver) -> ReceiveResult:
    """A finished job's :class:`ReceiveResult`, with the receiver's counters as they stand."""
    return ReceiveResult(
        job_id=r.job_id, peer=r.peer, total=r.total, lost_id_ranges=r.lost_ranges, groups=r.groups, messages=messages,
        vector_len=r.vector_len, elapsed_s=r.finished_at - r.first_packet_at, packets=r.packets,
        duplicates=r.duplicates, malformed=dict(core.malformed), dropped=dict(core.dropped),
        admission=dict(core.admission), memory=core.memory.as_dict(),
        grants={"budget": core.grant_budget, "rate_bps": core.grant_rate_bps} if core.config.receiver_grants else {})


def _with_partial(err: AtpError, results: list[ReceiveResult]) -> AtpError:
    err.partial = list(results)
    return err


def receive_job(bind: "str | Address | int", *, timeout: float | None, config: AtpConfig = AtpConfig(),
                linger_s: float = 0.2) -> ReceiveResult:
    """Serve exactly one job on ``bind`` and return it (packets of other jobs are not acknowledged)."""
    with ReceiverEndpoint(bind, config=config, accept_jobs=1) as ep:
        return ep.serve(jobs=1, timeout=timeout, linger_s=linger_s)[0]


def receive_jobs(bind: "str | Address | int", *, count: int, timeout: float | None,
                 config: AtpConfig = AtpConfig(), linger_s: float = 0.2) -> list[ReceiveResult]:
    """Serve ``count`` jobs, concurrently if they overlap, on one socket; results in finishing order."""
    with ReceiverEndpoint(bind, config=config, accept_jobs=count) as ep:
        return ep.serve(jobs=count, timeout=timeout, linger_s=linger_s)
