"""ATP REPORTs reach the controller as packet-in (with the ingress port), within each port's rate; packet-out
leaves unchanged."""
from __future__ import annotations

from common.qos_mixin import (DROPPED_REPORT_RATE, MALFORMED_BAD_VERSION, PORT_A, PORT_C, QosHelper, atp_packet,
                              udp_packet)
from netapprox.hostlib import wire

REPORT = wire.PacketType.REPORT


class ReportPacketInTest(QosHelper):
    """A REPORT to the ATP port and one to the report port arrive unchanged as packet-in with
    ingress_port set; they are not forwarded even though a route exists; a malformed REPORT is not punted."""

    def runTest(self):
        self.add_standard_routes()
        body = wire.Report(job_id=9, group_id=2, seq=4, tlr=0.25, loss=0.1, msr=0.9, rate_kbps=1000, total=10,
                           delivered=5, lost=1, epoch=3).encode()
        hdr = wire.decode(body)[0]
        for dport, port in ((wire.DEFAULT_ATP_PORT, PORT_A), (wire.DEFAULT_REPORT_PORT, PORT_C)):
            pkt = atp_packet(type=REPORT, job_id=hdr.job_id, tlr=hdr.tlr, dport=dport,
                             payload=body[wire.HEADER_LEN:])
            self.send_packet(port, pkt)
            self.verify_packet_in(pkt, port)
        before = self.malformed_count(MALFORMED_BAD_VERSION)
        self.send_packet(PORT_A, atp_packet(type=REPORT, version=3, payload=body[wire.HEADER_LEN:]))
        self.verify_no_packet_in()
        self.assertEqual(self.malformed_count(MALFORMED_BAD_VERSION) - before, 1)
        self.verify_no_other_packets()


class PacketOutTest(QosHelper):
    """The controller's packet goes out of the requested port byte for byte: no routing, no TTL change,
    no queue byte stamping, no counters."""

    def runTest(self):
        self.add_standard_routes()
        counters_before = self.all_queue_counters(PORT_C)
        for pkt in (udp_packet(), atp_packet(flags=int(wire.Flags.APPROX), tlr=0x2000)):
            self.send_packet_out(pkt, PORT_C)
            self.verify_packet(pkt, PORT_C)
        self.verify_no_other_packets()
        self.assertEqual(self.all_queue_counters(PORT_C), counters_before)


class ReportRateLimitTest(QosHelper):
    """report_meter limits the REPORTs punted from a port (2/s, burst 2 here): of 12 sent back to back, the first
    few reach the controller and the rest are dropped and counted (DROPPED_REPORT_RATE); another port's
    REPORTs are not limited by it."""

    def runTest(self):
        self.add_standard_routes()
        self.set_report_meter(PORT_A, rate_pps=2, burst=2)
        body = wire.Report(job_id=9, group_id=2, seq=4, tlr=0.25, loss=0.1, msr=0.9, rate_kbps=1000, total=10,
                           delivered=5, lost=1, epoch=3).encode()
        pkt = atp_packet(type=REPORT, job_id=9, dport=wire.DEFAULT_REPORT_PORT, payload=body[wire.HEADER_LEN:])
        before = self.malformed_count(DROPPED_REPORT_RATE)
        for _ in range(12):
            self.send_packet(PORT_A, pkt)
        punted = 0
        while self.get_packet_in(timeout=0.5) is not None:
            punted += 1
        dropped = self.malformed_count(DROPPED_REPORT_RATE) - before
        self.assertEqual(punted + dropped, 12, f"{punted} punted, {dropped} dropped")
        self.assertGreaterEqual(punted, 1)
        self.assertLessEqual(punted, 4, "the meter let the burst through")
        for _ in range(3):
            self.send_packet(PORT_C, pkt)
            self.verify_packet_in(pkt, PORT_C)
        self.verify_no_other_packets()
