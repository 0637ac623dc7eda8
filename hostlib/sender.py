"""The ATP sender state machine (sans-I/O, model: aioquic ``QuicConnection``).

It never touches a socket or the clock. Its owner feeds it datagrams and time and takes datagrams,
timers and events from it::

    sender = AtpSender(job, config=AtpConfig(), peer=("10.0.0.2", 7600), now=clock())
    loop:
        for data, addr in sender.datagrams_to_send(now): sock.sendto(data, addr)
        wait until sender.get_timer() or a datagram arrives
        sender.receive_datagram(data, addr, now) / sender.handle_timer(now)
        while (event := sender.next_event()) is not None: ...

Life of a job: SENDING (admission, announce, data, repairs, one epoch per smoothed RTT) -> CLOSING (the
completion policy is met; FIN sent until the receiver's DONE arrives or ``fin_timeout_s`` passes) -> DONE,
or FAILED when nothing is acknowledged for ``idle_timeout_s``.

Admission (hostlib/admission.py): the announce goes out first, without a token, and the first window of data
right behind it. A receiver that is not under pressure admits the job at once and keeps the data; its ACKs then
carry a token, which the sender echoes once (announce part 0 again) so the receiver knows the address is really
the sender's. A receiver under pressure answers with a RETRY carrying a token and keeps nothing: the sender
starts over at once with the token on every announce part (one round trip, as TCP with SYN cookies). Once the
job has proved its address the receiver sends a NEW_TOKEN: an address-validation token (``new_token``) the owner
keeps and hands to the next job to the same receiver (``address_token``), whose announce then carries it and is
admitted at once, validated, even under pressure (QUIC's NEW_TOKEN).

Only datagrams from ``peer`` for this job that answer something this sender sent move it: an ACK must echo
a sequence number it used (they start at a random value below 2^31) with the message and packet index that
sequence number carried, and SACK only sequence numbers it used; a DONE must echo one of its FINs; a RETRY
one of its announce parts. The rest is counted in ``rejected[reason]`` and otherwise ignored.

Message states per group: ACTIVE (not yet lost), DAMAGED (a packet was lost; the group can afford it, so
it is left alone), REPAIRING (the group's MSR needs it: its lost packets are retransmitted), DELIVERED
(every packet acknowledged). A group gives up at most ``N_g - ceil(MSR_g · N_g)`` messages; a further
damaged message is repaired, so the job can only complete with every group's MSR met.
"""
from __future__ import annotations

import array
import collections
import dataclasses
import enum
import heapq
import json
import secrets
from typing import Any

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import (DEFAULT_MAX_RATE_BPS, AtpConfig, ConfigError, JobSpec, Tags, job_rank,
                                      required_messages)
from netapprox.hostlib.rate import RateController, TokenBucket, WindowController
from netapprox.hostlib.recovery import LossRecovery, SentPacket
from netapprox.hostlib.scheduler import Scheduler

Address = Any

# message states
ACTIVE, DAMAGED, REPAIRING, DELIVERED = range(4)
# packet states
UNSENT, IN_FLIGHT, ACKED, LOST = range(4)

_MAX_SLACK_US = wire.NO_DEADLINE - 1
_FIN_RETRY_MIN_S = 0.02
_ECHO = -1  # control queue entry: announce part 0 once more, carrying the token an ACK brought (validation)


class SenderState(enum.Enum):
    SENDING = "sending"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"


class SenderError(RuntimeError):
    """The sender was used in a way its state does not allow."""


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    group_id: int
    msr: float
    total: int
    required: int
    delivered: int
    lost: int
    final_tlr: float
    packets_sent: int
    retransmissions: int

    @property
    def measured_loss(self) -> float:
        """Fraction of the group's messages lost (to compare with the target 1 - MSR)."""
        return self.lost / self.total if self.total else 0.0

    @property
    def target_loss(self) -> float:
        return 1.0 - self.msr

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(measured_loss=round(self.measured_loss, 6), target_loss=round(self.target_loss, 6))
        return d


@dataclasses.dataclass(frozen=True)
class SendSummary:
    """What happened to a job, from the sender (confirmed by the receiver's DONE when it arrived)."""

    job_id: int
    mode: str
    mrdf: bool
    completion: str
    jct_s: float
    """Job completion time: start to the moment the completion policy was met."""
    closed_s: float
    """Start to the end of the close handshake."""
    receiver_confirmed: bool
    """True when the receiver's DONE arrived; delivered/lost then are the receiver's numbers."""
    groups: tuple[GroupSummary, ...]
    lost_ids: tuple[int, ...]
    packets_sent: int
    packets_acked: int
    packets_lost: int
    retransmissions: int
    epochs: int
    final_rate_bps: float
    srtt_s: float
    losses_found_by: dict[str, int] = dataclasses.field(default_factory=dict)
    """Packet losses by how they were detected (``LossRecovery.lost_by``: reorder, time, tail)."""
    packets_surplus: int = 0
    """Packets sent as surplus (TLR 1.0, the lowest queue: messages beyond what the MSR still required)."""
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    """Datagrams the sender ignored, by reason (forged, stale or malformed ACK/DONE/RETRY)."""
    spurious_losses: int = 0
    """Packets declared lost by the packet or time threshold and acknowledged after that: reordered, not lost
    (``LossRecovery.spurious_losses``)."""

    def group(self, group_id: int) -> GroupSummary:
        for g in self.groups:
            if g.group_id == group_id:
                return g
        raise KeyError(f"job {self.job_id} has no group {group_id}")

    def msr_met(self) -> bool:
        return all(g.delivered >= g.required for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "mode": self.mode, "mrdf": self.mrdf, "completion": self.completion,
            "jct_s": round(self.jct_s, 6), "closed_s": round(self.closed_s, 6),
            "receiver_confirmed": self.receiver_confirmed, "msr_met": self.msr_met(),
            "groups": [g.as_dict() for g in self.groups], "lost_ids": list(self.lost_ids),
            "packets_sent": self.packets_sent, "packets_acked": self.packets_acked,
            "packets_lost": self.packets_lost, "retransmissions": self.retransmissions,
            "epochs": self.epochs, "final_rate_bps": round(self.final_rate_bps), "srtt_s": round(self.srtt_s, 6),
            "losses_found_by": dict(self.losses_found_by), "packets_surplus": self.packets_surplus,
            "rejected": dict(self.rejected), "spurious_losses": self.spurious_losses,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


class _Message:
    __slots__ = ("msg_id", "group", "data", "cnt", "next_new", "pkt_state", "acked", "remaining", "lost_pkts",
                 "state", "tags", "approx", "retries", "surplus")

    def __init__(self, msg_id: int, group: "_Group", data: bytes, max_payload: int, tags: Tags | None) -> None:
        self.msg_id = msg_id
        self.group = group
        self.data = bytes(data)
        self.cnt = max(1, -(-len(self.data) // max_payload))
        self.next_new = 0
        self.pkt_state = bytearray(self.cnt)
        self.acked = 0
        self.remaining = len(self.data)
        self.lost_pkts: collections.deque[int] | None = None  # created on the first loss (memory per message)
        self.state = ACTIVE
        self.tags = tags
        self.retries = 0  # retransmissions of this message lost again (repair rotation, scheduler.py)
        self.surplus = False  # started as surplus and not needed since (AtpSender._surplus)


class _Group:
    def __init__(self, group_id: int, msr: float, total: int, fixed_tlr: bool) -> None:
        self.group_id = group_id
        self.msr = msr
        self.total = total
        self.required = required_messages(msr, total)
        self.budget = total - self.required
        self.approx = msr < 1.0
        self.fixed_tlr = fixed_tlr
        self.tlr = 1.0 - msr
        self.delivered = 0
        self.active = total
        self.started = 0  # ACTIVE messages with a packet sent, not surplus
        self.damaged = 0
        self.repairing = 0
        self.idle: list[tuple] = []  # heap of damaged messages that may be picked for repair
        self.parked: list[int] = []  # messages held back as surplus (AtpSender._holds_surplus), until a loss
        self.packets_sent = 0
        self.retransmissions = 0
        self.report_seq = 0
        self.queues: collections.Counter[int] = collections.Counter()
        self.ece = 0  # ACKs with ECE (the DATA packet was CE-marked) in the current epoch

    @property
    def lost(self) -> int:
        return self.damaged + self.repairing

    def next_tlr(self) -> float:
        """Eq. 1: ((1 - MSR)·N - lost) / (N - delivered), clamped to [0, 1]."""
        if self.fixed_tlr:
            return 1.0 - self.msr
        left = self.total - self.delivered
        if left <= 0:
            return 1.0
        return min(1.0, max(0.0, ((1.0 - self.msr) * self.total - self.lost) / left))


class AtpSender:
    """Sends one job to one receiver. See the module docstring for the state machine."""

    def __init__(self, job: JobSpec, *, config: AtpConfig = AtpConfig(), peer: Address = None,
                 now: float, message_events: bool = True, isn: int | None = None,
                 address_token: bytes | None = None) -> None:
        """``peer``: the receiver address returned with every datagram. ``now``: creation time; the job's
        clock (JCT, epochs, deadlines) starts at the first :meth:`datagrams_to_send`. ``message_events``:
        emit a :class:`hostlib.events.MessageAcked` per delivered message (owners that ignore them, such as
        ``api.send_job`` without ``on_event``, turn them off). ``isn``: the first sequence number (default:
        random below 2^31; simulations and tests pass one to be reproducible). ``address_token``: an
        address-validation token from an earlier job's NEW_TOKEN from this receiver (``new_token``), presented in
        the announce."""
        if address_token is not None and (len(address_token) != wire.TOKEN_LEN or address_token == wire.NO_TOKEN):
            raise ConfigError(f"address_token must be {wire.TOKEN_LEN} bytes, not all zero")
        if isn is not None and not 0 <= isn <= 0xFFFFFFFF:
            raise ConfigError(f"isn {isn}: must be 0..4294967295")
        if config.max_rate_bps is None:  # no socket here to ask the link: the documented default
            config = dataclasses.replace(config, max_rate_bps=DEFAULT_MAX_RATE_BPS)
        self.job = job
        self.message_events = message_events
        self.config = config
        self.peer = peer
        self.state = SenderState.SENDING
        self.start_time = now
        mp = config.max_payload
        if job.vector_len is not None:
            for i, m in enumerate(job.messages):
                if len(m.data) > mp:
                    raise ConfigError(f"vector message {i} has {len(m.data)} bytes but one packet carries "
                                      f"{mp}: build the job with floats_per_message <= "
                                      f"{wire.floats_per_packet(mp)}")
        for i, m in enumerate(job.messages):
            if len(m.data) > 0xFFFF * mp:
                raise ConfigError(f"message {i} of {len(m.data)} bytes needs more than 65535 packets")
        self.adaptive = config.mode == "adaptive"
        self._reset_transfer()
        self._path_queue: int | None = None  # queue byte of the last data ACK
        self.bucket = TokenBucket(burst_bytes=self._burst_bytes(self.rate.rate_bps), now=now)
        self._isn = secrets.randbelow(1 << 31) if isn is None else isn
        self._seq = self._isn
        self._announce = self._announce_parts_for(job, config)
        if len(self._announce) > 0xFFFF:
            raise ConfigError("job announce too large: split the job or give groups contiguous message ids")
        self._free_until = max(config.first_window, len(self._announce))
        """Sequence numbers (offsets from the ISN) below this are the first window (the announce included): sent
        before anything comes back, without a grant."""
        self._grant: int | None = None
        """Offset from the ISN below which the receiver lets this sender send (its latest grant); ``None`` while the
        receiver sends none (it does not schedule): the window alone decides."""
        self._grant_top = -1
        """Offset of the newest packet a grant echoed: the receiver's grant is what may be in flight past it, so a
        granted packet past it that is declared lost gives its place back (``_on_lost``)."""
        self._probe = False  # scheduled and out of grant, the tail timed out: one packet may probe
        self.epoch = 0
        self._started = False
        self._epoch_end = now + self._epoch_length()
        self._last_progress = now
        self._events: collections.deque[events.Event] = collections.deque()
        # control messages: the job announce first, then (when closing) the FIN
        self._announce_acked = bytearray(len(self._announce))
        self._control: collections.deque[tuple[int, int]] = collections.deque(
            (control.ANNOUNCE_MSG_ID, i) for i in range(len(self._announce)))
        self._completed_at: float | None = None
        self._fin_next: float | None = None
        self._fin_deadline: float | None = None
        self._done_parts: dict[int, list[tuple[int, int]]] = {}
        self._done_cnt: int | None = None
        self.summary: SendSummary | None = None
        self.failure: str | None = None
        self.packets_sent = 0
        self.packets_surplus = 0
        self.retransmissions = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        # admission and what answers may echo
        self._token: bytes | None = address_token
        self.new_token: bytes | None = None
        """The address-validation token of the receiver's NEW_TOKEN, for the next job to it (``address_token``)."""
        self._admitted = False  # an ACK came: the receiver holds the job
        self.retries_received = 0  # RETRYs that made the job start over
        self._echo_next = 0.0  # earliest time the token may be echoed again (validation of a job admitted at once)
        self._token_pending = False  # the last ACK carried a token: the receiver still waits for the echo
        self._sent_msg = array.array("I")  # per sequence number used (seq - ISN): the msg_id and pkt_idx it
        self._sent_idx = array.array("H")  # carried, so answers can be checked (6 bytes per packet sent)
        # live MSR changes (set_msr): the latest per group, what the receiver acknowledged, what is in flight
        self._msr_changes = 0
        self._msr_latest: dict[int, tuple[int, float]] = {}  # group id -> (change number, MSR)
        self._msr_acked: dict[int, int] = {}  # group id -> highest change number acknowledged
        self._msr_queued: set[int] = set()  # groups with an MSR change in the control queue
        self._msr_sent: dict[int, tuple[int, int]] = {}  # sequence number -> (group id, change number)

    def _reset_transfer(self) -> None:
        """Message, group, scheduler, loss-recovery and rate state as at the start of the job. Called again when a
        RETRY says the receiver did not admit the job: nothing sent so far reached it, and nothing was acknowledged,
        so the job starts over (sequence numbers and the packet counters go on)."""
        job, config, mp = self.job, self.config, self.config.max_payload
        old = getattr(self, "groups", {})
        fixed = config.mode in ("fixtlr", "base")
        self.groups: dict[int, _Group] = {g: _Group(g, job.msr_of(g), n, fixed)
                                          for g, n in sorted(job.group_sizes().items())}
        for gid, g in old.items():  # what left stays counted, and REPORT sequence numbers go on
            new = self.groups[gid]
            new.packets_sent, new.retransmissions, new.report_seq = g.packets_sent, g.retransmissions, g.report_seq
        self.messages: list[_Message] = [_Message(i, self.groups[m.group_id], m.data, mp, m.tags or job.tags)
                                         for i, m in enumerate(job.messages)]
        base = config.mode == "base"
        self.scheduler = Scheduler(mrdf=config.mrdf, repairs_last=base)
        for msg in self.messages:
            self.scheduler.update(msg.msg_id, remaining=msg.remaining, repair=False)
        self._unsent_open = len(self.messages)  # ACTIVE/REPAIRING messages with never-sent packets
        wire_max = config.packet_size + config.overhead_bytes
        initial = config.initial_rate_bps or config.max_rate_bps
        self.window: WindowController | None = None
        if self.adaptive:
            self.window = self.rate = WindowController(
                max_rate_bps=config.max_rate_bps, pacing_gain=config.pacing_gain, packet_bits=wire_max * 8,
                initial_window=config.first_window, max_window=config.max_window,
                queue_packets=config.queue_packets, loss_memory=config.loss_memory,
                min_samples=config.loss_min_samples, header_bytes=wire.HEADER_LEN + config.overhead_bytes,
                gain=config.gain)
        else:
            self.rate = RateController(max_rate_bps=config.max_rate_bps, initial_rate_bps=initial,
                                       gain=config.gain, packet_bits=wire_max * 8, fixed=base)
        self.recovery = LossRecovery(initial_rtt_s=config.initial_rtt_s, reorder_threshold=config.reorder_threshold,
                                     min_loss_timeout_s=config.min_loss_timeout_s,
                                     adaptive_reorder=config.adaptive_reorder, path_reorders=config.path_reorders,
                                     listeners=[self.rate])

    @staticmethod
    def _announce_parts_for(job: JobSpec, config: AtpConfig) -> list[bytes]:
        """The job announce's chunks, one per part (docs/wire-format.md)."""
        sizes = job.group_sizes()
        ids_of: dict[int, list[int]] = {gid: [] for gid in sizes}
        for i, m in enumerate(job.messages):
            ids_of[m.group_id].append(i)
        need = 0  # the smallest messages of each group that meet its MSR: what a receiver must let through at least
        for gid, ids in ids_of.items():
            need += sum(sorted(len(job.messages[i].data) for i in ids)[:required_messages(job.msr_of(gid), len(ids))])
        manifest = control.Manifest(
            total=len(job.messages), vector_len=job.vector_len,
            groups=tuple(control.GroupShape.from_ids(gid, job.msr_of(gid), ids_of[gid]) for gid in sorted(sizes)),
            need_bytes=need)
        blob = manifest.encode()
        mp = config.max_payload
        return [blob[i:i + mp] for i in range(0, len(blob), mp)] or [b""]

    @property
    def datagrams_ignored(self) -> int:
        return sum(self.rejected.values())

    # -- public sans-I/O interface -----------------------------------------------------------------

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        """Datagrams the pacer allows now (at most ``burst_packets`` after an idle period)."""
        if self.state not in (SenderState.SENDING, SenderState.CLOSING):
            return []
        if not self._started:
            self._start(now)
        out: list[tuple[bytes, Address]] = []
        rate = self.rate.rate_bps
        self.bucket.burst_bytes = self._burst_bytes(rate)
        self.bucket.refill(rate, now)
        overhead = self.config.overhead_bytes
        while True:
            nxt = self._peek(now)
            copy = self._copy_candidate(nxt)
            if copy is not None:
                if not self._window_open(copy.msg_id):
                    break
                size = wire.HEADER_LEN + copy.size + overhead
                if not self.bucket.can_send(size):
                    break
                datagram = self._emit_copy(copy, now)
                self.bucket.consume(len(datagram) + overhead)
                out.append((datagram, self.peer))
                continue
            if nxt is None:
                break
            msg_id, idx = nxt
            if not self._window_open(msg_id):
                break
            size = wire.HEADER_LEN + self._payload_len(msg_id, idx) + overhead
            if not self.bucket.can_send(size):
                break
            datagram = self._emit(msg_id, idx, now)
            self.bucket.consume(len(datagram) + overhead)  # a packed packet: all its bytes (the tokens may go below 0)
            out.append((datagram, self.peer))
        return out

    def get_timer(self) -> float | None:
        """The next time :meth:`handle_timer` must run (pacing, loss detection, epoch end, timeouts)."""
        if not self._started:
            return self.start_time
        if self.state == SenderState.SENDING:
            times = [self._epoch_end, self._last_progress + self.config.idle_timeout_s]
            loss = self.recovery.loss_deadline()
            if loss is not None:
                times.append(loss)
            nxt = self._peek(None)
            copy = self._copy_candidate(nxt)
            if copy is not None:
                if self._window_open(copy.msg_id):
                    size = wire.HEADER_LEN + copy.size + self.config.overhead_bytes
                    times.append(self.bucket.ready_at(size, self.rate.rate_bps))
            elif nxt is not None and self._window_open(nxt[0]):
                size = wire.HEADER_LEN + self._payload_len(*nxt) + self.config.overhead_bytes
                times.append(self.bucket.ready_at(size, self.rate.rate_bps))
            return min(times)
        if self.state == SenderState.CLOSING:
            times = [self._fin_deadline]
            if self._fin_next is not None:
                times.append(self._fin_next)
            nxt = self._peek(None)  # the FIN, or an echo of the token
            if nxt is not None:
                size = wire.HEADER_LEN + self._payload_len(*nxt) + self.config.overhead_bytes
                times.append(self.bucket.ready_at(size, self.rate.rate_bps))
            return min(times)
        return None

    def handle_timer(self, now: float) -> None:
        if not self._started:
            return
        if self.state == SenderState.SENDING:
            lost = self.recovery.detect_lost(now)
            self._on_lost(lost, now)
            if self._grant is not None and any(not p.by_threshold for p in lost):  # the tail timed out
                self._give_back_overdue(now)
                if not self._granted():
                    self._probe = True  # and the grant is still spent: one packet may go to ask for more
            if lost and self._token_pending and now >= self._echo_next:
                # nothing acknowledged for a while and the receiver had not seen the echo: it may have been lost,
                # and an unvalidated job's data past its guarantee is not acknowledged (no ACK would ask again)
                self._echo_next = now + self.recovery.srtt
                self._control.append((_ECHO, 0))
            if now >= self._epoch_end:
                self._end_epoch(now)
            if now >= self._last_progress + self.config.idle_timeout_s:
                if not self._admitted:
                    self._fail(f"no acknowledgement from {self.peer} for {self.config.idle_timeout_s:g} s: job "
                               f"{self.job.job_id} was not admitted (receiver down, unreachable, out of job slots, "
                               f"or expecting an admission key?)")
                else:
                    self._fail(f"no acknowledgement from {self.peer} for {self.config.idle_timeout_s:g} s "
                               f"(receiver down, unreachable, or rejecting job {self.job.job_id}?)")
                return
            self._check_complete(now)
        elif self.state == SenderState.CLOSING:
            if now >= self._fin_deadline:
                self._finish(now, confirmed=False)
            elif self._fin_next is not None and now >= self._fin_next:
                self._queue_fin(now)

    def receive_datagram(self, data: bytes, addr: Address, now: float) -> None:
        if not self._started:
            self.rejected["before_start"] += 1
            return
        if not self._from_peer(addr):
            self.rejected["wrong_source"] += 1
            return
        try:
            header, payload = wire.decode(data)
        except wire.MalformedPacket:
            self.rejected["malformed"] += 1
            return
        if header.job_id != self.job.job_id:
            self.rejected["wrong_job"] += 1
            return
        if self.state in (SenderState.DONE, SenderState.FAILED):
            self.rejected["after_close"] += 1
            return
        if header.type in (wire.PacketType.ACK, wire.PacketType.GRANT):  # a GRANT is an ACK's layout, no blocks
            try:
                blocks, grant, token = wire.decode_ack(payload, header.flags)
            except wire.MalformedPacket:
                self.rejected["malformed"] += 1
                return
            reason = self._ack_rejection(header, blocks)
            if header.type == wire.PacketType.GRANT and grant is None:
                reason = "malformed"
            if reason is not None:
                self.rejected[reason] += 1
                return
            self._admitted = True
            if header.type == wire.PacketType.GRANT:
                self._last_progress = now
                self._on_grant(grant, header.seq)
                return
            self._token_pending = token is not None
            if token is not None:
                self._on_token(token, now)
            if grant is not None:
                self._on_grant(grant, header.seq)
            self._on_ack(header, blocks, now)
        elif header.type == wire.PacketType.DONE:
            self._on_done(header, payload, now)
        elif header.type == wire.PacketType.RETRY:
            self._on_retry(header, payload, now)
        elif header.type == wire.PacketType.NEW_TOKEN:
            self._on_new_token(header, payload)
        else:
            self.rejected["not_for_sender"] += 1

    def next_event(self) -> events.Event | None:
        return self._events.popleft() if self._events else None

    # -- introspection -----------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.state in (SenderState.DONE, SenderState.FAILED)

    def tlr(self, group_id: int) -> float:
        return self.groups[group_id].tlr

    def delivered(self, group_id: int) -> int:
        return self.groups[group_id].delivered

    # -- sending ---------------------------------------------------------------------------------

    def set_msr(self, group_id: int, msr: float, now: float) -> None:
        """Change a live group's MSR (docs/hostlib.md, A live MSR change). From now on the group needs
        ``ceil(msr * N_g)`` messages delivered: its loss budget, its TLR (eq. 1, at once) and its surplus follow;
        raised, damaged messages beyond the new budget are repaired; lowered, the job completes as soon as every
        group has what it now needs. Messages already delivered stay delivered. An approximate group stays below 1
        (an MSR of 1 makes a group exact, which the receiver learns from the announce); a group announced at 1
        cannot change. Only while SENDING: once the job completes its guarantee is settled. The MSR is rounded to
        Q1.15, as the wire carries it, and the change goes to the receiver as an MSR change control message
        (docs/wire-format.md), repeated until acknowledged."""
        g = self.groups[group_id]
        if isinstance(msr, bool) or not (isinstance(msr, (int, float)) and 0.0 <= msr < 1.0):
            raise ConfigError(f"MSR {msr!r} for group {group_id}: a live change must be in [0, 1)")
        if not g.approx:
            raise ConfigError(f"group {group_id} was announced with MSR 1 (exact, in order): its MSR cannot change")
        if self.state != SenderState.SENDING:
            raise ConfigError(f"job {self.job.job_id} is {self.state.value}: its MSR can no longer change")
        msr = wire.q15_to_tlr(wire.tlr_to_q15(msr))  # what the wire carries, so both ends agree on ceil(MSR·N)
        self._apply_msr(g, msr)
        self._msr_changes += 1
        self._msr_latest[group_id] = (self._msr_changes, msr)
        self._queue_msr_change(group_id)
        self._plan_repairs(g)
        self._check_complete(now)

    def _apply_msr(self, g: _Group, msr: float) -> None:
        g.msr = msr
        g.required = required_messages(g.msr, g.total)
        g.budget = g.total - g.required
        g.tlr = g.next_tlr()
        for mid in g.parked:  # the group may now be short: what was held back as surplus is offered again
            p = self.messages[mid]
            if p.state == ACTIVE and p.next_new < p.cnt:
                self.scheduler.update(mid, remaining=p.remaining, repair=False, retries=p.retries)
        g.parked.clear()

    def _queue_msr_change(self, group_id: int) -> None:
        """The group's latest change goes out (once queued; a newer change replaces what is not sent yet)."""
        if group_id not in self._msr_queued:
            self._msr_queued.add(group_id)
            self._control.append((control.MSR_MSG_ID, group_id))

    def _start(self, now: float) -> None:
        """The job starts at the first datagrams_to_send(), not at construction (which may be slow)."""
        self._started = True
        self.start_time = now
        self.bucket = TokenBucket(burst_bytes=self.bucket.burst_bytes, now=now)
        self._epoch_end = now + self._epoch_length()
        self._last_progress = now

    def _burst_bytes(self, rate_bps: float) -> float:
        """Token bucket depth: ``burst_packets`` full packets, or a train of ``pacing_train_s`` at ``rate_bps``
        when that is more, but never more than the queue stamped on the last data ACK holds (no train before the
        first data ACK)."""
        cfg = self.config
        wire_max = cfg.packet_size + cfg.overhead_bytes
        q = self._path_queue
        if q is None:
            return cfg.burst_packets * wire_max
        train = rate_bps * cfg.pacing_train_s / 8
        if q < len(cfg.queue_packets) and cfg.queue_packets[q] > 0:
            train = min(train, cfg.queue_packets[q] * wire_max)
        return max(cfg.burst_packets * wire_max, train)

    def _window_open(self, msg_id: int) -> bool:
        """Whether a data packet may leave now (control packets always may): within the ``adaptive`` window, and
        below the receiver's grant when it sends grants (or within the first window, or as a probe after a tail
        timeout): the receiver schedules its downlink, the window the rest of the path; with
        ``grant_overrides_window`` a granted packet beyond the first window needs no room in the window."""
        if msg_id in control.CONTROL_MSG_IDS or msg_id == _ECHO:
            return True
        if self._grant is not None:
            off = (self._seq - self._isn) & 0xFFFFFFFF
            if off >= self._free_until and off < self._grant and self.config.grant_overrides_window:
                return True
            if not (self._granted() or self._probe):
                return False
        return self.window is None or len(self.recovery.in_flight) < self.window.window

    def _holds_surplus(self) -> bool:
        """Whether surplus is held back rather than sent at TLR 1.0: with ``surplus`` off, and once the receiver
        schedules this job beyond its first window (the receiver's downlink is for what some job needs); never with
        the ``all_sent`` completion (every message goes)."""
        return self.config.completion == "early" and (
            not self.config.surplus or (self._grant is not None and not self._granted_first()))

    def _granted_first(self) -> bool:
        """The next sequence number is in the first window."""
        return (self._seq - self._isn) & 0xFFFFFFFF < self._free_until

    def _granted(self) -> bool:
        off = (self._seq - self._isn) & 0xFFFFFFFF
        return off < self._free_until or off < self._grant  # type: ignore[operator]

    def _give_back_overdue(self, now: float) -> None:
        """The tail timed out: every granted packet still in flight past the newest the receiver had when it granted
        that is overdue (sent a time threshold ago, nothing acknowledged since) gives its place back, as a lost one
        does (``_on_lost``): it died, or it arrived and the ACK that raised the grant by one for it was lost. Until
        then a sender whose ACKs were lost waited at its grant with one probe per tail timeout (docs/hostlib.md,
        Receiver grants)."""
        thr = self.recovery.time_threshold
        for p in self.recovery.in_flight.values():
            off = (p.seq - self._isn) & 0xFFFFFFFF
            if now - p.sent_time < thr:
                break
            if self._free_until <= off < self._grant and off > self._grant_top:  # type: ignore[operator]
                self._grant += 1  # type: ignore[operator]
                self._grant_top = off

    def _on_grant(self, grant: int, echo: int) -> None:
        """The receiver schedules this job: data may go up to (not including) sequence number ``grant``. Grants
        only grow (a smaller one is a reordered old one). ``echo``: the sequence number the answer echoes (the
        newest packet the receiver had, which the grant counts from)."""
        off = (grant - self._isn) & 0xFFFFFFFF
        if off >= 1 << 31:
            self.rejected["grant_out_of_range"] += 1
            return
        if self._grant is None or off > self._grant:
            self._grant = off
        self._grant_top = max(self._grant_top, (echo - self._isn) & 0xFFFFFFFF)

    def _payload_len(self, msg_id: int, idx: int) -> int:
        if msg_id == control.ANNOUNCE_MSG_ID or msg_id == _ECHO:
            return control.ANNOUNCE_PREFIX_LEN + len(self._announce[idx])
        if msg_id == control.FIN_MSG_ID:
            return 0
        if msg_id == control.MSR_MSG_ID:
            return control.MSR_CHANGE_LEN
        m = self.messages[msg_id]
        mp = self.config.max_payload
        return min(mp, len(m.data) - idx * mp) if m.data else 0

    def _peek(self, now: float | None) -> tuple[int, int] | None:
        """The next (msg_id, pkt_idx) to send, without sending it."""
        ctl = self._control
        while ctl:
            msg_id, idx = ctl[0]
            if msg_id == control.ANNOUNCE_MSG_ID and self._announce_acked[idx]:
                ctl.popleft()
                continue
            if msg_id == control.MSR_MSG_ID and self._msr_acked.get(idx, 0) >= self._msr_latest[idx][0]:
                ctl.popleft()
                self._msr_queued.discard(idx)
                continue
            return msg_id, idx
        if self.state != SenderState.SENDING:
            return None
        while True:
            msg_id = self.scheduler.peek()
            if msg_id is None:
                return None
            m = self.messages[msg_id]
            lost = m.lost_pkts
            if m.state == REPAIRING and lost is not None:
                while lost and m.pkt_state[lost[0]] != LOST:
                    lost.popleft()
                if lost:
                    return msg_id, lost[0]
            if m.state in (ACTIVE, REPAIRING) and m.next_new < m.cnt:
                g = m.group
                if (now is not None and m.state == ACTIVE and m.next_new == 0 and g.idle and self.adaptive
                        and self.config.mrdf):
                    before = g.repairing
                    self._plan_repairs(g)  # a damaged message smaller than this new one goes first
                    if g.repairing != before:
                        continue
                if self._starts_surplus(m) and self._holds_surplus():
                    self.scheduler.remove(msg_id)  # parked until a loss makes its group short again
                    g.parked.append(msg_id)
                    continue
                return msg_id, m.next_new
            self.scheduler.remove(msg_id)

    def _emit(self, msg_id: int, idx: int, now: float) -> bytes:
        if msg_id == _ECHO:  # announce part 0 again, with the token (its ACK validates like any announce's)
            self._control.popleft()
            msg_id = control.ANNOUNCE_MSG_ID
            seq = self._next_seq(msg_id, 0)
            self.packets_sent += 1
            self.recovery.on_packet_sent(SentPacket(seq, msg_id, 0, None, self._payload_len(msg_id, 0), now))
            return self._announce_datagram(0, seq)
        seq = self._next_seq(msg_id, 0 if msg_id == control.MSR_MSG_ID else idx)
        self.packets_sent += 1
        if msg_id in control.CONTROL_MSG_IDS:
            self._control.popleft()
            if msg_id == control.MSR_MSG_ID:  # idx: the group
                self._msr_queued.discard(idx)
                change, msr = self._msr_latest[idx]
                self._msr_sent[seq] = (idx, change)
                self.recovery.on_packet_sent(SentPacket(seq, msg_id, 0, None, control.MSR_CHANGE_LEN, now))
                return wire.encode(wire.Header(job_id=self.job.job_id, msg_id=msg_id, group_id=idx, seq=seq),
                                   control.encode_msr_change(change, msr))
            if msg_id == control.ANNOUNCE_MSG_ID:
                self.recovery.on_packet_sent(SentPacket(seq, msg_id, idx, None, self._payload_len(msg_id, idx), now))
                return self._announce_datagram(idx, seq)
            self._fin_next = now + max(_FIN_RETRY_MIN_S, self.recovery.tail_timeout)
            return wire.encode(wire.Header(job_id=self.job.job_id, msg_id=msg_id, seq=seq))
        first = (seq - self._isn) & 0xFFFFFFFF < self._free_until  # in the first window (unscheduled)
        if self._grant is not None and not first and (seq - self._isn) & 0xFFFFFFFF >= self._grant:
            self._probe = False  # beyond the grant: the one probe a tail timeout allows
        m = self.messages[msg_id]
        g = m.group
        payload, retx, surplus = self._take(m, idx)
        count = 1
        more: tuple[int, ...] = ()
        if self.config.pack_messages and m.cnt == 1:
            payload, count, more, retx = self._pack(m, payload, retx, surplus, now)
        if retx:  # a packet that carries a retransmitted message (packed with new ones, perhaps)
            self.retransmissions += 1
            g.retransmissions += 1
        # surplus packets are not counted by rate control (group None): their loss in the lowest queue is expected
        self.recovery.on_packet_sent(SentPacket(seq, msg_id, idx, None if surplus else g.group_id, len(payload),
                                                now, retx, more, first))
        low = surplus or (first and self.config.first_window_low and g.approx)  # the lowest queue (TLR 1.0)
        return self._data_datagram(m, idx, seq, payload, count, retx, low, now)

    def _data_datagram(self, m: _Message, idx: int, seq: int, payload: bytes, count: int, retx: bool, low: bool,
                       now: float) -> bytes:
        g = m.group
        flags = (wire.Flags.APPROX if g.approx else 0) | (wire.Flags.RETX if retx else 0)
        priority = weight = 0
        deadline = wire.NO_DEADLINE
        tags = m.tags
        if tags is not None:
            flags |= wire.Flags.TAGGED
            priority, weight = tags.priority, tags.weight
            if tags.deadline_s is not None:
                slack = self.start_time + tags.deadline_s - now
                deadline = min(_MAX_SLACK_US, max(0, int(slack * 1e6)))
        elif g.approx and self.config.job_rank_levels:  # a rank between jobs (AtpConfig.job_rank_levels)
            flags |= wire.Flags.TAGGED
            weight = 1
            priority = job_rank(self.job.job_id, self.config.job_rank_levels, now - self.start_time,
                                self.config.job_rank_promote_s)
        return wire.encode_data(flags=int(flags), priority=priority, job_id=self.job.job_id, msg_id=m.msg_id,
                                group_id=g.group_id, tlr=wire.TLR_ONE if low else wire.tlr_to_q15(g.tlr),
                                pkt_idx=idx, pkt_cnt=m.cnt, seq=seq, deadline_us=deadline, weight=weight,
                                payload=payload, count=count)

    def _copy_candidate(self, nxt: tuple[int, int] | None) -> SentPacket | None:
        """A packet in flight to send a copy of now (``nxt``: what ``_peek`` offers): on a lossy path
        (``LossRecovery.copies``), below the number of copies wanted, the oldest of those with the fewest copies
        among the announce parts not yet acknowledged (before anything but a control packet: the receiver takes
        no data of the job before them) and, when nothing else is to be sent, the needed packets that carried one
        message or one part of one (not a packed one), not yet acknowledged. Keeps the sender busy when most of
        what it sends dies and the rest would wait a tail timeout per round. ``adaptive`` only: the paper's rate
        control (``paper`` and its ablations) sends what it always sent. None below p = 1/3 until a tail timeout
        (``LossRecovery.copies``)."""
        if not self.adaptive or self.state != SenderState.SENDING or (
                nxt is not None and (nxt[0] in control.CONTROL_MSG_IDS or nxt[0] == _ECHO)):
            return None
        want = self.recovery.copies()
        if want == 0:
            return None
        announce: SentPacket | None = None
        data: SentPacket | None = None
        for p in self.recovery.in_flight.values():
            if p.copy or p.copies >= want:
                continue
            if p.msg_id == control.ANNOUNCE_MSG_ID:
                if not self._announce_acked[p.pkt_idx] and (announce is None or p.copies < announce.copies):
                    announce = p
            elif (nxt is None and p.group_id is not None and not p.more and p.msg_id < len(self.messages)
                  and (data is None or p.copies < data.copies)
                  and self.messages[p.msg_id].pkt_state[p.pkt_idx] == IN_FLIGHT):
                data = p
        return announce or data

    def _emit_copy(self, orig: SentPacket, now: float) -> bytes:
        """A copy of ``orig`` (``_copy_candidate``), not counted by rate control; a data packet's copy is a
        retransmission in the lowest queue (TLR 1.0: it uses only spare capacity)."""
        orig.copies += 1
        seq = self._next_seq(orig.msg_id, orig.pkt_idx)
        self.packets_sent += 1
        if orig.msg_id == control.ANNOUNCE_MSG_ID:
            self.recovery.on_packet_sent(SentPacket(seq, orig.msg_id, orig.pkt_idx, None, orig.size, now, copy=True))
            return self._announce_datagram(orig.pkt_idx, seq)
        m = self.messages[orig.msg_id]
        mp = self.config.max_payload
        payload = m.data[orig.pkt_idx * mp:(orig.pkt_idx + 1) * mp]
        self.retransmissions += 1
        m.group.retransmissions += 1
        m.group.packets_sent += 1
        self.recovery.on_packet_sent(SentPacket(seq, m.msg_id, orig.pkt_idx, None, len(payload), now, True,
                                                copy=True))
        return self._data_datagram(m, orig.pkt_idx, seq, payload, 1, True, True, now)

    def _take(self, m: _Message, idx: int) -> tuple[bytes, bool, bool]:
        """Packet ``idx`` of ``m`` leaves now: its payload, whether it is a retransmission, whether it is surplus
        (decided when a message starts)."""
        g = m.group
        mp = self.config.max_payload
        payload = m.data[idx * mp:(idx + 1) * mp]
        retx = m.pkt_state[idx] != UNSENT
        surplus = False
        if retx:
            m.lost_pkts.popleft()  # type: ignore[union-attr]
        else:
            if m.state == ACTIVE and (m.next_new == 0 or m.surplus):
                surplus = self._starts_surplus(m)
                if not surplus:
                    g.started += 1  # the message is needed from now on
                m.surplus = surplus
            m.next_new += 1
            if m.next_new == m.cnt:
                self._unsent_open -= 1
        m.pkt_state[idx] = IN_FLIGHT
        g.packets_sent += 1
        if surplus:
            self.packets_surplus += 1
        return payload, retx, surplus

    def _starts_surplus(self, m: _Message) -> bool:
        """Whether the next new packet of ``m`` would be surplus (only a message not yet started, or started
        as surplus, can be)."""
        if not (m.state == ACTIVE and (m.next_new == 0 or m.surplus)):
            return False
        return self.adaptive and m.group.approx and self._surplus(m.group)

    def _pack(self, first: _Message, payload: bytes, retx: bool, surplus: bool, now: float
              ) -> tuple[bytes, int, tuple[int, ...], bool]:
        """Message packing: behind ``first`` (a one-packet message), the messages the scheduler serves next, as
        long as each is a whole one-packet message of the same group with the same tags, new or repaired, as
        surplus as ``first``, and fits in ``packet_size`` with its record header. Only what is ready now; the
        first that does not fit ends the packet (so the scheduler's order is kept exactly). Returns the payload
        (``first``'s data alone, or the records), the count, the other message ids and the RETX flag."""
        records = [(first.msg_id, payload)]
        room = self.config.max_payload - wire.RECORD_HEADER_LEN - len(payload)
        while room >= wire.RECORD_HEADER_LEN and len(records) < wire.MAX_PACKED:
            nxt = self._peek(now)
            if nxt is None or nxt[0] >= len(self.messages):
                break  # nothing, or a control message (announce, FIN, echo) is due first
            m = self.messages[nxt[0]]
            if (m.cnt != 1 or m.group is not first.group or m.tags != first.tags
                    or len(m.data) + wire.RECORD_HEADER_LEN > room or self._starts_surplus(m) != surplus):
                break
            data, r, _ = self._take(m, 0)
            retx |= r
            records.append((m.msg_id, data))
            room -= wire.RECORD_HEADER_LEN + len(data)
        if len(records) == 1:
            return payload, 1, (), retx
        return wire.encode_records(records), len(records), tuple(mid for mid, _ in records[1:]), retx

    def _surplus(self, g: _Group) -> bool:
        """``adaptive``: whether the next new packet of a message not yet needed is surplus, that is whether the
        group reaches its required count without it: the messages delivered, plus those started as needed (a
        packet sent, none lost yet) and being repaired, discounted by the group's measured loss, already make
        it. Surplus packets carry TLR 1.0, which switches put in the lowest queue (docs/wire-format.md), so
        they only use spare capacity; completion never waits for them, and a surplus message becomes needed
        (its next packets carry the group's TLR) once the group falls short."""
        loss = self.window.loss_rate(g.group_id) if self.window is not None else None  # adaptive: a window
        # a scheduled sender (its receiver grants) sends no surplus, so repairs not yet in flight cannot count as on
        # their way: the scheduler may offer a new message before them, and holding it back would wait for nothing
        repairing = g.repairing if self._grant is None and self.config.surplus else 0
        on_the_way = (g.started + repairing) * (1.0 - (loss or 0.0))
        return g.delivered + on_the_way >= g.required

    # -- admission and validation of what arrives ------------------------------------------------

    def _announce_datagram(self, idx: int, seq: int) -> bytes:
        """Announce part ``idx`` with the token held (none yet: the all-zero field) and, with an admission
        key, its signature."""
        cnt = len(self._announce)
        payload = control.encode_announce_part(self._announce[idx], job_id=self.job.job_id, pkt_idx=idx, pkt_cnt=cnt,
                                               token=self._token or wire.NO_TOKEN, key=self.config.admission_key)
        header = wire.Header(job_id=self.job.job_id, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=idx, pkt_cnt=cnt,
                             seq=seq)
        return wire.encode(header, payload)

    def _on_retry(self, header: wire.Header, payload: bytes, now: float) -> None:
        """The receiver did not admit the job (it was under pressure, or the token held expired) and sent a
        token: nothing sent so far reached it, so the job starts over at once, the announce with the token first
        and the data right behind it (no timer: the data it dropped is sent again as new, not as losses)."""
        if self.state != SenderState.SENDING or self._admitted:
            self.rejected["retry_unexpected"] += 1
            return
        if self._carried(header.seq) != (control.ANNOUNCE_MSG_ID, header.pkt_idx):
            self.rejected["retry_unsent_seq"] += 1
            return
        try:
            token = wire.decode_retry_payload(payload)
        except wire.MalformedPacket:
            self.rejected["malformed"] += 1
            return
        self._token = token
        self._token_pending = False
        self.retries_received += 1
        self._reset_transfer()
        self._free_until = ((self._seq - self._isn) & 0xFFFFFFFF) + max(self.config.first_window, len(self._announce))
        self._grant = None
        self._grant_top = -1
        self._control = collections.deque((control.ANNOUNCE_MSG_ID, i) for i in range(len(self._announce)))
        # live MSR changes made so far hold on: applied again, and sent again behind the announce
        self._msr_sent.clear()
        self._msr_acked.clear()
        self._msr_queued.clear()
        for gid, (_, msr) in sorted(self._msr_latest.items()):
            self._apply_msr(self.groups[gid], msr)
            self._queue_msr_change(gid)
        self._epoch_end = now + self._epoch_length()
        self._last_progress = now

    def _on_new_token(self, header: wire.Header, payload: bytes) -> None:
        """The receiver holds the job validated and gives this host an address-validation token for its next jobs:
        kept in ``new_token`` if it answers one of this job's announce parts."""
        if self._carried(header.seq) != (control.ANNOUNCE_MSG_ID, header.pkt_idx):
            self.rejected["new_token_unsent_seq"] += 1
            return
        try:
            self.new_token = wire.decode_new_token_payload(payload)
        except wire.MalformedPacket:
            self.rejected["malformed"] += 1

    def _on_token(self, token: bytes, now: float) -> None:
        """An ACK carried an admission token: the receiver admitted the job without one and waits for this sender
        to prove its address. Echo it (announce part 0 again, with the token; at most once per smoothed RTT) without
        waiting for anything."""
        if token != self._token:
            self._token = token
            self._echo_next = 0.0
        if now >= self._echo_next and self.state in (SenderState.SENDING, SenderState.CLOSING):
            self._echo_next = now + self.recovery.srtt
            self._control.append((_ECHO, 0))

    def _from_peer(self, addr: Address) -> bool:
        peer = self.peer
        if peer is None or addr == peer:
            return True
        if isinstance(addr, tuple) and isinstance(peer, tuple):  # IPv6 sockets add flow info and scope id
            return addr[:2] == peer[:2]
        return False

    def _next_seq(self, msg_id: int, idx: int) -> int:
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        self._sent_msg.append(msg_id)
        self._sent_idx.append(idx)
        return seq

    def _carried(self, seq: int) -> tuple[int, int] | None:
        """``(msg_id, pkt_idx)`` that sequence number ``seq`` carried, ``None`` if this sender never used it."""
        off = (seq - self._isn) & 0xFFFFFFFF
        return (self._sent_msg[off], self._sent_idx[off]) if off < len(self._sent_msg) else None

    def _ack_rejection(self, header: wire.Header, blocks: list[tuple[int, int]]) -> str | None:
        """Why an ACK cannot be the receiver's answer to this sender (``None``: it can)."""
        carried = self._carried(header.seq)
        if carried is None:
            return "ack_unsent_seq"
        if carried != (header.msg_id, header.pkt_idx):
            return "ack_mismatch"
        used = len(self._sent_msg)
        for first, last in blocks:
            if not (first - self._isn) & 0xFFFFFFFF <= (last - self._isn) & 0xFFFFFFFF < used:
                return "ack_unsent_seq"
        return None

    # -- acknowledgements and loss -----------------------------------------------------------------

    def _on_ack(self, header: wire.Header, blocks: list[tuple[int, int]], now: float) -> None:
        self._last_progress = now
        if header.msg_id == control.FIN_MSG_ID:
            return
        group = self.groups.get(header.group_id)
        trimmed = bool(header.flags & wire.Flags.TRIM)
        if header.msg_id not in control.CONTROL_MSG_IDS and not trimmed:
            self._path_queue = header.queue
            if group is not None:
                group.queues[header.queue] += 1
                if header.flags & wire.Flags.ECE:
                    group.ece += 1
        if self.state != SenderState.SENDING:
            # keep counting deliveries while closing; losses no longer matter
            acked, _lost = self.recovery.on_ack_received(seq=header.seq, blocks=blocks, now=now, trimmed=trimmed)
            for p in acked:
                self._on_packet_acked(p, now)
            return
        acked, lost = self.recovery.on_ack_received(seq=header.seq, blocks=blocks, now=now, trimmed=trimmed)
        window = self.window
        if window is not None and not trimmed:
            window.on_path(queue=header.queue, rtt=self.recovery.min_rtt + self.config.pacing_train_s)
        delivery = self.recovery.delivery()
        for p in acked:
            self._on_packet_acked(p, now)
            if window is not None and p.group_id is not None:
                window.on_ack(p.seq, delivery)
        self._on_lost(lost, now)
        self._check_complete(now)

    def _on_packet_acked(self, p: SentPacket, now: float) -> None:
        if p.msg_id == control.ANNOUNCE_MSG_ID:
            self._announce_acked[p.pkt_idx] = 1
            return
        if p.msg_id == control.MSR_MSG_ID:
            gid, change = self._msr_sent.pop(p.seq, (0, 0))
            if change > self._msr_acked.get(gid, 0):
                self._msr_acked[gid] = change
            return
        if not p.more:
            self._message_packet_acked(self.messages[p.msg_id], p.pkt_idx, p.size)
            return
        for mid in (p.msg_id, *p.more):  # a packed packet: each message whole, in its one packet
            m = self.messages[mid]
            self._message_packet_acked(m, 0, len(m.data))

    def _message_packet_acked(self, m: _Message, idx: int, size: int) -> None:
        if m.pkt_state[idx] == ACKED:
            return
        m.pkt_state[idx] = ACKED
        m.acked += 1
        m.remaining -= size
        if m.acked < m.cnt:
            if self.scheduler.mrdf and m.state in (ACTIVE, REPAIRING):
                self.scheduler.update(m.msg_id, remaining=m.remaining, repair=m.state == REPAIRING,
                                      retries=m.retries)
            return
        g = m.group
        if m.state == ACTIVE:
            g.active -= 1
            g.started -= not m.surplus
        elif m.state == DAMAGED:
            g.damaged -= 1
        elif m.state == REPAIRING:
            g.repairing -= 1
        m.state = DELIVERED
        g.delivered += 1
        self.scheduler.remove(m.msg_id)
        if self.message_events:
            self._events.append(events.MessageAcked(m.msg_id, g.group_id))

    def _on_lost(self, lost: list[SentPacket], now: float) -> None:
        if self._grant is not None:  # a granted packet lost past what the receiver had gives its place back
            for p in lost:
                off = (p.seq - self._isn) & 0xFFFFFFFF
                if self._free_until <= off < self._grant and off > self._grant_top:
                    self._grant += 1
        if self.window is not None and lost:
            groups = {p.group_id for p in lost if p.group_id is not None}
            if groups:  # losses of first windows that collided do not end the ramp (rate.py)
                self.window.on_loss(groups=groups, tlr={gid: g.tlr for gid, g in self.groups.items()},
                                    next_seq=self._seq, first=all(p.first for p in lost if p.group_id is not None),
                                    queued=self.recovery.queued(), drain=self.recovery.drain())
        touched: set[int] = set()
        for p in lost:
            if p.copy:  # the packet it copied is still in flight, or acknowledged
                continue
            if p.msg_id == control.ANNOUNCE_MSG_ID:
                if not self._announce_acked[p.pkt_idx]:
                    self._control.append((p.msg_id, p.pkt_idx))
                    if self.recovery.every_overdue:  # twice: a receiver takes no data of the job before it
                        self._control.append((p.msg_id, p.pkt_idx))
                continue
            if p.msg_id == control.MSR_MSG_ID:
                gid, change = self._msr_sent.pop(p.seq, (0, 0))
                if change and change == self._msr_latest[gid][0] and self._msr_acked.get(gid, 0) < change:
                    self._queue_msr_change(gid)
                continue
            for mid in (p.msg_id, *p.more):
                self._message_packet_lost(self.messages[mid], p.pkt_idx, p.retransmission, touched)
        for gid in touched:
            self._plan_repairs(self.groups[gid])

    def _message_packet_lost(self, m: _Message, idx: int, retransmission: bool, touched: set[int]) -> None:
        if m.pkt_state[idx] != IN_FLIGHT:
            return  # acknowledged meanwhile, or a newer copy is the one in flight
        m.pkt_state[idx] = LOST
        if m.lost_pkts is None:
            m.lost_pkts = collections.deque()
        m.lost_pkts.append(idx)
        g = m.group
        for mid in g.parked:  # the group may fall short: what was held back as surplus is offered again
            p = self.messages[mid]
            if p.state == ACTIVE and p.next_new < p.cnt:
                self.scheduler.update(mid, remaining=p.remaining, repair=False, retries=p.retries)
        g.parked.clear()
        if m.state == ACTIVE:
            m.state = DAMAGED
            g.active -= 1
            g.started -= not m.surplus
            g.damaged += 1
            if m.next_new < m.cnt:
                self._unsent_open -= 1
            self.scheduler.remove(m.msg_id)
            key = (m.remaining, m.msg_id) if self.config.mrdf else (m.msg_id,)
            heapq.heappush(g.idle, key)
            touched.add(g.group_id)
        elif m.state == REPAIRING:
            if retransmission:
                m.retries += 1
            self.scheduler.update(m.msg_id, remaining=m.remaining, repair=True, retries=m.retries)

    def _plan_repairs(self, g: _Group) -> None:
        """Repair damaged messages while the group has given up more than it can afford. ``adaptive`` with MRDF
        also repairs a damaged message that has less left to send than the message the scheduler would serve
        next: the loss budget then goes to the largest messages (never sent) rather than to whichever small
        messages a queue happened to drop, so the MSR costs the fewest bytes (with equal sizes nothing changes)."""
        while g.damaged > g.budget and g.idle:
            msg_id = heapq.heappop(g.idle)[-1]
            if self.messages[msg_id].state == DAMAGED:
                self._repair(g, self.messages[msg_id])
        if not (self.adaptive and self.config.mrdf):
            return
        while g.idle:
            m = self.messages[g.idle[0][-1]]
            if m.state != DAMAGED:
                heapq.heappop(g.idle)
                continue
            top = self.scheduler.peek()
            if top is None or not m.remaining < self.messages[top].remaining:
                return
            heapq.heappop(g.idle)
            self._repair(g, m)

    def _repair(self, g: _Group, m: _Message) -> None:
        m.state = REPAIRING
        g.damaged -= 1
        g.repairing += 1
        if m.next_new < m.cnt:
            self._unsent_open += 1
        self.scheduler.update(m.msg_id, remaining=m.remaining, repair=True, retries=m.retries)

    # -- epochs, completion, close -----------------------------------------------------------------

    def _epoch_length(self) -> float:
        if self.config.epoch_s is not None:
            return self.config.epoch_s
        return max(self.config.min_epoch_s, self.recovery.srtt)

    def _end_epoch(self, now: float) -> None:
        srtt = self.recovery.srtt
        if self.window is not None:
            counts = self.window.end_epoch(duration_s=self._epoch_length())
            rate = min(self.config.max_rate_bps, self.window.window * self.window.mean_packet_bits / max(srtt, 1e-6))
        else:
            counts = self.rate.end_epoch(tlr={gid: g.tlr for gid, g in self.groups.items()}, rtt_s=srtt)
            rate = self.rate.rate_bps
        for gid, g in self.groups.items():
            g.tlr = g.next_tlr()
            c = counts.get(gid)
            loss = c.loss if c else 0.0
            if self.window is not None:
                # adaptive: the loss over the group's recent packets whose fate is known (a few epochs'
                # worth), the same estimate the window reacts to; the controller compares it with the TLR
                estimate = self.window.loss_rate(gid)
                if estimate is not None:
                    loss = estimate
            self._events.append(events.EpochEnded(
                epoch=self.epoch, time=now - self.start_time, group_id=gid, tlr=g.tlr, rate_bps=rate,
                loss=loss, sent=c.sent if c else 0, acked=c.acked if c else 0, queues=dict(g.queues), ece=g.ece))
            g.queues.clear()
            g.ece = 0
            g.report_seq += 1
            self._events.append(events.ReportReady(wire.Report(
                job_id=self.job.job_id, group_id=gid, seq=g.report_seq, tlr=g.tlr, loss=loss, msr=g.msr,
                rate_kbps=min(0xFFFFFFFF, int(rate / 1000)), total=g.total, delivered=g.delivered, lost=g.lost,
                epoch=self.epoch)))
        self.epoch += 1
        self._epoch_end = now + self._epoch_length()

    def _check_complete(self, now: float) -> None:
        if self.state != SenderState.SENDING:
            return
        if any(g.delivered < g.required for g in self.groups.values()) or not all(self._announce_acked):
            return
        if self.config.completion == "all_sent" and self._unsent_open > 0:
            return
        self._completed_at = now
        self.state = SenderState.CLOSING
        self._fin_deadline = now + self.config.fin_timeout_s
        self._queue_fin(now)

    def _queue_fin(self, now: float) -> None:
        """The FIN, once per tail timeout (at least ``_FIN_RETRY_MIN_S``) until a DONE comes: as many copies at a
        time as the answers' loss needs for one DONE to come back (``LossRecovery.fin_copies``; one on a path that
        loses no answers)."""
        self._control.extend([(control.FIN_MSG_ID, 0)] * self.recovery.fin_copies())
        self._fin_next = None  # set when the FIN actually leaves

    def _on_done(self, header: wire.Header, payload: bytes, now: float) -> None:
        if self.state != SenderState.CLOSING:
            self.rejected["done_before_fin"] += 1
            return
        if self._carried(header.seq) != (control.FIN_MSG_ID, 0):
            self.rejected["done_unsent_seq"] += 1
            return
        try:
            ranges = wire.decode_done_payload(payload)
        except wire.MalformedPacket:
            self.rejected["malformed"] += 1
            return
        if self._done_cnt is not None and header.pkt_cnt != self._done_cnt:
            self._done_parts.clear()
        self._done_cnt = header.pkt_cnt
        self._done_parts[header.pkt_idx] = ranges
        if len(self._done_parts) == self._done_cnt:
            n = len(self.messages)  # ids past the job's own are ignored: a DONE costs at most O(n + ranges) here
            lost: list[int] = []
            for first, end in sorted(r for part in self._done_parts.values() for r in part):
                lost.extend(range(max(first, lost[-1] + 1 if lost else 0), min(end, n)))
            self._finish(now, confirmed=True, lost_ids=lost)

    def _finish(self, now: float, *, confirmed: bool, lost_ids: list[int] | None = None) -> None:
        if lost_ids is None:
            lost_ids = [m.msg_id for m in self.messages if m.state != DELIVERED]
        lost_per_group: collections.Counter[int] = collections.Counter(
            self.messages[i].group.group_id for i in lost_ids)
        groups = tuple(
            GroupSummary(group_id=gid, msr=g.msr, total=g.total, required=g.required,
                         delivered=g.total - lost_per_group[gid], lost=lost_per_group[gid], final_tlr=g.tlr,
                         packets_sent=g.packets_sent, retransmissions=g.retransmissions)
            for gid, g in self.groups.items())
        completed = self._completed_at if self._completed_at is not None else now
        self.summary = SendSummary(
            job_id=self.job.job_id, mode=self.config.mode, mrdf=self.config.mrdf,
            completion=self.config.completion, jct_s=completed - self.start_time, closed_s=now - self.start_time,
            receiver_confirmed=confirmed, groups=groups, lost_ids=tuple(lost_ids), packets_sent=self.packets_sent,
            packets_acked=self.recovery.packets_acked, packets_lost=self.recovery.packets_lost,
            retransmissions=self.retransmissions, epochs=self.epoch, final_rate_bps=self.rate.rate_bps,
            srtt_s=self.recovery.srtt, losses_found_by=dict(self.recovery.lost_by),
            packets_surplus=self.packets_surplus, rejected=dict(self.rejected),
            spurious_losses=self.recovery.spurious_losses)
        self.state = SenderState.DONE
        self._events.append(events.JobCompleted(self.summary))

    def _fail(self, reason: str) -> None:
        self.state = SenderState.FAILED
        self.failure = reason
        self._events.append(events.JobFailed(reason))
