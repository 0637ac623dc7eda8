"""The kernel switch's traffic manager and classifier plumbing: tc through pyroute2 (and iproute2 to read back).

One egress port carries this tree (``tc`` handles in hex):

    root  1:    htb default 10 r2q 1            unclassified (ARP, non-IP) -> 1:10 = queue 0
    1:1         htb rate R ceil R               the port's line rate R
    1:2q        htb ceil R  (q = 0..7)          "stamp" class of queue q: the u32 entries point here; its
                                                filter (the eBPF stamper, else a u32 pass) picks the leaf
    1:1q        htb prio q, ceil R              logical queue q (leaf); HTB prio 0 is served first
    1q:         bfifo: q = 0 the rest of the port buffer; q >= 1 (8 - q) MTUs (the NetApprox paper's k-MTU
                queues: a byte limit, so a queue holds more small packets than full-size ones), times
                ``approx_unit`` (``model.queue_buffer_packets``)
    1:30        htb ceil R                      the drop class: the atp_version entries point here
    30:         bfifo limit 0                   drops every packet and counts it (ATP packets of another
                                                version; a tc action would need act_gact, not every kernel
                                                has it loaded)

and one ``u32`` classifier (``FILTER_PRIO``) on ``1:`` holding the entries ``controller.kernel.compiler``
makes. Functions here take a pyroute2 ``IPRoute`` bound to the switch's network namespace.
"""
from __future__ import annotations

import dataclasses
import errno
import subprocess

from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo

from netapprox.controller.errors import KernelSwitchError
from netapprox.controller.kernel.compiler import Key, U32Entry
from netapprox.controller.reference import DROPPED
from netapprox.controller.model import NON_APPROX_QUEUE, NUM_QUEUES, queue_buffer_packets

ETH_P_IP = 0x0800
ETH_P_ALL = 0x0003

# tc handles. Class 1:1q is logical queue q; its leaf qdisc has major 0x1q.
ROOT_HANDLE = 0x00010000
LINK_CLASSID = 0x00010001
FILTER_PRIO = 10  # the one u32 classifier instance (tc "pref") holding every NetApprox entry
STAMP_PRIO = 1  # the eBPF stamper on 1:2q
PASS_PRIO = 2  # u32 match-all on 1:2q -> leaf, used when the stamper is absent


DROP_CLASSID = ROOT_HANDLE | 0x30
DROP_LEAF = 0x30 << 16


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



@dataclasses.dataclass(frozen=True)
class PortShape:
    """The traffic manager of one egress port."""

    rate_mbit: float = 100.0
    """Line rate of the port (HTB root class rate and ceil), Mbit/s."""
    buffer_packets: int = 256
    """Whole port buffer in MTUs; queue k >= 1 gets ``approx_unit`` x (8 - k) of them, queue 0 the rest."""
    mtu_bytes: int = 1514
    """Bytes of an MTU (the queues' bfifo limits are their shares times this), and HTB quantum/burst."""
    approx_unit: int = 1
    """MTUs per unit of an approximate queue's buffer (the switch option ``approx_buffer_unit``): 1 is the
    NetApprox paper's k-MTU queues; the tuner's shares are in these units too."""

    def queue_bytes(self, q: int, approx: tuple[int, ...] = ()) -> int:
        """Byte limit of logical queue ``q``'s fifo (``approx``: the approximate queues' buffers in units of
        ``approx_unit`` MTUs, as the policy's tuner shares them out; empty: 8 - k)."""
        return queue_buffer_packets(q, self.buffer_packets, approx, self.approx_unit) * self.mtu_bytes

    def queue0_bytes(self) -> int:
        return self.queue_bytes(NON_APPROX_QUEUE)



def netns_prefix(netns: str | None) -> list[str]:
    """The command prefix that runs a program in ``netns`` (a name under /var/run/netns, a path, or None)."""
    if netns is None:
        return []
    return ["nsenter", f"--net={netns}"] if "/" in netns else ["ip", "netns", "exec", netns]


def _register_bfifo() -> None:
    # pyroute2 0.9 has no bfifo plugin; bfifo's options are the same struct as pfifo's (tc_fifo_qopt).
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
        ipr.tc("add", "bfifo", ifindex, leaf_handle(q), parent=queue_classid(q), limit=shape.queue_bytes(q))
    ipr.tc("add-class", "htb", ifindex, DROP_CLASSID, parent=LINK_CLASSID, rate="8kbit", ceil=rate,
           prio=NUM_QUEUES - 1, quantum=mtu, burst=mtu, cburst=mtu)
    ipr.tc("add", "bfifo", ifindex, DROP_LEAF, parent=DROP_CLASSID, limit=0)


def set_queue_limits(ipr, ifindex: int, shape: PortShape, approx: tuple[int, ...]) -> None:
    """Change the byte limits of port ``ifindex``'s fifos in place (queues 1..7 ``approx`` x ``shape.approx_unit``
    MTUs, queue 0 the rest of the buffer; empty: the k-MTU buffers); packets and counters stay."""
    _register_bfifo()
    for q in range(NUM_QUEUES):
        ipr.tc("change", "bfifo", ifindex, leaf_handle(q), parent=queue_classid(q), limit=shape.queue_bytes(q, approx))


def port_has_shape(ipr, ifindex: int, shape: PortShape, approx: tuple[int, ...] = ()) -> bool:
    """True when ``ifindex`` already carries exactly the tree ``build_port`` makes (so counters survive), with
    the approximate queues' buffers ``approx`` (``set_queue_limits``; empty: the k-MTU buffers)."""
    leaves = {}
    root_ok = drop_ok = False
    for msg in ipr.get_qdiscs(index=ifindex):
        kind = msg.get_attr("TCA_KIND")
        handle, parent = msg["handle"], msg["parent"]
        if parent == 0xFFFFFFFF:
            root_ok = kind == "htb" and handle == ROOT_HANDLE
        elif handle == DROP_LEAF:
            opts = msg.get_attr("TCA_OPTIONS")
            drop_ok = kind == "bfifo" and parent == DROP_CLASSID and opts is not None and opts.get("limit") == 0
        elif handle in {leaf_handle(q) for q in range(NUM_QUEUES)}:
            opts = msg.get_attr("TCA_OPTIONS")
            limit = opts.get("limit") if opts is not None and hasattr(opts, "get") else None
            leaves[(handle >> 16) - 0x10] = (kind, parent, limit)
    if not root_ok or not drop_ok or len(leaves) != NUM_QUEUES:
        return False
    for q in range(NUM_QUEUES):
        kind, parent, limit = leaves[q]
        if (kind, limit) != ("bfifo", shape.queue_bytes(q, approx)) or parent != queue_classid(q):
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
    target = DROP_CLASSID if entry.qid == DROPPED else stamp_classid(entry.qid)  # DROPPED: the drop class
    ipr.tc("replace-filter" if htid is not None else "add-filter", "u32", ifindex, handle,
           parent=ROOT_HANDLE, prio=FILTER_PRIO, protocol=ETH_P_IP, target=target,
           keys=[spec for k in entry.keys for spec in k.specs()])


def entry_bytes(keys) -> dict[int, tuple[int, int]]:
    """The byte-level meaning of a set of keys: offset -> (value, mask), zero masks dropped."""
    out: dict[int, tuple[int, int]] = {}
    for k in keys:
        out.update(k.bytes_masked())
    return out


def read_entries(netns: str | None, ifname: str) -> dict[int, tuple[dict[int, tuple[int, int]], int]]:
    """What the kernel holds in our classifier on ``ifname``, read with iproute2's ``tc`` (an independent
    decoder): node -> (byte-level keys, logical queue of its target, or ``DROPPED`` for an entry to the drop class)."""
    res = subprocess.run(netns_prefix(netns) + ["tc", "filter", "show", "dev", ifname, "parent", "1:"],
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
            minor = int(flowid.split(":")[1], 16)
            out[node] = ({}, DROPPED if minor == DROP_CLASSID & 0xFFFF else minor - 0x20)
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


@dataclasses.dataclass(frozen=True)
class FifoStats:
    qid: int
    packets: int  # dequeued (transmitted) packets
    drops: int
    backlog_packets: int
    bytes: int = 0  # dequeued bytes


def _fifo_stats(q: int, msg) -> FifoStats:
    basic = msg.get_nested("TCA_STATS2", "TCA_STATS_BASIC")
    queue = msg.get_nested("TCA_STATS2", "TCA_STATS_QUEUE")
    if basic is None or queue is None:
        stats = msg.get_attr("TCA_STATS")
        return FifoStats(q, stats["packets"], stats["drops"], stats["qlen"], stats["bytes"])
    return FifoStats(q, basic["packets"], queue["drops"], queue["qlen"], basic["bytes"])


def read_dropped(ipr, ifindexes) -> int:
    """Packets the drop class's fifo dropped on the ports ``ifindexes`` (ATP packets of another version)."""
    wanted = set(ifindexes)
    return sum(_fifo_stats(-1, msg).drops for msg in ipr.get_qdiscs()
               if msg["handle"] == DROP_LEAF and msg["index"] in wanted)


def read_stats(ipr, ifindexes) -> dict[int, list[FifoStats]]:
    """Per-queue statistics of the leaf fifos of every port in ``ifindexes`` (one netlink dump), each list
    ordered by queue id."""
    wanted = set(ifindexes)
    handles = {leaf_handle(q): q for q in range(NUM_QUEUES)}
    out: dict[int, dict[int, FifoStats]] = {i: {} for i in wanted}
    for msg in ipr.get_qdiscs():
        q = handles.get(msg["handle"])
        if q is not None and msg["index"] in wanted:
            out[msg["index"]][q] = _fifo_stats(q, msg)
    for ifindex, stats in out.items():
        missing = [q for q in range(NUM_QUEUES) if q not in stats]
        if missing:
            raise KernelSwitchError(f"interface index {ifindex} has no NetApprox queue(s) {missing}; "
                                    "connect() first")
    return {i: [stats[q] for q in range(NUM_QUEUES)] for i, stats in out.items()}


def read_port_stats(ipr, ifindex: int) -> list[FifoStats]:
    """Per-queue statistics of the leaf fifos on ``ifindex``, ordered by queue id."""
    return read_stats(ipr, [ifindex])[ifindex]
