"""Which BMv2 priority queue is served first, observed: logical queue 0 (BMv2 priority 7) must never be
overtaken by logical queue 7 (priority 0) traffic sent after it, and when the egress thread falls
behind, queue 0 traffic sent later overtakes queue 7 traffic waiting in the switch.

BMv2 builds a backlog in its egress queues only when its egress thread runs behind its ingress thread;
`python ptf/run_ptf.py --taskset 0 queueing` pins the switch to one CPU so that it does. Without a backlog
the packets leave in arrival order, which the test reports as inconclusive (it still passes)."""
from __future__ import annotations

import struct
import time

import ptf.testutils as testutils

from common.qos_mixin import HOST_A_MAC, HOST_A_IP, HOST_B_IP, PORT_A, PORT_B, SWITCH_MAC, QosHelper
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

HIGH_PORT, LOW_PORT = 5000, 5007  # UDP destination ports: logical queue 0 (default), queue 7 (class rule)
BURST = 300


def _frame(dport: int, seq: int) -> bytes:
    return bytes(Ether(src=HOST_A_MAC, dst=SWITCH_MAC) / IP(src=HOST_A_IP, dst=HOST_B_IP)
                 / UDP(sport=40000, dport=dport) / struct.pack("!I", seq) / (b"q" * 60))


class StrictPriorityOrderTest(QosHelper):
    def _burst(self, first_dport: int, second_dport: int) -> list[tuple[int, int]]:
        """Send BURST frames to ``first_dport`` then BURST to ``second_dport`` as fast as the socket goes;
        return the (dport, seq) of what arrives on port B, in arrival order."""
        frames = [_frame(first_dport, i) for i in range(BURST)] + \
                 [_frame(second_dport, BURST + i) for i in range(BURST)]
        for f in frames:
            self.dataplane.send(0, PORT_A, f)
        got = []
        while True:
            res = testutils.dp_poll(self, 0, PORT_B, timeout=2)
            if res.packet is None:
                break
            pkt = Ether(res.packet)
            got.append((pkt[UDP].dport, struct.unpack("!I", bytes(pkt[UDP].payload)[:4])[0]))
        return got

    @staticmethod
    def overtakes(got: list[tuple[int, int]], late_dport: int) -> int:
        """How many early packets arrived after the first packet of the later burst."""
        for i, (dport, _) in enumerate(got):
            if dport == late_dport:
                return sum(1 for d, _ in got[i:] if d != late_dport)
        return 0

    def runTest(self):
        self.add_standard_routes()
        self.add_queue_by_class(10, 17, 0xFF, LOW_PORT, 0xFFFF, 7)
        for qid in (0, 7):
            self.set_queue_depth(PORT_B, qid, 2 * BURST)
        # Low first, then high: with a backlog the high burst jumps ahead of waiting low packets.
        got_lh = self._burst(LOW_PORT, HIGH_PORT)
        time.sleep(0.5)
        # High first, then low: the low burst must never jump ahead of waiting high packets.
        got_hl = self._burst(HIGH_PORT, LOW_PORT)
        high_overtook = self.overtakes(got_lh, HIGH_PORT)
        low_overtook = self.overtakes(got_hl, LOW_PORT)
        if low_overtook:
            verdict = "logical queue 7 served before logical queue 0: the priority mapping is reversed"
        elif high_overtook:
            verdict = "logical queue 0 (BMv2 priority 7) served first"
        else:
            verdict = "inconclusive: no backlog built up, packets left in arrival order"
        print(f"\nStrictPriorityOrderTest: low-then-high burst: {high_overtook} queue-7 packets left after the "
              f"first queue-0 packet ({len(got_lh)}/{2 * BURST} arrived); high-then-low burst: {low_overtook} "
              f"queue-0 packets left after the first queue-7 packet ({len(got_hl)}/{2 * BURST} arrived): "
              f"{verdict}", flush=True)
        self.assertEqual(low_overtook, 0, "queue 7 traffic overtook queue 0 traffic: priority mapping reversed")
        self.verify_no_other_packets()
