"""Generated tables and packets for the conformance tests: every data plane against ``controller.reference``.

The strategies here draw what the logical tables of docs/architecture.md can hold (every rule kind, overlapping
ranks, TLR and deadline boundaries, jobs pinned to queue 0) and packets that exercise them: ATP and not,
approximate and not, tagged, surplus, on each ATP port, valid and malformed (every drop reason of
docs/dataplane.md), IPv4 options, fragments, short frames, other IP versions. A packet is a ``PacketSpec``, so a
falsifying example reads as fields, not bytes.

``reference_queue`` (controller/reference.py) is the answer for the queue. ``p4_outcome`` adds what the P4
program does around classification, as docs/dataplane.md specifies it (validation and its drop reasons, REPORT
punting, routing, TTL, the queue byte, checksums), so a test can predict every output byte and counter of BMv2.
"""
from __future__ import annotations

import dataclasses
import struct

from hypothesis import strategies as st

from netapprox.controller.model import (
    NON_APPROX_QUEUE,
    ClassRule,
    EcnRule,
    JobRule,
    Route,
    SwitchState,
    TagRule,
    TlrRule,
    default_tlr_rules,
    prefix_split,
)
from netapprox.controller.reference import approx_atp_header, reference_queue
from netapprox.hostlib import wire

ATP_PORT = wire.DEFAULT_ATP_PORT
REPORT_PORT = wire.DEFAULT_REPORT_PORT
JOB_IDS = (1, 2, 3, 7, 0xDEADBEEF)
"""Jobs the generated tables pin; generated packets mostly carry one of them (and sometimes another)."""
TLR_POINTS = tuple(sorted({0, 1, 0x7FFF, wire.TLR_ONE} | {k * 0x1000 + d for k in range(1, 8) for d in (-1, 0)}))
"""The default TLR thresholds (k/8 in Q1.15) and the values either side of them, 0, 1.0."""
PRIORITY_POINTS = (0, 1, 9, 10, 127, 128, 254, 255)
DEADLINE_POINTS = (0, 1, 17, 999, 1000, 5000, 5001, 0x7FFFFFFF, 0xFFFFFFFE, wire.NO_DEADLINE)
MALFORMED_REASONS = ("truncated", "bad_version", "bad_type", "bad_flags", "bad_tlr", "bad_index", "ttl_expired",
                     "ipv4_checksum", "report_rate_limited")
"""The index of ``NetApproxIngress.malformed_packets`` (p4src/shared/define.p4, docs/dataplane.md)."""


def _near(points, lo: int, hi: int) -> st.SearchStrategy[int]:
    """Mostly the boundary ``points``, sometimes any value in [lo, hi]."""
    return st.one_of(st.sampled_from(points), st.integers(lo, hi))


def _range(points, lo: int, hi: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(_near(points, lo, hi), _near(points, lo, hi)).map(lambda ab: (min(ab), max(ab)))


qids = st.integers(0, 7)
job_rules = st.lists(st.builds(JobRule, job_id=st.sampled_from(JOB_IDS), qid=qids), unique_by=lambda r: r.job_id,
                     max_size=3).map(frozenset)
"""queue_by_job: a job may be pinned to queue 0 (the guard moves it to 1)."""


@st.composite
def tag_rules(draw, max_rules: int = 3) -> frozenset[TagRule]:
    """queue_by_tag: overlapping priority x deadline ranges with distinct ranks (larger rank wins)."""
    n = draw(st.integers(0, max_rules))
    ranks = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n, unique=True))
    out = set()
    for rank in ranks:
        p_lo, p_hi = draw(_range(PRIORITY_POINTS, 0, 255))
        d_lo, d_hi = draw(_range(DEADLINE_POINTS, 0, wire.NO_DEADLINE))
        out.add(TagRule(rank=rank, priority_lo=p_lo, priority_hi=p_hi, deadline_lo_us=d_lo, deadline_hi_us=d_hi,
                        qid=draw(qids)))
    return frozenset(out)


@st.composite
def tlr_rules(draw, disjoint: bool = False) -> frozenset[TlrRule]:
    """queue_by_tlr: the default thresholds, or generated ranges with ends at and around the thresholds
    (``disjoint``: no two ranges overlap, as the policy makes them)."""
    if draw(st.booleans()):
        return default_tlr_rules()
    ranges = draw(st.lists(_range(TLR_POINTS, 0, wire.TLR_ONE), max_size=4, unique=True))
    if disjoint:
        kept: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if all(hi < a or lo > b for a, b in kept):
                kept.append((lo, hi))
        ranges = kept
    return frozenset(TlrRule(lo, hi, draw(qids)) for lo, hi in ranges)


@st.composite
def class_rules(draw, max_rules: int = 3) -> frozenset[ClassRule]:
    """queue_by_class: ternary ip_proto x l4_dport with distinct ranks, including rules on port 0 (which P4 gives
    packets without a TCP/UDP header) and on the ATP port itself."""
    n = draw(st.integers(0, max_rules))
    ranks = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n, unique=True))
    return frozenset(ClassRule(rank=rank, ip_proto=draw(st.sampled_from([6, 17, 1, 47, 0x10])),
                               ip_proto_mask=draw(st.sampled_from([0, 0xFF, 0xF0])),
                               l4_dport=draw(st.sampled_from([0, 80, 5201, ATP_PORT, REPORT_PORT, 0x1400])),
                               l4_dport_mask=draw(st.sampled_from([0, 0xFFFF, 0xFF00])), qid=draw(qids))
                     for rank in ranks)


def ranks_are_unique(state: SwitchState) -> bool:
    """Rules of one table with the same rank overlap ambiguously (in P4 too): only states whose tag and class
    rules have distinct ranks have one defined answer."""
    return (len({r.rank for r in state.tag_rules}) == len(state.tag_rules)
            and len({r.rank for r in state.class_rules}) == len(state.class_rules))


def tag_entry_count(state: SwitchState) -> int:
    """u32 entries the kernel switch needs for ``state``'s tag rules (priority and deadline ranges as prefixes)."""
    return sum(len(prefix_split(r.priority_lo, r.priority_hi, 8)) * len(prefix_split(r.deadline_lo_us,
                                                                                     r.deadline_hi_us, 32))
               for r in state.tag_rules)


# --- routes (P4) ------------------------------------------------------------------------------------------------

EGRESS_PORTS = (2, 3)
"""Ports the generated routes use (packets enter on port 1)."""
DESTINATIONS = ("10.0.2.1", "10.0.2.200", "10.0.3.7", "10.1.0.9", "192.168.9.9")
MARKER_DST = "198.51.100.1"
MARKER_ROUTE = Route("198.51.100.1", 32, 2, "02:00:00:00:0a:02", "02:00:00:00:0b:02")
"""Every generated P4 state routes this address to port 2: a packet to it shows that the switch has processed
what was sent before (BMv2's ingress is one thread)."""


@st.composite
def routes(draw) -> frozenset[Route]:
    """routes_v4: overlapping prefixes (the longest wins) towards ports 2 and 3, plus the marker's route."""
    candidates = [("10.0.0.0", 8), ("10.0.2.0", 24), ("10.0.2.128", 25), ("10.0.3.7", 32), ("10.1.0.0", 16)]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True, min_size=2, max_size=len(candidates)))
    out = {MARKER_ROUTE}
    for prefix, length in chosen:
        port = draw(st.sampled_from(EGRESS_PORTS))
        out.add(Route(prefix, length, port, f"02:00:00:00:0a:{length:02x}", f"02:00:00:00:0b:{port:02x}"))
    return frozenset(out)


@st.composite
def p4_states(draw) -> SwitchState:
    """What the P4 driver installs: every table, ECN thresholds, routes. TLR ranges are disjoint, as the policy
    makes them (the P4 driver gives every queue_by_tlr entry the same priority; see docs/dataplane.md)."""
    return SwitchState(routes=draw(routes()), class_rules=draw(class_rules()), job_rules=draw(job_rules),
                       tag_rules=draw(tag_rules()), tlr_rules=draw(tlr_rules(disjoint=True)),
                       ecn_rules=draw(st.lists(st.builds(EcnRule, qid=qids, depth_pkts=st.integers(1, 64)),
                                               unique_by=lambda r: r.qid, max_size=3).map(frozenset)))


@st.composite
def kernel_states(draw) -> SwitchState:
    """What the kernel switch implements: the classification tables (overlapping TLR ranges too)."""
    return SwitchState(class_rules=draw(class_rules()), job_rules=draw(job_rules),
                       tag_rules=draw(tag_rules(max_rules=2)), tlr_rules=draw(tlr_rules()))


# --- packets -------------------------------------------------------------------------------------------------------

def ipv4_checksum(header: bytes) -> int:
    """The Internet checksum of ``header`` (its checksum field as it is: 0 to compute one, else 0 = valid)."""
    if len(header) % 2:
        header += b"\x00"
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


@dataclasses.dataclass(frozen=True)
class PacketSpec:
    """One IPv4 packet, field by field (``bytes()``: from the IPv4 header on). ``atp`` is an ATP header with any
    field values (off-spec ones too) and ``atp_length`` its length field (None: the payload's length)."""

    proto: int = 17
    sport: int = 40000
    dport: int = ATP_PORT
    atp: wire.Header | None = None
    atp_length: int | None = None
    payload: bytes = b""
    version: int = 4
    ihl: int = 5
    tos: int = 0
    frag: int = 0
    ttl: int = 64
    checksum_ok: bool = True
    dst: str = "10.0.2.1"
    src: str = "10.0.1.1"
    cut: int | None = None
    """Truncate the packet to this many bytes (its length fields keep the untruncated values)."""

    def l4(self) -> bytes:
        body = self.payload
        if self.atp is not None:
            length = len(self.payload) if self.atp_length is None else self.atp_length
            body = dataclasses.replace(self.atp, length=length).encode() + self.payload
        if self.proto == 17:
            return struct.pack("!HHHH", self.sport, self.dport, 8 + len(body), 0xBEEF) + body
        if self.proto == 6:
            return struct.pack("!HHIIBBHHH", self.sport, self.dport, 1, 0, 5 << 4, 0x18, 8192, 0xBEEF, 0) + body
        return body

    def bytes(self) -> bytes:
        options = b""
        if self.ihl > 5:  # Router Alert, then NOPs up to the header length
            options = (b"\x94\x04\x00\x00" + b"\x01" * 40)[:4 * (self.ihl - 5)]
        rest = self.l4()
        header_len = 20 + len(options)
        header = struct.pack("!BBHHHBBH4s4s", (self.version << 4) | self.ihl, self.tos, header_len + len(rest),
                             0x1234, self.frag, self.ttl, self.proto, 0, _addr(self.src), _addr(self.dst)) + options
        checksum = ipv4_checksum(header)
        if not self.checksum_ok:
            checksum ^= 0x0F0F
        packet = header[:10] + struct.pack("!H", checksum) + header[12:] + rest
        return packet if self.cut is None else packet[:self.cut]


def _addr(dotted: str) -> bytes:
    return bytes(int(x) for x in dotted.split("."))


def ethernet(packet: bytes, dst: str = "02:00:00:00:00:02", src: str = "02:00:00:00:00:01",
             ethertype: int = 0x0800) -> bytes:
    """An Ethernet frame around ``packet`` (no padding: veths carry frames of any length)."""
    return bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", "")) + struct.pack("!H", ethertype) \
        + packet


@st.composite
def atp_headers(draw, jobs=JOB_IDS) -> wire.Header:
    """Valid ATP headers: every type (mostly DATA), flag combinations with and without APPROX and TAGGED, TLRs at
    and around the thresholds, pinned jobs and others."""
    pkt_cnt = draw(st.integers(1, 4))
    return wire.Header(
        type=draw(st.sampled_from([wire.PacketType.DATA] * 4 + list(wire.PacketType))),
        flags=draw(st.one_of(st.sampled_from([0x01, 0x01, 0x09, 0x00, 0x08, 0x03, 0x11, 0x0D, 0x1F]),
                             st.integers(0, 0x1F))),
        queue=draw(st.sampled_from([wire.QUEUE_UNSET, 0, 5])), priority=draw(_near(PRIORITY_POINTS, 0, 255)),
        job_id=draw(st.one_of(st.sampled_from(jobs), st.integers(0, 0xFFFFFFFF))),
        msg_id=draw(st.integers(0, 0xFFFFFFFF)), group_id=draw(st.integers(0, 0xFFFF)),
        tlr=draw(_near(TLR_POINTS, 0, wire.TLR_ONE)), pkt_idx=draw(st.integers(0, pkt_cnt - 1)), pkt_cnt=pkt_cnt,
        seq=draw(st.integers(0, 0xFFFFFFFF)), deadline_us=draw(_near(DEADLINE_POINTS, 0, wire.NO_DEADLINE)),
        weight=draw(st.integers(0, 255)))


MUTATIONS = ("atp_version", "atp_type", "atp_flags", "atp_tlr", "atp_index", "atp_length", "ip_version",
             "ip_options", "ihl_short", "fragment", "ttl", "checksum", "cut")
"""What ``packets`` may do to a well-formed packet: one for each drop reason of the P4 program and each kind of
header the tables must not read (or must read differently)."""


@st.composite
def packets(draw, destinations=DESTINATIONS, jobs=JOB_IDS) -> PacketSpec:
    """IPv4 packets of every kind the switch meets: ATP (to the ATP port, to the report port, from the ATP port),
    other UDP, TCP, other protocols, any ECN bits; about half of them well-formed, the others with one or two of
    ``MUTATIONS`` (off-spec ATP fields, other IP versions, IPv4 options, IHL < 5, fragments, TTL 0/1, wrong
    checksums, packets cut short)."""
    kind = draw(st.sampled_from(["atp"] * 5 + ["atp_report_port", "atp_from_port", "udp", "tcp", "other"]))
    proto = {"tcp": 6, "other": draw(st.sampled_from([1, 47, 0x12, 0]))}.get(kind, 17)
    sport, dport = draw(st.integers(1024, 65535)), draw(st.sampled_from([5201, 80, 0, 0x1450, ATP_PORT + 2]))
    atp = None
    if kind.startswith("atp"):
        atp = draw(atp_headers(jobs))
        sport, dport = {"atp": (sport, ATP_PORT), "atp_report_port": (sport, REPORT_PORT),
                        "atp_from_port": (ATP_PORT, dport)}[kind]
    spec = PacketSpec(proto=proto, sport=sport, dport=dport, atp=atp, payload=draw(st.binary(max_size=48)),
                      tos=draw(st.integers(0, 255)), dst=draw(st.sampled_from(destinations)))
    mutations = draw(st.one_of(st.just([]), st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2,
                                                      unique=True)))  # a second cut could leave nothing to cut
    for m in mutations:
        spec = draw(_mutated(spec, m))
    return spec


@st.composite
def _mutated(draw, spec: PacketSpec, mutation: str) -> PacketSpec:
    r = dataclasses.replace
    if mutation.startswith("atp_") and spec.atp is None:
        return spec
    h = spec.atp
    if mutation == "atp_version":
        return r(spec, atp=r(h, version=draw(st.sampled_from([0, 2, 15]))))
    if mutation == "atp_type":
        return r(spec, atp=r(h, type=draw(st.sampled_from([0, 6, 15]))))
    if mutation == "atp_flags":
        return r(spec, atp=r(h, flags=h.flags | draw(st.integers(1, 7)) << 5))
    if mutation == "atp_tlr":
        return r(spec, atp=r(h, tlr=draw(st.integers(wire.TLR_ONE + 1, 0xFFFF))))
    if mutation == "atp_index":
        idx, cnt = draw(st.sampled_from([(0, 0), (4, 4), (9, 3)]))
        return r(spec, atp=r(h, pkt_idx=idx, pkt_cnt=cnt))
    if mutation == "atp_length":  # announces more payload than there is
        return r(spec, atp_length=len(spec.payload) + draw(st.integers(1, 100)))
    if mutation == "ip_version":
        return r(spec, version=draw(st.sampled_from([6, 0, 15])))
    if mutation == "ip_options":
        return r(spec, ihl=draw(st.sampled_from([6, 7, 15])))
    if mutation == "ihl_short":
        return r(spec, ihl=draw(st.sampled_from([4, 0])))
    if mutation == "fragment":
        return r(spec, frag=draw(st.sampled_from([0x2000, 0x0001, 0x2004, 0x1FFF, 0x4001])))
    if mutation == "ttl":
        return r(spec, ttl=draw(st.sampled_from([0, 1])))
    if mutation == "checksum":
        return r(spec, checksum_ok=False)
    assert mutation == "cut"
    return r(spec, cut=draw(st.integers(0, len(spec.bytes()) - 1)))


def headers_complete(packet: bytes) -> bool:
    """Whether every header the P4 parser would extract from ``packet`` is whole: the 20 bytes of IPv4; for a
    first fragment without options, the TCP (20 bytes) or UDP (8) header; after a UDP header on an ATP port,
    the 32-byte ATP header. The P4 program drops the others (a malformed ATP header or a parser error); the
    kernel switch's u32 classifier stops at its first read past a packet's end (queue 0), so on a packet cut
    short inside a header it may disagree with the reference, which reads what is there
    (docs/emulation.md)."""
    if len(packet) < 20:
        return False
    if packet[0] & 0x0F != 5 or struct.unpack_from("!H", packet, 6)[0] & 0x1FFF or packet[9] not in (6, 17):
        return True
    if packet[9] == 6:
        return len(packet) >= 40
    if len(packet) < 28:
        return False
    sport, dport = struct.unpack_from("!HH", packet, 20)
    return len(packet) >= 28 + wire.HEADER_LEN or (dport not in (ATP_PORT, REPORT_PORT) and sport != ATP_PORT)


# --- what the P4 program does with a packet (docs/dataplane.md) ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class P4Outcome:
    """The fate of one packet entering the P4 switch, as docs/dataplane.md specifies it."""

    verdict: str
    """``forward``, ``cpu`` (packet-in), ``drop`` (counted in malformed_packets[reason]) or ``discard``
    (dropped and counted nowhere: route miss, not IPv4, IHL < 5, parser errors outside the ATP header)."""
    port: int | None = None
    qid: int | None = None
    reason: str | None = None
    guarded: bool = False
    """An approximate packet a table put in queue 0 (moved to 1, counted in queue0_guard_packets)."""
    job_hit: int | None = None
    """The job whose queue_by_job entry the packet hit (its direct counter counts it)."""
    frame: bytes | None = None
    """The frame that leaves (forward), or the packet-in payload (cpu)."""


_DEFINED_FLAGS = sum(int(f) for f in wire.Flags)


def _atp_validation(atp: bytes, udp_length: int) -> str | None:
    """The first ATP check that fails, in hostlib.wire.decode's order, on the parsed header; the length check
    uses the UDP length field (the P4 program does not see the frame's length)."""
    version, ptype = atp[0] >> 4, atp[0] & 0x0F
    flags = atp[wire.OFFSETS["flags"]]
    tlr, = struct.unpack_from("!H", atp, wire.OFFSETS["tlr"])
    idx, cnt = struct.unpack_from("!HH", atp, wire.OFFSETS["pkt_idx"])
    length, = struct.unpack_from("!H", atp, wire.OFFSETS["length"])
    if version != wire.VERSION:
        return "bad_version"
    if ptype == 0 or ptype > max(wire.PacketType):
        return "bad_type"
    if flags & ~_DEFINED_FLAGS & 0xFF:  # version 2 defines all eight
        return "bad_flags"
    if tlr > wire.TLR_ONE:
        return "bad_tlr"
    if cnt == 0 or idx >= cnt:
        return "bad_index"
    if udp_length < 8 + wire.HEADER_LEN + length:
        return "truncated"
    return None


def _lpm(state: SwitchState, dst: bytes) -> Route | None:
    best = None
    for r in state.routes:
        net = int.from_bytes(_addr(r.prefix), "big")
        mask = ((1 << r.prefix_len) - 1) << (32 - r.prefix_len) if r.prefix_len else 0
        if int.from_bytes(dst, "big") & mask == net & mask and (best is None or r.prefix_len > best.prefix_len):
            best = r
    return best


def _csum16_update(hc: int, old_a: int, new_a: int, old_b: int, new_b: int) -> int:
    """RFC 1624 eqn. 3 for two changed 16-bit words, as the v1model egress computes it for headers with options."""
    s = (~hc & 0xFFFF) + (~old_a & 0xFFFF) + new_a + (~old_b & 0xFFFF) + new_b
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def p4_outcome(state: SwitchState, packet: bytes, *, ingress_port: int = 1, ethertype: int = 0x0800,
               enq_qdepth: int = 0) -> P4Outcome:
    """What the P4 program (v1model, docs/dataplane.md) does with ``packet`` (bytes after the Ethernet header)
    arriving in a frame of ``ethertype`` on ``ingress_port``, its queue found with ``reference_queue``. The
    queue it enters held ``enq_qdepth`` packets (0 on an idle switch)."""
    if ethertype != 0x0800 or len(packet) < 20:
        return P4Outcome("discard")  # the parser cannot extract IPv4: parser error, not IPv4
    version, ihl = packet[0] >> 4, packet[0] & 0x0F
    proto = packet[9]
    frag_offset = struct.unpack_from("!H", packet, 6)[0] & 0x1FFF
    udp = tcp = atp = None
    parser_error = False
    if ihl == 5 and frag_offset == 0 and proto in (6, 17):
        need = 8 if proto == 17 else 20
        if len(packet) < 20 + need:
            parser_error = True
        elif proto == 17:
            udp = struct.unpack_from("!HHH", packet, 20)
            if udp[1] in (ATP_PORT, REPORT_PORT) or udp[0] == ATP_PORT:
                if len(packet) >= 28 + wire.HEADER_LEN:
                    atp = packet[28:28 + wire.HEADER_LEN]
                else:
                    parser_error = True
        else:
            tcp = struct.unpack_from("!HH", packet, 20)
    reason = None
    if atp is not None:
        reason = _atp_validation(atp, udp[2])
    elif udp is not None and (udp[1] in (ATP_PORT, REPORT_PORT) or udp[0] == ATP_PORT):
        reason = "truncated"
    if ihl == 5 and ipv4_checksum(packet[:20]) != 0:
        reason = "ipv4_checksum"
    if reason is not None:
        return P4Outcome("drop", reason=reason)
    if atp is not None and atp[0] & 0x0F == wire.PacketType.REPORT:
        return P4Outcome("cpu", port=ingress_port, frame=packet)
    if version != 4 or ihl < 5 or parser_error:
        return P4Outcome("discard")
    ttl = packet[8]
    if ttl <= 1:
        return P4Outcome("drop", reason="ttl_expired")
    route = _lpm(state, packet[16:20])
    if route is None:
        return P4Outcome("discard")
    qid = reference_queue(state, packet, ATP_PORT)
    approx = approx_atp_header(packet, ATP_PORT)
    guarded = job_hit = None
    if approx is not None:
        tlr, = struct.unpack_from("!H", approx, wire.OFFSETS["tlr"])
        job, = struct.unpack_from("!I", approx, wire.OFFSETS["job_id"])
        if tlr != wire.TLR_ONE:
            job_hit = job if any(r.job_id == job for r in state.job_rules) else None
        guarded = _tables_say_queue_0(state, approx)
    out = bytearray(packet)
    out[8] = ttl - 1
    ecn = out[1] & 3
    marks = any(r.qid == qid and enq_qdepth >= r.depth_pkts for r in state.ecn_rules)
    if ecn in (1, 2) and marks:
        out[1] |= 3
    if atp is not None and atp[0] & 0x0F == wire.PacketType.DATA:
        out[28 + wire.OFFSETS["queue"]] = qid
        out[26:28] = b"\x00\x00"
    if ihl == 5:
        out[10:12] = b"\x00\x00"
        out[10:12] = struct.pack("!H", ipv4_checksum(bytes(out[:20])))
    else:
        old_tos, old_ttl = struct.unpack_from("!H", packet, 0)[0], struct.unpack_from("!H", packet, 8)[0]
        new_tos, new_ttl = struct.unpack_from("!H", out, 0)[0], struct.unpack_from("!H", out, 8)[0]
        hc, = struct.unpack_from("!H", packet, 10)
        out[10:12] = struct.pack("!H", _csum16_update(hc, old_tos, new_tos, old_ttl, new_ttl))
    frame = ethernet(bytes(out), dst=route.dst_mac, src=route.src_mac)
    return P4Outcome("forward", port=route.port, qid=qid, guarded=bool(guarded), job_hit=job_hit, frame=frame)


def _tables_say_queue_0(state: SwitchState, atp: bytes) -> bool:
    """Whether the approximate tables (before the guard) put this packet in queue 0: the reference's own table
    walk, without its guard."""
    from netapprox.controller import reference
    return reference._approx_queue(state, atp) == NON_APPROX_QUEUE
