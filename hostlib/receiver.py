"""The ATP receiver state machine (sans-I/O). One instance serves any number of jobs on one socket.

It acknowledges every DATA packet of an admitted job (an ACK echoes ``seq``, the message coordinates and the
``queue`` byte of the newest packet it covers, plus up to 16 selective-ack blocks; packets of a job that
arrive in one batch share an ACK, ``AtpConfig.ack_every`` at most), suppresses duplicates, reassembles
messages and hands each whole message to the application as a :class:`hostlib.events.MessageReceived` event
(or keeps it for :meth:`AtpReceiver.take_messages`): at once for approximate groups, in msg_id order within
the group for MSR = 1 groups.

How a job gets in (hostlib/admission.py, hostlib/control.py): the sender's first datagram is its *job
announce* (reserved msg_id 0xFFFFFFFF: N, the groups with their MSR and message ids). The receiver answers
an announce for an unknown job with a RETRY carrying an admission token and keeps nothing; the job is
created when an announce echoing a valid token arrives from the address the token was minted for, and
only if a job slot and the memory budget allow; a job that proved its address gets a NEW_TOKEN, an
address-validation token its host's next jobs present to be admitted at once (admission.py). From then on the
job is bound to that address: datagrams
for it from anywhere else are dropped. Data is accepted once the whole announce has arrived. The
sender's FIN (msg_id 0xFFFFFFFE) ends the job: the receiver answers with DONE listing every message id
it does not have, and repeats that answer for repeated FINs during ``finished_linger_s``. A job silent
for ``idle_timeout_s`` is abandoned.

State follows evidence: a job costs a fixed record, its manifest as ranges (bytes the announce carried),
a delivered bitmap in 1024-message chunks created when a message in them first arrives, and the payload
it buffers; nothing is sized by the N an announce declares. Everything is charged to one budget
(``AtpConfig.memory_budget_bytes``, :attr:`AtpReceiver.memory`) at the ``*_BYTES`` costs below, each an
upper bound of what CPython allocates for the structure (tests/hostlib/test_hostlib_hostile.py checks them
with tracemalloc). A datagram that would exceed a limit is dropped unacknowledged and counted in
``dropped[reason]``; one that is not well-formed ATP in ``malformed[reason]``; nothing is printed.
"""
from __future__ import annotations

import array
import bisect
import collections
import dataclasses
import math
from typing import Any

from netapprox.hostlib import admission, control, events, wire
from netapprox.hostlib.config import DEFAULT_MAX_RATE_BPS, AtpConfig, required_messages

Address = Any
_MAX_SACK_RANGES = 64
CHUNK_BITS = 1024
_CHUNK_SHIFT = 10
_CHUNK_BYTES_RAW = CHUNK_BITS // 8
_FULL_CHUNK = b"\xff" * _CHUNK_BYTES_RAW

# What the budget charges (bytes): upper bounds of the CPython objects behind each structure.
JOB_BYTES = 4096
"""One job record: its fields, counters, empty containers and 64 SACK ranges."""
CHUNK_BYTES = 320
"""One 1024-message chunk of the delivered bitmap, with its dict slot."""
PARTIAL_BYTES = 512
"""One incomplete multi-packet message, before its payload."""
PACKET_BYTES = 160
"""Per buffered packet or held message, on top of its payload bytes."""
MANIFEST_BYTES = 2048
"""A decoded manifest, fixed part."""
MANIFEST_BYTES_PER_BYTE = 4
"""A decoded manifest per byte of announce: range arrays and the merged lookup arrays (2.25 B/B), plus
the announce itself while it is decoded."""
MANIFEST_BYTES_PER_GROUP = 640
"""A decoded manifest per group (its record, two arrays, its counters and cursor)."""
DONE_BYTES_PER_PART = 96
"""A kept DONE datagram, on top of its length."""

SMALL_MANIFEST = 1024
"""Manifests up to this many bytes (a few dozen ranges: nearly every job's) are not held back by the other
sources' manifests (``AtpConfig.manifest_bytes_per_s``), only by their own source's."""

OUT_BYTES = 128
"""A datagram waiting to be sent, on top of its length."""

OUT_QUEUE_SHARE = 64
"""The outgoing queue (replies not yet handed to the socket) is inside ``memory_budget_bytes``: a reserve of 1/64
of it (at least 64 KiB, or a quarter of a smaller budget) taken from the pool, charged and reported with the rest
(``memory["replies_queued"]``), so it never takes what the budget guarantees to jobs and jobs never take its room;
a reply that does not fit is dropped and counted (``replies["dropped_queue_full"]``), as the network could drop
it."""


def out_reserve(budget: int) -> int:
    """The outgoing queue's reserve within a budget of ``budget`` bytes (``OUT_QUEUE_SHARE``)."""
    return max(min(64 << 10, budget // 4), budget // OUT_QUEUE_SHARE)

RATE_GAINS = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
"""Receiver grants, a receiver not told its rate: the gain its budget has in each delivery window, in turn from the
first estimate on (BBR's ProbeBW cycle): 1.25 lets the arrivals show a rate above the estimate, 0.75 drains what
that queued. hostlib/native/receiver.c has the same numbers."""

LOSS_GAIN_MAX = 2.0
"""... and at most this much more for the packets that die: a grant counts from the newest packet that arrived, so
of the packets granted past it a fraction ``loss`` (of a window's link time, the share that carried packets that died
after the bottleneck: ``DeliveryRate.loss``) holds a place without arriving; the budget is 1 / (1 - loss) larger, up
to this."""

GAP_CREDIT_MAX = 64
"""A packet after a gap counts at most this many sequence numbers it skipped as the link's (at 90 % random loss a gap
longer than 64 has a chance of 0.1 %; a forged jump moves a window's count by no more)."""


IDLE_FACTOR = 2.0
"""A pair of arrivals counts at most this many times the time its packets (with those it skipped) take at the estimate,
or at the quickest spacing of two arrivals so far when that is quicker (no two arrivals come closer than the link sends
them): a longer one held a link the senders left idle (waiting for ACKs that were lost, or for a timer), which is not
the link's rate. At the estimate alone, a first sample that came out low let the waits of the senders it held back into
the samples that could raise it (docs/results.md, "Loss at 0.9: one seed's tail")."""


class DeliveryRate:
    """The rate at which a receiver's link delivers DATA, for a granting receiver not told it
    (``AtpConfig.max_rate_bps`` None): its grant budget is ``gain`` x this x ``initial_rtt_s``. Measured over windows of
    ``window_s`` of arrival time, two ways at once. *In order*: a packet that is its job's next sequence number adds its
    bytes and the time since the arrival before it (of any job): the pace at which packets leave the bottleneck back to
    back, or the senders' when they send slower. *With the gaps*: every packet at or past its job's next sequence number
    adds the time since the arrival before it and its bytes, and as many more packets of its size as sequence numbers it
    skipped (up to ``GAP_CREDIT_MAX``): a packet that died after the bottleneck took its time on the link too. Under
    heavy random loss few pairs are in order (at 90 %, one arrival in ten), so the second closes the windows and gives
    the rate early; but a packet a full bottleneck queue dropped never took link time, so the sample is the smaller of
    the two (the in-order pairs leave the full queue back to back, at the link's rate): gaps cannot make it faster than
    the in-order pace. A window with no in-order pair does not raise the estimate, and the first sample waits for one
    (at 90 % random loss, about five windows). Before the first sample an in-order pair counts at most ``IDLE_FACTOR``
    times the shortest time per byte between two arrivals so far (``quick``: no two arrivals come closer than the link
    sends them): a pair spanning a wait of the senders is not the link's pace, and the first sample sizes the budget the
    senders then keep to (at 90 % random loss one pair that spanned a sender's 8 ms wait made it 1.0-1.1 Mbit/s on a 20
    Mbit/s link, and the sender, held to 2-4 packets, found its losses by the tail timeout for 6 s: docs/results.md,
    "Loss at 0.9: one seed's tail"). The first sample's gaps' side counts at most ``IDLE_FACTOR`` times its bytes (with
    the skipped ones) at the quickest spacing known at its close: its pairs span the senders' waits too (the first
    window's packets dead, a sender's probes dying through its tail timeouts: 130-220 ms without an arrival), and the
    first of them has no spacing before it to compare with. Packets read in one batch of the socket arrive at one
    instant: the first adds the time since the batch before, the others their bytes only if that time counted (the first
    batch's never does), so a batch does not look infinitely fast. A sample closes once the window holds ``window_s`` of
    time, at an instant later than the last (a batch counts whole); the first is the first packets' train: no grant goes
    out before it. The estimate is the largest sample: the rate of the receiver's own link, which does not change; a
    window with the senders idle gives a smaller sample that does not lower it. Measured over every arrival's bytes, or
    the last 10 windows only (BBR's max filter), the estimate followed the losses down; over in-order pairs only, its
    first sample came late and low at 90 % random loss (docs/results.md, "Receiver grants sized by the delivery rate").
    ``loss``: of what the window's link carried (the bytes with the gaps', at most the sample x the window's time), the
    share that did not arrive: the packets that died after the bottleneck, not the ones a full queue dropped (the budget
    grows for the first, ``gain``; growing it for the second would overflow the queue more). hostlib/native/receiver.c
    (``rate_note``) is the same."""

    __slots__ = ("window_s", "last", "counted", "busy", "bytes", "at", "span", "sent", "got", "samples", "bps", "phase",
                 "loss", "quick")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last: float | None = None  # the newest arrival's time
        self.counted: float | None = None  # the newest instant whose time counted for the in-order pairs ...
        self.busy = 0.0  # ... and their time and bytes in the window
        self.bytes = 0
        self.at: float | None = None  # the newest instant whose time counted with the gaps ...
        self.span = 0.0  # ... their time, the bytes with the gaps', and the bytes that arrived
        self.sent = 0
        self.got = 0
        self.samples = 0  # windows closed
        self.bps: float | None = None  # the estimate (bit/s), ``None`` before the first window closed
        self.phase = 0  # index into RATE_GAINS
        self.loss = 0.0
        self.quick = math.inf  # the shortest time per byte between two arrivals (of any job) so far

    def note(self, nbytes: int, now: float, skipped: int) -> None:
        """A DATA packet of ``nbytes`` on the wire arrived at ``now``, ``skipped`` sequence numbers past its job's
        newest (0: the next one; -1: below it, late or repeated)."""
        if self.last is None:
            self.last = now
            return
        if now > self.last and self.span >= self.window_s > 0 and (self.busy > 0 or self.bps is not None):
            self._close()
        credit = 1 + min(skipped, GAP_CREDIT_MAX)
        raw = dt = now - self.last
        if self.bps is not None:  # a pair slower than twice the quicker of the estimate and the quickest spacing waited
            dt = min(dt, IDLE_FACTOR * credit * nbytes * min(8 / self.bps, self.quick))  # on an idle link
        if skipped >= 0 and now > self.last:
            self.span += dt
            self.at = now
        if skipped >= 0 and now == self.at:  # the first of its instant, or the rest of a batch whose time counted
            self.sent += credit * nbytes
            self.got += nbytes
        if skipped == 0 and now > self.last:
            # before the first sample, at most twice the quickest spacing so far: the pair may span the senders' wait
            self.busy += dt if self.bps is not None else min(dt, IDLE_FACTOR * nbytes * self.quick)
            self.counted = now
        if skipped == 0 and now == self.counted:
            self.bytes += nbytes
        if now > self.last:
            self.quick = min(self.quick, raw / nbytes)
        self.last = max(self.last, now)

    def _close(self) -> None:
        if self.bps is None:  # the first sample: the gaps' side at most twice its bytes at the quickest spacing too
            self.span = min(self.span, IDLE_FACTOR * self.sent * self.quick)
        sample = min(8 * self.sent / self.span, 8 * self.bytes / self.busy if self.busy > 0 else self.bps)
        self.bps = sample if self.bps is None else max(self.bps, sample)
        self.phase = self.samples % len(RATE_GAINS)
        self.samples += 1
        carried = min(8 * self.sent, sample * self.span)  # the bits the link carried, at most the sample's
        self.loss = max(0.0, 1 - 8 * self.got / carried) if carried > 0 else 0.0
        self.busy, self.bytes, self.span, self.sent, self.got = 0.0, 0, 0.0, 0, 0

    @property
    def gain(self) -> float:
        """The budget's gain: the cycle's, and 1 / (1 - loss) up to ``LOSS_GAIN_MAX``."""
        lost = LOSS_GAIN_MAX if self.loss * LOSS_GAIN_MAX >= LOSS_GAIN_MAX - 1 else 1 / (1 - self.loss)
        return RATE_GAINS[self.phase] * lost


GRANT_REPEAT_RTTS = 2
GRANT_REPEAT_DOUBLINGS = 6
"""Receiver grants: a granted sender that sent nothing for ``GRANT_REPEAT_RTTS`` x ``initial_rtt_s`` while its grant
lets it send past the newest packet that arrived is sent its grant again in a GRANT, then after twice that, and so on
(``GRANT_REPEAT_DOUBLINGS`` times at most, then at that interval) until it sends again. A sender waits at its grant
with nothing in flight, so no timer of its own fires, and when the ACK or GRANT that raised it was lost it waited for
its idle timeout (ml/'s DDP under 20 % injected loss: "went silent for 10 s before its FIN"; docs/results.md,
"Receiver grants: the delivery rate with the gaps"). The repeats are replies like any (``REPLY_FACTOR``)."""

REPLY_FACTOR = 3
"""A job's replies (ACKs, DONE) total at most this many times the bytes its sender sent it (QUIC's limit for an
unvalidated address, RFC 9000 §8.1, here for every job): a reply that would pass it waits for more request
bytes (an ACK sends fewer SACK blocks, a DONE part waits for the next FIN). RETRYs are smaller than the
announce they answer."""


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
    lost_ranges: tuple[tuple[int, int], ...]
    """The message ids not delivered, as ascending ranges ``(first, end)``: at most one more range than
    messages delivered, whatever N the job declared."""
    groups: tuple[GroupResult, ...]
    packets: int
    duplicates: int
    first_packet_at: float
    finished_at: float

    @property
    def lost(self) -> int:
        return sum(end - first for first, end in self.lost_ranges)

    @property
    def delivered(self) -> int:
        return self.total - self.lost

    @property
    def lost_ids(self) -> tuple[int, ...]:
        """Every lost id (``lost`` of them: prefer ``lost_ranges`` when N may be large)."""
        return tuple(wire.range_ids(self.lost_ranges))


class _Bitmap:
    """Delivered message ids: 1024-bit chunks, created the first time a message in them arrives."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: dict[int, bytearray] = {}

    def has(self, i: int) -> bool:
        c = self.chunks.get(i >> _CHUNK_SHIFT)
        return c is not None and bool(c[(i >> 3) & (_CHUNK_BYTES_RAW - 1)] >> (i & 7) & 1)

    def needs_chunk(self, i: int) -> bool:
        return (i >> _CHUNK_SHIFT) not in self.chunks

    def reserve(self, i: int) -> None:
        """Create the chunk of ``i`` (charged when the first packet of a message in it is accepted)."""
        if (i >> _CHUNK_SHIFT) not in self.chunks:
            self.chunks[i >> _CHUNK_SHIFT] = bytearray(_CHUNK_BYTES_RAW)

    def add(self, i: int) -> None:
        """Set ``i``; its chunk was reserved."""
        self.chunks[i >> _CHUNK_SHIFT][(i >> 3) & (_CHUNK_BYTES_RAW - 1)] |= 1 << (i & 7)

    def missing_ranges(self, total: int) -> array.array:
        """The ids in ``0 .. total-1`` not set, as flat ascending ranges ``first, end, ...`` (adjacent runs
        merged). Time: O(total / 1024 + chunks · 128 + ranges)."""
        out = array.array("I")

        def gap(first: int, end: int) -> None:
            if first >= end:
                return
            if out and out[-1] == first:
                out[-1] = end
            else:
                out.extend((first, end))

        gap_from = 0  # start of the current run of ids in chunks never created
        for c in sorted(self.chunks):
            base = c << _CHUNK_SHIFT
            if base >= total:
                break
            gap(gap_from, base)
            gap_from = min(total, base + CHUNK_BITS)
            bits = self.chunks[c]
            if bits == _FULL_CHUNK:
                continue
            for k, byte in enumerate(bits):
                if byte != 0xFF:
                    first = base + 8 * k
                    for a, b in _UNSET_RUNS[byte]:
                        gap(first + a, min(first + b, total))
        gap(gap_from, total)
        return out


def _unset_runs(v: int) -> tuple[tuple[int, int], ...]:
    runs, b = [], 0
    while b < 8:
        if v >> b & 1:
            b += 1
            continue
        a = b
        while b < 8 and not v >> b & 1:
            b += 1
        runs.append((a, b))
    return tuple(runs)


_UNSET_RUNS = tuple(_unset_runs(v) for v in range(256))


def _manifest_cost(blob: bytes) -> int:
    head = control.MANIFEST_HEAD_LEN
    n_groups = int.from_bytes(blob[head - 2:head], "big") if len(blob) >= head else 0
    n_groups = min(n_groups, len(blob) // 12)  # a group takes at least 12 bytes of announce
    return MANIFEST_BYTES + MANIFEST_BYTES_PER_BYTE * len(blob) + MANIFEST_BYTES_PER_GROUP * n_groups


class _Partial:
    __slots__ = ("cnt", "parts", "nbytes")

    def __init__(self, cnt: int) -> None:
        self.cnt = cnt
        self.parts: dict[int, bytes] = {}
        self.nbytes = 0


class _Job:
    __slots__ = (
        "job_id", "peer", "source", "first_at", "last_at", "progress_at", "progressed", "manifest", "index",
        "ordered", "delivered_per_group", "cursor", "announce_parts", "announce_cnt", "partial", "delivered",
        "held", "seq_firsts", "seq_lasts", "packets", "duplicates", "charged", "done_datagrams", "finished_at",
        "rejected", "pending_ack", "pending_count", "rx_bytes", "tx_bytes", "done_next", "validated", "token",
        "required", "top", "grant", "alloc", "data_packets", "records", "trimmed", "echo", "grant_queue", "need_bytes",
        "payload", "msr", "msr_change", "grant_repeats")

    def __init__(self, job_id: int, peer: Address, now: float) -> None:
        self.job_id = job_id
        self.peer = peer
        self.source = admission.source_of(peer)
        self.first_at = now
        self.last_at = now
        self.progress_at = now
        self.progressed = False
        self.manifest: control.Manifest | None = None
        self.index: control.GroupIndex | None = None
        self.ordered: list[bool] = []  # per group index: MSR = 1, delivered in id order
        self.delivered_per_group: list[int] = []
        self.cursor: dict[int, tuple[int, int]] = {}  # ordered group index -> (range index, next msg id)
        self.announce_parts: dict[int, bytes] = {}
        self.announce_cnt: int | None = None
        self.partial: dict[int, _Partial] = {}
        self.delivered = _Bitmap()
        self.held: dict[int, bytes] = {}  # complete MSR = 1 messages waiting for their predecessors
        self.seq_firsts = array.array("I")
        self.seq_lasts = array.array("I")
        self.packets = 0
        self.duplicates = 0
        self.charged = 0
        self.done_datagrams: list[bytes] | None = None
        self.finished_at: float | None = None
        self.rejected: str | None = None
        self.pending_ack: tuple[wire.Header, bool] | None = None  # newest packet not yet acknowledged, CE mark
        self.pending_count = 0
        self.rx_bytes = 0  # datagram bytes the job's sender sent us (its reply credit: REPLY_FACTOR x this)
        self.tx_bytes = 0  # reply bytes sent for the job
        self.done_next = 0  # the DONE part a repeated FIN resends first
        self.validated = True
        """False while a job admitted without a token waits for its sender to echo ``token``: it may hold at most
        its slot's guarantee, and is sent at most ``rx_bytes`` (what came from its address) in all, not
        ``REPLY_FACTOR`` times that."""
        self.token: bytes | None = None
        self.required: list[int] = []  # per group index: messages the MSR needs
        self.msr: list[float] = []  # per group index: the MSR, as announced or as last changed (MSR change)
        self.msr_change: list[int] = []  # per group index: number of the last MSR change applied (0: none)
        # receiver grants (AtpConfig.receiver_grants): the newest sequence number that arrived (data, announce or a
        # trimmed header), the grant given (the sender may send below it), the packets it may have in flight
        self.top: int | None = None
        self.grant: int | None = None
        self.alloc = 0
        self.data_packets = 0  # DATA packets that arrived (trimmed included), and the messages they carried:
        self.records = 0  # messages per packet, for the packets the MSR still needs
        self.trimmed = 0
        self.echo: wire.Header | None = None  # the newest packet that arrived, echoed by a GRANT
        self.grant_queue = wire.QUEUE_UNSET  # the switch queue stamped on its newest needed (TLR < 1) packet
        self.need_bytes = 0  # the announce's hint: payload bytes the MSR needs at least
        self.payload = 0  # payload bytes taken (not duplicates)
        self.grant_repeats = 0  # GRANTs repeated since the sender's last datagram (GRANT_REPEAT_RTTS)

    @property
    def holds_slot(self) -> bool:
        return self.finished_at is None

    def note_seq(self, seq: int) -> None:
        """Record a received sequence number in the SACK ranges (the newest 64 ranges are kept)."""
        firsts, lasts = self.seq_firsts, self.seq_lasts
        i = bisect.bisect_right(firsts, seq) - 1
        if i >= 0 and lasts[i] >= seq:
            return
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

    def received_seq(self, seq: int) -> bool:
        i = bisect.bisect_right(self.seq_firsts, seq) - 1
        return i >= 0 and self.seq_lasts[i] >= seq

    def need_packets(self, max_payload: int) -> int:
        """Packets still needed to meet every group's MSR: the bytes the announce said the MSR needs, less what
        came, in full packets, or (once that is spent, losses having made the sender send larger messages) the
        messages still needed at the messages per packet seen so far, whichever is more."""
        need = sum(max(0, r - d) for r, d in zip(self.required, self.delivered_per_group))
        if need <= 0:
            return 0
        by_count = -(-need * self.data_packets // self.records) if self.records > self.data_packets > 0 else need
        return max(by_count, -(-max(0, self.need_bytes - self.payload) // max_payload))

    def sack_blocks(self) -> list[tuple[int, int]]:
        n = min(wire.MAX_SACK_BLOCKS, len(self.seq_firsts))
        return [(self.seq_firsts[-1 - k], self.seq_lasts[-1 - k]) for k in range(n)]


class AtpReceiver:
    """Serves ATP jobs. See the module docstring."""

    def __init__(self, *, config: AtpConfig = AtpConfig(), now: float = 0.0, accept_jobs: int | None = None,
                 token_secret: bytes | None = None, collect_messages: bool = False) -> None:
        """``accept_jobs``: admit at most this many distinct jobs over the receiver's life (``None``: no
        limit); further announces are dropped unanswered, so nothing is acknowledged that the owner will
        not collect (``receive_job`` serves exactly one job). ``token_secret``: key of the admission
        tokens (default: 32 random bytes). ``collect_messages``: keep whole messages for
        :meth:`take_messages` instead of one ``MessageReceived`` event each (settable; the owner takes them,
        they are outside the memory budget like delivered events)."""
        self.config = config
        self.accept_jobs = accept_jobs
        self.collect_messages = collect_messages
        self._collected: dict[int, dict[int, bytes]] = {}
        self._pending: list[_Job] = []  # jobs with an ACK waiting, in the order their first packet arrived
        self.jobs_seen = 0
        self.jobs: dict[int, _Job] = {}
        self._finished: collections.OrderedDict[int, None] = collections.OrderedDict()  # finish order
        self.tokens = admission.TokenMinter(lifetime_s=config.token_lifetime_s, secret=token_secret,
                                            address_lifetime_s=config.address_token_lifetime_s, now=now)
        self.slots = admission.SlotTable(max_jobs=config.max_jobs, max_per_source=config.max_jobs_per_source,
                                         stall_s=config.stall_timeout_s)
        self.memory = admission.MemoryBudget(config.memory_budget_bytes, config.max_jobs,
                                             out_reserve(config.memory_budget_bytes))
        self.manifest_rate = admission.SourceRate(config.manifest_bytes_per_s, 4 * config.max_jobs,
                                                  total_rate=2 * config.manifest_bytes_per_s, small=SMALL_MANIFEST)
        self._out: list[tuple[bytes, Address]] = []  # charged to memory.out (OUT_BYTES per datagram on top of it)
        self._events: collections.deque[events.Event] = collections.deque()
        self.buffered = 0
        """Payload bytes held for incomplete or not-yet-in-order messages (part of ``memory.used``)."""
        self.datagrams = 0
        self.malformed: collections.Counter[str] = collections.Counter()
        self.dropped: collections.Counter[str] = collections.Counter()
        self.admission: collections.Counter[str] = collections.Counter()
        """``retries`` (RETRYs sent), ``admitted`` (of which ``admitted_without_token``), ``validated`` (jobs whose
        sender echoed a token), ``to_tokens`` / ``to_open`` (switches of ``admission_mode``), ``evicted_stalled``,
        ``evicted_share`` (jobs that lost their slot to a newcomer), ``linger_dropped`` (finished jobs forgotten
        early for memory)."""
        self.replies: collections.Counter[str] = collections.Counter()
        """Amplification: ``request_bytes`` (datagrams of admitted jobs), ``reply_bytes`` (their ACKs and DONEs),
        ``retry_bytes`` and ``announce_bytes`` (RETRYs and the announces they answered), ``sack_trimmed`` (ACKs
        sent with fewer SACK blocks) and ``done_deferred`` (DONE parts held until the next FIN), both for
        ``REPLY_FACTOR`` (1 for a job not validated yet)."""
        self.admission_mode = "open" if accept_jobs is None and config.open_admission_share > 0 else "tokens"
        """``open``: token-less announces are admitted at once; ``tokens``: they get a RETRY (under pressure, or
        always with ``accept_jobs`` or ``open_admission_share`` 0)."""
        self.granting = config.receiver_grants
        self.grant_budget = config.grant_window_packets or config.grant_budget_for(config.bdp_packets)
        """Receiver grants: packets in flight towards this receiver over all its jobs: ``grant_window_packets``, or
        one bandwidth-delay product (``max_rate_bps`` x ``initial_rtt_s``) in the packets that arrive (full packets
        until the first DATA packet; then the mean size on the wire of the DATA packets that arrived whole)."""
        self._grant_fixed = bool(config.grant_window_packets)
        self._bdp_bits = (config.max_rate_bps or DEFAULT_MAX_RATE_BPS) * config.initial_rtt_s
        self.delivery: DeliveryRate | None = None
        """A granting receiver not told its rate (``max_rate_bps`` None, no ``grant_window_packets``) sizes its
        budget by the rate its DATA arrives at (:class:`DeliveryRate`), and grants nothing before the first
        sample: until then its jobs' senders follow their own windows."""
        if self.granting and not self._grant_fixed and not config.max_rate_bps:
            self.delivery = DeliveryRate(config.initial_rtt_s)
            self.grant_budget = 0
        self._data_packets = 0  # DATA packets of admitted jobs that arrived whole, and their bytes on the wire
        self._data_wire_bytes = 0  # (header, payload, ``overhead_bytes``): the budget's packet size
        self._grant_dirty = False
        self.trimmed = 0
        """DATA packets that arrived trimmed (a switch cut their payload): answered at once with a TRIM ACK."""

    @property
    def grant_rate_bps(self) -> float | None:
        """Receiver grants: the rate the budget is sized at: the :class:`DeliveryRate` estimate for a receiver not
        told its rate (``None`` before its first sample), else ``max_rate_bps``; ``None`` with a fixed budget."""
        if self.delivery is not None:
            return self.delivery.bps
        return None if self._grant_fixed else self.config.max_rate_bps or DEFAULT_MAX_RATE_BPS

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
        trimmed = header.flags & wire.Flags.TRIM
        if trimmed and (header.flags & wire.Flags.APPROX or header.length or header.msg_id >= control.MSR_MSG_ID):
            self.malformed["bad_trim"] += 1  # a switch leaves just the header of approximate data, APPROX cleared
            return
        job = self.jobs.get(header.job_id)
        if job is None:
            if header.msg_id == control.ANNOUNCE_MSG_ID:
                self._on_new_announce(header, payload, addr, now)
            elif header.msg_id == control.FIN_MSG_ID:
                self.dropped["fin_for_unknown_job"] += 1
            else:
                self.dropped["unknown_job"] += 1
            return
        if job.peer != addr:
            self.dropped["wrong_source"] += 1
            return
        job.rx_bytes += len(data)
        self.replies["request_bytes"] += len(data)
        if job.finished_at is not None:
            if job.rejected is not None:
                self.dropped["job_rejected"] += 1
            elif header.msg_id != control.FIN_MSG_ID:
                self.dropped["job_finished"] += 1
            elif job.done_datagrams is not None:
                self._send_done(job, job.done_datagrams)
            else:
                self.dropped["done_not_kept"] += 1
            return
        job.last_at = now
        job.grant_repeats = 0
        if trimmed:
            self._on_trimmed(job, header, now)
        elif header.msg_id == control.FIN_MSG_ID:
            self._on_fin(job, header, now)
        elif header.msg_id == control.MSR_MSG_ID:
            self._on_msr_change(job, header, payload)
        elif header.msg_id == control.ANNOUNCE_MSG_ID:
            chunk = self._announce_chunk(header, payload)
            if chunk is not None:
                echo = not job.validated and payload[:wire.TOKEN_LEN] != wire.NO_TOKEN
                if echo:
                    self._validate(job, header, payload[:wire.TOKEN_LEN], now)
                self._on_announce(job, header, chunk, now, echo=echo)
        else:
            self._on_data(job, header, payload, now, ce)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        """ACKs (the waiting ones now, one per job), RETRYs, DONEs and GRANTs."""
        if self._grant_dirty:
            self._schedule()
        for job in list(self._pending):
            self._flush_ack(job)
        out, self._out = self._out, []
        self.memory.out_release()
        return out

    def get_timer(self) -> float | None:
        times = []
        for job in self.jobs.values():
            if job.finished_at is not None:
                times.append(job.finished_at + self.config.finished_linger_s)
            else:
                times.append(job.last_at + self.config.idle_timeout_s)
                repeat = self._grant_repeat_at(job)
                if repeat is not None:
                    times.append(repeat)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        for job_id, job in list(self.jobs.items()):
            if job.finished_at is not None:
                if now >= job.finished_at + self.config.finished_linger_s:
                    self._forget(job)
            elif now >= job.last_at + self.config.idle_timeout_s:
                self._abandon(job, "idle")
            else:
                repeat = self._grant_repeat_at(job)
                if repeat is not None and now >= repeat:
                    job.grant_repeats += 1
                    self._send_grant(job, again=True)

    def next_event(self) -> events.Event | None:
        return self._events.popleft() if self._events else None

    def take_messages(self, job_id: int) -> dict[int, bytes]:
        """The job's whole messages kept while ``collect_messages`` was set, ``{msg_id: data}`` in delivery
        order, handed over (and forgotten) once."""
        return self._collected.pop(job_id, {})

    def _hand_over(self, job: _Job, msg_id: int, group_id: int, data: bytes) -> None:
        """A whole message goes to the application: a ``MessageReceived`` event, or kept for take_messages."""
        if self.collect_messages:
            self._collected.setdefault(job.job_id, {})[msg_id] = data
        else:
            self._events.append(events.MessageReceived(job.job_id, msg_id, group_id, data))

    def stats(self) -> dict[str, Any]:
        """Counters for summaries and metrics: every datagram not acknowledged is in one of them."""
        return {"datagrams": self.datagrams, "malformed": dict(self.malformed), "dropped": dict(self.dropped),
                "admission": dict(self.admission), "admission_mode": self.admission_mode, "jobs": len(self.slots),
                "finished": len(self._finished), "trimmed": self.trimmed, "memory": self.memory.as_dict(),
                "replies": dict(self.replies)}

    # -- replies -------------------------------------------------------------------------------------

    def _reply_room(self, job: _Job) -> int:
        """Bytes ``job`` may still be sent within ``REPLY_FACTOR`` x what its sender sent (once, not validated yet:
        a forged source address gets no more than what was sent in its name)."""
        return (REPLY_FACTOR if job.validated else 1) * job.rx_bytes - job.tx_bytes

    def _queue(self, datagram: bytes, addr: Address) -> bool:
        """Queue a datagram to send, within the budget's reserve for replies until ``datagrams_to_send`` hands it
        over."""
        if not self.memory.out_charge(len(datagram) + OUT_BYTES):
            self.replies["dropped_queue_full"] += 1
            return False
        self._out.append((datagram, addr))
        return True

    def _reply(self, job: _Job, datagram: bytes) -> None:
        if self._queue(datagram, job.peer):
            job.tx_bytes += len(datagram)
            self.replies["reply_bytes"] += len(datagram)

    def _send_done(self, job: _Job, done: list[bytes]) -> None:
        """Send the DONE parts the job's reply room allows, from the first one not yet sent (then round again):
        a sender that repeats its FIN gets the rest, an attacker's FINs buy at most REPLY_FACTOR x their bytes."""
        for k in range(len(done)):
            i = (job.done_next + k) % len(done)
            if len(done[i]) > self._reply_room(job):
                self.replies["done_deferred"] += len(done) - k
                job.done_next = i
                return
            self._reply(job, done[i])
        job.done_next = 0

    # -- admission -----------------------------------------------------------------------------------

    def _on_new_announce(self, h: wire.Header, payload: bytes, addr: Address, now: float) -> None:
        """An announce for a job this receiver does not hold: admit it (at once while not under pressure, else
        with a valid token: a RETRY's, or an address-validation token), answer with a RETRY, or drop it. Holds
        nothing unless it admits. Without a valid token the job is unvalidated whatever its source address, and
        is accounted apart from its host's validated jobs (``admission.account_of``)."""
        if self.accept_jobs is not None and self.jobs_seen >= self.accept_jobs:
            self.dropped["not_accepting_jobs"] += 1
            return
        chunk = self._announce_chunk(h, payload)
        if chunk is None:
            return
        token = payload[:wire.TOKEN_LEN]
        proof = None if token == wire.NO_TOKEN else self.tokens.check_announce(token, h.job_id, addr, now)
        validated = proof in ("job", "address")
        account = admission.account_of(admission.source_of(addr), validated)
        refusal, victim, why = self.slots.choose(account, now)
        if refusal is not None:
            self.dropped[refusal] += 1
            return
        if proof is not None and not validated:
            self.dropped[proof] += 1
            self._retry(h, addr, now)
            return
        if proof is None and not self._admits_without_token(h, account, now):
            self._retry(h, addr, now)
            return
        job = _Job(h.job_id, addr, now)
        job.validated = validated
        job.source = account
        if not self._make_room(job, JOB_BYTES):
            self.dropped["memory_budget"] += 1
            return
        if victim is not None:
            self.admission[f"evicted_{why}"] += 1
            self._abandon(victim, why)  # type: ignore[arg-type]
        self.jobs[h.job_id] = job
        job.rx_bytes = wire.HEADER_LEN + len(payload)  # the announce that admitted it
        self.replies["request_bytes"] += job.rx_bytes
        self._charge(job, JOB_BYTES)
        self.slots.add(job)
        self.jobs_seen += 1
        self.admission["admitted"] += 1
        if validated:
            if proof == "address":
                self.admission["admitted_by_address_token"] += 1
            self._new_token(job, h, now)
        else:
            self.admission["admitted_without_token"] += 1
            job.token = self.tokens.mint(h.job_id, addr, now)
        self._on_announce(job, h, chunk, now)

    def _admits_without_token(self, h: wire.Header, account: Any, now: float) -> bool:
        """Whether a token-less announce is admitted at once (``open_admission_share``): not under pressure (fewer
        than that share of the slots and of the budget in use) and its source's unvalidated ``account`` below that
        share of its own limit. Under pressure never: no source address is trusted for having been validated
        before (a returning sender presents its address-validation token instead). A multi-part announce (a
        manifest larger than one datagram) always asks for a token. Notes every switch of ``admission_mode``."""
        cfg = self.config
        share = cfg.open_admission_share
        if self.accept_jobs is not None or share <= 0:
            return False
        pressure = (len(self.slots) >= share * cfg.max_jobs
                    or self.memory.used >= share * self.memory.limit)
        mode = "tokens" if pressure else "open"
        if mode != self.admission_mode:
            self.admission_mode = mode
            self.admission[f"to_{mode}"] += 1
        if h.pkt_cnt > 1 or pressure:
            return False
        return self.slots.per_source.get(account, 0) < max(1.0, share * cfg.max_jobs_per_source)

    def _validate(self, job: _Job, h: wire.Header, token: bytes, now: float) -> None:
        """An unvalidated job's sender echoed a token (announce part ``h``): if it is the one minted for this job and
        address, the address is the sender's (an off-path forger never saw the ACK that carried it). The job moves
        to its host's validated account (beyond ``max_jobs_per_source`` there if it must: it holds its slot
        already) and gets an address-validation token for the host's next jobs."""
        bad = self.tokens.check(token, job.job_id, job.peer, now)
        if bad is not None:
            self.dropped[bad] += 1
            return
        job.validated = True
        job.token = None
        self.admission["validated"] += 1
        self.slots.rekey(job, admission.account_of(admission.source_of(job.peer), True))
        self._new_token(job, h, now)

    def _new_token(self, job: _Job, h: wire.Header, now: float) -> None:
        """Give a job that proved its address an address-validation token (NEW_TOKEN, echoing announce part ``h``),
        within its reply room like any reply."""
        self._reply_within(job, wire.encode_new_token(h, self.tokens.mint_address(job.peer, now)), "new_token")

    def _retry(self, h: wire.Header, addr: Address, now: float) -> None:
        """Answer with a fresh token. A RETRY is 48 bytes, an announce at least 64: no amplification."""
        self.admission["retries"] += 1
        retry = wire.encode_retry(h, self.tokens.mint(h.job_id, addr, now))
        if self._queue(retry, addr):
            self.replies["retry_bytes"] += len(retry)
            self.replies["announce_bytes"] += wire.HEADER_LEN + h.length

    def _reply_within(self, job: _Job, datagram: bytes, what: str) -> None:
        """Send an ACK, a GRANT or a TRIM ACK if the job's reply room allows it, else count it in ``replies``
        (``ack_withheld``, ...: only tiny packets from an unvalidated address run out of room)."""
        if len(datagram) > self._reply_room(job):
            self.replies[f"{what}_withheld"] += 1
            return
        self._reply(job, datagram)

    def _ack_blocks(self, job: _Job, extra: int) -> list[tuple[int, int]]:
        """The job's SACK blocks, as many as its reply room allows in an ACK with ``extra`` bytes of fields."""
        blocks = job.sack_blocks()
        room = max(0, (self._reply_room(job) - wire.ACK_BASE_LEN - extra) // wire.SACK_BLOCK_LEN)
        if len(blocks) > room:  # tiny DATA packets: fewer blocks, never an ACK larger than REPLY_FACTOR allows
            self.replies["sack_trimmed"] += 1
            blocks = blocks[:room]
        return blocks

    def _make_room(self, job: _Job, n: int) -> bool:
        """Whether ``job`` may be charged ``n`` more bytes, forgetting the oldest finished jobs (never
        ``job`` itself) if that helps."""
        while not self._fits(job, n) and self._forget_oldest_finished(but=job):
            pass
        return self._fits(job, n)

    def _forget_oldest_finished(self, but: _Job | None = None) -> bool:
        for job_id in self._finished:
            if self.jobs[job_id] is not but:
                self.admission["linger_dropped"] += 1
                self._forget(self.jobs[job_id])
                return True
        return False

    def _fits(self, job: _Job, n: int) -> bool:
        if not job.validated and job.charged + n > self.memory.guarantee:
            return False  # an unvalidated job: its slot's guarantee at most, never the pool
        return self.memory.fits(job.charged, job.holds_slot, n)

    def _charge(self, job: _Job, n: int) -> None:
        """Charge ``n`` bytes (``n < 0`` releases); a positive ``n`` was checked with ``_fits``."""
        self.memory.charge(job.charged, job.holds_slot, n)
        job.charged += n

    # -- data --------------------------------------------------------------------------------------

    def _ack(self, job: _Job, h: wire.Header, ce: bool = False) -> None:
        """Acknowledge ``h``: together with the job's other packets of this batch (ACK coalescing), at once when
        ``ack_every`` packets are waiting; a packet with another queue byte or CE mark sends the waiting ACK first."""
        self._arrived(job, h)
        waiting = job.pending_ack
        if waiting is not None and (waiting[0].queue != h.queue or waiting[1] != ce):
            self._flush_ack(job)
        if job.pending_ack is None:
            self._pending.append(job)
        job.pending_ack = (h, ce)
        job.pending_count += 1
        if job.pending_count >= self.config.ack_every:
            self._flush_ack(job)

    def _flush_ack(self, job: _Job) -> None:
        """Send the job's waiting ACK: it echoes the newest packet; the SACK blocks cover the others."""
        h, ce = job.pending_ack  # type: ignore[misc]
        job.pending_ack = None
        job.pending_count = 0
        self._pending.remove(job)
        grant = self._grant_of(job)
        blocks = self._ack_blocks(job, (4 if grant is not None else 0) + (wire.TOKEN_LEN if job.token else 0))
        self._reply_within(job, wire.encode_ack(flags=wire.Flags.ECE if ce else 0, queue=h.queue, job_id=h.job_id,
                                                msg_id=h.msg_id, group_id=h.group_id, pkt_idx=h.pkt_idx,
                                                pkt_cnt=h.pkt_cnt, seq=h.seq, blocks=blocks, token=job.token,
                                                grant=grant), "ack")

    def _note_data_size(self, job: _Job, h: wire.Header, now: float) -> None:
        """The grant budget: one bandwidth-delay product (the told rate, or the :class:`DeliveryRate` estimate
        times its gains, x ``initial_rtt_s``) in the packets that arrive: counted in full packets, a budget
        under-fills the link with smaller ones (1000-byte messages at 20 Mbit/s and 10 ms: 18 full packets where
        24 fit)."""
        nbytes = wire.HEADER_LEN + h.length + self.config.overhead_bytes
        self._data_packets += 1
        self._data_wire_bytes += nbytes
        bits = self._bdp_bits
        if self.delivery is not None:
            skipped = 0 if job.top is None else (h.seq - job.top - 1) & 0xFFFFFFFF
            self.delivery.note(nbytes, now, -1 if skipped >= 1 << 31 else skipped)
            rate = self.delivery.bps
            if rate is None:
                return
            bits = self.delivery.gain * rate * self.config.initial_rtt_s
        budget = self.config.grant_budget_for(math.ceil(bits * self._data_packets / (8 * self._data_wire_bytes)))
        if budget != self.grant_budget:
            self.grant_budget = budget
            self._grant_dirty = True

    def _on_data(self, job: _Job, h: wire.Header, payload: bytes, now: float, ce: bool = False) -> None:
        m = job.manifest
        if m is None:
            self.dropped["before_announce"] += 1
            return
        if self.granting and not self._grant_fixed:
            self._note_data_size(job, h, now)
        if h.count > 1:
            self._on_packed(job, h, payload, now, ce)
            return
        msg_id = h.msg_id
        if msg_id >= m.total:
            self.dropped["msg_id_out_of_range"] += 1
            return
        if h.pkt_cnt > self.config.max_packets_per_message:
            self.dropped["too_many_packets"] += 1
            return
        k = job.index.find(msg_id)  # type: ignore[union-attr]
        if k < 0 or m.groups[k].group_id != h.group_id:
            self.malformed["inconsistent_message"] += 1
            return
        job.packets += 1
        job.data_packets += 1
        job.records += 1
        if job.delivered.has(msg_id):
            self._duplicate(job, h, ce)
            return
        part = job.partial.get(msg_id)
        if part is not None:
            if part.cnt != h.pkt_cnt:
                self.malformed["inconsistent_message"] += 1
                return
            if h.pkt_idx in part.parts:
                self._duplicate(job, h, ce)
                return
        n = len(payload)
        cost = n + PACKET_BYTES
        if part is None:
            cost += PARTIAL_BYTES if h.pkt_cnt > 1 else 0
            cost += CHUNK_BYTES if job.delivered.needs_chunk(msg_id) else 0
        if not self._take(job, h, cost, n, now, ce):
            return
        if part is None:
            job.delivered.reserve(msg_id)
            if h.pkt_cnt == 1:
                self._complete(job, msg_id, k, payload, n)
                return
            part = job.partial[msg_id] = _Partial(h.pkt_cnt)
        part.parts[h.pkt_idx] = payload
        part.nbytes += n
        if len(part.parts) == part.cnt:
            del job.partial[msg_id]
            data = b"".join(part.parts[i] for i in range(part.cnt))
            self._charge(job, -(PARTIAL_BYTES + (part.cnt - 1) * PACKET_BYTES))
            self._complete(job, msg_id, k, data, part.nbytes)

    def _take(self, job: _Job, h: wire.Header, cost: int, nbytes: int, now: float, ce: bool) -> bool:
        """Keep ``nbytes`` of payload that costs ``cost`` bytes of the memory budget, and acknowledge the packet;
        False (counted, nothing kept, no ACK) when the budget cannot hold it."""
        if not self._fits(job, cost):
            self.dropped["memory_budget"] += 1
            return False
        self._charge(job, cost)
        self.buffered += nbytes
        job.payload += nbytes
        job.progressed = True
        job.progress_at = now
        job.note_seq(h.seq)
        self._ack(job, h, ce)
        return True

    def _on_packed(self, job: _Job, h: wire.Header, payload: bytes, now: float, ce: bool) -> None:
        """A packed DATA packet: ``count`` whole one-packet messages of the header's group, kept all or none (its
        one ACK tells the sender that every one of them arrived)."""
        try:
            records = wire.decode_records(payload, h)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            return
        m, index = job.manifest, job.index
        groups = []
        for msg_id, _ in records:
            if msg_id >= m.total:  # type: ignore[union-attr]
                self.dropped["msg_id_out_of_range"] += 1
                return
            k = index.find(msg_id)  # type: ignore[union-attr]
            if k < 0 or m.groups[k].group_id != h.group_id or msg_id in job.partial:  # type: ignore[union-attr]
                self.malformed["inconsistent_message"] += 1
                return
            groups.append(k)
        job.packets += 1
        job.data_packets += 1
        job.records += len(records)
        delivered = job.delivered
        fresh = []
        cost = nbytes = 0
        chunks: set[int] = set()
        for (msg_id, data), k in zip(records, groups):
            if delivered.has(msg_id):
                continue  # this record came before
            fresh.append((msg_id, data, k))
            cost += len(data) + PACKET_BYTES
            nbytes += len(data)
            if delivered.needs_chunk(msg_id) and msg_id >> _CHUNK_SHIFT not in chunks:
                chunks.add(msg_id >> _CHUNK_SHIFT)
                cost += CHUNK_BYTES
        if not fresh:
            self._duplicate(job, h, ce)
            return
        if not self._take(job, h, cost, nbytes, now, ce):
            return
        for msg_id, data, k in fresh:
            delivered.reserve(msg_id)
            self._complete(job, msg_id, k, data, len(data))

    def _on_trimmed(self, job: _Job, h: wire.Header, now: float) -> None:
        """A DATA packet a switch trimmed on the way (its queue was full): only the header came. The sender learns
        at once, with an ACK flagged TRIM that echoes it (no timer); nothing is kept."""
        m = job.manifest
        if m is None:
            self.dropped["before_announce"] += 1
            return
        if h.msg_id >= m.total:
            self.dropped["msg_id_out_of_range"] += 1
            return
        if job.received_seq(h.seq):
            self.dropped["trim_of_received"] += 1  # that packet came whole: the header is forged or stale
            return
        self.trimmed += 1
        job.trimmed += 1
        job.data_packets += 1
        job.records += h.count
        self._arrived(job, h)
        if job.pending_ack is not None:
            self._flush_ack(job)
        grant = self._grant_of(job)
        blocks = self._ack_blocks(job, (4 if grant is not None else 0) + (wire.TOKEN_LEN if job.token else 0))
        self._reply_within(job, wire.encode_ack(flags=wire.Flags.TRIM, queue=h.queue, job_id=h.job_id,
                                                msg_id=h.msg_id, group_id=h.group_id, pkt_idx=h.pkt_idx,
                                                pkt_cnt=h.pkt_cnt, seq=h.seq, blocks=blocks, token=job.token,
                                                grant=grant), "trim_ack")

    # -- receiver grants ------------------------------------------------------------------------------

    def _arrived(self, job: _Job, h: wire.Header) -> None:
        """Packet ``h`` of ``job`` arrived (whole or trimmed): the newest sequence number moves, and a job that
        needs less than it may have in flight (or was not granted) changes the schedule."""
        if job.top is None or (h.seq - job.top) & 0xFFFFFFFF < 1 << 31:
            job.top = h.seq
            job.echo = h
            if h.tlr < wire.TLR_ONE and h.queue != job.grant_queue:  # surplus (TLR 1.0) is in the lowest queue
                job.grant_queue = h.queue  # whatever the job's priority
                self._grant_dirty = self.granting
        if self.granting and (job.alloc == 0 or job.need_packets(self.config.max_payload) < job.alloc):
            self._grant_dirty = True

    def _grant_of(self, job: _Job) -> int | None:
        """The grant an answer to ``job`` carries: the newest sequence number plus what the job may have in
        flight (never less than given before); ``None`` when this receiver does not schedule."""
        if not self.granting or job.top is None or self.grant_budget == 0:
            return None
        g = (job.top + 1 + job.alloc) & 0xFFFFFFFF
        if job.grant is None or (g - job.grant) & 0xFFFFFFFF < 1 << 31:
            job.grant = g
        return job.grant

    def _schedule(self) -> None:
        """Share ``grant_budget`` packets in flight over the jobs in the order the network serves them (the switch
        queue stamped on each job's newest needed packet: a strict-priority queue above first), then least data
        left to their MSR (SRPT), so the grants do not hold back the job the switches put first. The
        first job may have the whole budget in flight (what it needs is an estimate, and a job granted less than
        it needs crawls to its end); each next one what the jobs before it are not expected to need, at most what
        it needs itself, so its data arrives as theirs ends. A job whose MSR is met comes after every job that still
        needs data and may have in flight what those are not expected to need (the whole budget when none needs
        any): its sender may still be sending the rest (completion ``all_sent``, as ml/'s DDP hook), and a job
        granted nothing once its MSR is met would wait for a grant until its idle timeout. Jobs given more than
        before that have no ACK waiting get a GRANT now."""
        self._grant_dirty = False
        active = [j for j in self.jobs.values() if j.finished_at is None and j.manifest is not None]
        mp = self.config.max_payload
        need = {j: j.need_packets(mp) for j in active}
        active.sort(key=lambda j: (need[j] == 0, j.grant_queue, need[j], j.first_at, j.job_id))
        left = budget = self.grant_budget
        first = True
        for j in active:
            n = need[j]
            a = budget if first else left if n == 0 else min(left, n)
            first = first and n == 0
            left = max(0, left - n)
            if a > j.alloc and j.pending_ack is None and j.echo is not None:
                j.alloc = a
                self._send_grant(j)
            j.alloc = a

    def _grant_repeat_at(self, job: _Job) -> float | None:
        """When ``job``'s grant goes again in a GRANT (``GRANT_REPEAT_RTTS``): its sender silent while the grant lets
        it send past the newest packet that arrived; ``None``: not due."""
        if not self.granting or job.grant is None or job.echo is None or job.grant == (job.top + 1) & 0xFFFFFFFF:
            return None
        n, k = job.grant_repeats, min(job.grant_repeats, GRANT_REPEAT_DOUBLINGS)  # the waits so far: 1, 2, 4, .. 64, 64
        waits = (1 << (k + 1)) - 1 + (n - k) * (1 << GRANT_REPEAT_DOUBLINGS)
        return job.last_at + GRANT_REPEAT_RTTS * self.config.initial_rtt_s * waits

    def _send_grant(self, job: _Job, again: bool = False) -> None:
        before = job.grant
        grant = self._grant_of(job)
        if grant is None or (grant == before and not again):
            return
        e = job.echo
        grant_packet = wire.encode_ack(ptype=wire.PacketType.GRANT, flags=0, queue=e.queue, job_id=e.job_id,
                                       msg_id=e.msg_id, group_id=e.group_id, pkt_idx=e.pkt_idx, pkt_cnt=e.pkt_cnt,
                                       seq=e.seq, blocks=[], grant=grant)
        self._reply_within(job, grant_packet, "grant")

    def _duplicate(self, job: _Job, h: wire.Header, ce: bool) -> None:
        job.duplicates += 1
        job.note_seq(h.seq)
        self._ack(job, h, ce)

    def _complete(self, job: _Job, msg_id: int, k: int, data: bytes, nbytes: int) -> None:
        """A whole message: its payload (``nbytes`` + one PACKET_BYTES charged) is delivered or held."""
        job.delivered.add(msg_id)
        job.delivered_per_group[k] += 1
        gid = job.manifest.groups[k].group_id  # type: ignore[union-attr]
        if not job.ordered[k]:
            self._unbuffer(job, nbytes)
            self._hand_over(job, msg_id, gid, data)
            return
        job.held[msg_id] = data
        self._release_in_order(job, k)

    def _unbuffer(self, job: _Job, nbytes: int) -> None:
        self.buffered -= nbytes
        self._charge(job, -(nbytes + PACKET_BYTES))

    def _release_in_order(self, job: _Job, k: int) -> None:
        """Deliver the held messages of ordered group ``k`` that are next in id order."""
        g = job.manifest.groups[k]  # type: ignore[union-attr]
        firsts, lasts = g.firsts, g.lasts
        ri, nxt = job.cursor[k]
        while ri < len(firsts):
            data = job.held.pop(nxt, None)
            if data is None:
                break
            self._unbuffer(job, len(data))
            self._hand_over(job, nxt, g.group_id, data)
            if nxt < lasts[ri]:
                nxt += 1
            else:
                ri += 1
                nxt = firsts[ri] if ri < len(firsts) else 0
        job.cursor[k] = (ri, nxt)

    def _announce_chunk(self, h: wire.Header, payload: bytes) -> bytes | None:
        """The manifest chunk of an announce part, or ``None`` (counted) when it is short or, with an
        admission key, not signed with it."""
        try:
            token, auth, chunk = control.decode_announce_part(payload)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            return None
        key = self.config.admission_key
        if key is not None and not control.announce_auth_ok(key, h, token, auth, chunk):
            self.dropped["bad_auth"] += 1
            return None
        return chunk

    def _on_announce(self, job: _Job, h: wire.Header, chunk: bytes, now: float, echo: bool = False) -> None:
        """An announce part; ``echo``: the one that carried the token back (acknowledged, not a duplicate)."""
        if job.announce_cnt is not None and h.pkt_cnt != job.announce_cnt:
            self.malformed["inconsistent_announce"] += 1
            return
        if job.manifest is not None or h.pkt_idx in job.announce_parts:
            if echo:
                job.note_seq(h.seq)
                self._ack(job, h)
            else:
                self._duplicate(job, h, False)
            return
        cost = len(chunk) + PACKET_BYTES
        if not self._fits(job, cost):
            self.dropped["memory_budget"] += 1
            return
        if len(job.announce_parts) + 1 == h.pkt_cnt:  # this part completes the manifest: may it be decoded now?
            size = len(chunk) + sum(map(len, job.announce_parts.values()))
            if not self.manifest_rate.take(job.source, size, now):
                self.dropped["manifest_rate"] += 1
                return
        self._charge(job, cost)
        job.note_seq(h.seq)
        job.announce_cnt = h.pkt_cnt
        job.announce_parts[h.pkt_idx] = chunk
        job.progress_at = now
        self._ack(job, h)
        if len(job.announce_parts) < h.pkt_cnt:
            return
        blob = b"".join(job.announce_parts[i] for i in range(h.pkt_cnt))
        cost = _manifest_cost(blob)  # charged before decoding allocates
        if not self._make_room(job, cost):
            self.dropped["memory_budget"] += 1
            self._reject(job, "announce does not fit the receiver's memory budget (memory_budget_bytes)", now)
            return
        self._charge(job, cost)
        self._charge(job, -(len(blob) + h.pkt_cnt * PACKET_BYTES))
        job.announce_parts.clear()
        try:
            manifest = control.Manifest.decode(blob, max_messages=self.config.max_messages)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            self._reject(job, str(err), now)
            return
        job.manifest = manifest
        job.index = manifest.group_index()
        job.ordered = [g.msr >= 1.0 for g in manifest.groups]
        job.delivered_per_group = [0] * len(manifest.groups)
        job.required = [required_messages(g.msr, g.count) for g in manifest.groups]
        job.msr = [g.msr for g in manifest.groups]
        job.msr_change = [0] * len(manifest.groups)
        job.need_bytes = manifest.need_bytes
        self._grant_dirty = self.granting
        for k, g in enumerate(manifest.groups):
            if job.ordered[k]:
                job.cursor[k] = (0, g.firsts[0] if g.firsts else 0)

    def _reject(self, job: _Job, reason: str, now: float) -> None:
        job.rejected = reason
        self._release(job)
        self._finish_record(job, now)
        self._events.append(events.JobRejected(job.job_id, reason))

    def _on_msr_change(self, job: _Job, h: wire.Header, payload: bytes) -> None:
        """A live MSR change of group ``h.group_id``: applied when newer than the group's last (changes may be
        reordered or repeated), acknowledged either way; the job's result reports the group's MSR as changed."""
        try:
            change, msr = control.decode_msr_change(payload)
        except wire.MalformedPacket as err:
            self.malformed[err.reason] += 1
            return
        m = job.manifest
        if m is None:
            self.dropped["msr_before_announce"] += 1
            return
        k = next((i for i, g in enumerate(m.groups) if g.group_id == h.group_id), None)
        if k is None:
            self.dropped["msr_unknown_group"] += 1
            return
        if job.ordered[k]:
            self.dropped["msr_exact_group"] += 1
            return
        if change > job.msr_change[k]:
            job.msr_change[k] = change
            job.msr[k] = msr
            job.required[k] = required_messages(msr, m.groups[k].count)
        self._ack(job, h)

    def _on_fin(self, job: _Job, h: wire.Header, now: float) -> None:
        m = job.manifest
        if m is None:
            self.dropped["fin_before_announce"] += 1
            return
        # an MSR = 1 group should have no gaps; if it has, hand over what is held anyway, in order
        for msg_id in sorted(job.held):
            data = job.held.pop(msg_id)
            self._unbuffer(job, len(data))
            gid = m.groups[job.index.find(msg_id)].group_id  # type: ignore[union-attr]
            self._hand_over(job, msg_id, gid, data)
        lost = job.delivered.missing_ranges(m.total)
        result = JobResult(
            job_id=job.job_id, peer=job.peer, total=m.total, vector_len=m.vector_len,
            lost_ranges=tuple(zip(lost[::2], lost[1::2])),
            groups=tuple(GroupResult(g.group_id, job.msr[k], g.count, job.delivered_per_group[k])
                         for k, g in enumerate(m.groups)),
            packets=job.packets, duplicates=job.duplicates, first_packet_at=job.first_at, finished_at=now)
        parts = wire.encode_done_payloads(lost, self.config.max_payload)
        done = [wire.encode_done(job_id=job.job_id, seq=h.seq, pkt_idx=i, pkt_cnt=len(parts), payload=p)
                for i, p in enumerate(parts)]
        self._release(job)
        self._finish_record(job, now)
        kept = sum(len(d) + DONE_BYTES_PER_PART for d in done)
        if job.job_id in self.jobs and self._make_room(job, kept):
            self._charge(job, kept)
            job.done_datagrams = done
        else:
            self.admission["done_not_kept"] += 1
        if job.pending_ack is not None:
            self._flush_ack(job)  # the data's ACKs before the DONE
        self._send_done(job, done)
        self._events.append(events.JobFinished(result))

    # -- freeing -----------------------------------------------------------------------------------

    def _release(self, job: _Job) -> None:
        """Free a job's buffers and bitmaps; its record (JOB_BYTES) stays charged while it is tracked."""
        self.buffered -= sum(p.nbytes for p in job.partial.values()) + sum(len(d) for d in job.held.values())
        self._charge(job, JOB_BYTES - job.charged)
        job.partial = {}
        job.held = {}
        job.announce_parts = {}
        job.delivered = _Bitmap()
        job.index = None
        job.cursor = {}

    def _finish_record(self, job: _Job, now: float) -> None:
        """The job gives up its slot and lingers to answer repeated FINs (at most ``max_jobs`` linger,
        within the pool; the oldest are forgotten first, this one too if nothing else makes room)."""
        self.memory.leave_slot(job.charged)
        job.finished_at = now
        job.alloc = 0
        self._grant_dirty = self.granting
        self.slots.remove(job)
        self._finished[job.job_id] = None
        while len(self._finished) > self.config.max_jobs or self.memory.pool_overdrawn:
            if not self._forget_oldest_finished(but=job):
                if self.memory.pool_overdrawn:
                    self.admission["linger_dropped"] += 1
                    self._forget(job)
                break

    def _forget(self, job: _Job) -> None:
        if job.pending_ack is not None:
            self._flush_ack(job)  # what arrived is acknowledged before the job goes
        self._release(job)
        self._charge(job, -job.charged)
        self.slots.remove(job)
        self._finished.pop(job.job_id, None)
        del self.jobs[job.job_id]
        job.alloc = 0
        self._grant_dirty = self.granting

    def _abandon(self, job: _Job, reason: str) -> None:
        delivered = sum(job.delivered_per_group)
        self._forget(job)
        self._events.append(events.JobAbandoned(job.job_id, delivered, reason))
