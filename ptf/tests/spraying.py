"""Spraying (docs/dataplane.md, Spraying): routes_v4 -> set_ecmp_group(group_id, spray) and ecmp_members (exact on
group and bucket). Approximate ATP DATA takes a random bucket per packet when the group sprays; every other
packet, and approximate DATA when it does not, the bucket CRC-32(src, dst, proto, sport, dport) mod 16 of
controller.model.flow_hash, so a flow is never split and lands on the port the reference names."""
from __future__ import annotations

import math

import ptf.testutils as testutils
from common.qos_mixin import HOST_B_MAC, PORT_A, SWITCH_MAC, QosHelper, atp_packet, routed, tcp_packet, udp_packet
from netapprox.controller.model import ECMP_BUCKETS, ecmp_buckets, flow_hash
from netapprox.hostlib import wire

from common.base_test import ipv4_to_int, mac_to_int

GROUP = 7
MEMBERS = (2, 3, 4)  # 16 buckets over 3 ports: 6 / 5 / 5
DST = "10.0.2.1"
QUEUE_LOWEST = 7  # approximate DATA that no queue table matches (classification.p4)


class SprayHelper(QosHelper):
    def add_group(self, spray: int) -> tuple[int, ...]:
        self.insert(self.table_entry("forwarding.routes_v4", {"dst_addr": (ipv4_to_int("10.0.2.0"), 24)},
                                     "forwarding.set_ecmp_group", {"group_id": GROUP, "spray": spray}))
        buckets = ecmp_buckets(MEMBERS)
        for b, port in enumerate(buckets):
            # One next-hop MAC for every member: the egress port alone tells where a packet went.
            self.insert(self.table_entry("forwarding.ecmp_members", {"group_id": GROUP, "bucket": b},
                                         "forwarding.route", {"port": port, "src_mac": mac_to_int(SWITCH_MAC),
                                                              "dst_mac": mac_to_int(HOST_B_MAC)}))
        return buckets

    def port_of(self, pkt, exp) -> int:
        """Send ``pkt`` from host A; the member port ``exp`` left by (the test fails if none)."""
        self.send_packet(PORT_A, pkt)
        index, _ = testutils.verify_packet_any_port(self, exp, list(MEMBERS))
        return MEMBERS[index]

    @staticmethod
    def reference_port(buckets, src, dst, proto, sport, dport) -> int:
        return buckets[flow_hash(src, dst, proto, sport, dport) % ECMP_BUCKETS]


class SprayedFlowSpreadsOverGroupTest(SprayHelper):
    """One approximate ATP flow, 240 DATA packets: every member gets within 4.5 standard deviations of its
    bucket share (6/16, 5/16, 5/16) of them."""

    def runTest(self):
        buckets = self.add_group(spray=1)
        n = 240
        counts = dict.fromkeys(MEMBERS, 0)
        for i in range(n):
            pkt = atp_packet(flags=wire.Flags.APPROX, dst=DST, pkt_idx=i, pkt_cnt=n)
            counts[self.port_of(pkt, routed(pkt, HOST_B_MAC, queue=QUEUE_LOWEST))] += 1
        self.verify_no_other_packets()
        for port in MEMBERS:
            share = buckets.count(port) / ECMP_BUCKETS
            sd = math.sqrt(n * share * (1 - share))
            self.assertLessEqual(abs(counts[port] - n * share), 4.5 * sd, (port, counts))


class HashedFlowsOnReferencePortTest(SprayHelper):
    """Non-approximate flows (UDP, TCP, ATP DATA without APPROX) on a spraying group: every packet of a flow
    leaves by the port of the reference's flow hash."""

    def runTest(self):
        buckets = self.add_group(spray=1)
        seen = set()
        for sport in range(40000, 40024):
            for make, proto in ((udp_packet, 17), (tcp_packet, 6)):
                pkt = make(sport=sport, dst=DST)
                want = self.reference_port(buckets, "10.0.1.1", DST, proto, sport, 5001 if proto == 17 else 80)
                for _ in range(2):
                    self.send_packet(PORT_A, pkt)
                    self.verify_packet(routed(pkt, HOST_B_MAC), want)
                seen.add(want)
            pkt = atp_packet(flags=0, dst=DST, sport=sport)
            want = self.reference_port(buckets, "10.0.1.1", DST, 17, sport, wire.DEFAULT_ATP_PORT)
            self.send_packet(PORT_A, pkt)
            self.verify_packet(routed(pkt, HOST_B_MAC, queue=0), want)
        self.verify_no_other_packets()
        self.assertEqual(seen, set(MEMBERS))  # the flows do use the whole group


class NoSprayHashesApproximateTest(SprayHelper):
    """spray = 0: approximate ATP DATA is hashed like any flow, every packet on the reference's port."""

    def runTest(self):
        buckets = self.add_group(spray=0)
        for sport in range(41000, 41012):
            want = self.reference_port(buckets, "10.0.1.1", DST, 17, sport, wire.DEFAULT_ATP_PORT)
            for i in range(4):
                pkt = atp_packet(flags=wire.Flags.APPROX, dst=DST, sport=sport, pkt_idx=i, pkt_cnt=4)
                self.send_packet(PORT_A, pkt)
                self.verify_packet(routed(pkt, HOST_B_MAC, queue=QUEUE_LOWEST), want)
        self.verify_no_other_packets()
