"""One ATP job over a simulated lossy link in virtual time: the sans-I/O cores (``hostlib.core``: native when
built) and an in-memory path per direction (random loss, a bottleneck with a tail-drop queue, a delay). Nothing
touches a socket or the clock, so a job of thousands of messages runs in well under a second and a seed fixes every
outcome. The analytics tests and ``python -m netapprox.analytics --simulate`` run on it; real networks use the same
job through ``hostlib.api``.
"""
from __future__ import annotations

import dataclasses
import heapq
import random
from typing import Callable

from netapprox.hostlib import core, events
from netapprox.hostlib.config import AtpConfig, JobSpec

SENDER_ADDR = ("10.0.0.1", 40000)
RECEIVER_ADDR = ("10.0.0.2", 7600)


@dataclasses.dataclass
class LossyPath:
    """One direction: random loss, then an optional bottleneck (``rate_bps``, a queue of ``queue_packets``,
    tail drop), then ``delay_s``."""

    loss: float = 0.0
    delay_s: float = 0.001
    rate_bps: float | None = None
    queue_packets: int = 16
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss {self.loss}: must be in [0, 1)")
        self._rng = random.Random(self.seed)
        self._busy_until = 0.0
        self._backlog: list[float] = []
        self.sent = self.dropped = 0

    def transit(self, data: bytes, now: float) -> float | None:
        """When the datagram arrives, or ``None`` when it is dropped."""
        self.sent += 1
        if self.loss and self._rng.random() < self.loss:
            self.dropped += 1
            return None
        depart = now
        if self.rate_bps is not None:
            self._backlog = [t for t in self._backlog if t > now]
            if len(self._backlog) >= self.queue_packets:
                self.dropped += 1
                return None
            self._busy_until = max(now, self._busy_until) + (len(data) + 42) * 8 / self.rate_bps
            self._backlog.append(self._busy_until)
            depart = self._busy_until
        return depart + self.delay_s


@dataclasses.dataclass
class Transfer:
    """What one job left behind: the messages the receiver delivered, and the sender's summary."""

    received: dict[int, bytes]
    summary: object
    """``hostlib.sender.SendSummary`` (``None`` if the job failed)."""
    failure: str | None
    end_s: float
    """Virtual time at which the sender finished."""


class TransferTimeout(RuntimeError):
    """The job did not finish within the virtual time allowed."""


def run(job: JobSpec, config: AtpConfig = AtpConfig(), *, forward: LossyPath | None = None,
        reverse: LossyPath | None = None, until_s: float = 600.0, isn: int = 1,
        on_step: Callable[[float, object, dict[int, bytes]], None] | None = None) -> Transfer:
    """Run ``job`` from a sender to a receiver to its end. ``on_step(now, sender, received)`` is called after each
    step (the analytics job adjusts its MSR there)."""
    forward = forward or LossyPath()
    reverse = reverse or LossyPath(seed=forward.seed + 1)
    now = 0.0
    sender = core.AtpSender(job, config=config, peer=RECEIVER_ADDR, now=now, message_events=False, isn=isn)
    receiver = core.AtpReceiver(config=config, now=now)
    arrivals: list[tuple[float, int, bool, bytes]] = []
    n = 0
    received: dict[int, bytes] = {}
    while True:
        for data, _ in sender.datagrams_to_send(now):
            if (t := forward.transit(data, now)) is not None:
                n += 1
                heapq.heappush(arrivals, (t, n, True, data))
        for data, addr in receiver.datagrams_to_send(now):
            if addr == SENDER_ADDR and (t := reverse.transit(data, now)) is not None:
                n += 1
                heapq.heappush(arrivals, (t, n, False, data))
        while (e := receiver.next_event()) is not None:
            if isinstance(e, events.MessageReceived) and e.job_id == job.job_id:
                received[e.msg_id] = e.data
        while sender.next_event() is not None:
            pass
        if sender.done:
            break
        if on_step is not None:
            on_step(now, sender, received)
        times = [t for t in (sender.get_timer(), receiver.get_timer()) if t is not None]
        if arrivals:
            times.append(arrivals[0][0])
        if not times:
            raise TransferTimeout(f"job {job.job_id}: nothing left to happen at {now:.3f}s (sender {sender.state})")
        nxt = max(now, min(times))
        if nxt > until_s:
            raise TransferTimeout(f"job {job.job_id} not finished by {until_s:g}s of virtual time")
        now = nxt
        while arrivals and arrivals[0][0] <= now:
            _, _, to_receiver, d = heapq.heappop(arrivals)
            if to_receiver:
                receiver.receive_datagram(d, SENDER_ADDR, now)
            else:
                sender.receive_datagram(d, RECEIVER_ADDR, now)
        if (t := sender.get_timer()) is not None and t <= now:
            sender.handle_timer(now)
        if (t := receiver.get_timer()) is not None and t <= now:
            receiver.handle_timer(now)
    return Transfer(received, sender.summary, sender.failure, now)
