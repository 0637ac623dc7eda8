"""Runs inside the test's network namespace (``ip netns exec NS python bmv2_spray_scenario.py ...``), next to a
``simple_switch_grpc`` the test started there with ports 1..3 on veths swp1..swp3 (host ends h1..h3).

``P4RuntimeDriver`` installs one ECMP group, 10.0.9.0/24 over ports 2 and 3 (8 buckets each), from a
``SwitchState`` as the controller builds it, with each member's MACs. Frames go in at h1 and are counted where
they come out (h2, h3):

1. ``sprayed``: one approximate ATP DATA flow, the switch spraying: how many packets left by each port;
2. ``hashed``: non-approximate flows (UDP, TCP, ATP DATA without APPROX): the ports each flow left by, and the
   one ``controller.reference.reference_next_hops`` names;
3. ``spray_off``: the same approximate flow once the policy stops spraying (one Modify per group), likewise.

Prints one JSON object; the test asserts on it.
"""
from __future__ import annotations

import json
import select
import socket
import time
from pathlib import Path

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether

from netapprox.controller.model import EcmpRoute, Route, SwitchState, default_tlr_rules
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.reference import reference_next_hops
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, Flags, Header, PacketType, encode

from ctl_fixtures import scenario_args

H1_IP, DST_IP = "10.0.0.1", "10.0.9.7"
GRPC_PORT = 9559
SWITCH_MACS = {1: "02:00:00:00:5a:01", 2: "02:00:00:00:5a:02", 3: "02:00:00:00:5a:03"}
SPRAYED = 240


def mac(ifname: str) -> str:
    return Path(f"/sys/class/net/{ifname}/address").read_text().strip()


class Hosts:
    """Raw frames in at h1, counted per port (2: h2, 3: h3) with the MACs they arrive with."""

    def __init__(self) -> None:
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind(("h1", 0))
        self.rx = {}
        for port in (2, 3):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((f"h{port}", 0))
            s.setblocking(False)
            self.rx[port] = s
        self.src, self.swp1 = mac("h1"), mac("swp1")
        self.macs_seen: set[tuple[int, str, str]] = set()

    def send(self, ip_packets: list[bytes]) -> dict[int, int]:
        """Send the IPv4 packets (paced: BMv2's queues hold 64), return how many came out of each port."""
        for i, pkt in enumerate(ip_packets):
            self.tx.send(bytes(Ether(src=self.src, dst=self.swp1, type=0x0800)) + pkt)
            if i % 4 == 3:
                time.sleep(0.002)
        counts = {p: 0 for p in self.rx}
        end = time.monotonic() + 5.0
        while sum(counts.values()) < len(ip_packets) and time.monotonic() < end:
            self._collect(counts, 0.2)
        self._collect(counts, 0.2)  # anything extra (a duplicate would show here)
        return counts

    def _collect(self, counts: dict[int, int], timeout: float) -> None:
        for s in select.select(list(self.rx.values()), [], [], timeout)[0]:
            port = next(p for p, r in self.rx.items() if r is s)
            while True:
                try:
                    frame = s.recv(65535)
                except BlockingIOError:
                    break
                if frame[12:14] == b"\x08\x00" and frame[30:33] == bytes([10, 0, 9]):
                    counts[port] += 1
                    self.macs_seen.add((port, frame[6:12].hex(":"), frame[0:6].hex(":")))

    def close(self) -> None:
        self.tx.close()
        for s in self.rx.values():
            s.close()


def approx(sport: int, msg: int, flags: int = int(Flags.APPROX)) -> bytes:
    header = Header(type=PacketType.DATA, flags=flags, job_id=5, msg_id=msg, tlr=8000)
    return bytes(IP(src=H1_IP, dst=DST_IP, ttl=64) / UDP(sport=sport, dport=DEFAULT_ATP_PORT)
                 / encode(header, b"x" * 32))


def non_approx(kind: str, sport: int) -> bytes:
    if kind == "atp-exact":
        return approx(sport, 1, flags=0)
    l4 = TCP(sport=sport, dport=80, flags="A") if kind == "tcp" else UDP(sport=sport, dport=5001)
    return bytes(IP(src=H1_IP, dst=DST_IP, ttl=64) / l4 / (b"y" * 32))


def main() -> int:
    args = scenario_args()
    options = P4RuntimeOptions(address=f"127.0.0.1:{GRPC_PORT}", p4info=args.p4info, bmv2_json=args.bmv2_json,
                               ports=(1, 2, 3), connect_timeout_s=10.0)
    group = EcmpRoute("10.0.9.0", 24, (2, 3), src_macs=(SWITCH_MACS[2], SWITCH_MACS[3]),
                      dst_macs=(mac("h2"), mac("h3")))
    state = SwitchState(routes=frozenset({Route(H1_IP, 32, 1, SWITCH_MACS[1], mac("h1"))}),
                        tlr_rules=default_tlr_rules(), ecmp_routes=frozenset({group}))
    out: dict = {}
    driver = P4RuntimeDriver("s1", options)
    hosts = Hosts()
    try:
        driver.connect()
        summary = driver.apply(state)
        out["inserted"] = summary.inserted
        pkt = approx(40000, 1)
        out["sprayed"] = {"sent": SPRAYED, "counts": hosts.send([pkt] * SPRAYED),
                          "share": reference_next_hops(state, pkt)}
        hashed = []
        for kind in ("udp", "tcp", "atp-exact"):
            for sport in range(41000, 41006):
                pkt = non_approx(kind, sport)
                hashed.append({"kind": kind, "sport": sport, "counts": hosts.send([pkt] * 4),
                               "reference": reference_next_hops(state, pkt)})
        out["hashed"] = hashed
        off = SwitchState(routes=state.routes, tlr_rules=state.tlr_rules, ecmp_routes=state.ecmp_routes, spray=False)
        summary = driver.apply(off)
        out["spray_off_writes"] = [summary.inserted, summary.modified, summary.deleted]
        flows = []
        for sport in range(42000, 42006):
            pkt = approx(sport, 2)
            flows.append({"sport": sport, "counts": hosts.send([pkt] * 4), "reference": reference_next_hops(off, pkt)})
        out["spray_off"] = flows
        out["macs_seen"] = sorted(hosts.macs_seen)
        out["macs_wanted"] = sorted((p, SWITCH_MACS[p], mac(f"h{p}")) for p in (2, 3))
    finally:
        hosts.close()
        driver.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
