"""Two ATP endpoints in memory with a virtual clock (model: aioquic tests/test_connection.py).

``Path`` models one direction: an optional bottleneck (rate + queue of ``queue_packets``, tail drop), a
propagation delay with optional jitter (reordering), and chosen drops/duplicates. Everything is
deterministic for a given seed.
"""
from __future__ import annotations

import dataclasses
import heapq
import random
from typing import Callable

from netapprox.hostlib import events, wire
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.receiver import AtpReceiver
from netapprox.hostlib.sender import AtpSender

SENDER_ADDR = ("10.0.0.1", 40000)
RECEIVER_ADDR = ("10.0.0.2", 7600)


@dataclasses.dataclass
class Path:
    delay: float = 0.001
    jitter: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0
    rate_bps: float | None = None
    queue_packets: int = 8
    drop: Callable[[wire.Header, int], bool] | None = None
    """Extra drop rule: (decoded header, running datagram index) -> drop?"""
    queue_byte: int | None = None
    """Stamp this queue byte on DATA packets (what a switch does)."""
    seed: int = 1
    record: list | None = None
    """If a list: (time, header) of every datagram offered to the path, dropped or not."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.index = 0
        self.busy_until = 0.0
        self.sent = 0
        self.dropped = 0

    def transit(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        """Arrival times of this datagram (none when dropped, two when duplicated)."""
        self.index += 1
        self.sent += 1
        header, _ = wire.decode(data)
        if self.record is not None:
            self.record.append((now, header))
        if self.drop is not None and self.drop(header, self.index):
            self.dropped += 1
            return []
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return []
        if self.queue_byte is not None and header.type == wire.PacketType.DATA:
            data = data[:2] + bytes([self.queue_byte]) + data[3:]
        depart = now
        if self.rate_bps is not None:
            service = (len(data) + 42) * 8 / self.rate_bps
            start = max(now, self.busy_until)
            if start - now > self.queue_packets * service:
                self.dropped += 1
                return []
            self.busy_until = start + service
            depart = self.busy_until
        t = depart + self.delay + (self.rng.random() * self.jitter if self.jitter else 0.0)
        out = [(t, data)]
        if self.duplicate and self.rng.random() < self.duplicate:
            out.append((t + self.rng.random() * self.delay, data))
        return out


@dataclasses.dataclass
class Run:
    sender: AtpSender
    receiver: AtpReceiver
    sender_events: list
    receiver_events: list
    now: float

    @property
    def summary(self):
        return self.sender.summary

    def received(self) -> dict[int, bytes]:
        return {e.msg_id: e.data for e in self.receiver_events if isinstance(e, events.MessageReceived)}

    def received_order(self) -> list[int]:
        return [e.msg_id for e in self.receiver_events if isinstance(e, events.MessageReceived)]

    def epochs(self) -> list[events.EpochEnded]:
        return [e for e in self.sender_events if isinstance(e, events.EpochEnded)]


def run_job(job: JobSpec, config: AtpConfig = AtpConfig(), *, forward: Path | None = None,
            reverse: Path | None = None, receiver_config: AtpConfig | None = None, until: float = 120.0,
            max_steps: int = 5_000_000) -> Run:
    forward = forward or Path()
    reverse = reverse or Path(seed=2)
    now = 0.0
    sender = AtpSender(job, config=config, peer=RECEIVER_ADDR, now=now)
    receiver = AtpReceiver(config=receiver_config or config, now=now)
    arrivals: list[tuple[float, int, str, bytes]] = []
    n = 0
    s_events: list = []
    r_events: list = []
    for _ in range(max_steps):
        for data, _addr in sender.datagrams_to_send(now):
            for t, d in forward.transit(data, now):
                n += 1
                heapq.heappush(arrivals, (t, n, "r", d))
        for data, _addr in receiver.datagrams_to_send(now):
            for t, d in reverse.transit(data, now):
                n += 1
                heapq.heappush(arrivals, (t, n, "s", d))
        while (e := sender.next_event()) is not None:
            s_events.append(e)
        while (e := receiver.next_event()) is not None:
            r_events.append(e)
        if sender.done:
            break
        times = [t for t in (sender.get_timer(), receiver.get_timer()) if t is not None]
        if arrivals:
            times.append(arrivals[0][0])
        nxt = max(now, min(times))
        if nxt > until:
            raise AssertionError(f"job not done by virtual time {until}s (state {sender.state})")
        now = nxt
        while arrivals and arrivals[0][0] <= now:
            _t, _n, dst, d = heapq.heappop(arrivals)
            if dst == "r":
                receiver.receive_datagram(d, SENDER_ADDR, now)
            else:
                sender.receive_datagram(d, RECEIVER_ADDR, now)
        st = sender.get_timer()
        if st is not None and st <= now:
            sender.handle_timer(now)
        rt = receiver.get_timer()
        if rt is not None and rt <= now:
            receiver.handle_timer(now)
    else:
        raise AssertionError("simulation did not finish within max_steps")
    # let the receiver's last answers drain into the event lists
    while (e := receiver.next_event()) is not None:
        r_events.append(e)
    return Run(sender, receiver, s_events, r_events, now)
