"""The logical switch tables, as values: what every data plane implements and every driver installs.

The P4 program (p4src/), the kernel switch (controller/kernel/) and the simulated switch implement the same
logical tables; docs/architecture.md lists them and ``controller.reference`` evaluates them on a packet.
The controller's policy produces a ``SwitchState`` (the whole desired content of the tables) every epoch; a
driver (``controller.drivers.Driver``) diffs it against what it installed and writes the difference in one
batch. Re-applying an unchanged state writes nothing.

The one TLR -> queue mapping lives here too (``queue_for_tlr``, ``default_tlr_rules``): the policy, the
``queue_by_tlr`` table and everything that predicts a queue from a TLR use it.

Units: queue ids are logical (0 = highest priority, reserved for non-approximate traffic; 7 = lowest).
TLRs are Q1.15 integers as on the wire (``hostlib.wire.TLR_ONE`` = 1.0). Ranges are inclusive.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import zlib
from typing import Any, Iterable, Mapping

from netapprox.hostlib.wire import TLR_ONE

NUM_QUEUES = 8
LOWEST_QUEUE = NUM_QUEUES - 1
NON_APPROX_QUEUE = 0
FIRST_APPROX_QUEUE = 1
DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(k / NUM_QUEUES for k in range(NUM_QUEUES))
"""TLR thresholds T_0..T_7 (T_k = k/8, NetApprox §5.2): TLR in [T_k, T_k+1) goes to queue k, below T_1 to queue
1. The paper's thresholds: the switches' ``queue_by_tlr`` entries before a controller writes its own."""
POLICY_THRESHOLDS: tuple[float, ...] = (0.0, 0.3, 0.45, 0.6, 0.7, 0.8, 0.875, 0.95)
"""The default policy's thresholds (``PolicyConfig.thresholds``): queue 1 below 0.45, finer towards the top, where
eq. 1 takes jobs that deliver without loss. With the finishing rule it is the best fixed configuration measured
on the shifting workload (``finish-high-fine``, docs/results.md, Held-out seeds)."""
DEFAULT_APPROX_BUFFERS: tuple[int, ...] = tuple(NUM_QUEUES - k for k in range(1, NUM_QUEUES))
"""Buffers of the approximate queues 1..7 in MTUs (packets where the target counts packets): the NetApprox
paper's k-MTU queues, 7 for queue 1 down to 1 for queue 7 (28 in all)."""


def _check_qid(qid: int) -> None:
    if not 0 <= qid < NUM_QUEUES:
        raise ValueError(f"queue id {qid} outside 0..{NUM_QUEUES - 1}")


def _check_range(name: str, lo: int, hi: int, bits: int) -> None:
    if not 0 <= lo <= hi < (1 << bits):
        raise ValueError(f"{name} range [{lo}, {hi}] is empty or exceeds {bits} bits")


@dataclasses.dataclass(frozen=True, order=True)
class Route:
    """routes_v4: IPv4 LPM to an egress port, with MAC rewrite (P4 targets; the kernel switch bridges)."""

    prefix: str  # dotted quad, host bits zero
    prefix_len: int
    port: int
    src_mac: str
    dst_mac: str


ECMP_BUCKETS = 16
ZERO_MAC = "00:00:00:00:00:00"
_MAC = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}")
"""Buckets of every ECMP group (a power of two, so a bucket is the low bits of a hash or a random number, as a
Tofino selector or a P4 ``hash(..., max)`` takes them). Group members fill the buckets in port order, round
robin (``ecmp_buckets``): 2, 4, 8 or 16 members share them evenly; 3 members get 6/5/5 buckets."""


@dataclasses.dataclass(frozen=True, order=True)
class EcmpRoute:
    """ecmp_routes: IPv4 LPM -> a group of equal-cost egress ports (the ECMP group of a multi-path fabric).

    Which member a packet leaves by (``controller.reference.reference_next_hops``): approximate ATP DATA, when
    the switch sprays (``SwitchState.spray``), a new uniformly random bucket for every packet; every other
    packet the bucket of its flow's hash (``flow_hash``), so a non-approximate flow never splits over paths.
    The kernel switch forwards by it (controller/kernel/forward.bpf.c); on a switch that also bridges, a
    packet no route matches is left to the bridge."""

    prefix: str  # dotted quad, host bits zero
    prefix_len: int
    ports: tuple[int, ...]
    """Egress ports of the equal-cost next hops, distinct, in any order (buckets take them sorted)."""
    src_macs: tuple[str, ...] = ()
    """P4 targets: the source MAC each member's ``route`` writes, one per port in ``ports`` order (as a ``Route``'s
    ``src_mac``); empty: 00:00:00:00:00:00 for all. The kernel switch leaves MACs alone."""
    dst_macs: tuple[str, ...] = ()
    """P4 targets: the destination MAC each member's ``route`` writes, one per port in ``ports`` order (as a
    ``Route``'s ``dst_mac``); empty: 00:00:00:00:00:00 for all."""

    def __post_init__(self) -> None:
        try:
            net = ipaddress.IPv4Network(f"{self.prefix}/{self.prefix_len}")
        except ValueError as e:
            raise ValueError(f"ecmp route {self.prefix}/{self.prefix_len}: {e}") from None
        if str(net.network_address) != self.prefix:
            raise ValueError(f"ecmp route {self.prefix}/{self.prefix_len}: host bits set (use {net})")
        if not self.ports or len(set(self.ports)) != len(self.ports) or not all(
                isinstance(p, int) and 0 <= p < 512 for p in self.ports):
            raise ValueError(f"ecmp route {net}: need distinct ports in 0..511, got {self.ports}")
        if len(self.ports) > ECMP_BUCKETS:
            raise ValueError(f"ecmp route {net}: at most {ECMP_BUCKETS} next hops, got {len(self.ports)}")
        for name in ("src_macs", "dst_macs"):
            macs = getattr(self, name)
            if macs and len(macs) != len(self.ports):
                raise ValueError(f"ecmp route {net}: {name} needs one MAC per port ({len(self.ports)}), "
                                 f"got {len(macs)}")
            bad = [m for m in macs if not isinstance(m, str) or not _MAC.fullmatch(m)]
            if bad:
                raise ValueError(f"ecmp route {net}: {name}: not a MAC address: {bad[0]!r}")

    @property
    def buckets(self) -> tuple[int, ...]:
        return ecmp_buckets(self.ports)

    def member_macs(self, port: int) -> tuple[str, str]:
        """(source MAC, destination MAC) the member ``port`` rewrites to (zeros where none were given)."""
        i = self.ports.index(port)
        return (self.src_macs[i] if self.src_macs else ZERO_MAC, self.dst_macs[i] if self.dst_macs else ZERO_MAC)


def ecmp_buckets(ports: Iterable[int]) -> tuple[int, ...]:
    """The ``ECMP_BUCKETS`` members of a group: its ports sorted, repeated round robin (bucket b holds the
    (b mod n)-th smallest port)."""
    members = sorted(ports)
    return tuple(members[b % len(members)] for b in range(ECMP_BUCKETS))


def flow_hash(src: str | bytes, dst: str | bytes, proto: int, sport: int, dport: int) -> int:
    """The flow hash of every data plane's ECMP decision: CRC-32 (IEEE 802.3, as zlib, P4's
    ``HashAlgorithm.crc32`` and Tofino's ``CRC32``) of the 13 bytes source address, destination address,
    protocol, source port, destination port, in network order. A bucket is its low bits."""
    a = src if isinstance(src, bytes) else ipaddress.IPv4Address(src).packed
    b = dst if isinstance(dst, bytes) else ipaddress.IPv4Address(dst).packed
    return zlib.crc32(a + b + bytes([proto]) + sport.to_bytes(2, "big") + dport.to_bytes(2, "big"))


def longest_match(routes: Iterable[EcmpRoute], dst: str | bytes) -> EcmpRoute | None:
    """The route of ``routes`` with the longest prefix holding ``dst`` (None if none does)."""
    addr = int.from_bytes(dst if isinstance(dst, bytes) else ipaddress.IPv4Address(dst).packed, "big")
    best = None
    for r in routes:
        net = ipaddress.IPv4Network(f"{r.prefix}/{r.prefix_len}")
        if addr & int(net.netmask) == int(net.network_address) and (best is None or r.prefix_len > best.prefix_len):
            best = r
    return best


@dataclasses.dataclass(frozen=True, order=True)
class ClassRule:
    """queue_by_class: queue for non-approximate traffic (non-ATP, or ATP without APPROX), ternary.

    ``rank``: larger wins when several rules match (P4Runtime priority). Unmatched: queue 0.
    """

    rank: int
    ip_proto: int
    ip_proto_mask: int
    l4_dport: int
    l4_dport_mask: int
    qid: int

    def __post_init__(self) -> None:
        _check_qid(self.qid)
        if self.rank < 1:
            raise ValueError("rank must be >= 1")


@dataclasses.dataclass(frozen=True, order=True)
class JobRule:
    """queue_by_job: exact job id -> queue. Beats tag and TLR rules for approximate packets."""

    job_id: int
    qid: int

    def __post_init__(self) -> None:
        _check_qid(self.qid)
        if not 0 < self.job_id < (1 << 32):
            raise ValueError(f"job id {self.job_id} outside 1..2^32-1")


@dataclasses.dataclass(frozen=True, order=True)
class TagRule:
    """queue_by_tag: CadentFlow priority range x deadline-slack range -> queue (TAGGED approximate packets)."""

    rank: int
    priority_lo: int
    priority_hi: int
    deadline_lo_us: int
    deadline_hi_us: int
    qid: int

    def __post_init__(self) -> None:
        _check_qid(self.qid)
        _check_range("priority", self.priority_lo, self.priority_hi, 8)
        _check_range("deadline", self.deadline_lo_us, self.deadline_hi_us, 32)
        if self.rank < 1:
            raise ValueError("rank must be >= 1")


@dataclasses.dataclass(frozen=True, order=True)
class TlrRule:
    """queue_by_tlr: the packet's TLR (Q1.15, inclusive range) -> queue. Unmatched: the lowest queue."""

    tlr_lo: int
    tlr_hi: int
    qid: int

    def __post_init__(self) -> None:
        _check_qid(self.qid)
        _check_range("tlr", self.tlr_lo, self.tlr_hi, 16)


@dataclasses.dataclass(frozen=True, order=True)
class EcnRule:
    """ecn_thresholds: mark CE on ECN-capable packets of queue ``qid`` when its depth >= ``depth_pkts``."""

    qid: int
    depth_pkts: int

    def __post_init__(self) -> None:
        _check_qid(self.qid)
        if self.depth_pkts < 1:
            raise ValueError("ECN threshold must be at least 1 packet")


def check_thresholds(thresholds: tuple[float, ...]) -> None:
    """Raise ValueError unless ``thresholds`` are 8 strictly increasing values starting at 0, below 1."""
    if len(thresholds) != NUM_QUEUES or thresholds[0] != 0.0 or list(thresholds) != sorted(set(thresholds)):
        raise ValueError(f"need {NUM_QUEUES} strictly increasing TLR thresholds starting at 0, got {thresholds}")
    if thresholds[-1] >= 1.0:
        raise ValueError("the last TLR threshold must be below 1.0")


def queue_for_tlr(tlr: float, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> int:
    """The queue whose TLR range holds ``tlr``: the largest k with T_k <= tlr, at least 1 (approximate traffic
    never uses queue 0). The same mapping ``default_tlr_rules`` installs in ``queue_by_tlr``."""
    qid = FIRST_APPROX_QUEUE
    for k in range(FIRST_APPROX_QUEUE, NUM_QUEUES):
        if tlr >= thresholds[k]:
            qid = k
    return qid


def queue_range(qid: int, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> tuple[float, float]:
    """[lo, hi) of TLRs that ``queue_for_tlr`` maps to ``qid`` (queue 1 starts at 0, queue 7 ends above 1)."""
    lo = 0.0 if qid == FIRST_APPROX_QUEUE else thresholds[qid]
    hi = thresholds[qid + 1] if qid + 1 < NUM_QUEUES else float("inf")
    return lo, hi


def default_tlr_rules(thresholds: tuple[float, ...] | None = None) -> frozenset[TlrRule]:
    """``queue_by_tlr`` entries implementing ``queue_for_tlr`` on the wire's Q1.15 TLR: queue k for TLR in
    [T_k, T_{k+1}); the range below T_1 maps to queue 1; TLR = 1.0 falls in the last range."""
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else tuple(thresholds)
    check_thresholds(thresholds)
    bounds = [int(round(t * TLR_ONE)) for t in thresholds] + [TLR_ONE + 1]
    return frozenset(TlrRule(tlr_lo=bounds[k], tlr_hi=bounds[k + 1] - 1, qid=max(k, FIRST_APPROX_QUEUE))
                     for k in range(NUM_QUEUES))


@dataclasses.dataclass(frozen=True)
class SwitchState:
    """Everything the controller wants in one switch's logical tables."""

    routes: frozenset[Route] = frozenset()
    class_rules: frozenset[ClassRule] = frozenset()
    job_rules: frozenset[JobRule] = frozenset()
    tag_rules: frozenset[TagRule] = frozenset()
    tlr_rules: frozenset[TlrRule] = frozenset()
    ecn_rules: frozenset[EcnRule] = frozenset()
    ecmp_routes: frozenset[EcmpRoute] = frozenset()
    """ECMP groups of a multi-path fabric (``controller.fabric.ecmp_routes`` computes them from the topology)."""
    spray: bool = True
    """Spray approximate ATP DATA per packet over an ECMP group's members (the design); False: every packet by
    its flow's hash (an ordinary ECMP switch). Policy ``spray``; off on a ``fifo`` switch."""
    queue_buffers: tuple[int, ...] = ()
    """Buffers of the approximate queues 1..7 as the online tuner (``controller.tuning``) shares them out, in
    units of the target's ``approx_buffer_unit`` (1 by default) packets, or MTUs of bytes where it counts
    bytes: each driver multiplies them by its unit (``queue_buffer_packets``); empty: the target's configured
    k-MTU buffers. Written where the target allows it (the simulated and the kernel switch); the P4 drivers keep
    the buffers they configure at connect (docs/controller.md, Tuning and Queue buffers)."""
    fifo: bool = False
    """A network-oblivious switch (policy mode ``fifo``, where the papers run their baselines): every packet
    in queue 0, no approximate classification (surplus, job, tag and TLR tables, the queue-0 guard). The
    kernel and simulated switches implement it; the P4 program always classifies approximate traffic, so
    its driver refuses such a state."""

    def __post_init__(self) -> None:
        jobs = [r.job_id for r in self.job_rules]
        if len(jobs) != len(set(jobs)):
            raise ValueError("two queue_by_job rules for the same job id")
        nets = [(r.prefix, r.prefix_len) for r in self.ecmp_routes]
        if len(nets) != len(set(nets)):
            raise ValueError("two ecmp routes for the same prefix")
        if self.queue_buffers and (len(self.queue_buffers) != NUM_QUEUES - 1 or min(self.queue_buffers) < 1):
            raise ValueError(f"queue_buffers: need {NUM_QUEUES - 1} buffers of at least 1 packet (queues "
                             f"1..{NUM_QUEUES - 1}), got {self.queue_buffers}")


def prefix_split(lo: int, hi: int, bits: int) -> list[tuple[int, int]]:
    """Decompose the inclusive range [lo, hi] of ``bits``-bit integers into (value, mask) prefix matches."""
    if not 0 <= lo <= hi < (1 << bits):
        raise ValueError(f"range [{lo}, {hi}] is empty or exceeds {bits} bits")
    full = (1 << bits) - 1
    out = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << bits
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, full & ~(size - 1)))
        lo += size
    return out


def queue_buffer_packets(qid: int, total_packets: int, approx: tuple[int, ...] = (), unit: int = 1) -> int:
    """Buffer of logical queue ``qid``: ``unit`` x (8 - k) packets for k >= 1 (or ``unit`` x ``approx[k - 1]``,
    the tuner's shares); queue 0 gets the rest of ``total_packets``. ``unit`` 1 is the NetApprox paper's k-MTU
    buffers; a port with a large buffer may give the approximate queues more of it in the same proportions
    (``approx_buffer_unit``: docs/controller.md, Queue buffers)."""
    _check_qid(qid)
    check_buffer_unit(unit, total_packets)
    approx = approx or DEFAULT_APPROX_BUFFERS
    if qid == 0:
        rest = total_packets - unit * sum(approx)
        if rest < 1:
            raise ValueError(f"a total buffer of {total_packets} packets leaves nothing for queue 0")
        return rest
    return unit * approx[qid - 1]


def check_buffer_unit(unit: int, total_packets: int) -> None:
    """Raise ValueError unless ``unit`` x 28 packets of approximate queues leave queue 0 at least one packet of
    a ``total_packets`` port (the tuner's shares keep the same total: ``TuningConfig.buffer_total``)."""
    if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1:
        raise ValueError(f"approx_buffer_unit: need an integer >= 1, got {unit!r}")
    if total_packets - unit * sum(DEFAULT_APPROX_BUFFERS) < 1:
        raise ValueError(f"a total buffer of {total_packets} packets leaves nothing for queue 0 "
                         f"(approximate queues of {unit} x 28 packets)")


def buffer_unit_option_error(unit: Any, total_packets: int) -> str | None:
    """What is wrong with a switch's ``approx_buffer_unit`` option, as "approx_buffer_unit: ...", or None. Unit
    1 (the k-MTU queues) is left to the target's own buffer checks."""
    if unit == 1 and not isinstance(unit, bool):
        return None
    try:
        check_buffer_unit(unit, total_packets)
    except ValueError as e:
        if str(e).startswith("approx_buffer_unit"):
            return str(e)
        most = max(1, (total_packets - 1) // sum(DEFAULT_APPROX_BUFFERS))
        return f"approx_buffer_unit: {e}; at most {most} with buffer_packets {total_packets}"
    return None


def half_buffer_unit(total_packets: int) -> int:
    """The largest ``unit`` whose approximate queues (``unit`` x 28 packets) hold at most half of a
    ``total_packets`` port, at least 1 (the k-MTU buffers): 1 for the testbed's 64-packet ports, 17 for the
    simulations' 1000-packet ones. The one default of every data plane (``approx_buffer_unit`` unset:
    ``resolve_buffer_unit``; docs/controller.md, Queue buffers)."""
    return max(1, total_packets // (2 * sum(DEFAULT_APPROX_BUFFERS)))


def resolve_buffer_unit(unit: int | None, total_packets: int) -> int:
    """A switch's ``approx_buffer_unit``: ``unit`` when set, else the one sizing policy of every data plane,
    ``half_buffer_unit`` (the approximate queues get at most half of the port, in the paper's 7:6:...:1
    proportions; never less than the paper's k-MTU queues)."""
    return half_buffer_unit(total_packets) if unit is None else unit


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Per (port, logical queue) packet counts since the switch (re)started."""

    port: int
    qid: int
    enqueued: int  # packets classified into this queue (P4: ingress counter; kernel: sent + dropped + queued)
    transmitted: int  # packets that left the queue
    dropped: int  # tail drops (P4: enqueued - transmitted, clamped at 0; kernel: qdisc drops)
    transmitted_bytes: int = 0  # bytes that left the queue
    backlog: int | None = None  # packets queued when read (kernel); None where the target cannot tell (P4)


@dataclasses.dataclass(frozen=True)
class Counters:
    """What a driver's ``read_counters`` returns."""

    queues: tuple[QueueStats, ...]
    job_packets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    """job id -> packets that hit its queue_by_job entry (targets with per-entry counters)."""
    malformed: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """drop reason -> packets the data plane dropped as malformed (P4 targets: ``malformed_packets``)."""


@dataclasses.dataclass(frozen=True)
class TableUpdates:
    """What changed in one switch's tables in one epoch."""

    static: bool
    """Anything but ``queue_by_job`` changed (the first epoch, a reconfiguration): apply the whole state."""
    jobs: Mapping[int, int | None]
    """``queue_by_job`` entries that changed: job id -> new queue, or None for an entry to delete."""
    urgent: frozenset[int] = frozenset()
    """Jobs in ``jobs`` whose measured loss exceeds their TLR: written first when a switch cannot take every
    update of an epoch."""

    @property
    def empty(self) -> bool:
        return not self.static and not self.jobs


@dataclasses.dataclass(frozen=True)
class WriteSummary:
    """What one ``Driver.apply`` changed. ``writes == 0`` means nothing was sent to the switch."""

    inserted: int = 0
    modified: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.inserted + self.modified + self.deleted
