"""The ATP receiver state machine (sans-I/O). One instance serves any number of jobs on one socket.

For every DATA packet it queues one ACK (echoing ``seq``, the message coordinates and the ``queue`` byte,
plus up to 16 selective-ack blocks), suppresses duplicates, reassembles messages and hands each whole
message to the application as a :class:`hostlib.events.MessageReceived` event: at once for approximate
groups, in msg_id order within the group for MSR = 1 groups.

How the receiver learns a job (see hostlib/control.py): the sender's first message is the *job announce*
(reserved msg_id 0xFFFFFFFF): N, the groups with their MSR and message ids, and the vector length of a
float-vector job. Data that arrives before the announce is buffered (within the memory limits); MSR = 1
messages wait for it because their order depends on it. The sender's FIN (msg_id 0xFFFFFFFE) ends the
job: the receiver answers with DONE listing every message id it does not have, and repeats that answer
for repeated FINs during ``finished_linger_s``. A job silent for ``idle_timeout_s`` is abandoned.

Memory stays bounded: N, ``pkt_cnt``, the number of jobs and the buffered bytes have limits in
:class:`hostlib.config.AtpConfig`; packets over a limit are dropped unacknowledged and counted in
``dropped`` (garbage is counted in ``malformed``, by reason).
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
from typing import Any

from netapprox.hostlib import control, events, wire
from netapprox.hostlib.config import AtpConfig

Address = Any
_MAX_SACK_RANGES = 64


@dataclasses.dataclass(frozen=True)
class GroupResult:
    group_id: int
    msr: float
    total: int
    delivered: int

    @property
    def lost(self) -> int:
        return self.total - self.delivered


@dataclasses.dataclass(frozen=True)
class JobResult:
    """The receiver's final account of a job (also what its DONE told the sender)."""

    job_id: int
    peer: Address
    total: int
    vector_len: int | None
    lost_ids: tuple[int, ...]
    groups: tuple[GroupResult, ...]
    packets: int
    duplicates: int
    first_packet_at: float
    finished_at: float

    @property
    def delivered(self) -> int:
        return self.total - len(self.lost_ids)


class _Partial:
    __slots__ = ("cnt", "parts", "got", "group_id", "approx", "nbytes")

    def __init__(self, cnt: int, group_id: int, approx: bool) -> None:
        self.cnt = cnt
        self.parts: list[bytes | None] = [None] * cnt
        self.got = 0
        self.group_id = group_id
        self.approx = approx
        self.nbytes = 0


class _Job:
    def __init__(self, job_id: int, peer: Address, now: float) -> None:
        self.job_id = job_id
        self.peer = peer
        self.first_at = now
        self.last_at = now
        self.manifest: control.Manifest | None = None
        self.group_of: dict[int, int] = {}  # from the announce
        self.rejected: str | None = None
        self.announce_parts: dict[int, bytes] = {}
        self.announce_cnt: int | None = None
        self.partial: dict[int, _Partial] = {}
        self.delivered: set[int] = set()
        self.group_of_delivered: dict[int, int] = {}
        self.unordered: dict[int, tuple[int, bytes]] = {}  # complete MSR=1 messages waiting for the announce
        self.order: dict[int, list[int]] = {}  # MSR=1 group -> its msg ids, ascending
        self.order_pos: dict[int, int] = {}
        self.held: dict[int, bytes] = {}  # complete MSR=1 messages waiting for their predecessors
        self.seq_firsts: list[int] = []
        self.seq_lasts: list[int] = []
        self.packets = 0
        self.duplicates = 0
        self.buffered = 0
        self.done_datagrams: list[bytes] | None = None
        self.result: JobResult | None = None
        self.finished_at: float | None = None

    def note_seq(self, seq: int) -> bool:
        """Record a received sequence number; False if it was seen before."""
        firsts, lasts = self.seq_firsts, self.seq_lasts
        i = bisect.bisect_right(firsts, seq) - 1
        if i >= 0 and lasts[i] >= seq:
            return False
        if i >= 0 and lasts[i] + 1 == seq:
            lasts[i] = seq
            if i + 1 < len(firsts) and firsts[i + 1] == seq + 1:
                lasts[i] = lasts[i + 1]
                del firsts[i + 1], lasts[i + 1]
        elif i + 1 < len(firsts) and firsts[i + 1] == seq + 1:
            firsts[i + 1] = seq
        else:
            firsts.insert(i + 1, seq)
            lasts.insert(i + 1, seq)
            if len(firsts) > _MAX_SACK_RANGES:
                del firsts[0], lasts[0]
        return True

    def sack_blocks(self) -> list[tuple[int, int]]:
        n = min(wire.MAX_SACK_BLOCKS, len(self.seq_firsts))
        return [(self.seq_firsts[-1 - k], self.seq_lasts[-1 - k]) for k in range(n)]


class AtpReceiver:
    """Serves ATP jobs. See the module docstring."""

    def __init__(self, *, config: AtpConfig = AtpConfig(), now: float = 0.0, accept_jobs: int | None = None) -> None:
        """``accept_jobs``: serve at most this many distinct jobs over the receiver's life (``None``: no
        limit). Packets of further jobs are dropped unacknowledged, so nothing is acknowledged that
        the owner will not collect (``receive_job`` serves exactly one job)."""
        self.config = config
        self.accept_jobs = accept_jobs
        self.jobs_seen = 0
        self.jobs: dict[int, _Job] = {}
        self._out: list[tuple[bytes, Address]] = []
        self._events: collections.deque[events.Event] = collections.deque()
        self.buffered = 0
        self.datagrams = 0
        self.malformed: collections.Counter[str] = collections.Counter()
        self.dropped: collections.Counter[str] = collections.Counter()

    # -- public sans-I/O interface -----------------------------------------------------------------

    def receive_datagram(self, data: bytes, addr: Address, now: float, *, ce: bool = False) -> None:
        """``ce``: the datagram arrived with IP ECN = CE (the I/O layer reads it); its ACK gets ``ECE``."""
        self.datagrams += 1
        try:
            header, payload = wire.decode(data)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            return
        if header.type != wire.PacketType.DATA:
            self.malformed["not_data"] += 1
            return
        if header.job_id == 0:
            self.malformed["job_zero"] += 1
            return
        job = self.jobs.get(header.job_id)
        if job is None:
            if len(self.jobs) >= self.config.max_jobs:
                self.dropped["too_many_jobs"] += 1
                return
            if header.msg_id == control.FIN_MSG_ID:
                self.dropped["fin_for_unknown_job"] += 1
                return
            if self.accept_jobs is not None and self.jobs_seen >= self.accept_jobs:
                self.dropped["not_accepting_jobs"] += 1
                return
            self.jobs_seen += 1
            job = self.jobs[header.job_id] = _Job(header.job_id, addr, now)
        if job.done_datagrams is not None:
            if header.msg_id == control.FIN_MSG_ID:
                self._out.extend((d, addr) for d in job.done_datagrams)
            else:
                self.dropped["job_finished"] += 1
            return
        if job.rejected is not None:
            self.dropped["job_rejected"] += 1
            return
        job.peer = addr
        job.last_at = now
        if header.msg_id == control.FIN_MSG_ID:
            self._on_fin(job, header, now)
        elif header.msg_id == control.ANNOUNCE_MSG_ID:
            self._on_announce(job, header, payload, now)
        else:
            self._on_data(job, header, payload, now, ce)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        times = []
        for job in self.jobs.values():
            if job.finished_at is not None:
                times.append(job.finished_at + self.config.finished_linger_s)
            else:
                times.append(job.last_at + self.config.idle_timeout_s)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        for job_id, job in list(self.jobs.items()):
            if job.finished_at is not None:
                if now >= job.finished_at + self.config.finished_linger_s:
                    del self.jobs[job_id]
            elif now >= job.last_at + self.config.idle_timeout_s:
                delivered = len(job.delivered)
                self._release(job)
                del self.jobs[job_id]
                self._events.append(events.JobAbandoned(job_id, delivered))

    def next_event(self) -> events.Event | None:
        return self._events.popleft() if self._events else None

    # -- data --------------------------------------------------------------------------------------

    def _ack(self, job: _Job, h: wire.Header, ce: bool = False) -> None:
        ack = wire.Header(type=wire.PacketType.ACK, flags=wire.Flags.ECE if ce else 0, queue=h.queue,
                          job_id=h.job_id, msg_id=h.msg_id,
                          group_id=h.group_id, pkt_idx=h.pkt_idx, pkt_cnt=h.pkt_cnt, seq=h.seq)
        self._out.append((wire.encode(ack, wire.encode_ack_payload(job.sack_blocks())), job.peer))

    def _on_data(self, job: _Job, h: wire.Header, payload: bytes, now: float, ce: bool = False) -> None:
        cfg = self.config
        m = job.manifest
        if h.msg_id >= (m.total if m is not None else cfg.max_messages):
            self.dropped["msg_id_out_of_range"] += 1
            return
        if h.pkt_cnt > cfg.max_packets_per_message:
            self.dropped["too_many_packets"] += 1
            return
        job.packets += 1
        if h.msg_id in job.delivered:
            job.duplicates += 1
            job.note_seq(h.seq)
            self._ack(job, h, ce)
            return
        if m is not None and job.group_of.get(h.msg_id) != h.group_id:
            self.malformed["inconsistent_message"] += 1
            return
        part = job.partial.get(h.msg_id)
        if part is None:
            approx = h.approx if m is None else self._group_msr(job, h.group_id) < 1.0
            part = job.partial[h.msg_id] = _Partial(h.pkt_cnt, h.group_id, approx)
        elif part.cnt != h.pkt_cnt or part.group_id != h.group_id:
            self.malformed["inconsistent_message"] += 1
            return
        if part.parts[h.pkt_idx] is not None:
            job.duplicates += 1
            job.note_seq(h.seq)
            self._ack(job, h, ce)
            return
        if self.buffered + len(payload) > cfg.max_buffered_bytes:
            self.dropped["buffer_full"] += 1
            return
        part.parts[h.pkt_idx] = payload
        part.got += 1
        part.nbytes += len(payload)
        self._buffer(job, len(payload))
        job.note_seq(h.seq)
        self._ack(job, h, ce)
        if part.got == part.cnt:
            del job.partial[h.msg_id]
            data = b"".join(part.parts)  # type: ignore[arg-type]
            self._buffer(job, -part.nbytes)
            job.delivered.add(h.msg_id)
            job.group_of_delivered[h.msg_id] = part.group_id
            self._deliver(job, h.msg_id, part.group_id, part.approx, data)

    def _group_msr(self, job: _Job, group_id: int) -> float:
        for g in job.manifest.groups:  # type: ignore[union-attr]
            if g.group_id == group_id:
                return g.msr
        return 0.0

    def _buffer(self, job: _Job, delta: int) -> None:
        job.buffered += delta
        self.buffered += delta

    def _deliver(self, job: _Job, msg_id: int, group_id: int, approx: bool, data: bytes) -> None:
        if approx:
            self._events.append(events.MessageReceived(job.job_id, msg_id, group_id, data))
            return
        if job.manifest is None:
            job.unordered[msg_id] = (group_id, data)
            self._buffer(job, len(data))
            return
        job.held[msg_id] = data
        self._buffer(job, len(data))
        self._release_in_order(job, group_id)

    def _release_in_order(self, job: _Job, group_id: int) -> None:
        ids = job.order.get(group_id)
        if ids is None:  # not an MSR = 1 group after all: deliver what is held
            ids = []
        pos = job.order_pos.get(group_id, 0)
        while pos < len(ids) and ids[pos] in job.held:
            data = job.held.pop(ids[pos])
            self._buffer(job, -len(data))
            self._events.append(events.MessageReceived(job.job_id, ids[pos], group_id, data))
            pos += 1
        job.order_pos[group_id] = pos

    def _on_announce(self, job: _Job, h: wire.Header, payload: bytes, now: float) -> None:
        if job.announce_cnt is not None and h.pkt_cnt != job.announce_cnt:
            self.malformed["inconsistent_announce"] += 1
            return
        job.note_seq(h.seq)
        if job.manifest is not None or h.pkt_idx in job.announce_parts:
            job.duplicates += 1
            self._ack(job, h)
            return
        if self.buffered + len(payload) > self.config.max_buffered_bytes:
            self.dropped["buffer_full"] += 1
            return
        job.announce_cnt = h.pkt_cnt
        job.announce_parts[h.pkt_idx] = payload
        self._buffer(job, len(payload))
        self._ack(job, h)
        if len(job.announce_parts) < h.pkt_cnt:
            return
        blob = b"".join(job.announce_parts[i] for i in range(h.pkt_cnt))
        self._buffer(job, -len(blob))
        job.announce_parts.clear()
        try:
            manifest = control.Manifest.decode(blob, max_messages=self.config.max_messages)
            self._check_against_manifest(job, manifest)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            job.rejected = str(err)
            self._release(job)
            self._events.append(events.JobRejected(job.job_id, job.rejected))
            return
        job.manifest = manifest
        job.group_of = manifest.group_of()
        for g in manifest.groups:
            if g.msr >= 1.0:
                job.order[g.group_id] = list(g.msg_ids)
        # messages completed before the announce: MSR=1 ones now go out in order
        for msg_id, (group_id, data) in sorted(job.unordered.items()):
            job.held[msg_id] = data
        job.unordered.clear()
        for group_id in job.order:
            self._release_in_order(job, group_id)
        for msg_id, part in job.partial.items():
            part.approx = self._group_msr(job, part.group_id) < 1.0

    def _check_against_manifest(self, job: _Job, manifest: control.Manifest) -> None:
        group_of = manifest.group_of()
        seen = list(job.partial.items()) + [(i, None) for i in job.delivered]
        for msg_id, part in seen:
            gid = part.group_id if part is not None else job.group_of_delivered.get(msg_id)
            if group_of.get(msg_id) != gid:
                raise wire.MalformedPacket("bad_announce",
                                           f"message {msg_id} arrived as group {gid}, announce disagrees")

    def _on_fin(self, job: _Job, h: wire.Header, now: float) -> None:
        m = job.manifest
        if m is None:
            self.dropped["fin_before_announce"] += 1
            return
        # an MSR = 1 group should have no gaps; if it has, hand over what is held anyway, in order
        for msg_id in sorted(job.held):
            data = job.held.pop(msg_id)
            self._buffer(job, -len(data))
            self._events.append(events.MessageReceived(job.job_id, msg_id, job.group_of_delivered[msg_id], data))
        lost = tuple(i for i in range(m.total) if i not in job.delivered)
        delivered_per_group = collections.Counter(job.group_of_delivered.values())
        result = JobResult(
            job_id=job.job_id, peer=job.peer, total=m.total, vector_len=m.vector_len, lost_ids=lost,
            groups=tuple(GroupResult(g.group_id, g.msr, g.count, delivered_per_group[g.group_id])
                         for g in m.groups),
            packets=job.packets, duplicates=job.duplicates, first_packet_at=job.first_at, finished_at=now)
        parts = wire.encode_done_payloads(lost, self.config.max_payload)
        job.done_datagrams = [
            wire.encode(wire.Header(type=wire.PacketType.DONE, job_id=job.job_id, pkt_idx=i, pkt_cnt=len(parts),
                                    seq=h.seq), p)
            for i, p in enumerate(parts)]
        job.result = result
        job.finished_at = now
        self._release(job)
        self._out.extend((d, job.peer) for d in job.done_datagrams)
        self._events.append(events.JobFinished(result))

    def _release(self, job: _Job) -> None:
        """Free a job's buffers (it finished, was rejected or abandoned)."""
        self.buffered -= job.buffered
        job.buffered = 0
        job.partial.clear()
        job.held.clear()
        job.unordered.clear()
        job.announce_parts.clear()
        job.delivered = set()
        job.group_of_delivered = {}
        job.group_of = {}
