"""The P4 program on BMv2 against the reference model, with generated tables and packets.

Runs inside the test's network namespace (``ip netns exec NS python p4_reference_scenario.py ...``, from
tests/dataplane/test_p4_reference.py), next to the ``simple_switch_grpc`` the test started there: switch ports
1..3 are veths ``swp1..3`` whose host ends are ``h1..h3``. For every example hypothesis draws a ``SwitchState``
(tests/support/conformance.py: routes, every rule kind, overlapping ranks, TLR and deadline boundaries, jobs
pinned to queue 0, ECN thresholds) and up to 8 packets; ``P4RuntimeDriver.apply`` writes the state (the
controller's own code path, so its encoding is under test too), and each packet goes in on ``h1`` alone. What
comes out must be what ``conformance.p4_outcome`` predicts from docs/dataplane.md and ``reference_queue``: the
frame byte for byte on the right port (MACs, TTL, checksum, the queue byte, no ECN mark on an idle switch), or
the packet-in, or nothing; and the counters must move exactly so: enqueued and transmitted packets (and bytes)
of that (port, queue), malformed_packets[reason], queue0_guard_packets, the job's direct counter.

A dropped packet shows nothing, so it is followed by a marker (a packet to ``MARKER_DST``, always routed):
BMv2's ingress is one thread, so once the marker is out, the dropped packet has been through ingress and its
counters are final. Prints one JSON line of statistics; exits 1 with the falsifying example on a mismatch.
"""
from __future__ import annotations

import argparse
import collections
import json
import select
import socket
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from support.conformance import (MARKER_DST, PacketSpec, ethernet, p4_outcome, p4_states, packets)

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
HOST_PORTS = (1, 2, 3)
SENDER_MAC, SWITCH_MAC = "02:00:00:00:00:a1", "02:00:00:00:00:5a"
WAIT_S = 3.0
"""Deadline for a frame or packet-in that must come (not a measurement: BMv2 takes milliseconds)."""


def marker() -> bytes:
    return PacketSpec(proto=17, sport=9, dport=9, payload=b"marker", dst=MARKER_DST).bytes()


class Bmv2Ports:
    """The host ends of the switch's ports: send on h1, receive on every h<i>."""

    def __init__(self) -> None:
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind(("h1", 0))
        self.rx = {}
        for port in HOST_PORTS:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((f"h{port}", ETH_P_ALL))
            s.setblocking(False)
            self.rx[port] = s

    def send(self, frame: bytes) -> None:
        self.tx.send(frame)

    def received(self, timeout: float) -> list[tuple[int, bytes]]:
        """Frames that arrive within ``timeout`` (all waiting ones, then those that come until the deadline)."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            ready = select.select(list(self.rx.values()), [], [], max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                return out
            for port, s in self.rx.items():
                if s in ready:
                    while True:
                        try:
                            frame, addr = s.recvfrom(65535)
                        except BlockingIOError:
                            break
                        if addr[2] != PACKET_OUTGOING:
                            out.append((port, frame))

    def wait_for(self, port: int, frame: bytes, seen: list[tuple[int, bytes]]) -> bool:
        """Collect arriving frames into ``seen`` until ``frame`` arrived on ``port`` (or the deadline)."""
        deadline = time.monotonic() + WAIT_S
        while (port, frame) not in seen and time.monotonic() < deadline:
            seen.extend(self.received(min(0.05, max(0.0, deadline - time.monotonic()))))
        return (port, frame) in seen


def snapshot(driver: P4RuntimeDriver) -> collections.Counter:
    c = driver.read_counters()
    out: collections.Counter = collections.Counter()
    for q in c.queues:
        out[("enqueued", q.port, q.qid)] = q.enqueued
        out[("transmitted", q.port, q.qid)] = q.transmitted
        out[("transmitted_bytes", q.port, q.qid)] = q.transmitted_bytes
    for job, n in c.job_packets.items():
        out[("job", job)] = n
    for reason, n in c.malformed.items():
        out[("malformed", reason)] = n
    out[("guard",)] = int(driver.stats()["queue0_guard_packets"])
    return out


def delta(after: collections.Counter, before: collections.Counter) -> dict:
    return {k: after[k] - before[k] for k in set(after) | set(before) if after[k] != before[k]}


def expected_counts(outcome, frame_len: int) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    if outcome.verdict == "forward":
        out[("enqueued", outcome.port, outcome.qid)] += 1
        out[("transmitted", outcome.port, outcome.qid)] += 1
        out[("transmitted_bytes", outcome.port, outcome.qid)] += frame_len
        if outcome.guarded:
            out[("guard",)] += 1
        if outcome.job_hit is not None:
            out[("job", outcome.job_hit)] += 1
    elif outcome.verdict == "drop":
        out[("malformed", outcome.reason)] += 1
    return out


class Check:
    def __init__(self, driver: P4RuntimeDriver, ports: Bmv2Ports) -> None:
        self.driver = driver
        self.ports = ports
        self.stats: collections.Counter = collections.Counter()

    def packet(self, state, spec: PacketSpec, ethertype: int) -> None:
        packet = spec.bytes()
        frame = ethernet(packet, dst=SWITCH_MAC, src=SENDER_MAC, ethertype=ethertype)
        outcome = p4_outcome(state, packet, ingress_port=1, ethertype=ethertype)
        stray = self.ports.received(0) + [(255, p) for p, _ in self.driver.drain_packet_in()]
        assert not stray, ("frames nobody sent for", stray)
        before = snapshot(self.driver)
        self.ports.send(frame)
        want = expected_counts(outcome, len(frame))
        seen: list[tuple[int, bytes]] = []
        packet_ins: list[tuple[bytes, int | None]] = []
        if outcome.verdict == "forward":
            assert self.ports.wait_for(outcome.port, outcome.frame, seen), \
                ("expected frame did not arrive", outcome.port, outcome.frame.hex(), [(p, f.hex()) for p, f in seen],
                 spec)
            seen.remove((outcome.port, outcome.frame))
        elif outcome.verdict == "cpu":
            deadline = time.monotonic() + WAIT_S
            while not packet_ins and time.monotonic() < deadline:
                time.sleep(0.002)
                packet_ins = self.driver.drain_packet_in()
            assert packet_ins == [(frame, 1)], ("expected a packet-in from port 1", packet_ins, spec)
            packet_ins = []
        else:
            mark = ethernet(marker(), dst=SWITCH_MAC, src=SENDER_MAC)
            mark_outcome = p4_outcome(state, marker())
            self.ports.send(mark)
            assert self.ports.wait_for(mark_outcome.port, mark_outcome.frame, seen), ("the marker did not arrive", spec)
            seen.remove((mark_outcome.port, mark_outcome.frame))
            want += expected_counts(mark_outcome, len(mark))
        seen += self.ports.received(0)
        packet_ins += self.driver.drain_packet_in()
        assert not seen and not packet_ins, ("frames that should not be there", [(p, f.hex()) for p, f in seen],
                                             packet_ins, outcome, spec)
        got = delta(snapshot(self.driver), before)
        assert got == dict(want), ("counters", got, dict(want), outcome, spec)
        self.stats["packets"] += 1
        self.stats[outcome.verdict] += 1
        if outcome.verdict == "forward":
            self.stats[f"q{outcome.qid}"] += 1
            self.stats["guarded"] += outcome.guarded
            self.stats["job_hits"] += outcome.job_hit is not None
        elif outcome.verdict == "drop":
            self.stats[outcome.reason] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--device-id", type=int, default=1)
    ap.add_argument("--p4info", required=True)
    ap.add_argument("--bmv2-json", required=True)
    ap.add_argument("--examples", type=int, default=300)
    args = ap.parse_args()
    driver = P4RuntimeDriver("bmv2", P4RuntimeOptions(
        address=f"127.0.0.1:{args.grpc_port}", device_id=args.device_id, p4info=str(Path(args.p4info)),
        bmv2_json=str(Path(args.bmv2_json)), ports=HOST_PORTS))
    driver.connect()
    ports = Bmv2Ports()
    check = Check(driver, ports)
    t0 = time.monotonic()

    @settings(max_examples=args.examples, deadline=None, database=None)
    @given(state=p4_states(), pkts=st.lists(st.tuples(packets(), st.sampled_from([0x0800] * 15 + [0x86DD])),
                                            min_size=1, max_size=8))
    def agreement(state, pkts):
        driver.apply(state)
        for spec, ethertype in pkts:
            check.packet(state, spec, ethertype)
        check.stats["examples"] += 1

    try:
        agreement()
    finally:
        driver.close()
    check.stats["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(dict(check.stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
