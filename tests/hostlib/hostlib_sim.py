"""Two ATP endpoints in memory with a virtual clock (model: aioquic tests/test_connection.py).

``Path`` models one direction: an optional bottleneck (rate + queue of ``queue_packets``, tail drop), a
propagation delay with optional jitter (reordering), and chosen drops/duplicates. Everything is
deterministic for a given seed. The endpoints are ``hostlib.core.AtpSender``/``AtpReceiver`` (the ``cores``
fixture chooses the implementation), or what ``run_job`` is given.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import random
from typing import Any, Callable, Protocol

from netapprox.hostlib import control, core, events, wire
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
        self.backlog: collections.deque[float] = collections.deque()  # when each queued packet starts service
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
            while self.backlog and self.backlog[0] <= now:  # packets that started service by now
                self.backlog.popleft()
            if len(self.backlog) >= self.queue_packets:  # tail drop: the queue holds queue_packets packets
                self.dropped += 1
                return []
            self.busy_until = start + service
            self.backlog.append(start)
            depart = self.busy_until
        t = depart + self.delay + (self.rng.random() * self.jitter if self.jitter else 0.0)
        out = [(t, data)]
        if self.duplicate and self.rng.random() < self.duplicate:
            out.append((t + self.rng.random() * self.delay, data))
        return out


class TrimmingPath(Path):
    """A path whose full queue trims approximate DATA packets instead of dropping them (NDP, CP): the header goes
    on alone, TRIM set, payload cut (docs/wire-format.md); what it drops otherwise is dropped."""

    def transit(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        h, _ = wire.decode(data)
        out = super().transit(data, now)
        if out or h.type != wire.PacketType.DATA or not h.flags & wire.Flags.APPROX or h.msg_id >= control.FIN_MSG_ID:
            return out
        return [(now + self.delay, trim(h))]


def trim(h: wire.Header) -> bytes:
    """What a switch forwards of an approximate DATA packet it trimmed: the header alone, TRIM set, APPROX cleared."""
    return wire.encode(dataclasses.replace(h, flags=(h.flags | wire.Flags.TRIM) & ~wire.Flags.APPROX, length=0))


class Attacker(Protocol):
    """A third host on the network: it injects datagrams (from any source address it likes) straight into
    either endpoint, sees what the receiver sends to addresses other than the sender's, and may watch the
    sender's and receiver's traffic (an on-path observer)."""

    def next_time(self) -> float | None: ...
    def fire(self, now: float) -> list[tuple[str, bytes, Any]]:
        """(``"r"`` receiver or ``"s"`` sender, datagram, source address) to deliver now."""
    def on_datagram(self, data: bytes, addr: Any, now: float) -> None:
        """The receiver sent ``data`` to ``addr`` (not the sender)."""
    def observe(self, direction: str, data: bytes, now: float) -> None:
        """``"s->r"`` or ``"r->s"``: a datagram of the real job, as it leaves its endpoint."""


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

    def receiver_result(self):
        """The receiver's JobResult (from its JobFinished event)."""
        (result,) = [e.result for e in self.receiver_events if isinstance(e, events.JobFinished)]
        return result


# --- driving one endpoint by hand ------------------------------------------------------------------

def messages_in(header: wire.Header, payload: bytes) -> list[int]:
    """The message ids a DATA packet carries: its own, or those of its records when it is packed."""
    if header.count > 1:
        return [mid for mid, _ in wire.decode_records(payload, header)]
    return [header.msg_id]


def retry_sender(sender: AtpSender, now: float = 0.0, token: bytes = b"T" * wire.TOKEN_LEN) -> wire.Header:
    """Answer the sender's first datagram (its token-less announce, sent with the first window behind it) with a
    RETRY, as a receiver under pressure does; returns the announce's header."""
    data, addr = sender.datagrams_to_send(now)[0]
    hello, _ = wire.decode(data)
    assert hello.msg_id == control.ANNOUNCE_MSG_ID
    sender.receive_datagram(wire.encode_retry(hello, token), addr, now)
    return hello


def announce(job_id: int, groups, total: int, *, seq: int = 1000, token: bytes = wire.NO_TOKEN,
             key: bytes | None = None, vector_len: int | None = None, pkt_idx: int = 0, pkt_cnt: int = 1,
             chunk: bytes | None = None) -> bytes:
    """An announce part: ``groups`` as (group_id, msr, msg_ids); the whole manifest unless ``chunk``."""
    if chunk is None:
        chunk = control.Manifest(total=total, vector_len=vector_len, groups=tuple(
            control.GroupShape.from_ids(g, msr, ids) for g, msr, ids in groups)).encode()
    payload = control.encode_announce_part(chunk, job_id=job_id, pkt_idx=pkt_idx, pkt_cnt=pkt_cnt, token=token,
                                           key=key)
    return wire.encode(wire.Header(job_id=job_id, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=pkt_idx, pkt_cnt=pkt_cnt,
                                   seq=seq), payload)


def token_for(receiver: AtpReceiver, hello: bytes, peer=SENDER_ADDR, now: float = 0.0) -> bytes:
    """Send a token-less announce part to a receiver that asks for tokens (under pressure, or configured so);
    return the token of the RETRY that answers it."""
    receiver.receive_datagram(hello, peer, now)
    out = receiver.datagrams_to_send(now)
    retries = [wire.decode(d)[1] for d, _ in out if wire.decode(d)[0].type == wire.PacketType.RETRY]
    assert len(retries) == 1, f"expected one RETRY, got {out}"
    return retries[0]


def token_of(answers: list[tuple[wire.Header, bytes]]) -> bytes | None:
    """The admission token in a receiver's answers: a RETRY's, or the one an ACK to an unvalidated job carries."""
    for h, payload in answers:
        if h.type == wire.PacketType.RETRY:
            return payload
        if h.type == wire.PacketType.ACK and h.flags & wire.Flags.TOKEN:
            return wire.decode_ack(payload, h.flags)[2]
    return None


def admit(receiver: AtpReceiver, job_id: int, groups, total: int, *, peer=SENDER_ADDR, now: float = 0.0,
          **kw) -> list[tuple[wire.Header, bytes]]:
    """Admit and validate a job the way a sender does: a token-less announce, admitted at once (its ACK carries a
    token, which the sender echoes on announce part 0) or answered with a RETRY (the announce again, with the
    token); returns the datagrams that answered the second announce (its ACK)."""
    receiver.receive_datagram(announce(job_id, groups, total, **kw), peer, now)
    token = token_of([wire.decode(d) for d, _ in receiver.datagrams_to_send(now)])
    assert token is not None, f"job {job_id}: neither admitted nor answered with a RETRY: {receiver.stats()}"
    receiver.receive_datagram(announce(job_id, groups, total, token=token, **kw), peer, now)
    assert job_id in receiver.jobs, f"job {job_id} not admitted: {receiver.stats()}"
    answers = [wire.decode(d) for d, _ in receiver.datagrams_to_send(now)]
    assert token_of(answers) is None, f"job {job_id} not validated: {receiver.stats()}"
    return answers


def run_job(job: JobSpec, config: AtpConfig = AtpConfig(), *, forward: Path | None = None,
            reverse: Path | None = None, receiver_config: AtpConfig | None = None, until: float = 120.0,
            max_steps: int = 5_000_000, attacker: Attacker | None = None, receiver: AtpReceiver | None = None,
            on_step: Callable[[float, AtpReceiver], None] | None = None, sender_cls: Any = None,
            receiver_cls: Any = None) -> Run:
    """Run one job to its end. ``attacker``: a hostile third host (see :class:`Attacker`). ``receiver``: an
    existing receiver to use. ``on_step(now, receiver)``: called after every step (to sample state).
    ``sender_cls``/``receiver_cls``: what builds the endpoints (default: ``hostlib.core``'s)."""
    forward = forward or Path()
    reverse = reverse or Path(seed=2)
    now = 0.0
    sender = (sender_cls or core.AtpSender)(job, config=config, peer=RECEIVER_ADDR, now=now)
    if receiver is None:
        receiver = (receiver_cls or core.AtpReceiver)(config=receiver_config or config, now=now)
    arrivals: list[tuple[float, int, str, bytes]] = []
    n = 0
    s_events: list = []
    r_events: list = []
    for _ in range(max_steps):
        for data, _addr in sender.datagrams_to_send(now):
            if attacker is not None:
                attacker.observe("s->r", data, now)
            for t, d in forward.transit(data, now):
                n += 1
                heapq.heappush(arrivals, (t, n, "r", d))
        for data, addr in receiver.datagrams_to_send(now):
            if addr != SENDER_ADDR:
                if attacker is not None:
                    attacker.on_datagram(data, addr, now)
                continue
            if attacker is not None:
                attacker.observe("r->s", data, now)
            for t, d in reverse.transit(data, now):
                n += 1
                heapq.heappush(arrivals, (t, n, "s", d))
        while (e := sender.next_event()) is not None:
            s_events.append(e)
        while (e := receiver.next_event()) is not None:
            r_events.append(e)
        if sender.done:
            break
        times = [t for t in (sender.get_timer(), receiver.get_timer(),
                             attacker.next_time() if attacker is not None else None) if t is not None]
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
        if attacker is not None and (at := attacker.next_time()) is not None and at <= now:
            for dst, d, src in attacker.fire(now):
                (receiver if dst == "r" else sender).receive_datagram(d, src, now)
        st = sender.get_timer()
        if st is not None and st <= now:
            sender.handle_timer(now)
        rt = receiver.get_timer()
        if rt is not None and rt <= now:
            receiver.handle_timer(now)
        if on_step is not None:
            on_step(now, receiver)
    else:
        raise AssertionError("simulation did not finish within max_steps")
    # let the receiver's last answers drain into the event lists
    while (e := receiver.next_event()) is not None:
        r_events.append(e)
    return Run(sender, receiver, s_events, r_events, now)
