"""routes_v4: IPv4 LPM to a port with MAC rewrite and TTL decrement; TTL <= 1 and misses are dropped; headers
with options are routed too."""
from __future__ import annotations

from common.qos_mixin import (DROPPED_TTL_EXPIRED, HOST_B_MAC, HOST_C_MAC, PORT_A, PORT_B, PORT_C, ROUTER_ALERT,
                              SWITCH_MAC, QosHelper, atp_packet, routed, tcp_packet, udp_packet)
from netapprox.hostlib import wire
from scapy.layers.inet import IP


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


class Ipv4OptionsRoutedTest(QosHelper):
    """IPv4 headers with options (IHL 6, a Router Alert) are routed like any other packet: MACs rewritten, TTL - 1,
    the header checksum updated over the whole header (compared byte for byte), the options unchanged. The switch
    does not parse their L4 header: UDP, TCP and even ATP DATA with APPROX travel as non-ATP traffic in queue 0,
    unstamped, whatever the classification rules say. A header shorter than 20 bytes (IHL 4) is dropped."""

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_tlr(0, 0x8000, 3)
        self.add_queue_by_class(1, 17, 0xFF, 5001, 0xFFFF, 2)  # UDP to 5001, but only when its L4 is parsed
        cases = [
            (udp_packet(ip_options=ROUTER_ALERT), "UDP"),
            (tcp_packet(ip_options=ROUTER_ALERT), "TCP"),
            (atp_packet(flags=int(wire.Flags.APPROX), tlr=0x2000, ip_options=ROUTER_ALERT), "ATP DATA"),
            (atp_packet(flags=int(wire.Flags.APPROX), tlr=0x2000, ttl=2, ip_options=ROUTER_ALERT), "TTL 2"),
        ]
        for pkt, what in cases:
            self.assertEqual(pkt[IP].ihl, 6, what)
            before = self.queue_counters(PORT_B, 0)
            self.send_packet(PORT_A, pkt)
            self.verify_packet(routed(pkt, HOST_B_MAC), PORT_B)
            after = self.queue_counters(PORT_B, 0)
            self.assertEqual((after[0] - before[0], after[1] - before[1]), (1, 1), f"{what}: not in queue 0")
        short = bytearray(bytes(udp_packet()))
        short[14] = 0x44  # version 4, IHL 4
        self.send_packet(PORT_A, bytes(short))
        self.verify_no_other_packets()
