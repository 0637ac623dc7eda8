"""asyncio adapter: drives a sans-I/O core (AtpSender or AtpReceiver) from an asyncio datagram endpoint.

asyncio's event loop waits in epoll with a millisecond timeout, so a timer-driven sender wakes at most
about once per millisecond and, with bursts capped at two packets, tops out near 2 packets/ms (~25 Mbit/s
at 1400 B). :func:`send_job_async` therefore runs the blocking, microsecond-paced loop of
:func:`hostlib.api.send_job` in a worker thread by default (``precise=True``); ``precise=False`` keeps
everything on the event loop for low rates. Receivers never pace, so :func:`receive_job_async` runs on
the loop.

With the native cores (hostlib/core.py) the loop watches a plain UDP socket (``add_reader``) and the datagrams
move between it and the core in C, batched (:class:`AtpSocket`: ``receive_from``/``transmit``, GSO/GRO,
sendmmsg/recvmmsg); the receiver then keeps whole messages in the core (``collect_messages``). Any other core
runs on an asyncio datagram transport (:class:`AtpProtocol`).
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable, Sequence

from netapprox.hostlib import api, core, events, link
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.reporting import ReportSink
from netapprox.hostlib.errors import JobAbandonedError, JobFailedError, JobRejectedError, ReceiveTimeout
from netapprox.hostlib.sender import SendSummary
from netapprox.hostlib.udp import open_socket, send_all


def rearm(loop: asyncio.AbstractEventLoop, timer: asyncio.TimerHandle | None, timer_at: float | None,
          at: float | None, callback: Callable[[], None]) -> tuple[asyncio.TimerHandle | None, float | None]:
    """The loop timer for a core's next deadline ``at``: ``(timer, timer_at)`` kept when the deadline did not
    move, else the old one cancelled and a new one set (or none when the core has no deadline)."""
    if at == timer_at:
        return timer, timer_at
    if timer is not None:
        timer.cancel()
    return (None if at is None else loop.call_at(at, callback)), at


class AtpProtocol(asyncio.DatagramProtocol):
    """Feeds datagrams and timer expiries to ``core``; sends what it returns; hands events to ``on_event``."""

    def __init__(self, core: Any, on_event: Callable[[events.Event], None]) -> None:
        self.core = core
        self.on_event = on_event
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.closed = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pump()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.core.receive_datagram(data, addr, self.loop.time())
        self.pump()

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP errors (e.g. port unreachable): ATP treats the datagrams as lost

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.core.handle_timer(self.loop.time())
        self.pump()

    def pump(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        for data, addr in self.core.datagrams_to_send(self.loop.time()):
            self.transport.sendto(data, addr)
        while (ev := self.core.next_event()) is not None:
            self.on_event(ev)
        if self.transport.is_closing():
            return
        self._timer, self._timer_at = rearm(self.loop, self._timer, self._timer_at, self.core.get_timer(),
                                            self._on_timer)


class AtpSocket:
    """Drives a native core from the event loop on a non-blocking UDP socket it owns: the loop calls back when
    the socket is readable (``core.receive_from``) or a timer is due; ``core.transmit`` sends what the core
    allows. ``on_event`` gets the core's events; ``closed`` resolves (or fails) when the socket closes."""

    def __init__(self, core_obj: Any, sock: socket.socket, on_event: Callable[[events.Event], None]) -> None:
        self.core = core_obj
        self.sock = sock
        self.fd = sock.fileno()
        self.on_event = on_event
        self.loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.closed = self.loop.create_future()
        core.enable_gro(sock)
        self.loop.add_reader(self.fd, self._readable)
        self.loop.call_soon(self._guarded, self.pump)

    def _guarded(self, fn: Callable[[], None]) -> None:
        if self.closed.done():
            return
        try:
            fn()
        except Exception as exc:  # an I/O error ends the endpoint; the owner sees it on ``closed``
            self.close(exc)

    def _readable(self) -> None:
        def read() -> None:
            self.core.receive_from(self.fd, self.loop.time())
            self.pump()
        self._guarded(read)

    def _on_timer(self) -> None:
        def fire() -> None:
            self._timer = None
            self._timer_at = None
            self.core.handle_timer(self.loop.time())
            self.pump()
        self._guarded(fire)

    def pump(self) -> None:
        self.core.transmit(self.fd, self.loop.time())
        while (ev := self.core.next_event()) is not None:
            self.on_event(ev)
            if self.closed.done():
                return
        self._timer, self._timer_at = rearm(self.loop, self._timer, self._timer_at, self.core.get_timer(),
                                            self._on_timer)

    def sendto(self, data: bytes, addr: Any) -> None:
        """Send one datagram of the owner's (a REPORT) on the same socket; a full buffer drops it."""
        send_all(self.sock, [(data, addr)])

    def close(self, error: BaseException | None = None) -> None:
        if self.closed.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        self.loop.remove_reader(self.fd)
        self.sock.close()
        if error is None:
            self.closed.set_result(None)
        else:
            self.closed.set_exception(error)


async def send_job_async(dest: "str | api.Address", job: JobSpec, *, config: AtpConfig = AtpConfig(),
                         report_to: "str | api.Address | Sequence[str | api.Address] | None" = None,
                         timeline: Any = None, precise: bool = True) -> SendSummary:
    """Async :func:`hostlib.api.send_job`. ``precise=False`` paces on the event loop (~1 ms resolution)."""
    if precise:
        return await asyncio.to_thread(api.send_job, dest, job, config=config, report_to=report_to,
                                       timeline=timeline)
    loop = asyncio.get_running_loop()
    addr = api.parse_address(dest)
    family, _, _, _, sockaddr = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_DGRAM)[0]
    addr = sockaddr[:2]  # the numeric address answers come from: the sender accepts nothing else
    reports = ReportSink(report_to, config.report_key)
    writer = api.TimelineWriter(timeline)
    result: asyncio.Future[SendSummary] = loop.create_future()
    native = core.is_native(core.AtpSender)
    if native:
        sock, _peer = open_socket(addr, bind=False)
    config, _ = link.resolve_rate(config, addr)
    presented = api.ADDRESS_TOKENS.get(addr)
    sender = core.AtpSender(job, config=config, peer=addr, now=loop.time(), message_events=False,
                            address_token=presented)
    transport: Any = None

    def on_event(ev: events.Event) -> None:
        if isinstance(ev, events.ReportReady):
            if transport is not None:
                for data, target in reports.datagrams(ev):
                    transport.sendto(data, target)
        elif isinstance(ev, events.EpochEnded):
            writer(ev.as_dict())
        elif isinstance(ev, events.JobCompleted) and not result.done():
            result.set_result(ev.summary)
        elif isinstance(ev, events.JobFailed) and not result.done():
            result.set_exception(JobFailedError(f"job {job.job_id}: {ev.reason}"))

    if native:
        transport = AtpSocket(sender, sock, on_event)
        transport.closed.add_done_callback(
            lambda f: f.exception() is not None and not result.done() and result.set_exception(f.exception()))
    else:
        transport, _protocol = await loop.create_datagram_endpoint(lambda: AtpProtocol(sender, on_event),
                                                                   family=family)
    try:
        return await result
    finally:
        api.ADDRESS_TOKENS.update(addr, presented, sender)
        transport.close()
        writer.close()


async def receive_job_async(bind: "str | api.Address | int", *, timeout: float | None,
                            config: AtpConfig = AtpConfig()) -> api.ReceiveResult:
    """Async :func:`hostlib.api.receive_job` on the event loop (serves exactly one job)."""
    loop = asyncio.get_running_loop()
    addr = api.parse_address(bind)
    rx = core.AtpReceiver(config=config, now=loop.time(), accept_jobs=1)
    native = core.is_native(rx)
    rx.collect_messages = native  # whole messages in the core, no event each
    messages: dict[int, bytes] = {}
    result: asyncio.Future[api.ReceiveResult] = loop.create_future()

    def on_event(ev: events.Event) -> None:
        if isinstance(ev, events.MessageReceived):
            messages[ev.msg_id] = ev.data
        elif isinstance(ev, events.JobFinished) and not result.done():
            messages.update(rx.take_messages(ev.result.job_id))
            result.set_result(api.receive_result(ev.result, dict(messages), rx))
        elif isinstance(ev, events.JobRejected) and not result.done():
            result.set_exception(JobRejectedError(f"job {ev.job_id} rejected: {ev.reason}"))
        elif isinstance(ev, events.JobAbandoned) and not result.done():
            result.set_exception(JobAbandonedError(f"job {ev.job_id} went silent before finishing"))

    transport: Any
    if native:
        sock, _bound = open_socket(addr, bind=True)
        transport = AtpSocket(rx, sock, on_event)
        transport.closed.add_done_callback(
            lambda f: f.exception() is not None and not result.done() and result.set_exception(f.exception()))
    else:
        transport, _protocol = await loop.create_datagram_endpoint(
            lambda: AtpProtocol(rx, on_event), local_addr=addr, reuse_port=False)
    try:
        return await asyncio.wait_for(asyncio.shield(result), timeout)
    except asyncio.TimeoutError:
        raise ReceiveTimeout(f"no job finished on {addr[0]}:{addr[1]} within {timeout:g} s") from None
    finally:
        transport.close()
