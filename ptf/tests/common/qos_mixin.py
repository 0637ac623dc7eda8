"""NetApprox feature helpers over P4RuntimeTest: one ``add_*`` per logical table of docs/architecture.md,
counter reads per (port, queue), BMv2 queue knobs over Thrift, and the expected-packet builders.

Every ``add_*`` inserts through P4RuntimeTest.insert, so tearDown removes it again.
"""
from __future__ import annotations

from scapy.layers.inet import IP, TCP, UDP, IPOption
from scapy.layers.l2 import Ether

from common.base_test import P4RuntimeTest, ipv4_to_int, mac_to_int
from netapprox.controller.p4runtime.bmv2_thrift import SimpleSwitchThrift
from netapprox.hostlib import wire
from netapprox.hostlib.scapy_atp import ATP

NUM_QUEUES = 8

# Topology of the suite: PTF port i is switch port i.
PORT_A, PORT_B, PORT_C = 1, 2, 3
HOST_A_MAC, HOST_B_MAC, HOST_C_MAC = "00:00:00:00:0a:01", "00:00:00:00:0b:01", "00:00:00:00:0c:01"
SWITCH_MAC = "00:00:00:00:5a:01"
HOST_A_IP, HOST_B_IP, HOST_C_IP = "10.0.1.1", "10.0.2.1", "10.0.3.1"

# Drop reasons: index of NetApproxIngress.malformed_packets (p4src/shared/define.p4).
MALFORMED_TRUNCATED = 0
MALFORMED_BAD_VERSION = 1
MALFORMED_BAD_TYPE = 2
MALFORMED_BAD_FLAGS = 3
MALFORMED_BAD_TLR = 4
MALFORMED_BAD_INDEX = 5
DROPPED_TTL_EXPIRED = 6
DROPPED_IPV4_CHECKSUM = 7
DROPPED_REPORT_RATE = 8
ROUTER_ALERT = b"\x94\x04\x00\x00"  # a 4-byte IPv4 option (RFC 2113): IHL 6


def bmv2_priority(qid: int) -> int:
    """Logical queue -> BMv2 priority queue (p4src/v1model/define_v1model.p4: BMV2_PRIORITY_OF)."""
    return NUM_QUEUES - 1 - qid


class QosHelper(P4RuntimeTest):
    """Helpers for the NetApprox tables. Tests subclass this and define runTest."""

    # --- logical tables ----------------------------------------------------------------------------
    def add_route(self, prefix: str, prefix_len: int, port: int, src_mac: str, dst_mac: str):
        return self.insert(self.table_entry(
            "forwarding.routes_v4", {"dst_addr": (ipv4_to_int(prefix), prefix_len)},
            "forwarding.route", {"port": port, "src_mac": mac_to_int(src_mac), "dst_mac": mac_to_int(dst_mac)}))

    def add_drop_route(self, prefix: str, prefix_len: int):
        return self.insert(self.table_entry(
            "forwarding.routes_v4", {"dst_addr": (ipv4_to_int(prefix), prefix_len)}, "forwarding.drop"))

    def add_queue_by_class(self, rank: int, ip_proto: int, ip_proto_mask: int, l4_dport: int,
                           l4_dport_mask: int, qid: int):
        return self.insert(self.table_entry(
            "classification.queue_by_class",
            {"ip_proto": (ip_proto, ip_proto_mask), "l4_dport": (l4_dport, l4_dport_mask)},
            "classification.set_queue", {"qid": qid}, priority=rank))

    def add_queue_by_job(self, job_id: int, qid: int):
        # v1model: set_queue; TNA: set_job_queue (docs/dataplane.md). Take it from the table.
        action = self.table_action("classification.queue_by_job")
        return self.insert(self.table_entry(
            "classification.queue_by_job", {"job_id": job_id}, action, {"qid": qid}))

    def add_queue_by_tag(self, rank: int, priority: tuple[int, int], deadline_us: tuple[int, int], qid: int):
        """One CadentFlow rule: deadline_us is a ternary key (Tofino range keys are <= 20 bits), so the range
        is written as its prefixes, as the controller does (controller.p4runtime.classification.tag_entries)."""
        from netapprox.controller.model import prefix_split

        return [self.insert(self.table_entry(
            "classification.queue_by_tag", {"priority": priority, "deadline_us": (value, mask)},
            "classification.set_queue", {"qid": qid}, priority=rank))
            for value, mask in prefix_split(*deadline_us, 32)]

    def add_queue_by_tlr(self, tlr_lo: int, tlr_hi: int, qid: int, rank: int = 1):
        return self.insert(self.table_entry(
            "classification.queue_by_tlr", {"tlr": (tlr_lo, tlr_hi)},
            "classification.set_queue", {"qid": qid}, priority=rank))

    def add_default_tlr_rules(self) -> None:
        """The controller's default thresholds (controller.model.default_tlr_rules): TLR in [k/8, (k+1)/8)
        -> queue k, [0, 1/8) -> queue 1, 1.0 in the last range."""
        from netapprox.controller.model import default_tlr_rules

        for rule in sorted(default_tlr_rules()):
            self.add_queue_by_tlr(rule.tlr_lo, rule.tlr_hi, rule.qid)

    def add_ecn_threshold(self, qid: int, threshold: int):
        return self.insert(self.table_entry(
            "ecn.ecn_thresholds", {"qid": qid}, "ecn.mark_ecn", {"threshold": threshold}))

    # --- counters ----------------------------------------------------------------------------------
    def queue_counters(self, port: int, qid: int) -> tuple[int, int]:
        """(enqueued, transmitted) packets of (port, logical queue)."""
        index = port * NUM_QUEUES + qid
        return (self.read_counter("enqueued_packets", index)[0],
                self.read_counter("transmitted_packets", index)[0])

    def all_queue_counters(self, port: int) -> list[tuple[int, int]]:
        return [self.queue_counters(port, q) for q in range(NUM_QUEUES)]

    def malformed_count(self, reason: int) -> int:
        return self.read_counter("malformed_packets", reason)[0]

    def queue0_guard_count(self) -> int:
        return self.read_counter("queue0_guard_packets", 0)[0]

    # --- the REPORT punt meter (P4Runtime MeterEntry) ------------------------------------------------
    def set_report_meter(self, port: int, rate_pps: int, burst: int) -> None:
        """Rate-limit REPORTs punted from ``port`` (cir = pir); tearDown resets the cell to unconfigured."""
        from netapprox.controller.p4runtime.protos import p4runtime_pb2

        def entity(config):
            e = p4runtime_pb2.Entity()
            e.meter_entry.meter_id = self.p4id("meters", "report_meter")
            e.meter_entry.index.index = port
            if config is not None:
                e.meter_entry.config.CopyFrom(config)
            return e

        config = p4runtime_pb2.MeterConfig(cir=rate_pps, cburst=burst, pir=rate_pps, pburst=burst)
        self._write([self._update(p4runtime_pb2.Update.MODIFY, entity(config))])
        self.add_cleanup(lambda: self._write([self._update(p4runtime_pb2.Update.MODIFY, entity(None))]))

    # --- BMv2 queues (Thrift) ----------------------------------------------------------------------
    def _thrift(self) -> SimpleSwitchThrift:
        if not self.is_v1model():
            self.skipTest("queues are shaped through BMv2's Thrift API; Tofino's TM is configured over BfRt")
        if self.thrift_port is None:
            self.skipTest("needs BMv2's Thrift port (test parameter thrift_port) to shape queues")
        return SimpleSwitchThrift(self.thrift_port)

    def set_queue_rate(self, port: int, qid: int, rate_pps: int) -> None:
        """Rate-limit one logical queue of a port (BMv2 set_queue_rate); tearDown lifts the limit."""
        prio = bmv2_priority(qid)
        with self._thrift() as sw:
            sw.set_egress_priority_queue_rate(port, prio, rate_pps)

        def undo():
            with self._thrift() as sw:
                sw.set_egress_priority_queue_rate(port, prio, 0)

        self.add_cleanup(undo)

    def set_queue_depth(self, port: int, qid: int, depth_pkts: int, restore_to: int = 64) -> None:
        """Capacity of one logical queue of a port (BMv2 set_queue_depth); tearDown restores 64."""
        prio = bmv2_priority(qid)
        with self._thrift() as sw:
            sw.set_egress_priority_queue_depth(port, prio, depth_pkts)

        def undo():
            with self._thrift() as sw:
                sw.set_egress_priority_queue_depth(port, prio, restore_to)

        self.add_cleanup(undo)

    # --- the standard little topology --------------------------------------------------------------
    def add_standard_routes(self) -> None:
        """10.0.1.0/24 -> port 1, 10.0.2.0/24 -> port 2, 10.0.3.0/24 -> port 3, switch MAC as source."""
        self.add_route("10.0.1.0", 24, PORT_A, SWITCH_MAC, HOST_A_MAC)
        self.add_route("10.0.2.0", 24, PORT_B, SWITCH_MAC, HOST_B_MAC)
        self.add_route("10.0.3.0", 24, PORT_C, SWITCH_MAC, HOST_C_MAC)


# --- packets ---------------------------------------------------------------------------------------
def _ip(src, dst, ttl, ecn, ip_options: bytes) -> IP:
    ip = IP(src=src, dst=dst, ttl=ttl, tos=ecn, id=1)
    if ip_options:
        ip.options = [IPOption(ip_options)]
    return ip


def atp_packet(*, type=wire.PacketType.DATA, flags=0, tlr=0, job_id=1, priority=0,
               deadline_us=wire.NO_DEADLINE, weight=0, pkt_idx=0, pkt_cnt=1, queue=wire.QUEUE_UNSET,
               version=wire.VERSION, sport=40000, dport=wire.DEFAULT_ATP_PORT, src=HOST_A_IP, dst=HOST_B_IP,
               ecn=0, ttl=64, payload=b"approximate!", length=None, ip_options=b"") -> Ether:
    """A complete Ether/IPv4/UDP/ATP frame from host A, checksums computed (frozen as bytes); ``ip_options``
    (raw bytes, a multiple of 4) make the IPv4 header longer than 20 bytes."""
    atp = ATP(version=version, type=int(type), flags=flags, queue=queue, priority=priority, job_id=job_id,
              msg_id=3, group_id=0, tlr=tlr, pkt_idx=pkt_idx, pkt_cnt=pkt_cnt, seq=11,
              deadline_us=deadline_us, weight=weight, length=len(payload) if length is None else length)
    pkt = (Ether(src=HOST_A_MAC, dst=SWITCH_MAC) / _ip(src, dst, ttl, ecn, ip_options)
           / UDP(sport=sport, dport=dport) / atp / payload)
    return Ether(bytes(pkt))


def udp_packet(*, dport=5001, sport=40000, src=HOST_A_IP, dst=HOST_B_IP, ttl=64, ecn=0,
               payload=b"x" * 32, ip_options=b"") -> Ether:
    pkt = (Ether(src=HOST_A_MAC, dst=SWITCH_MAC) / _ip(src, dst, ttl, ecn, ip_options)
           / UDP(sport=sport, dport=dport) / payload)
    return Ether(bytes(pkt))


def tcp_packet(*, dport=80, sport=40000, src=HOST_A_IP, dst=HOST_B_IP, ttl=64, ip_options=b"") -> Ether:
    pkt = (Ether(src=HOST_A_MAC, dst=SWITCH_MAC) / _ip(src, dst, ttl, 0, ip_options)
           / TCP(sport=sport, dport=dport, flags="S") / (b"y" * 16))
    return Ether(bytes(pkt))


def routed(pkt: Ether, dst_mac: str, *, queue: int | None = None, ecn: int | None = None) -> Ether:
    """What the switch sends for ``pkt``: MACs rewritten, TTL - 1, IPv4 checksum recomputed; for ATP DATA
    (``queue`` given) the queue byte stamped and the UDP checksum zeroed; ``ecn`` rewrites the ECN bits."""
    out = Ether(bytes(pkt))
    out[Ether].src = SWITCH_MAC
    out[Ether].dst = dst_mac
    out[IP].ttl -= 1
    if ecn is not None:
        out[IP].tos = (out[IP].tos & 0xFC) | ecn
    del out[IP].chksum
    if queue is not None:
        out[ATP].queue = queue
        out[UDP].chksum = 0
    return Ether(bytes(out))
