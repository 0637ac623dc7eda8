"""The kernel switch's classifier: a ``SwitchState`` compiled to ``u32`` filter entries. Pure (no tc, no I/O).

One ``u32`` classifier (one filter priority) on the root HTB qdisc of every egress port holds entries that
mirror the P4 tables of docs/architecture.md in order. u32 evaluates the entries of one hash bucket in
increasing node id, so the table order is a node-id layout:

    node 0x001..0x00c   (atp_version)    an ATP packet of another version               -> drop
    node 0x010          (surplus)        approximate ATP DATA and tlr == 1.0            -> queue 7
    node 0x011..0x3ff   queue_by_job     approximate ATP DATA and job_id == J           -> 1:2q
    node 0x400..0x9ff   queue_by_tag     ... and TAGGED, priority x deadline ranges     -> 1:2q
    node 0xa00..0xdff   queue_by_tlr     ... and tlr range                              -> 1:2q
    node 0xe00          (default)        any approximate ATP DATA                       -> queue 7
    node 0xe01..0xffe   queue_by_class   everything else: ip_proto / l4_dport ternary   -> 1:2q
    node 0xfff          (default)        any packet                                     -> 1:20 (queue 0)
    (not IPv4)          htb default      -> 1:10 (queue 0)

The atp_version entries drop what ``controller.reference.other_atp_version`` names (IPv4 without options, not a
non-first fragment, UDP to the ATP or report port or from the ATP port, a whole ATP header, a version nibble other
than this one: the versions as prefixes), as the P4 program's validation does; tc counts their matches
(``tc -s filter``). Approximate rules (job, tag, TLR) that name queue 0 are compiled to queue 1: the P4 program's guard
(``controller.reference.approx_guard``; approximate traffic never uses queue 0), applied here at compile time,
so the kernel switch has no per-packet count of it.
"Approximate ATP DATA" is the conjunction: IPv4 (version 4) without options (ihl 5), not a non-first fragment,
UDP, destination port = the ATP port, ATP byte 0 = 0x21 (version 2, DATA), flag APPROX set. Ranges (TLR,
CadentFlow priority and deadline) are decomposed into prefix (value/mask) matches, one u32 entry each.
``u32_queue`` evaluates compiled entries on a packet the way the kernel does (``kernel_keys``: the words the
kernel holds, in its order; a read past the end of the packet stops the classifier: queue 0); the tests
compare it with ``controller.reference.reference_queue`` for every rule kind, and with the real kernel
(tests/controller/test_kernel_agreement.py). ``controller.kernel.tc`` writes the entries.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Iterable, Mapping, Sequence

from netapprox.controller.errors import KernelSwitchError
from netapprox.controller.model import (
    LOWEST_QUEUE,
    NON_APPROX_QUEUE,
    NUM_QUEUES,
    ClassRule,
    JobRule,
    SwitchState,
    TagRule,
    TlrRule,
    prefix_split,
)
from netapprox.controller.reference import (
    DATA_V1 as _DATA_V1,
    DROPPED,
    IPPROTO_UDP,
    IPV4_MIN_HEADER,
    UDP_HEADER,
    approx_guard,
    class_order,
    tag_order,
)
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, DEFAULT_REPORT_PORT, OFFSETS, TLR_ONE, VERSION, Flags


class TableFull(KernelSwitchError):
    """More entries than the table's node range holds."""


# Node-id layout of the u32 root hash table (12-bit node ids, evaluated in increasing order).
VERSION_NODES = range(0x001, 0x010)
SURPLUS_NODE = 0x010
JOB_NODES = range(0x011, 0x400)
TAG_NODES = range(0x400, 0xA00)
TLR_NODES = range(0xA00, 0xE00)
APPROX_DEFAULT_NODE = 0xE00
CLASS_NODES = range(0xE01, 0xFFF)
CATCH_ALL_NODE = 0xFFF

# Byte offsets of the 32-bit words u32 matches, from the start of the IPv4 header (no options: the keys
# require IHL 5). ATP fields come from hostlib.wire.OFFSETS, so the header is defined once.
ATP_OFFSET = IPV4_MIN_HEADER + UDP_HEADER
_OFF_IHL = 0
_OFF_PROTO_WORD = 8  # byte 9 = protocol
_OFF_PORTS = 20  # UDP/TCP source port (20..21), destination port (22..23)
_OFF_ATP0 = ATP_OFFSET + OFFSETS["version"]  # word: version/type, flags, queue, priority
_OFF_JOB = ATP_OFFSET + OFFSETS["job_id"]
_OFF_TLR_WORD = ATP_OFFSET + OFFSETS["tlr"] - 2  # word: group_id (high 16 bits), tlr (low 16 bits)
_OFF_DEADLINE = ATP_OFFSET + OFFSETS["deadline_us"]
assert OFFSETS["flags"] == 1 and OFFSETS["priority"] == 3 and OFFSETS["group_id"] == OFFSETS["tlr"] - 2


@dataclasses.dataclass(frozen=True, order=True)
class Key:
    """One u32 key: (32-bit word at ``offset`` from the IPv4 header) & mask == value."""

    offset: int
    value: int
    mask: int

    def matches(self, packet: bytes) -> bool:
        word = packet[self.offset:self.offset + 4]
        if len(word) < 4:
            return False
        return struct.unpack("!I", word)[0] & self.mask == self.value

    def bytes_masked(self) -> dict[int, tuple[int, int]]:
        """offset -> (value, mask) of every byte this key constrains."""
        out = {}
        for i in range(4):
            m = (self.mask >> (24 - 8 * i)) & 0xFF
            if m:
                out[self.offset + i] = ((self.value >> (24 - 8 * i)) & m, m)
        return out

    def specs(self) -> list[str]:
        """pyroute2 key syntax, one key per constrained byte.

        pyroute2 0.9's u32 key parser drops zero mask bytes *inside* a key without advancing the offset (a mask
        0xff00ff00 at 28 would test bytes 28 and 29, not 28 and 30), and cannot parse an all-zero mask written
        with leading zeros. Single-byte keys avoid both; pyroute2 regroups them into 32-bit kernel keys.
        """
        if self.mask == 0:
            return [f"0x0/0x0+{self.offset}"]
        return [f"0x{v:02x}/0x{m:02x}+{off}" for off, (v, m) in sorted(self.bytes_masked().items())]


@dataclasses.dataclass(frozen=True)
class U32Entry:
    """One u32 filter entry: all keys match -> logical queue ``qid``. ``table`` names its logical table."""

    node: int
    keys: tuple[Key, ...]
    qid: int
    table: str

    def matches(self, packet: bytes) -> bool:
        return all(k.matches(packet) for k in self.keys)


def _approx_data_keys(atp_port: int, extra_flags: int = 0, atp0_low: tuple[int, int] = (0, 0)) -> list[Key]:
    flags = int(Flags.APPROX) | extra_flags
    low_value, low_mask = atp0_low
    return _l4_parsed() + [
        Key(_OFF_PROTO_WORD, IPPROTO_UDP << 16, 0x00FF0000),
        Key(_OFF_PORTS, atp_port, 0x0000FFFF),
        Key(_OFF_ATP0, (_DATA_V1 << 24) | (flags << 16) | low_value, 0xFF000000 | (flags << 16) | low_mask),
    ]


def other_version_key_sets(atp_port: int, report_port: int = DEFAULT_REPORT_PORT) -> list[tuple[Key, ...]]:
    """The atp_version entries' keys: UDP to the ATP or report port or from the ATP port, a version nibble other
    than ``VERSION`` (as prefixes of 0..15). No key asks for the whole ATP header: pyroute2 puts zero-mask keys
    first, so one would stop the classifier on every short packet; a packet cut inside its ATP header is one
    the P4 program drops as truncated (docs/emulation.md)."""
    versions = [(v, m) for lo, hi in ((0, VERSION - 1), (VERSION + 1, 15)) if lo <= hi
                for v, m in prefix_split(lo, hi, 4)]
    ports = (Key(_OFF_PORTS, atp_port, 0x0000FFFF), Key(_OFF_PORTS, report_port, 0x0000FFFF),
             Key(_OFF_PORTS, atp_port << 16, 0xFFFF0000))
    return [tuple(_l4_parsed() + [Key(_OFF_PROTO_WORD, IPPROTO_UDP << 16, 0x00FF0000), port,
                                  Key(_OFF_ATP0, v << 28, m << 28)])
            for port in ports for v, m in versions]


def job_keys(rule: JobRule, atp_port: int) -> tuple[Key, ...]:
    return tuple(_approx_data_keys(atp_port) + [Key(_OFF_JOB, rule.job_id, 0xFFFFFFFF)])


def tag_key_sets(rule: TagRule, atp_port: int) -> list[tuple[Key, ...]]:
    out = []
    for pv, pm in prefix_split(rule.priority_lo, rule.priority_hi, 8):
        base = _approx_data_keys(atp_port, int(Flags.TAGGED), (pv, pm))
        for dv, dm in prefix_split(rule.deadline_lo_us, rule.deadline_hi_us, 32):
            keys = list(base)
            if dm:
                keys.append(Key(_OFF_DEADLINE, dv, dm))
            out.append(tuple(keys))
    return out


def tlr_key_sets(rule: TlrRule, atp_port: int) -> list[tuple[Key, ...]]:
    out = []
    for v, m in prefix_split(rule.tlr_lo, rule.tlr_hi, 16):
        keys = _approx_data_keys(atp_port)
        if m:
            keys.append(Key(_OFF_TLR_WORD, v, m))
        out.append(tuple(keys))
    return out


def _l4_parsed() -> list[Key]:
    """IPv4 (version 4) without options and not a non-first fragment: where the P4 parser reads L4 ports and ATP."""
    return [Key(_OFF_IHL, 0x45000000, 0xFF000000), Key(4, 0, 0x00001FFF)]


def _ipv4() -> list[Key]:
    """Version 4 and a whole 20-byte header (a zero-mask word at 16 only reads: a shorter packet stops the
    classifier, and HTB's default puts it in queue 0, as the reference does with anything that is not IPv4)."""
    return [Key(_OFF_IHL, 0x40000000, 0xF0000000), Key(16, 0, 0)]


def _runs(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def class_key_sets(rule: ClassRule) -> list[tuple[Key, ...]]:
    """u32 entries for one queue_by_class rule (first match of them = the rule matches).

    ``l4_dport`` follows the P4 program: the TCP/UDP destination port of a first fragment without IP options,
    and 0 for every other packet. A rule with an ``l4_dport`` mask therefore becomes one entry per matching
    TCP/UDP protocol, plus, when the rule also matches port 0, prefix entries for every other protocol its
    ``ip_proto`` ternary admits and for TCP/UDP packets whose ports are not parsed (IHL other than 5, the IHL
    nibble as prefixes; non-first fragments, the 13-bit fragment offset [1, 8191] as prefixes).
    """
    pv, pm = rule.ip_proto & rule.ip_proto_mask, rule.ip_proto_mask
    if not rule.l4_dport_mask:
        return [tuple(_ipv4() + ([Key(_OFF_PROTO_WORD, pv << 16, pm << 16)] if pm else []))]
    dv, dm = rule.l4_dport & rule.l4_dport_mask, rule.l4_dport_mask
    out = []
    for proto in (6, IPPROTO_UDP):
        if proto & pm == pv:
            out.append(tuple(_l4_parsed() + [Key(_OFF_PROTO_WORD, proto << 16, 0x00FF0000),
                                              Key(_OFF_PORTS, dv, dm)]))
    if dv == 0:
        others = [p for p in range(256) if p & pm == pv and p not in (6, IPPROTO_UDP)]
        for lo, hi in _runs(others):
            for v, m in prefix_split(lo, hi, 8):
                out.append(tuple(_ipv4() + [Key(_OFF_PROTO_WORD, v << 16, m << 16)]))
        for proto in (6, IPPROTO_UDP):
            if proto & pm != pv:
                continue
            proto_key = Key(_OFF_PROTO_WORD, proto << 16, 0x00FF0000)
            for lo, hi in ((0, 4), (6, 15)):
                for v, m in prefix_split(lo, hi, 4):
                    out.append((Key(_OFF_IHL, (0x40 | v) << 24, (0xF0 | m) << 24), Key(16, 0, 0), proto_key))
            for v, m in prefix_split(1, 0x1FFF, 13):
                out.append((Key(_OFF_IHL, 0x45000000, 0xFF000000), Key(4, v, m), proto_key))
    return out


def _place(table: str, nodes: range, key_sets: Iterable[tuple[tuple[Key, ...], int]]) -> list[U32Entry]:
    out = []
    for i, (keys, qid) in enumerate(key_sets):
        if i >= len(nodes):
            raise TableFull(
                f"{table}: more than {len(nodes)} u32 entries after range decomposition; "
                f"use fewer or wider-aligned ranges")
        out.append(U32Entry(nodes[i], keys, qid, table))
    return out


class JobNodes:
    """Stable node ids for queue_by_job entries, so that moving a job to another queue is one replace."""

    def __init__(self) -> None:
        self._by_job: dict[int, int] = {}

    def assign(self, job_ids: Iterable[int]) -> dict[int, int]:
        wanted = set(job_ids)
        for job in list(self._by_job):
            if job not in wanted:
                del self._by_job[job]
        used = set(self._by_job.values())
        free = (n for n in JOB_NODES if n not in used)
        for job in sorted(wanted - set(self._by_job)):
            node = next(free, None)
            if node is None:
                raise TableFull(f"queue_by_job: more than {len(JOB_NODES)} jobs")
            self._by_job[job] = node
        return dict(self._by_job)


def compile_filters(state: SwitchState, atp_port: int = DEFAULT_ATP_PORT,
                    job_nodes: JobNodes | None = None) -> dict[int, U32Entry]:
    """The u32 entries (by node id) implementing ``state``'s classification tables. Pure.

    ``routes`` do not apply (the kernel switch bridges) and ``ecn_rules`` are not implemented here.
    """
    if state.fifo:  # one queue: everything goes by the catch-all entry
        return {CATCH_ALL_NODE: U32Entry(CATCH_ALL_NODE, (Key(0, 0, 0),), NON_APPROX_QUEUE, "default")}
    nodes = (job_nodes or JobNodes()).assign(r.job_id for r in state.job_rules)
    entries: list[U32Entry] = _place("atp_version", VERSION_NODES,
                                     ((ks, DROPPED) for ks in other_version_key_sets(atp_port)))
    entries += [U32Entry(SURPLUS_NODE, tuple(_approx_data_keys(atp_port)) + (
        Key(_OFF_TLR_WORD, TLR_ONE, 0xFFFF),), LOWEST_QUEUE, "surplus")]
    for rule in state.job_rules:
        entries.append(U32Entry(nodes[rule.job_id], job_keys(rule, atp_port), approx_guard(rule.qid), "queue_by_job"))
    entries += _place("queue_by_tag", TAG_NODES,
                      ((ks, approx_guard(r.qid)) for r in sorted(state.tag_rules, key=tag_order)
                       for ks in tag_key_sets(r, atp_port)))
    entries += _place("queue_by_tlr", TLR_NODES,
                      ((ks, approx_guard(r.qid)) for r in sorted(state.tlr_rules) for ks in tlr_key_sets(r, atp_port)))
    entries.append(U32Entry(APPROX_DEFAULT_NODE, tuple(_approx_data_keys(atp_port)), LOWEST_QUEUE, "approx_default"))
    entries += _place("queue_by_class", CLASS_NODES,
                      ((ks, r.qid) for r in sorted(state.class_rules, key=class_order) for ks in class_key_sets(r)))
    entries.append(U32Entry(CATCH_ALL_NODE, (Key(0, 0, 0),), NON_APPROX_QUEUE, "default"))
    return {e.node: e for e in entries}


def stamp_filters(class_rules: Iterable[ClassRule], atp_port: int = DEFAULT_ATP_PORT) -> dict[int, U32Entry]:
    """The traffic-manager classifier behind a P4 switch's port (BMv2 in emulation): ATP DATA -> the queue the
    P4 pipeline stamped into its ``queue`` byte; everything else -> ``queue_by_class`` (the same rules the P4
    table holds), default queue 0."""
    queue_byte = OFFSETS["queue"]
    entries = {}
    for q in range(NUM_QUEUES):
        keys = tuple(_l4_parsed()) + (Key(_OFF_PROTO_WORD, IPPROTO_UDP << 16, 0x00FF0000),
                                      Key(_OFF_PORTS, atp_port, 0x0000FFFF),
                                      Key(_OFF_ATP0, (_DATA_V1 << 24) | (q << (24 - 8 * queue_byte)),
                                          0xFF000000 | (0xFF << (24 - 8 * queue_byte))))
        entries[1 + q] = U32Entry(1 + q, keys, q, "tm_by_stamp")
    state = compile_filters(SwitchState(class_rules=frozenset(class_rules)), atp_port)
    entries.update({n: e for n, e in state.items() if e.table in ("queue_by_class", "default")})
    return entries


def kernel_keys(keys: Iterable[Key]) -> list[tuple[int, int, int]]:
    """The (offset, value, mask) words the kernel holds for ``keys``, in the order it evaluates them: what
    pyroute2 0.9's u32 encoder makes of ``Key.specs()``. Zero-mask keys come first; then the constrained bytes,
    regrouped into 4-byte words in increasing offset, each starting at the first constrained byte the previous
    word does not cover."""
    specs = list(keys)
    out = [(k.offset, 0, 0) for k in specs if k.mask == 0]
    constrained: dict[int, tuple[int, int]] = {}
    for k in specs:
        constrained.update(k.bytes_masked())
    end = -1
    for off in sorted(constrained):
        if off <= end:
            continue
        value = mask = 0
        for i in range(4):
            v, m = constrained.get(off + i, (0, 0))
            value, mask = (value << 8) | v, (mask << 8) | m
        out.append((off, value, mask))
        end = off + 3
    return out


def u32_queue(entries: Mapping[int, U32Entry], packet: bytes) -> int:
    """What the kernel does with ``packet`` (bytes from the IPv4 header on): the entries in node order, each
    one's words (``kernel_keys``) in order; the first entry whose words all match decides. A word past the end
    of the packet stops the whole classifier with no match (cls_u32: ``skb_header_pointer`` fails, ``goto
    out``), and HTB's default class puts the packet in queue 0."""
    for node in sorted(entries):
        for offset, value, mask in kernel_keys(entries[node].keys):
            word = packet[offset:offset + 4]
            if len(word) < 4:
                return NON_APPROX_QUEUE
            if struct.unpack("!I", word)[0] & mask != value:
                break
        else:
            return entries[node].qid
    return NON_APPROX_QUEUE


def describe(entries: Sequence[U32Entry]) -> str:
    """Human-readable listing (for logs and docs)."""
    return "\n".join(f"{e.node:#05x} {e.table:<15} -> q{e.qid}  " + " ".join(s for k in e.keys for s in k.specs())
                     for e in sorted(entries, key=lambda e: e.node))
