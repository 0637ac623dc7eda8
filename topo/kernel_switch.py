"""The Linux kernel switch: NetApprox's logical tables as an HTB strict-priority tree and ``u32`` filters.

One egress port carries this tree (``tc`` handles in hex):

    root  1:    htb default 10 r2q 1            unclassified (ARP, non-IP) -> 1:10 = queue 0
    1:1         htb rate R ceil R               the port's line rate R
    1:2q        htb ceil R  (q = 0..7)          "stamp" class of queue q: the u32 entries point here; its
                                                filter (the eBPF stamper, else a u32 pass) picks the leaf
    1:1q        htb prio q, ceil R              logical queue q (leaf); HTB prio 0 is served first
    1q:         bfifo (q = 0: the rest of the port buffer, in bytes)
                pfifo limit 8 - q packets (q >= 1)

and one ``u32`` classifier (one filter priority) on ``1:`` whose entries mirror the P4 tables of
docs/architecture.md in order. u32 evaluates the entries of one hash bucket in increasing node id, so the
table order is a node-id layout:

    node 0x001..0x3ff   queue_by_job     approximate ATP DATA and job_id == J           -> 1:1q
    node 0x400..0x9ff   queue_by_tag     ... and TAGGED, priority x deadline ranges     -> 1:1q
    node 0xa00..0xdff   queue_by_tlr     ... and tlr range                              -> 1:1q
    node 0xe00          (default)        any approximate ATP DATA                       -> queue 7
    node 0xe01..0xffe   queue_by_class   everything else: ip_proto / l4_dport ternary   -> 1:2q
    node 0xfff          (default)        any IPv4 packet                                -> 1:20 (queue 0)
    (not IPv4)          htb default      -> 1:10 (queue 0)

"Approximate ATP DATA" is the conjunction: IPv4 without options (ihl 5), UDP, destination port = the ATP
port, ATP byte 0 = 0x11 (version 1, DATA), flag APPROX set. Ranges (TLR, CadentFlow priority and deadline)
are decomposed into prefix (value/mask) matches, one u32 entry each. Offsets are relative to the IPv4
header; the ATP header starts 28 bytes after it (docs/wire-format.md).

Queue stamp: a small eBPF classifier (topo/bpf/stamp.c, one section per queue) on each stamp class 1:2q
writes q into the ATP ``queue`` byte of DATA packets (and zeroes the UDP checksum), as the P4 program does.
It needs clang and tc with BPF support; without them the stamp classes pass packets on unchanged (u32
match-all) and the byte stays 0xFF (``attach_stamps`` raises, the driver logs it).

ECN: with the stamper, queue 0's section also marks CE from a virtual copy of queue 0's backlog
(``attach_queue0``; queue 0 drains at line rate, being the highest priority). Thresholds on other queues are
not implemented. No per-job hit counters (``CONFIG_CLS_U32_PERF`` is off on common kernels).

This module is pure except for the functions that take an ``IPRoute``; ``compile_filters`` and
``reference_queue`` / ``u32_queue`` are used by the tests to check the layout without root.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from netapprox.controller.model import (
    LOWEST_QUEUE,
    NON_APPROX_QUEUE,
    NUM_QUEUES,
    ClassRule,
    JobRule,
    SwitchState,
    TagRule,
    TlrRule,
    queue_buffer_packets,
)
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, Flags, PacketType

ETH_P_IP = 0x0800
ETH_P_ALL = 0x0003
IPPROTO_UDP = 17

# tc handles. Class 1:1q is logical queue q; its leaf qdisc has major 0x1q.
ROOT_HANDLE = 0x00010000
LINK_CLASSID = 0x00010001
FILTER_PRIO = 10  # the one u32 classifier instance (tc "pref") holding every NetApprox entry


def queue_classid(qid: int) -> int:
    """HTB class of logical queue ``qid`` (1:10 .. 1:17)."""
    return ROOT_HANDLE | (0x10 + qid)


def queue_of_classid(classid: int) -> int:
    return (classid & 0xFFFF) - 0x10


def stamp_classid(qid: int) -> int:
    """Inner HTB class of queue ``qid`` (1:20 .. 1:27), parent of its leaf; the u32 entries point here."""
    return ROOT_HANDLE | (0x20 + qid)


def leaf_handle(qid: int) -> int:
    """Handle of the fifo under queue ``qid`` (10: .. 17:)."""
    return (0x10 + qid) << 16


# Node-id layout of the u32 root hash table (12-bit node ids, evaluated in increasing order).
JOB_NODES = range(0x001, 0x400)
TAG_NODES = range(0x400, 0xA00)
TLR_NODES = range(0xA00, 0xE00)
APPROX_DEFAULT_NODE = 0xE00
CLASS_NODES = range(0xE01, 0xFFF)
CATCH_ALL_NODE = 0xFFF
STAMP_PRIO = 1  # the eBPF stamper on 1:2q
PASS_PRIO = 2  # u32 match-all on 1:2q -> leaf, used when the stamper is absent

# Byte offsets from the start of the IPv4 header.
ATP_OFFSET = 28
_OFF_IHL = 0
_OFF_PROTO_WORD = 8  # byte 9 = protocol
_OFF_PORTS = 20  # UDP/TCP source port (20..21), destination port (22..23)
_OFF_ATP0 = ATP_OFFSET + 0  # version/type, flags, queue, priority
_OFF_JOB = ATP_OFFSET + 4
_OFF_TLR_WORD = ATP_OFFSET + 12  # group_id (hi 16 bits), tlr (lo 16 bits)
_OFF_DEADLINE = ATP_OFFSET + 24

_DATA_V1 = (1 << 4) | int(PacketType.DATA)


class KernelSwitchError(RuntimeError):
    """A kernel switch operation failed; the message says what and how to fix it."""


class TableFull(KernelSwitchError):
    pass


@dataclasses.dataclass(frozen=True)
class PortShape:
    """The traffic manager of one egress port."""

    rate_mbit: float = 100.0
    """Line rate of the port (HTB root class rate and ceil), Mbit/s."""
    buffer_packets: int = 256
    """Whole port buffer in MTU-sized packets; queue k >= 1 gets 8 - k packets, queue 0 the rest (bytes)."""
    mtu_bytes: int = 1514
    """Bytes per buffer slot (queue 0's bfifo limit is its share times this), and HTB quantum/burst."""

    def queue0_bytes(self) -> int:
        return queue_buffer_packets(0, self.buffer_packets) * self.mtu_bytes


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


def _approx_data_keys(atp_port: int, extra_flags: int = 0, atp0_low: tuple[int, int] = (0, 0)) -> list[Key]:
    flags = int(Flags.APPROX) | extra_flags
    low_value, low_mask = atp0_low
    return _l4_parsed() + [
        Key(_OFF_PROTO_WORD, IPPROTO_UDP << 16, 0x00FF0000),
        Key(_OFF_PORTS, atp_port, 0x0000FFFF),
        Key(_OFF_ATP0, (_DATA_V1 << 24) | (flags << 16) | low_value, 0xFF000000 | (flags << 16) | low_mask),
    ]


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
    """IPv4 without options and not a non-first fragment: where the P4 parser reads L4 ports and ATP."""
    return [Key(_OFF_IHL, 0x05000000, 0x0F000000), Key(4, 0, 0x00001FFF)]


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

    ``l4_dport`` follows the P4 program: the TCP/UDP destination port, and 0 for packets of other protocols.
    A rule with an ``l4_dport`` mask therefore becomes one entry per matching TCP/UDP protocol, plus, when
    the rule also matches port 0, prefix entries for every other protocol its ``ip_proto`` ternary admits.
    """
    pv, pm = rule.ip_proto & rule.ip_proto_mask, rule.ip_proto_mask
    if not rule.l4_dport_mask:
        return [(Key(_OFF_PROTO_WORD, pv << 16, pm << 16),) if pm else (Key(0, 0, 0),)]
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
                out.append((Key(_OFF_PROTO_WORD, v << 16, m << 16),))
    return out


def _tag_order(r: TagRule):
    return (-r.rank, r.priority_lo, r.priority_hi, r.deadline_lo_us, r.deadline_hi_us, r.qid)


def _class_order(r: ClassRule):
    return (-r.rank, r.ip_proto, r.ip_proto_mask, r.l4_dport, r.l4_dport_mask, r.qid)


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
    nodes = (job_nodes or JobNodes()).assign(r.job_id for r in state.job_rules)
    entries: list[U32Entry] = []
    for rule in state.job_rules:
        entries.append(U32Entry(nodes[rule.job_id], job_keys(rule, atp_port), rule.qid, "queue_by_job"))
    entries += _place("queue_by_tag", TAG_NODES,
                      ((ks, r.qid) for r in sorted(state.tag_rules, key=_tag_order) for ks in tag_key_sets(r, atp_port)))
    entries += _place("queue_by_tlr", TLR_NODES,
                      ((ks, r.qid) for r in sorted(state.tlr_rules) for ks in tlr_key_sets(r, atp_port)))
    entries.append(U32Entry(APPROX_DEFAULT_NODE, tuple(_approx_data_keys(atp_port)), LOWEST_QUEUE, "approx_default"))
    entries += _place("queue_by_class", CLASS_NODES,
                      ((ks, r.qid) for r in sorted(state.class_rules, key=_class_order) for ks in class_key_sets(r)))
    entries.append(U32Entry(CATCH_ALL_NODE, (Key(0, 0, 0),), NON_APPROX_QUEUE, "default"))
    return {e.node: e for e in entries}


def u32_queue(entries: Mapping[int, U32Entry], packet: bytes) -> int:
    """What the kernel does with ``packet`` (bytes from the IPv4 header on): first match in node order."""
    for node in sorted(entries):
        if entries[node].matches(packet):
            return entries[node].qid
    return NON_APPROX_QUEUE


def reference_queue(state: SwitchState, packet: bytes, atp_port: int = DEFAULT_ATP_PORT) -> int:
    """The logical tables of docs/architecture.md evaluated directly on a packet (IPv4 header first).

    Independent of the u32 layout: the tests compare it with ``u32_queue(compile_filters(...))``.
    """
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return NON_APPROX_QUEUE
    ihl = (packet[0] & 0x0F) * 4
    proto = packet[9]
    # l4_dport as the P4 parser sets it: the TCP/UDP destination port, 0 for other protocols. (Divergence,
    # documented in docs/emulation.md: TCP/UDP with IP options or non-first fragments are 0 in P4, while
    # the kernel switch matches no l4_dport rule for them. Hosts never send such packets.)
    first_fragment = len(packet) >= 8 and struct.unpack_from("!H", packet, 6)[0] & 0x1FFF == 0
    l4 = proto in (6, 17) and ihl == 20 and first_fragment and len(packet) >= 24
    dport = struct.unpack_from("!H", packet, 22)[0] if l4 else None
    atp = packet[ihl + 8:] if proto == IPPROTO_UDP and dport == atp_port else b""
    if len(atp) >= 32 and atp[0] == _DATA_V1 and atp[1] & Flags.APPROX:
        flags, prio = atp[1], atp[3]
        job, = struct.unpack_from("!I", atp, 4)
        tlr, = struct.unpack_from("!H", atp, 14)
        deadline, = struct.unpack_from("!I", atp, 24)
        for r in state.job_rules:
            if r.job_id == job:
                return r.qid
        if flags & Flags.TAGGED:
            for r in sorted(state.tag_rules, key=_tag_order):
                if r.priority_lo <= prio <= r.priority_hi and r.deadline_lo_us <= deadline <= r.deadline_hi_us:
                    return r.qid
        for r in sorted(state.tlr_rules):
            if r.tlr_lo <= tlr <= r.tlr_hi:
                return r.qid
        return LOWEST_QUEUE
    for r in sorted(state.class_rules, key=_class_order):
        if proto & r.ip_proto_mask != r.ip_proto & r.ip_proto_mask:
            continue
        if r.l4_dport_mask and (dport or 0) & r.l4_dport_mask != r.l4_dport & r.l4_dport_mask:
            continue
        return r.qid
    return NON_APPROX_QUEUE


# ---------------------------------------------------------------------------------------------------------
# Programming a port through pyroute2 (an IPRoute bound to the switch's network namespace).

def _register_bfifo() -> None:
    # pyroute2 0.9 has no bfifo plugin; bfifo's options are the same struct as pfifo's (tc_fifo_qopt).
    from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo
    plugins.setdefault("bfifo", sched_pfifo)


def build_port(ipr, ifindex: int, shape: PortShape) -> None:
    """(Re)create the HTB strict-priority tree on egress port ``ifindex`` (removes any other root qdisc)."""
    _register_bfifo()
    try:
        ipr.tc("del", index=ifindex, handle=0, parent=0xFFFFFFFF)
    except Exception as exc:  # no root qdisc yet (ENOENT) or the default one (EINVAL on some kernels)
        if getattr(exc, "code", None) not in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    rate = f"{int(round(shape.rate_mbit * 1000))}kbit"
    mtu = shape.mtu_bytes
    ipr.tc("add", "htb", ifindex, ROOT_HANDLE, default=0x10 + NON_APPROX_QUEUE, r2q=1)
    ipr.tc("add-class", "htb", ifindex, LINK_CLASSID, parent=ROOT_HANDLE, rate=rate, ceil=rate,
           burst=2 * mtu, cburst=2 * mtu, quantum=mtu)
    for q in range(NUM_QUEUES):
        ipr.tc("add-class", "htb", ifindex, stamp_classid(q), parent=LINK_CLASSID, rate="8kbit", ceil=rate,
               prio=q, quantum=mtu, burst=mtu, cburst=mtu)
        ipr.tc("add-class", "htb", ifindex, queue_classid(q), parent=stamp_classid(q), rate="8kbit", ceil=rate,
               prio=q, quantum=mtu, burst=mtu, cburst=mtu)
        ipr.tc("add-filter", "u32", ifindex, 0, parent=stamp_classid(q), prio=PASS_PRIO, protocol=ETH_P_ALL,
               target=queue_classid(q), keys=Key(0, 0, 0).specs())
        if q == NON_APPROX_QUEUE:
            ipr.tc("add", "bfifo", ifindex, leaf_handle(q), parent=queue_classid(q), limit=shape.queue0_bytes())
        else:
            ipr.tc("add", "pfifo", ifindex, leaf_handle(q), parent=queue_classid(q),
                   limit=queue_buffer_packets(q, shape.buffer_packets))


def port_has_shape(ipr, ifindex: int, shape: PortShape) -> bool:
    """True when ``ifindex`` already carries exactly the tree ``build_port`` makes (so counters survive)."""
    leaves = {}
    root_ok = False
    for msg in ipr.get_qdiscs(index=ifindex):
        kind = msg.get_attr("TCA_KIND")
        handle, parent = msg["handle"], msg["parent"]
        if parent == 0xFFFFFFFF:
            root_ok = kind == "htb" and handle == ROOT_HANDLE
        elif handle in {leaf_handle(q) for q in range(NUM_QUEUES)}:
            opts = msg.get_attr("TCA_OPTIONS")
            limit = opts.get("limit") if opts is not None and hasattr(opts, "get") else None
            leaves[(handle >> 16) - 0x10] = (kind, parent, limit)
    if not root_ok or len(leaves) != NUM_QUEUES:
        return False
    for q in range(NUM_QUEUES):
        kind, parent, limit = leaves[q]
        want = ("bfifo", shape.queue0_bytes()) if q == 0 else ("pfifo", queue_buffer_packets(q, shape.buffer_packets))
        if (kind, limit) != want or parent != queue_classid(q):
            return False
    rates, parents = {}, {}
    for msg in ipr.get_classes(index=ifindex):
        parms = msg.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
        if parms is not None:
            rates[msg["handle"]] = parms["ceil"]
            parents[msg["handle"]] = msg["parent"]
    if any(parents.get(queue_classid(q)) != stamp_classid(q) for q in range(NUM_QUEUES)):
        return False
    want_rate = int(shape.rate_mbit * 1e6 / 8)
    return all(abs(rates.get(c, -1) - want_rate) <= max(1, want_rate // 1000)
               for c in [LINK_CLASSID] + [stamp_classid(q) for q in range(NUM_QUEUES)]
               + [queue_classid(q) for q in range(NUM_QUEUES)])


def root_htid(ipr, ifindex: int) -> int | None:
    """Hash-table id (upper 12 bits of the handle) of our u32 classifier on ``ifindex``, None if absent."""
    for msg in ipr.get_filters(index=ifindex, parent=ROOT_HANDLE):
        if msg.get_attr("TCA_KIND") == "u32" and (msg["info"] >> 16) == FILTER_PRIO and msg["handle"]:
            return msg["handle"] & 0xFFF00000
    return None


def write_entry(ipr, ifindex: int, htid: int | None, entry: U32Entry) -> None:
    """Add or replace one entry. ``htid`` None: the classifier does not exist yet (the kernel creates it)."""
    handle = (htid or 0) | entry.node
    ipr.tc("replace-filter" if htid is not None else "add-filter", "u32", ifindex, handle,
           parent=ROOT_HANDLE, prio=FILTER_PRIO, protocol=ETH_P_IP, target=stamp_classid(entry.qid),
           keys=[spec for k in entry.keys for spec in k.specs()])


def entry_bytes(keys) -> dict[int, tuple[int, int]]:
    """The byte-level meaning of a set of keys: offset -> (value, mask), zero masks dropped."""
    out: dict[int, tuple[int, int]] = {}
    for k in keys:
        out.update(k.bytes_masked())
    return out


def read_entries(netns: str | None, ifname: str) -> dict[int, tuple[dict[int, tuple[int, int]], int]]:
    """What the kernel holds in our classifier on ``ifname``, read with iproute2's ``tc`` (an independent
    decoder): node -> (byte-level keys, logical queue of its target)."""
    res = subprocess.run(_netns_prefix(netns) + ["tc", "filter", "show", "dev", ifname, "parent", "1:"],
                         capture_output=True, text=True, check=True)
    out: dict[int, tuple[dict[int, tuple[int, int]], int]] = {}
    node = None
    for line in res.stdout.splitlines():
        words = line.split()
        if line.startswith("filter ") and "u32" in words and "fh" in words and "flowid" in line:
            if int(words[words.index("pref") + 1]) != FILTER_PRIO:
                node = None
                continue
            node = int(words[words.index("fh") + 1].split("::")[1], 16)
            flowid = words[words.index("*flowid") + 1] if "*flowid" in words else words[words.index("flowid") + 1]
            out[node] = ({}, int(flowid.split(":")[1], 16) - 0x20)
        elif line.startswith("filter "):
            node = None
        elif node is not None and words and words[0] == "match":
            value, mask = (int(x, 16) for x in words[1].split("/"))
            out[node][0].update(Key(int(words[3]), value, mask).bytes_masked())
    return out


def delete_entry(ipr, ifindex: int, htid: int, node: int) -> None:
    ipr.tc("del-filter", "u32", ifindex, htid | node, parent=ROOT_HANDLE, prio=FILTER_PRIO,
           protocol=ETH_P_IP, target=0)


def flush_filters(ipr, ifindex: int) -> None:
    """Remove our u32 classifier instance (all entries) from ``ifindex``."""
    try:
        ipr.tc("del-filter", "u32", ifindex, 0, parent=ROOT_HANDLE, prio=FILTER_PRIO, protocol=ETH_P_IP,
               target=0)
    except Exception as exc:
        if getattr(exc, "code", None) not in (errno.ENOENT, errno.EINVAL):
            raise


STAMP_SOURCE = Path(__file__).resolve().parent / "bpf" / "stamp.c"


def _netns_prefix(netns: str | None) -> list[str]:
    if netns is None:
        return []
    return ["nsenter", f"--net={netns}"] if "/" in netns else ["ip", "netns", "exec", netns]


def stamp_object(atp_port: int = DEFAULT_ATP_PORT, ecn: tuple[int, int, int] | None = None) -> Path:
    """The compiled stamper for ``atp_port`` (built with clang on first use, cached under build/kernel/).

    ``ecn``: (threshold bytes, line rate kbit/s, queue 0 buffer bytes) builds section q0 with CE marking."""
    out_dir = STAMP_SOURCE.parent.parent.parent / "build" / "kernel"
    defines = [f"-DATP_PORT={atp_port}"]
    name = f"stamp-{atp_port}"
    if ecn is not None:
        threshold, rate_kbps, cap = ecn
        defines += [f"-DECN_THRESHOLD_BYTES={threshold}", f"-DRATE_KBPS={rate_kbps}", f"-DQUEUE0_BYTES={cap}"]
        name += f"-ecn{threshold}-r{rate_kbps}-c{cap}"
    obj = out_dir / f"{name}.o"
    if obj.exists() and obj.stat().st_mtime >= STAMP_SOURCE.stat().st_mtime:
        return obj
    clang = shutil.which("clang")
    if clang is None:
        raise KernelSwitchError("the queue stamper needs clang (Debian: clang, libbpf-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    arch_inc = f"/usr/include/{os.uname().machine}-linux-gnu"
    cmd = [clang, "-O2", "-g", "-target", "bpf", *defines, f"-I{arch_inc}", "-c", str(STAMP_SOURCE), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelSwitchError(f"compiling {STAMP_SOURCE.name} failed: {res.stderr.strip()[-500:]}")
    os.replace(tmp, obj)
    return obj


def _tc_batch(netns: str | None, lines: list[str], what: str) -> None:
    res = subprocess.run(_netns_prefix(netns) + ["tc", "-batch", "-"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelSwitchError(f"{what} failed: {res.stderr.strip()[-500:]}")


def attach_queue0(netns: str | None, shapes: Mapping[str, PortShape], ecn_threshold_pkts: int | None,
                  atp_port: int = DEFAULT_ATP_PORT) -> None:
    """(Re)attach queue 0's stamper on every port: with CE marking at ``ecn_threshold_pkts`` MTU-sized packets
    of virtual backlog (drained at each port's line rate), or without marking when None."""
    lines = []
    for ifname, shape in shapes.items():
        ecn = None
        if ecn_threshold_pkts is not None:
            ecn = (ecn_threshold_pkts * shape.mtu_bytes, int(round(shape.rate_mbit * 1000)), shape.queue0_bytes())
        obj = stamp_object(atp_port, ecn)
        lines.append(f"filter replace dev {ifname} parent 1:20 protocol all prio {STAMP_PRIO} "
                     f"handle 1 bpf obj {obj} sec q0 classid 1:10")
    _tc_batch(netns, lines, "attaching queue 0's stamper")


def attach_stamps(netns: str | None, ifnames: Sequence[str], atp_port: int = DEFAULT_ATP_PORT) -> None:
    """Attach the stamper to the 8 stamp classes of every port (one ``tc -batch`` run). ``netns``: a name
    under /var/run/netns, a path such as /proc/PID/ns/net, or None for this namespace."""
    obj = stamp_object(atp_port)
    lines = []
    for ifname in ifnames:
        for q in range(NUM_QUEUES):
            lines.append(f"filter replace dev {ifname} parent 1:{0x20 + q:x} protocol all prio {STAMP_PRIO} "
                         f"handle 1 bpf obj {obj} sec q{q} classid 1:{0x10 + q:x}")
    _tc_batch(netns, lines, "attaching the queue stamper")


@dataclasses.dataclass(frozen=True)
class FifoStats:
    qid: int
    packets: int  # dequeued (transmitted) packets
    drops: int
    backlog_packets: int


def read_port_stats(ipr, ifindex: int) -> list[FifoStats]:
    """Per-queue statistics of the leaf fifos on ``ifindex``, ordered by queue id."""
    out = {}
    handles = {leaf_handle(q): q for q in range(NUM_QUEUES)}
    for msg in ipr.get_qdiscs(index=ifindex):
        q = handles.get(msg["handle"])
        if q is None:
            continue
        basic = msg.get_nested("TCA_STATS2", "TCA_STATS_BASIC")
        queue = msg.get_nested("TCA_STATS2", "TCA_STATS_QUEUE")
        if basic is None or queue is None:
            stats = msg.get_attr("TCA_STATS")
            out[q] = FifoStats(q, stats["packets"], stats["drops"], stats["qlen"])
        else:
            out[q] = FifoStats(q, basic["packets"], queue["drops"], queue["qlen"])
    missing = [q for q in range(NUM_QUEUES) if q not in out]
    if missing:
        raise KernelSwitchError(f"interface index {ifindex} has no NetApprox queue(s) {missing}; connect() first")
    return [out[q] for q in range(NUM_QUEUES)]


def describe(entries: Sequence[U32Entry]) -> str:
    """Human-readable listing (for logs and docs)."""
    return "\n".join(f"{e.node:#05x} {e.table:<15} -> q{e.qid}  " + " ".join(s for k in e.keys for s in k.specs())
                     for e in sorted(entries, key=lambda e: e.node))
