"""Runs inside the test's network namespace (``ip netns exec NS python bmv2_restart_scenario.py ...``), where the
test made veth pairs swp1-h1 and swp2-h2: starts ``simple_switch_grpc`` itself, runs the controller CLI as a
process of its own (``python -m netapprox.controller``), streams UDP packets h1 -> h2 through the switch, and
then

1. kills the controller (SIGKILL) and starts it again while the packets keep flowing: every packet must
   arrive, the pipeline must not be pushed again (same cookie, counters not reset), the job entry and its
   direct counter must survive;
2. stops the switch and starts a fresh one: the controller must re-arm it (pipeline, every entry) within 2 s of
   the switch answering again.

Prints one JSON object; the test asserts on it. Everything started here is stopped here.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.p4runtime.protos import p4runtime_pb2, p4runtime_pb2_grpc
from netapprox.hostlib.wire import Flags, Header, Report, encode, tlr_to_q15
from netapprox.topo.bmv2 import Bmv2Options, Bmv2Process

from ctl_fixtures import controller_toml, scenario_args, stop_process

H1_IP, H2_IP = "10.0.0.1", "10.0.0.2"
JOB = 42
GRPC_PORT, THRIFT_PORT = 9559, 9090
ROUTE_TABLE = "NetApproxIngress.forwarding.routes_v4"


def mac(ifname: str) -> str:
    return Path(f"/sys/class/net/{ifname}/address").read_text().strip()


class Stream:
    """UDP packets h1 -> h2 at ``pps``, numbered; ATP DATA of job 42 every 4th packet. Counts what arrives."""

    def __init__(self, pps: float) -> None:
        self.pps = pps
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind(("h1", 0))
        self.rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.rx.bind(("h2", 0))
        self.src, self.dst = mac("h1"), mac("swp1")
        self.sent = 0
        self.received: set[int] = set()
        self.queues: dict[int, int] = {}
        self.stop = threading.Event()
        self.sending = threading.Event()
        self.sending.set()
        self._threads = [threading.Thread(target=self._send, daemon=True),
                         threading.Thread(target=self._receive, daemon=True)]

    def _frame(self, seq: int) -> bytes:
        if seq % 4 == 0:
            payload = encode(Header(flags=int(Flags.APPROX), job_id=JOB, msg_id=seq, tlr=tlr_to_q15(0.95)),
                             struct.pack("!I", seq))
            dport = 7600
        else:
            payload, dport = struct.pack("!I", seq), 5001
        return bytes(Ether(src=self.src, dst=self.dst) / IP(src=H1_IP, dst=H2_IP, ttl=64)
                     / UDP(sport=40000, dport=dport) / payload)

    def _send(self) -> None:
        next_t = time.monotonic()
        while not self.stop.is_set():
            if self.sending.is_set():
                self.tx.send(self._frame(self.sent))
                self.sent += 1
            next_t += 1.0 / self.pps
            time.sleep(max(0.0, next_t - time.monotonic()))

    def _receive(self) -> None:
        while not self.stop.is_set():
            if not select.select([self.rx], [], [], 0.1)[0]:
                continue
            data = self.rx.recv(4096)
            if len(data) < 14 + 20 + 8 + 4 or data[12:14] != b"\x08\x00" or data[23] != 17:
                continue
            udp = 14 + (data[14] & 0x0F) * 4
            dport = struct.unpack_from("!H", data, udp + 2)[0]
            if dport == 7600 and len(data) >= udp + 8 + 36:
                (seq,) = struct.unpack_from("!I", data, udp + 8 + 32)
                self.queues[data[udp + 8 + 2]] = self.queues.get(data[udp + 8 + 2], 0) + 1
            elif dport == 5001:
                (seq,) = struct.unpack_from("!I", data, udp + 8)
            else:
                continue
            self.received.add(seq)

    def start(self) -> "Stream":
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(5)
        self.tx.close()
        self.rx.close()


def reader(address: str):
    """A read-only P4Runtime client (Reads need no arbitration)."""
    channel = grpc.insecure_channel(address)
    stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)

    def read(entity: p4runtime_pb2.Entity) -> list:
        try:
            return [e for r in stub.Read(p4runtime_pb2.ReadRequest(device_id=1, entities=[entity]), timeout=2)
                    for e in r.entities]
        except grpc.RpcError:
            return []

    def cookie() -> int | None:
        try:
            return stub.GetForwardingPipelineConfig(p4runtime_pb2.GetForwardingPipelineConfigRequest(
                device_id=1, response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY),
                timeout=2).config.cookie.cookie
        except grpc.RpcError:
            return None

    return channel, read, cookie


def main() -> int:
    args = scenario_args()
    work = args.workdir
    p4info = P4Info.load(args.p4info)
    job_table = p4info.table("NetApproxIngress.classification.queue_by_job").id
    enqueued = p4info.counter_id("NetApproxIngress.enqueued_packets")
    report_port = 7611
    config = work / "controller.toml"
    config.write_text(controller_toml(
        address=f"127.0.0.1:{GRPC_PORT}", p4info=args.p4info, bmv2_json=args.bmv2_json, report_port=report_port,
        decision_log=work / "decisions.jsonl",
        routes=[(f"{H1_IP}/32", 1, mac("h1")), (f"{H2_IP}/32", 2, mac("h2"))],
        policy="job_timeout_s = 5.0\nhysteresis = 0.0",
        options=f"ports = [1, 2]\nthrift_port = {THRIFT_PORT}\nconnect_timeout_s = 5.0"))
    out: dict = {}
    switch_options = Bmv2Options(ports={1: "swp1", 2: "swp2"}, device_id=1, grpc_port=GRPC_PORT,
                                 thrift_port=THRIFT_PORT, log_level=None)
    switch = Bmv2Process(switch_options, work / "bmv2.log")
    controllers: list[subprocess.Popen] = []
    log = open(work / "controller.log", "ab")
    env = dict(os.environ)

    def start_controller() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "netapprox.controller", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        controllers.append(proc)
        return proc

    stream = None
    reports_stop = threading.Event()

    def report_loop() -> None:
        seq = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not reports_stop.wait(0.05):
                seq += 1
                s.sendto(Report(job_id=JOB, group_id=0, seq=seq, tlr=0.30, loss=0.0, msr=0.9, rate_kbps=1000,
                                total=100, delivered=0, lost=0, epoch=seq).encode(), ("127.0.0.1", report_port))

    reports = threading.Thread(target=report_loop, daemon=True)
    channel, read, cookie = reader(f"127.0.0.1:{GRPC_PORT}")
    all_entries = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0))

    def job_counter() -> int | None:
        e = p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
            table_entry=p4runtime_pb2.TableEntry(table_id=job_table)))
        got = read(e)
        return got[0].direct_counter_entry.data.packet_count if got else None

    def enqueued_total() -> int:
        e = p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(counter_id=enqueued))
        return sum(x.counter_entry.data.packet_count for x in read(e))

    try:
        switch.start(timeout=30)
        first = start_controller()
        reports.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and job_counter() is None:
            time.sleep(0.05)
        out["armed"] = job_counter() is not None
        if not out["armed"]:
            print(json.dumps(out))
            return 0
        entries = len(read(all_entries))
        out["entries"] = entries
        stream = Stream(pps=200).start()
        time.sleep(1.0)
        cookie_before = cookie()
        out["job_counter_before"] = job_counter()
        out["enqueued_before"] = enqueued_total()
        # 1. kill the controller, start it again, traffic flowing
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        time.sleep(0.5)
        start_controller()
        time.sleep(2.5)
        stream.sending.clear()
        time.sleep(0.5)
        out["sent"] = stream.sent
        out["lost"] = stream.sent - len(stream.received)
        out["queues"] = stream.queues
        out["cookie_unchanged"] = cookie() == cookie_before and cookie_before not in (None, 0)
        out["job_counter_after"] = job_counter()
        out["enqueued_after"] = enqueued_total()
        out["entries_after_controller_restart"] = len(read(all_entries))
        # 2. restart the switch
        switch.stop()
        time.sleep(0.5)
        switch = Bmv2Process(switch_options, work / "bmv2-2.log")
        switch.start(timeout=30)
        t0 = time.monotonic()
        rearmed = None
        while time.monotonic() - t0 < 10:
            if len(read(all_entries)) == entries and cookie() == cookie_before:
                rearmed = time.monotonic() - t0
                break
            time.sleep(0.02)
        out["switch_rearmed_s"] = rearmed
        out["controllers_alive"] = controllers[-1].poll() is None
    finally:
        reports_stop.set()
        if stream is not None:
            stream.close()
        channel.close()
        for proc in controllers:
            stop_process(proc)
        switch.stop()
        log.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
