"""asyncio adapter: drives a sans-I/O core (AtpSender or AtpReceiver) from an asyncio datagram endpoint.

asyncio's event loop waits in epoll with a millisecond timeout, so a timer-driven sender wakes at most
about once per millisecond and, with bursts capped at two packets, tops out near 2 packets/ms (~25 Mbit/s
at 1400 B). :func:`send_job_async` therefore runs the blocking, microsecond-paced loop of
:func:`hostlib.api.send_job` in a worker thread by default (``precise=True``); ``precise=False`` keeps
everything on the event loop for low rates. Receivers never pace, so :func:`receive_job_async` runs on
the loop.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable

from netapprox.hostlib import api, events, wire
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.receiver import AtpReceiver
from netapprox.hostlib.sender import AtpSender, SendSummary


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
        at = self.core.get_timer()
        if at != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None if at is None else self.loop.call_at(at, self._on_timer)
            self._timer_at = at


async def send_job_async(dest: "str | api.Address", job: JobSpec, *, config: AtpConfig = AtpConfig(),
                         report_to: "str | api.Address | None" = None, timeline: Any = None,
                         precise: bool = True) -> SendSummary:
    """Async :func:`hostlib.api.send_job`. ``precise=False`` paces on the event loop (~1 ms resolution)."""
    if precise:
        return await asyncio.to_thread(api.send_job, dest, job, config=config, report_to=report_to,
                                       timeline=timeline)
    loop = asyncio.get_running_loop()
    addr = api.parse_address(dest)
    family, _, _, _, sockaddr = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_DGRAM)[0]
    addr = sockaddr[:2]  # the numeric address answers come from: the sender accepts nothing else
    report_addr = None if report_to is None else api.parse_address(report_to, wire.DEFAULT_REPORT_PORT)
    writer = api._TimelineWriter(timeline)
    result: asyncio.Future[SendSummary] = loop.create_future()
    sender = AtpSender(job, config=config, peer=addr, now=loop.time())
    transport = None

    def on_event(ev: events.Event) -> None:
        if isinstance(ev, events.ReportReady) and report_addr is not None and transport is not None:
            transport.sendto(ev.report.encode(config.report_key), report_addr)
        elif isinstance(ev, events.EpochEnded):
            writer(ev.as_dict())
        elif isinstance(ev, events.JobCompleted) and not result.done():
            result.set_result(ev.summary)
        elif isinstance(ev, events.JobFailed) and not result.done():
            result.set_exception(api.JobFailedError(f"job {job.job_id}: {ev.reason}"))

    transport, _protocol = await loop.create_datagram_endpoint(lambda: AtpProtocol(sender, on_event),
                                                               family=family)
    try:
        return await result
    finally:
        transport.close()
        writer.close()


async def receive_job_async(bind: "str | api.Address | int", *, timeout: float | None,
                            config: AtpConfig = AtpConfig()) -> api.ReceiveResult:
    """Async :func:`hostlib.api.receive_job` on the event loop (serves exactly one job)."""
    loop = asyncio.get_running_loop()
    addr = api.parse_address(bind)
    core = AtpReceiver(config=config, now=loop.time(), accept_jobs=1)
    messages: dict[int, bytes] = {}
    result: asyncio.Future[api.ReceiveResult] = loop.create_future()

    def on_event(ev: events.Event) -> None:
        if isinstance(ev, events.MessageReceived):
            messages[ev.msg_id] = ev.data
        elif isinstance(ev, events.JobFinished) and not result.done():
            result.set_result(api.receive_result(ev.result, dict(messages), core))
        elif isinstance(ev, events.JobRejected) and not result.done():
            result.set_exception(api.JobRejectedError(f"job {ev.job_id} rejected: {ev.reason}"))
        elif isinstance(ev, events.JobAbandoned) and not result.done():
            result.set_exception(api.JobAbandonedError(f"job {ev.job_id} went silent before finishing"))

    transport, _protocol = await loop.create_datagram_endpoint(
        lambda: AtpProtocol(core, on_event), local_addr=addr, reuse_port=False)
    try:
        return await asyncio.wait_for(asyncio.shield(result), timeout)
    except asyncio.TimeoutError:
        raise api.ReceiveTimeout(f"no job finished on {addr[0]}:{addr[1]} within {timeout:g} s") from None
    finally:
        transport.close()
