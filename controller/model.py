"""The logical switch tables, as values, and the driver interface both data planes implement.

The P4 program (p4src/) and the kernel switch (topo/kernel_switch.py) implement the same logical tables;
docs/architecture.md lists them. The controller's policy produces a ``SwitchState`` (the whole desired
content of the tables) every epoch; a ``Driver`` diffs it against what it installed and writes the
difference in one batch. Re-applying an unchanged state writes nothing.

Units: queue ids are logical (0 = highest priority, reserved for non-approximate traffic; 7 = lowest).
TLRs are Q1.15 integers as on the wire (``hostlib.wire.TLR_ONE`` = 1.0). Ranges are inclusive.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Mapping

from netapprox.hostlib.wire import TLR_ONE

NUM_QUEUES = 8
LOWEST_QUEUE = NUM_QUEUES - 1
NON_APPROX_QUEUE = 0


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


def default_tlr_rules(thresholds: tuple[float, ...] | None = None) -> frozenset[TlrRule]:
    """Queue k for TLR in [T_k, T_{k+1}); by default T_k = k/8. Approximate traffic never gets queue 0:
    the range below T_1 maps to queue 1. TLR = 1.0 falls in the last range."""
    if thresholds is None:
        thresholds = tuple(k / NUM_QUEUES for k in range(NUM_QUEUES))
    if len(thresholds) != NUM_QUEUES or thresholds[0] != 0.0 or list(thresholds) != sorted(set(thresholds)):
        raise ValueError(f"need {NUM_QUEUES} strictly increasing TLR thresholds starting at 0, got {thresholds}")
    if thresholds[-1] >= 1.0:
        raise ValueError("the last TLR threshold must be below 1.0")
    bounds = [int(round(t * TLR_ONE)) for t in thresholds] + [TLR_ONE + 1]
    rules = []
    for k in range(NUM_QUEUES):
        rules.append(TlrRule(tlr_lo=bounds[k], tlr_hi=bounds[k + 1] - 1, qid=max(k, 1)))
    return frozenset(rules)


@dataclasses.dataclass(frozen=True)
class SwitchState:
    """Everything the controller wants in one switch's logical tables."""

    routes: frozenset[Route] = frozenset()
    class_rules: frozenset[ClassRule] = frozenset()
    job_rules: frozenset[JobRule] = frozenset()
    tag_rules: frozenset[TagRule] = frozenset()
    tlr_rules: frozenset[TlrRule] = frozenset()
    ecn_rules: frozenset[EcnRule] = frozenset()

    def __post_init__(self) -> None:
        jobs = [r.job_id for r in self.job_rules]
        if len(jobs) != len(set(jobs)):
            raise ValueError("two queue_by_job rules for the same job id")


def queue_buffer_packets(qid: int, total_packets: int) -> int:
    """Buffer of logical queue ``qid``: (8 - k) packets for k >= 1; queue 0 gets the rest of ``total_packets``."""
    _check_qid(qid)
    if qid == 0:
        rest = total_packets - sum(NUM_QUEUES - k for k in range(1, NUM_QUEUES))
        if rest < 1:
            raise ValueError(f"a total buffer of {total_packets} packets leaves nothing for queue 0")
        return rest
    return NUM_QUEUES - qid


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Per (port, logical queue) packet counts since the switch (re)started."""

    port: int
    qid: int
    enqueued: int  # packets classified into this queue (P4: ingress counter; kernel: sent + dropped)
    transmitted: int  # packets that left the queue
    dropped: int  # tail drops (P4: enqueued - transmitted, clamped at 0; kernel: qdisc drops)


@dataclasses.dataclass(frozen=True)
class Counters:
    queues: tuple[QueueStats, ...]
    job_packets: Mapping[int, int]  # job id -> packets that hit its queue_by_job rule


@dataclasses.dataclass(frozen=True)
class WriteSummary:
    """What one ``Driver.apply`` changed. ``writes == 0`` means nothing was sent to the switch."""

    inserted: int = 0
    modified: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.inserted + self.modified + self.deleted


class SwitchUnavailable(ConnectionError):
    """A driver cannot reach its switch (connection refused or lost, switch restarted).

    Drivers raise it from ``connect``/``apply``/``read_counters``; the controller then marks the switch down,
    reconnects with backoff and calls ``connect`` again, which must re-push the pipeline and re-install the
    last applied state."""

    def __init__(self, switch: str, detail: str) -> None:
        super().__init__(f"switch {switch!r} unavailable: {detail}")
        self.switch = switch
        self.detail = detail


class Driver(abc.ABC):
    """One switch, one data plane. Implementations: controller/p4runtime_driver.py (BMv2, Tofino) and
    controller/kernel_driver.py (the Linux kernel switch)."""

    name: str

    @abc.abstractmethod
    def connect(self) -> None:
        """(Re)connect, push the pipeline and re-install the last applied state. Idempotent."""

    @abc.abstractmethod
    def apply(self, desired: SwitchState) -> WriteSummary:
        """Diff ``desired`` against the installed copy and write the difference in one batch."""

    @abc.abstractmethod
    def read_counters(self) -> Counters:
        """Per-(port, queue) and per-job counters."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection and anything this driver started."""

    def drain_packet_in(self) -> list[bytes]:
        """Frames the switch punted to the controller since the last call (packet-in), oldest first.

        The controller parses REPORT packets out of them. Data planes without packet-in return nothing."""
        return []
