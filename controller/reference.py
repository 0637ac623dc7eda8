"""The reference model of the logical tables: docs/architecture.md evaluated directly on one packet.

Every data plane is tested against this function: the kernel switch's u32 layout
(tests/controller/test_kernel_compiler.py), the P4 program on BMv2 (the PTF suite and the BMv2 controller
tests) and the simulated switch. It is deliberately naive (a linear scan in table order, no layout, no
prefix expansion) so that it is easy to check by reading, and it reads every ATP field at the offset
``hostlib.wire.OFFSETS`` gives, so the header is defined in one place.

    qid = reference_queue(state, packet)      # packet: bytes from the IPv4 header on

Order (docs/architecture.md): an ATP packet of another version is dropped (``DROPPED``); approximate ATP DATA (IPv4 without options, UDP to the ATP port, a complete
ATP header of the current version (hostlib.wire.VERSION) and type DATA, flag APPROX) with TLR 1.0 (surplus) goes to the lowest queue; other
approximate ATP DATA goes through queue_by_job, then queue_by_tag (TAGGED packets only), then queue_by_tlr,
then the lowest queue, and a result of queue 0 becomes queue 1 (the guard: approximate traffic never uses
queue 0); everything else through queue_by_class, then queue 0.
queue_by_tag is evaluated on its rules' ranges; the P4 table holds their prefix expansion, which matches the
same packets.
``l4_dport`` follows the P4 parser: the TCP/UDP destination port of a first fragment without IP options,
0 for every other packet.

The egress decision of a multi-path fabric (``reference_next_hops``): the longest ``ecmp_routes`` prefix
holding the destination address gives a group of equal-cost ports in ``ECMP_BUCKETS`` buckets; approximate
ATP DATA (the packets ``approx_atp_header`` accepts, surplus included) on a spraying switch takes a uniformly
random bucket per packet, every other packet the bucket ``flow_hash(src, dst, proto, sport, dport) mod
ECMP_BUCKETS`` (ports as ``l4_dport`` reads them, 0 where it reads none), so a non-approximate flow never splits.
"""
from __future__ import annotations

import struct

from netapprox.controller.model import (
    ECMP_BUCKETS,
    FIRST_APPROX_QUEUE,
    LOWEST_QUEUE,
    NON_APPROX_QUEUE,
    ClassRule,
    SwitchState,
    TagRule,
    flow_hash,
    longest_match,
)
from netapprox.hostlib.wire import (
    DEFAULT_ATP_PORT, DEFAULT_REPORT_PORT, HEADER_LEN, OFFSETS, TLR_ONE, VERSION, Flags, PacketType)

IPV4_MIN_HEADER = 20
UDP_HEADER = 8
DROPPED = -1
"""``reference_queue``'s answer for a packet every NetApprox switch drops (and counts, ``bad_version``): an ATP
packet of another version (``other_atp_version``)."""
IPPROTO_TCP = 6
IPPROTO_UDP = 17
DATA_V1 = (VERSION << 4) | int(PacketType.DATA)
"""Byte 0 of an ATP DATA header (version in the high nibble, type in the low one)."""


def tag_order(rule: TagRule) -> tuple:
    """Evaluation order of queue_by_tag: higher rank first (P4Runtime priority: larger wins)."""
    return (-rule.rank, rule.priority_lo, rule.priority_hi, rule.deadline_lo_us, rule.deadline_hi_us, rule.qid)


def class_order(rule: ClassRule) -> tuple:
    """Evaluation order of queue_by_class: higher rank first."""
    return (-rule.rank, rule.ip_proto, rule.ip_proto_mask, rule.l4_dport, rule.l4_dport_mask, rule.qid)


def l4_dport(packet: bytes) -> int | None:
    """The destination port the P4 parser extracts (TCP/UDP, IHL 5, first fragment), else None (P4: 0)."""
    if len(packet) < IPV4_MIN_HEADER + 4 or packet[0] & 0x0F != 5 or packet[9] not in (IPPROTO_TCP, IPPROTO_UDP):
        return None
    if struct.unpack_from("!H", packet, 6)[0] & 0x1FFF:
        return None
    return struct.unpack_from("!H", packet, IPV4_MIN_HEADER + 2)[0]


def approx_atp_header(packet: bytes, atp_port: int = DEFAULT_ATP_PORT) -> bytes | None:
    """The ATP header of an approximate ATP DATA packet, else None."""
    if l4_dport(packet) != atp_port or packet[9] != IPPROTO_UDP:
        return None
    atp = packet[IPV4_MIN_HEADER + UDP_HEADER:IPV4_MIN_HEADER + UDP_HEADER + HEADER_LEN]
    if len(atp) < HEADER_LEN or atp[OFFSETS["type"]] != DATA_V1 or not atp[OFFSETS["flags"]] & Flags.APPROX:
        return None
    return atp


def other_atp_version(packet: bytes, atp_port: int = DEFAULT_ATP_PORT,
                      report_port: int = DEFAULT_REPORT_PORT) -> bool:
    """Whether ``packet`` (bytes from the IPv4 header on) is an ATP packet of another version than this one
    (``hostlib.wire.VERSION``): what the P4 parser takes for ATP (IPv4 without options, not a non-first fragment,
    UDP to the ATP or the report port or from the ATP port, a whole 32-byte header after the UDP header) with a
    version other than ``VERSION`` in byte 0's high nibble. Every NetApprox switch drops it and counts it as
    malformed (``bad_version``): the P4 program's validation, the kernel switch's drop entries, the ns-3 queue
    disc (docs/wire-format.md, Versions)."""
    if len(packet) < IPV4_MIN_HEADER + UDP_HEADER + HEADER_LEN or packet[0] != 0x45 or packet[9] != IPPROTO_UDP:
        return False
    if struct.unpack_from("!H", packet, 6)[0] & 0x1FFF:
        return False
    sport, dport = struct.unpack_from("!HH", packet, IPV4_MIN_HEADER)
    if dport not in (atp_port, report_port) and sport != atp_port:
        return False
    return packet[IPV4_MIN_HEADER + UDP_HEADER] >> 4 != VERSION


def reference_queue(state: SwitchState, packet: bytes, atp_port: int = DEFAULT_ATP_PORT) -> int:
    """The logical queue ``state``'s tables give ``packet`` (bytes from the IPv4 header on), or ``DROPPED`` for an
    ATP packet of another version (``other_atp_version``; a FIFO switch, the baselines' network-oblivious one,
    knows nothing of ATP and queues it in queue 0)."""
    if len(packet) < IPV4_MIN_HEADER or packet[0] >> 4 != 4 or state.fifo:
        return NON_APPROX_QUEUE
    if other_atp_version(packet, atp_port):
        return DROPPED
    atp = approx_atp_header(packet, atp_port)
    if atp is not None:
        return approx_guard(_approx_queue(state, atp))
    proto, dport = packet[9], l4_dport(packet) or 0
    for r in sorted(state.class_rules, key=class_order):
        if proto & r.ip_proto_mask != r.ip_proto & r.ip_proto_mask:
            continue
        if dport & r.l4_dport_mask != r.l4_dport & r.l4_dport_mask:
            continue
        return r.qid
    return NON_APPROX_QUEUE


def approx_guard(qid: int) -> int:
    """The data plane's guard after classification: approximate traffic never enters queue 0 (a table entry
    that says 0 gives queue 1; the P4 program counts it in ``queue0_guard_packets``)."""
    return FIRST_APPROX_QUEUE if qid == NON_APPROX_QUEUE else qid


def _approx_queue(state: SwitchState, atp: bytes) -> int:
    """Surplus, queue_by_job, queue_by_tag, queue_by_tlr, lowest queue: the first that decides."""
    tlr, = struct.unpack_from("!H", atp, OFFSETS["tlr"])
    if tlr == TLR_ONE:
        return LOWEST_QUEUE  # surplus: the sender does not need this packet
    job, = struct.unpack_from("!I", atp, OFFSETS["job_id"])
    for r in state.job_rules:
        if r.job_id == job:
            return r.qid
    if atp[OFFSETS["flags"]] & Flags.TAGGED:
        prio = atp[OFFSETS["priority"]]
        deadline, = struct.unpack_from("!I", atp, OFFSETS["deadline_us"])
        for r in sorted(state.tag_rules, key=tag_order):
            if r.priority_lo <= prio <= r.priority_hi and r.deadline_lo_us <= deadline <= r.deadline_hi_us:
                return r.qid
    for r in sorted(state.tlr_rules):
        if r.tlr_lo <= tlr <= r.tlr_hi:
            return r.qid
    return LOWEST_QUEUE


def flow_key(packet: bytes) -> tuple[bytes, bytes, int, int, int]:
    """(source, destination, protocol, source port, destination port) as the ECMP hash reads them: the ports of
    a TCP/UDP first fragment without IP options (as ``l4_dport``), 0 and 0 for every other packet."""
    sport = dport = 0
    if l4_dport(packet) is not None:
        sport, dport = struct.unpack_from("!HH", packet, IPV4_MIN_HEADER)
    return packet[12:16], packet[16:20], packet[9], sport, dport


def sprays(state: SwitchState, packet: bytes, atp_port: int = DEFAULT_ATP_PORT) -> bool:
    """Whether ``state``'s switch sprays ``packet`` per packet: approximate ATP DATA on a switch that sprays
    (not ``fifo``)."""
    return (state.spray and not state.fifo and len(packet) >= IPV4_MIN_HEADER and packet[0] >> 4 == 4
            and approx_atp_header(packet, atp_port) is not None)


def reference_next_hops(state: SwitchState, packet: bytes, atp_port: int = DEFAULT_ATP_PORT) -> dict[int, float]:
    """The egress ports ``state``'s ``ecmp_routes`` give ``packet`` (bytes from the IPv4 header on), each with
    the probability that the packet leaves by it: one port with 1.0 for a hashed packet, the group's bucket
    shares for a sprayed one; {} when no route holds the destination (or the packet is not IPv4)."""
    if len(packet) < IPV4_MIN_HEADER or packet[0] >> 4 != 4:
        return {}
    route = longest_match(state.ecmp_routes, packet[16:20])
    if route is None:
        return {}
    buckets = route.buckets
    if sprays(state, packet, atp_port):
        return {p: buckets.count(p) / ECMP_BUCKETS for p in sorted(set(buckets))}
    return {buckets[flow_hash(*flow_key(packet)) % ECMP_BUCKETS]: 1.0}
