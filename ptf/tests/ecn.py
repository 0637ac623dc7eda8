"""ecn_thresholds / mark_ecn: ECN-capable packets of a queue whose depth at enqueue reached the threshold
leave with CE; others never change. Queue 0 of port B is slowed down with BMv2 set_queue_rate so that it
builds up."""
from __future__ import annotations

import time

import ptf.testutils as testutils

from common.qos_mixin import HOST_B_MAC, PORT_A, PORT_B, ROUTER_ALERT, QosHelper, routed, udp_packet
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3


class EcnNoMarkWhenIdleTest(QosHelper):
    """With a threshold of 1 packet and an idle queue, nothing is marked."""

    def runTest(self):
        self.add_standard_routes()
        self.add_ecn_threshold(0, 1)
        for ecn in (ECN_ECT0, ECN_ECT1, ECN_NOT_ECT, ECN_CE):
            pkt = udp_packet(ecn=ecn)
            self.send_packet(PORT_A, pkt)
            self.verify_packet(routed(pkt, HOST_B_MAC), PORT_B)
            time.sleep(0.05)  # let the queue drain: each packet must find it empty
        self.verify_no_other_packets()


class EcnMarkWhenCongestedTest(QosHelper):
    """Queue 0 of port B drains at 10 packets/s; a burst of 12 fills it. ECT(0)/ECT(1) packets that found
    >= 3 packets queued leave as CE, those that found fewer leave unchanged, Not-ECT is never marked. All
    packets leave in order with a correct IPv4 checksum (compared byte for byte), including those whose header
    carries options (updated incrementally for the TTL and the ECN change)."""

    RATE_PPS = 10
    THRESHOLD = 3

    def runTest(self):
        self.add_standard_routes()
        self.add_ecn_threshold(0, self.THRESHOLD)
        self.add_ecn_threshold(7, 1)  # another queue's threshold must not matter
        self.set_queue_rate(PORT_B, 0, self.RATE_PPS)
        ecns = [ECN_ECT0, ECN_ECT1] * 4 + [ECN_NOT_ECT, ECN_ECT0, ECN_NOT_ECT, ECN_ECT1]
        sent = []
        for i, ecn in enumerate(ecns):
            pkt = udp_packet(ecn=ecn, sport=41000 + i, ip_options=ROUTER_ALERT if i in (6, 7, 8) else b"")
            sent.append(pkt)
            self.send_packet(PORT_A, pkt)
        # The first packet finds an empty queue, the second too (the first left at once): never marked.
        # From the 5th on, at least 3 packets wait (10 pps drains one per 100 ms; the burst takes a few ms).
        timeout = 2 + len(ecns) / self.RATE_PPS
        got = []
        for i, pkt in enumerate(sent):
            res = testutils.dp_poll(self, 0, PORT_B, timeout=timeout)
            if isinstance(res, self.dataplane.PollFailure):
                self.fail(f"packet {i} of {len(sent)} did not arrive on port {PORT_B}")
            got.append(Ether(res.packet))
        marked = []
        for i, (pkt, rx) in enumerate(zip(sent, got)):
            ecn = pkt[IP].tos & 3
            rx_ecn = rx[IP].tos & 3
            expect_ecn = rx_ecn if ecn in (ECN_ECT0, ECN_ECT1) and rx_ecn == ECN_CE else ecn
            self.assertEqual(bytes(rx), bytes(routed(pkt, HOST_B_MAC, ecn=expect_ecn)),
                             f"packet {i}: wrong bytes (order, rewrite or checksum)")
            if ecn == ECN_NOT_ECT:
                self.assertEqual(rx_ecn, ECN_NOT_ECT, f"packet {i}: Not-ECT was changed")
            marked.append(rx_ecn == ECN_CE)
        self.assertFalse(marked[0] or marked[1], f"marked before the queue built up: {marked}")
        ect = [i for i, ecn in enumerate(ecns) if ecn in (ECN_ECT0, ECN_ECT1)]
        self.assertTrue(all(marked[i] for i in ect if i >= self.THRESHOLD + 2),
                        f"ECT packets behind >= {self.THRESHOLD} queued packets not marked: {marked}")
        self.verify_no_other_packets()
