"""routes_v4: IPv4 LPM to a port with MAC rewrite and TTL decrement; TTL <= 1 and misses are dropped."""
from __future__ import annotations

from common.qos_mixin import (DROPPED_TTL_EXPIRED, HOST_B_MAC, HOST_C_MAC, PORT_A, PORT_B, PORT_C, SWITCH_MAC,
                              QosHelper, routed, tcp_packet, udp_packet)


class RouteLpmTest(QosHelper):
    """The longest prefix wins; MACs rewritten, TTL - 1, IPv4 checksum recomputed."""

    def runTest(self):
        self.add_route("10.0.0.0", 8, PORT_B, SWITCH_MAC, HOST_B_MAC)
        self.add_route("10.0.3.0", 24, PORT_C, SWITCH_MAC, HOST_C_MAC)

        pkt = udp_packet(dst="10.0.2.9")
        self.send_packet(PORT_A, pkt)
        self.verify_packet(routed(pkt, HOST_B_MAC), PORT_B)

        pkt = tcp_packet(dst="10.0.3.7")
        self.send_packet(PORT_A, pkt)
        self.verify_packet(routed(pkt, HOST_C_MAC), PORT_C)
        self.verify_no_other_packets()


class RouteMissAndDropActionTest(QosHelper):
    """No route, or the drop action: nothing leaves the switch."""

    def runTest(self):
        self.add_route("10.0.2.0", 24, PORT_B, SWITCH_MAC, HOST_B_MAC)
        self.add_drop_route("10.0.2.128", 25)
        self.send_packet(PORT_A, udp_packet(dst="10.9.9.9"))
        self.send_packet(PORT_A, udp_packet(dst="10.0.2.200"))
        self.verify_no_other_packets()


class TtlExpiredTest(QosHelper):
    """TTL 1 and 0 are dropped and counted (malformed_packets[DROPPED_TTL_EXPIRED]); TTL 2 leaves with 1."""

    def runTest(self):
        self.add_route("10.0.2.0", 24, PORT_B, SWITCH_MAC, HOST_B_MAC)
        before = self.malformed_count(DROPPED_TTL_EXPIRED)
        self.send_packet(PORT_A, udp_packet(ttl=1))
        self.send_packet(PORT_A, udp_packet(ttl=0))
        pkt = udp_packet(ttl=2)
        self.send_packet(PORT_A, pkt)
        self.verify_packet(routed(pkt, HOST_B_MAC), PORT_B)
        self.verify_no_other_packets()
        self.assertEqual(self.malformed_count(DROPPED_TTL_EXPIRED) - before, 2)
