"""Runs inside the test's network namespace (``ip netns exec NS python bmv2_scenario.py ...``), next to a
``simple_switch_grpc`` the test started there: the controller programs it, hosts report TLRs (over UDP and
as REPORT packets punted by the switch), and ATP DATA probes sent on veth ``h1`` are read back on ``h2``
to see which logical queue the switch stamped. Prints one JSON object; the test asserts on it.
"""
from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import threading
import time
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
from netapprox.controller.runtime import Runtime
from netapprox.controller.model import Route
from netapprox.hostlib.wire import Flags, Header, PacketType, Report, encode, tlr_to_q15
from support.paper_policy import PolicyConfig

H1_IP, H2_IP, CTL_IP = "10.0.0.1", "10.0.0.2", "10.0.0.100"
JOB = 42


def mac(ifname: str) -> str:
    return Path(f"/sys/class/net/{ifname}/address").read_text().strip()


class Probe:
    """Sends ATP DATA on h1 (raw socket) and reads the queue byte of what arrives on h2."""

    def __init__(self) -> None:
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind(("h1", 0))
        self.rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.rx.bind(("h2", 0))
        self.msg = 0
        self.src, self.swp1 = mac("h1"), mac("swp1")

    def frame(self, payload: bytes, dport: int, dst_ip: str) -> bytes:
        return bytes(Ether(src=self.src, dst=self.swp1) / IP(src=H1_IP, dst=dst_ip, ttl=64)
                     / UDP(sport=40000, dport=dport) / payload)

    def send_report(self, report: Report) -> None:
        self.tx.send(self.frame(report.encode(), 7601, CTL_IP))

    def queue_of_next_probe(self, packet_tlr: float, timeout: float = 1.0) -> int | None:
        self.msg += 1
        header = Header(type=PacketType.DATA, flags=int(Flags.APPROX), job_id=JOB, msg_id=self.msg,
                        tlr=tlr_to_q15(packet_tlr))
        self.tx.send(self.frame(encode(header, b"x" * 64), 7600, H2_IP))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not select.select([self.rx], [], [], max(0.0, end - time.monotonic()))[0]:
                break
            data = self.rx.recv(4096)
            if len(data) < 14 + 20 + 8 + 32 or data[12:14] != b"\x08\x00" or data[23] != 17:
                continue
            udp = 14 + (data[14] & 0x0F) * 4
            atp = udp + 8
            if struct.unpack_from("!H", data, udp + 2)[0] != 7600:
                continue
            job, msg = struct.unpack_from("!II", data, atp + 4)
            if job == JOB and msg == self.msg:
                return data[atp + 2]
        return None


def wait_for_queue(probe: Probe, expected: int, t0: float, timeout: float) -> float | None:
    """Probe every 2 ms until the stamped queue is ``expected``; seconds since ``t0``, or None."""
    while time.monotonic() - t0 < timeout:
        if probe.queue_of_next_probe(packet_tlr=0.95, timeout=0.2) == expected:
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--thrift-port", type=int, required=True)
    ap.add_argument("--p4info", required=True)
    ap.add_argument("--bmv2-json", required=True)
    ap.add_argument("--epoch-ms", type=float, default=50.0)
    args = ap.parse_args()
    epoch_s = args.epoch_ms / 1000.0
    sw_mac = "02:00:00:00:ff:00"
    options = {"address": f"127.0.0.1:{args.grpc_port}", "p4info": args.p4info, "bmv2_json": args.bmv2_json,
               "ports": [1, 2], "thrift_port": args.thrift_port, "buffer_packets": 64, "connect_timeout_s": 10.0}
    config = ControllerConfig(
        switches=(SwitchConfig("s1", options=options, routes=(
            Route(H1_IP, 32, 1, sw_mac, mac("h1")), Route(H2_IP, 32, 2, sw_mac, mac("h2")))),),
        policy=PolicyConfig(hysteresis=0.0, job_timeout_s=30.0),
        reports=ReportConfig(bind="127.0.0.1", port=0), epoch_s=epoch_s, counters_every=1)
    out: dict = {"epoch_s": epoch_s}
    ctl = Runtime(config)
    stop = threading.Event()
    runner = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    try:
        out["up"] = ctl.connect(20)
        if not out["up"]:
            out["error"] = ctl._switches["s1"].last_error
            return print(json.dumps(out)) or 0
        driver = ctl.driver("s1")
        out["queue_config_error"] = driver.queue_config_error
        runner.start()
        probe = Probe()
        time.sleep(3 * epoch_s)
        # before any report: the packet's own TLR (0.95) decides through queue_by_tlr -> queue 7
        out["before"] = probe.queue_of_next_probe(packet_tlr=0.95)
        steps = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for seq, (tlr, expected, via) in enumerate(
                    [(0.30, 2, "udp"), (0.80, 6, "udp"), (0.55, 4, "packet_in"), (0.05, 1, "packet_in")], start=1):
                report = Report(job_id=JOB, group_id=0, seq=seq, tlr=tlr, loss=0.0, msr=0.9, rate_kbps=1000,
                                total=100, delivered=0, lost=0, epoch=seq)
                t0 = time.monotonic()
                if via == "udp":
                    s.sendto(report.encode(), ctl.report_address)
                else:
                    probe.send_report(report)
                latency = wait_for_queue(probe, expected, t0, timeout=5.0)
                steps.append({"tlr": tlr, "expected": expected, "via": via, "latency_s": latency})
        out["steps"] = steps
        time.sleep(2 * epoch_s)
        counters = driver.read_counters()
        out["enqueued_port2"] = {q.qid: q.enqueued for q in counters.queues if q.port == 2}
        out["job_packets"] = dict(counters.job_packets)
    finally:
        stop.set()
        if runner.is_alive():
            runner.join(5)
        ctl.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
