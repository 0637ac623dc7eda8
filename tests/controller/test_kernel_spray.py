"""The kernel switch's ECMP decision against the reference model on the real kernel (root).

A kernel switch with four ports (``NetnsLab``): host 1 sends, hosts 2..4 stand for the three equal-cost next
hops of one ECMP group (ports 2, 3, 4: 6/5/5 buckets). ``KernelDriver`` installs the group; frames go in at
host 1 below IP and are counted where they come out. A sprayed flow must spread over the group as
``controller.reference.reference_next_hops`` says (every port within five standard deviations of its bucket
share, nothing lost, nothing duplicated); every non-approximate flow, and every flow once spraying is off,
must leave by exactly the one port the reference's flow hash names.
"""
from __future__ import annotations

import math
import select
import socket
import time

import pytest

from netapprox.controller.kernel.driver import KernelDriver
from netapprox.controller.model import EcmpRoute, JobRule, SwitchState, default_tlr_rules
from netapprox.controller.reference import reference_next_hops
from netapprox.hostlib import wire
from netapprox.topo.netns import NetnsLab
from support.conformance import PacketSpec
from support.packet_sockets import packet_socket
from support.skips import requires_root

pytestmark = [requires_root, pytest.mark.root, pytest.mark.timeout(300)]

ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
PACKET_OUTGOING = 4
GROUP = EcmpRoute(prefix="10.250.0.0", prefix_len=16, ports=(2, 3, 4))
BASE = SwitchState(tlr_rules=default_tlr_rules(), ecmp_routes=frozenset({GROUP}),
                   job_rules=frozenset({JobRule(job_id=5, qid=1)}))  # queue 1: 7 packets of buffer


class Fabric:
    def __init__(self, lab: NetnsLab) -> None:
        self.driver = KernelDriver.from_options("leaf", {"netns": lab.switch_ns, "rate_mbit": 1000,
                                                         "ports": {"p1": 1, "p2": 2, "p3": 3, "p4": 4}})
        self.driver.connect()
        self.tx = packet_socket(lab.host_ns[0], socket.SOCK_DGRAM, 0)
        self.rx = {}
        for port in (2, 3, 4):
            s = packet_socket(lab.host_ns[port - 1], socket.SOCK_RAW, ETH_P_ALL)
            s.bind(("eth0", ETH_P_ALL))
            s.setblocking(False)
            self.rx[port] = s

    def send_flow(self, packets: list[bytes]) -> dict[int, int]:
        """Send ``packets`` (paced so no queue overflows), return how many came out of each port."""
        for i, pkt in enumerate(packets):
            self.tx.sendto(pkt, ("eth0", ETH_P_IP, 0, 0, b"\x02\x00\x00\x00\x00\x99"))
            if i % 4 == 3:
                time.sleep(0.0005)
        counts = {p: 0 for p in self.rx}
        end = time.monotonic() + 5.0
        while sum(counts.values()) < len(packets) and time.monotonic() < end:
            self._collect(counts, 0.2)
        self._collect(counts, 0.1)  # anything extra (a duplicate would show here)
        return counts

    def _collect(self, counts: dict[int, int], timeout: float) -> None:
        for s in select.select(list(self.rx.values()), [], [], timeout)[0]:
            port = next(p for p, r in self.rx.items() if r is s)
            while True:
                try:
                    frame, addr = s.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] != PACKET_OUTGOING and frame[12:14] == b"\x08\x00" and frame[30:32] == bytes([10, 250]):
                    counts[port] += 1

    def close(self) -> None:
        self.driver.close()
        self.tx.close()
        for s in self.rx.values():
            s.close()


@pytest.fixture(scope="module")
def fabric():
    with NetnsLab(hosts=4, subnet="10.205.0.0/24") as lab:
        f = Fabric(lab)
        try:
            yield f
        finally:
            f.close()


def approx(sport: int = 40000, dst: str = "10.250.0.7", flags: int = wire.Flags.APPROX) -> bytes:
    return PacketSpec(sport=sport, dst=dst, atp=wire.Header(type=wire.PacketType.DATA, flags=flags, job_id=5,
                                                            tlr=8000, pkt_cnt=1), payload=b"x" * 32).bytes()


def test_kernel_spray_matches_the_reference_distribution(fabric):
    fabric.driver.apply(BASE)
    pkt = approx()
    share = reference_next_hops(BASE, pkt)
    assert share == {2: 6 / 16, 3: 5 / 16, 4: 5 / 16}
    n = 480
    counts = fabric.send_flow([pkt] * n)
    assert sum(counts.values()) == n, counts  # nothing lost, nothing duplicated
    for port, p in share.items():
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[port] - n * p) <= 5 * sd, (counts, share)


NON_APPROX = [
    ("atp-exact", lambda s: approx(sport=s, flags=0)),
    ("tcp", lambda s: PacketSpec(proto=6, sport=s, dport=80, dst="10.250.0.9", payload=b"GET /").bytes()),
    ("udp", lambda s: PacketSpec(proto=17, sport=s, dport=53, dst="10.250.3.1", payload=b"query").bytes()),
    ("options", lambda s: PacketSpec(sport=s, ihl=6, dst="10.250.0.7", src=f"10.0.{s % 200}.1",
                                     atp=wire.Header(type=wire.PacketType.DATA, flags=1, job_id=5, tlr=8000,
                                                     pkt_cnt=1)).bytes()),
]


@pytest.mark.parametrize("name,make", NON_APPROX, ids=[n for n, _ in NON_APPROX])
def test_kernel_spray_never_splits_non_approximate_flows(fabric, name, make):
    fabric.driver.apply(BASE)
    used = set()
    for sport in range(41000, 41008):
        pkt = make(sport)
        hops = reference_next_hops(BASE, pkt)
        assert len(hops) == 1
        counts = fabric.send_flow([pkt] * 6)
        assert {p: c for p, c in counts.items() if c} == {next(iter(hops)): 6}, (name, sport, counts, hops)
        used |= set(hops)
    assert len(used) >= 2 or name == "options"  # the hash spreads flows (options: same ports, read as 0)


def test_kernel_spray_off_hashes_approximate_flows(fabric):
    state = SwitchState(tlr_rules=BASE.tlr_rules, ecmp_routes=BASE.ecmp_routes, job_rules=BASE.job_rules, spray=False)
    writes = fabric.driver.apply(state).writes
    assert writes > 0 and fabric.driver.apply(state).writes == 0  # re-applying changes nothing
    used = set()
    for sport in range(42000, 42010):
        pkt = approx(sport=sport)
        hops = reference_next_hops(state, pkt)
        assert len(hops) == 1
        counts = fabric.send_flow([pkt] * 6)
        assert {p: c for p, c in counts.items() if c} == {next(iter(hops)): 6}, (sport, counts, hops)
        used |= set(hops)
    assert used == {2, 3, 4}


def test_kernel_spray_without_routes_bridges_again(fabric):
    fabric.driver.apply(SwitchState(tlr_rules=default_tlr_rules()))
    # No route: the bridge floods the unknown destination MAC to every other port.
    counts = fabric.send_flow([approx()] * 3)
    assert counts == {2: 3, 3: 3, 4: 3}
