"""Malformed ATP packets are dropped and counted per reason (malformed_packets), never classified. Wire version 2
defines every flag bit, so no packet is malformed by its flags (bad_flags stays a reason for a later version)."""
from __future__ import annotations

from common.qos_mixin import (DROPPED_IPV4_CHECKSUM, MALFORMED_BAD_INDEX, MALFORMED_BAD_TLR,
                              MALFORMED_BAD_TYPE, MALFORMED_BAD_VERSION, MALFORMED_TRUNCATED, HOST_A_IP,
                              HOST_A_MAC, HOST_B_IP, HOST_B_MAC, PORT_A, PORT_B, SWITCH_MAC, QosHelper, atp_packet,
                              routed)
from netapprox.hostlib import wire
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

APPROX = int(wire.Flags.APPROX)


def _raw_udp(payload: bytes, *, sport=40000, dport=wire.DEFAULT_ATP_PORT) -> Ether:
    return Ether(bytes(Ether(src=HOST_A_MAC, dst=SWITCH_MAC) / IP(src=HOST_A_IP, dst=HOST_B_IP, id=1)
                       / UDP(sport=sport, dport=dport) / payload))


class MalformedAtpTest(QosHelper):
    """Each bad header is dropped and counted under its own reason, with every classification rule
    installed; a good packet sent last still goes through."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        self.add_queue_by_job(1, 3)
        good = wire.encode(wire.Header(flags=APPROX, job_id=1, pkt_cnt=2, pkt_idx=1), b"abcd")
        cases = [
            (MALFORMED_TRUNCATED, _raw_udp(good[:20]), "20-byte ATP header"),
            (MALFORMED_TRUNCATED, _raw_udp(b""), "empty UDP to the ATP port"),
            (MALFORMED_TRUNCATED, _raw_udp(good[:10], sport=wire.DEFAULT_ATP_PORT, dport=40000),
             "short ACK from the ATP port"),
            (MALFORMED_TRUNCATED, _raw_udp(good[:-1]), "payload shorter than length"),
            (MALFORMED_BAD_VERSION, atp_packet(version=1, flags=APPROX), "version 1 (wire version 2 only)"),
            (MALFORMED_BAD_VERSION, atp_packet(version=3, flags=APPROX), "version 3"),
            (MALFORMED_BAD_VERSION, atp_packet(version=0, flags=APPROX), "version 0"),
            (MALFORMED_BAD_TYPE, atp_packet(type=0, flags=APPROX), "type 0"),
            (MALFORMED_BAD_TYPE, atp_packet(type=8, flags=APPROX), "type 8 (7 is NEW_TOKEN)"),
            (MALFORMED_BAD_TYPE, atp_packet(type=15, flags=APPROX), "type 15"),
            (MALFORMED_BAD_TLR, atp_packet(flags=APPROX, tlr=0x8001), "tlr 0x8001"),
            (MALFORMED_BAD_TLR, atp_packet(flags=APPROX, tlr=0xFFFF), "tlr 0xffff"),
            (MALFORMED_BAD_INDEX, atp_packet(flags=APPROX, pkt_cnt=0, pkt_idx=0), "pkt_cnt 0"),
            (MALFORMED_BAD_INDEX, atp_packet(flags=APPROX, pkt_cnt=5, pkt_idx=5), "pkt_idx == pkt_cnt"),
            (MALFORMED_BAD_INDEX, atp_packet(flags=APPROX, pkt_cnt=5, pkt_idx=0xFFFF), "pkt_idx > pkt_cnt"),
        ]
        for reason, pkt, what in cases:
            before = [self.malformed_count(r) for r in range(8)]
            queues_before = self.all_queue_counters(PORT_B)
            self.send_packet(PORT_A, pkt)
            self.verify_no_other_packets()
            after = [self.malformed_count(r) for r in range(8)]
            want = [b + (r == reason) for r, b in enumerate(before)]
            self.assertEqual(after, want, f"{what}: malformed_packets per reason")
            self.assertEqual(self.all_queue_counters(PORT_B), queues_before, f"{what}: was classified")
        ok = atp_packet(flags=APPROX, job_id=1, pkt_cnt=2, pkt_idx=1)
        self.send_packet(PORT_A, ok)
        self.verify_packet(routed(ok, HOST_B_MAC, queue=3), PORT_B)
        self.verify_no_other_packets()


class BadIpv4ChecksumTest(QosHelper):
    """An IPv4 header with a wrong checksum is dropped and counted (DROPPED_IPV4_CHECKSUM)."""

    def runTest(self):
        self.add_standard_routes()
        pkt = atp_packet(flags=APPROX)
        pkt[IP].chksum ^= 0x0101
        before = self.malformed_count(DROPPED_IPV4_CHECKSUM)
        self.send_packet(PORT_A, pkt)
        self.verify_no_other_packets()
        self.assertEqual(self.malformed_count(DROPPED_IPV4_CHECKSUM) - before, 1)
