"""Queue selection: queue_by_class, queue_by_job, queue_by_tag, queue_by_tlr and the defaults, observed
through the ATP queue byte and the per-(port, queue) counters."""
from __future__ import annotations

from common.qos_mixin import (HOST_B_MAC, NUM_QUEUES, PORT_A, PORT_B, QosHelper, atp_packet, routed, tcp_packet,
                              udp_packet)
from netapprox.hostlib import wire

APPROX = int(wire.Flags.APPROX)
TAGGED = int(wire.Flags.TAGGED)


class ClassifierTest(QosHelper):
    """Send ``pkt`` from port A, expect it on port B in logical queue ``qid`` (queue byte for ATP DATA,
    and the enqueued/transmitted counters of (B, qid) up by one, every other queue of B unchanged)."""

    def expect_queue(self, pkt, qid: int, *, stamped: bool = True, note: str = "") -> None:
        before = self.all_queue_counters(PORT_B)
        self.send_packet(PORT_A, pkt)
        self.verify_packet(routed(pkt, HOST_B_MAC, queue=qid if stamped else None), PORT_B)
        after = self.all_queue_counters(PORT_B)
        want = [(e + (q == qid), t + (q == qid)) for q, (e, t) in enumerate(before)]
        self.assertEqual(after, want, f"counters of port {PORT_B} per queue (enqueued, transmitted) {note}")


class TlrRangesTest(ClassifierTest):
    """Default thresholds: every TLR range lands in its queue, both ends of each range; [0, 1/8) -> 1."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        step = wire.TLR_ONE // NUM_QUEUES  # 4096
        for k in range(NUM_QUEUES):
            lo, hi = k * step, (k + 1) * step - 1
            if k == NUM_QUEUES - 1:
                hi = wire.TLR_ONE  # 1.0 falls in the last range
            for tlr in (lo, hi):
                self.expect_queue(atp_packet(flags=APPROX, tlr=tlr), max(k, 1), note=f"tlr=0x{tlr:04x}")
        self.verify_no_other_packets()


class TlrMissGoesToLowestQueueTest(ClassifierTest):
    """Approximate traffic that no rule matches goes to queue 7."""

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_tlr(0x0000, 0x0FFF, 2)
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x0800), 2)
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x5000), 7)
        self.verify_no_other_packets()


class JobOverrideTest(ClassifierTest):
    """queue_by_job beats TLR (and tag) rules; its direct counter counts the job's packets only."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        self.add_queue_by_tag(1, (0, 255), (0, 0xFFFFFFFF), 5)
        job = self.add_queue_by_job(42, 3)
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x7000, job_id=42), 3)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=0x7000, job_id=42, priority=1), 3)
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x7000, job_id=43), 7)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=0x7000, job_id=43, priority=1), 5)
        # Non-approximate DATA of the same job is not overridden.
        self.expect_queue(atp_packet(flags=0, job_id=42), 0)
        self.verify_no_other_packets()
        self.assertEqual(self.read_direct_counter(job)[0], 2)


class SurplusToLowestQueueTest(ClassifierTest):
    """Approximate DATA with TLR 1.0 is surplus (its sender does not need it): queue 7 even when its job has a
    queue_by_job entry or a tag rule matches, and the job's direct counter does not count it."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        self.add_queue_by_tag(1, (0, 255), (0, 0xFFFFFFFF), 5)
        job = self.add_queue_by_job(42, 2)
        self.expect_queue(atp_packet(flags=APPROX, tlr=wire.TLR_ONE, job_id=42), 7)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=wire.TLR_ONE, job_id=7, priority=1), 7)
        self.expect_queue(atp_packet(flags=APPROX, tlr=wire.TLR_ONE - 1, job_id=42), 2)
        self.verify_no_other_packets()
        self.assertEqual(self.read_direct_counter(job)[0], 1)


class TagRulesTest(ClassifierTest):
    """CadentFlow tags (priority range x deadline range) classify TAGGED approximate DATA; untagged
    packets and tag misses fall through to the TLR rules; among overlapping tag rules the larger rank wins."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        self.add_queue_by_tag(10, (0, 9), (0, 999), 2)             # urgent, tight deadline
        self.add_queue_by_tag(5, (0, 255), (0, 0xFFFFFFFE), 4)     # anything with a deadline
        self.add_queue_by_tag(1, (100, 255), (0, 0xFFFFFFFF), 6)   # low priority, with or without one
        tlr_q5 = 5 * 4096 + 7
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=3, deadline_us=500), 2)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=9, deadline_us=999), 2)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=10, deadline_us=500), 4)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=3, deadline_us=1000), 4)
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=200,
                                     deadline_us=wire.NO_DEADLINE), 6)
        # No tag rule matches: TLR decides.
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=tlr_q5, priority=50,
                                     deadline_us=wire.NO_DEADLINE), 5)
        # Not TAGGED: the tag fields are ignored.
        self.expect_queue(atp_packet(flags=APPROX, tlr=tlr_q5, priority=3, deadline_us=500), 5)
        self.verify_no_other_packets()


class NonApproxToQueueZeroTest(ClassifierTest):
    """Non-ATP traffic, ATP DATA without APPROX and every other ATP type go to queue 0, even with
    approximate-looking TLR/job/tag rules installed; only DATA gets its queue byte stamped."""

    def runTest(self):
        self.add_standard_routes()
        self.add_default_tlr_rules()
        self.add_queue_by_job(42, 3)
        self.add_queue_by_tag(1, (0, 255), (0, 0xFFFFFFFF), 5)
        self.expect_queue(udp_packet(), 0, stamped=False, note="plain UDP")
        self.expect_queue(tcp_packet(), 0, stamped=False, note="TCP")
        self.expect_queue(atp_packet(flags=0, tlr=0x7000, job_id=42), 0, note="DATA without APPROX")
        # ACK and DONE come FROM the ATP port; the switch never rewrites them.
        for ptype in (wire.PacketType.ACK, wire.PacketType.DONE):
            pkt = atp_packet(type=ptype, flags=APPROX | TAGGED, tlr=0x7000, job_id=42, queue=6,
                             sport=wire.DEFAULT_ATP_PORT, dport=40000, src="10.0.1.1", dst="10.0.2.1")
            self.expect_queue(pkt, 0, stamped=False, note=ptype.name)
        self.verify_no_other_packets()


class ClassRulesTest(ClassifierTest):
    """queue_by_class moves chosen non-approximate traffic out of queue 0 (ternary on ip_proto and l4_dport,
    larger rank wins); it never applies to approximate DATA."""

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_class(10, 17, 0xFF, 5001, 0xFFFF, 2)   # UDP to 5001
        self.add_queue_by_class(1, 17, 0xFF, 0, 0, 4)            # any other UDP
        self.expect_queue(udp_packet(dport=5001), 2, stamped=False)
        self.expect_queue(udp_packet(dport=5002), 4, stamped=False)
        self.expect_queue(tcp_packet(dport=5001), 0, stamped=False)
        self.expect_queue(atp_packet(flags=0), 4, note="non-approximate ATP DATA is UDP to 7600")
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x1000), 7, note="approximate: class rules ignored")
        self.verify_no_other_packets()


class Queue0GuardTest(ClassifierTest):
    """Approximate traffic never reaches queue 0: job and TLR entries that name queue 0 (a controller bug, or a
    pinned job) are overruled to queue 1 in the data plane and counted in queue0_guard_packets; non-approximate
    traffic still uses queue 0, uncounted."""

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_job(42, 0)
        self.add_queue_by_tlr(0x0000, 0x0FFF, 0)
        self.add_queue_by_tag(3, (0, 255), (0, 1000), 0)
        before = self.queue0_guard_count()
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x7000, job_id=42), 1, note="job entry says 0")
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x0800, job_id=7), 1, note="TLR entry says 0")
        self.expect_queue(atp_packet(flags=APPROX | TAGGED, tlr=0x7000, job_id=7, deadline_us=500), 1,
                          note="tag entry says 0")
        self.expect_queue(atp_packet(flags=APPROX, tlr=0x7000, job_id=7), 7, note="no entry: queue 7")
        self.expect_queue(atp_packet(flags=0, job_id=42), 0, note="non-approximate ATP stays in 0")
        self.verify_no_other_packets()
        self.assertEqual(self.queue0_guard_count() - before, 3)
