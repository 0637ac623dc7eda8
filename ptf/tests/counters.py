"""enqueued_packets / transmitted_packets per (port, queue): both move with traffic, bytes included, and
their difference is the tail drop of a full queue."""
from __future__ import annotations

import time

from common.qos_mixin import HOST_B_MAC, PORT_A, PORT_B, QosHelper, atp_packet, routed
from netapprox.hostlib import wire

APPROX = int(wire.Flags.APPROX)


class QueueCountersTest(QosHelper):
    """Five packets into queue 6 of port B: +5 packets and +5 x frame length bytes on both counters."""

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_tlr(0x6000, 0x6FFF, 6)
        index = PORT_B * 8 + 6
        enq0 = self.read_counter("enqueued_packets", index)
        tx0 = self.read_counter("transmitted_packets", index)
        pkt = atp_packet(flags=APPROX, tlr=0x6123)
        for _ in range(5):
            self.send_packet(PORT_A, pkt)
            self.verify_packet(routed(pkt, HOST_B_MAC, queue=6), PORT_B)
        self.verify_no_other_packets()
        enq1 = self.read_counter("enqueued_packets", index)
        tx1 = self.read_counter("transmitted_packets", index)
        self.assertEqual(enq1[0] - enq0[0], 5)
        self.assertEqual(tx1[0] - tx0[0], 5)
        if self.is_v1model():
            # BMv2 counts the frame as its pipeline sees it (no FCS). Tofino adds its own per-packet
            # overheads (FCS, bridged metadata in egress), so bytes are only checked here.
            self.assertEqual(enq1[1] - enq0[1], 5 * len(pkt))
            self.assertEqual(tx1[1] - tx0[1], 5 * len(pkt))


class TailDropVisibleInCountersTest(QosHelper):
    """Queue 7 of port B holds 2 packets and drains at 5/s; a burst of 10 overflows it. enqueued counts all
    10, transmitted only those that left, and exactly that many arrive."""

    def runTest(self):
        self.add_standard_routes()
        self.set_queue_depth(PORT_B, 7, 2)
        self.set_queue_rate(PORT_B, 7, 5)
        enq0, tx0 = self.queue_counters(PORT_B, 7)
        pkt = atp_packet(flags=APPROX, tlr=0x7777)  # no TLR rule: queue 7
        for _ in range(10):
            self.send_packet(PORT_A, pkt)
        time.sleep(1.5)  # everything that was queued has left (<= 3 packets at 5/s)
        arrived = 0
        while self.dataplane.poll(port_number=PORT_B, timeout=0.2, exp_pkt=routed(pkt, HOST_B_MAC, queue=7)).packet:
            arrived += 1
        enq1, tx1 = self.queue_counters(PORT_B, 7)
        self.assertEqual(enq1 - enq0, 10)
        self.assertEqual(tx1 - tx0, arrived)
        self.assertGreaterEqual(arrived, 2)
        self.assertLess(arrived, 10, "no tail drop although the queue holds 2 packets")
        self.verify_no_other_packets()
