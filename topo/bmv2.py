"""The one BMv2 launcher: ``simple_switch_grpc`` with NetApprox's options, a readiness probe, stop by PID.

Used by the Mininet ``BMv2Switch``, the PTF runner (ptf/run_ptf.py) and the BMv2 controller tests::

    with Bmv2Process(Bmv2Options(ports={1: "swp1", 2: "swp2"}, netns="na-p4-x"), log=path) as sw:
        ...  # sw.grpc_address answers P4Runtime; the controller pushes the pipeline

Command line (verified with BMv2 1.15.5; target options go after ``--``)::

    simple_switch_grpc --no-p4 --device-id D -i 1@swp1 ... --thrift-port T --log-level warn \
        -- --grpc-server-addr 127.0.0.1:G --cpu-port 255 --priority-queues 8

In a network namespace it runs under ``ip netns exec`` (which execs, so the PID is the switch's own) and the
probe connects from inside that namespace.
"""
from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from netapprox.topo.netns import Lifecycle, stop_process

CPU_PORT = 255
PRIORITY_QUEUES = 8
P4_TOOLS_HINT = ("BMv2 is not installed: `simple_switch_grpc` (BMv2 >= 1.15.1 built with PI/P4Runtime and "
                 "Thrift) and `p4c-bm2-ss` (p4c) must be on PATH. Build them from https://github.com/p4lang/"
                 "behavioral-model and https://github.com/p4lang/p4c (or install the p4lang packages), then "
                 "run `make p4`; see docs/emulation.md.")


class Bmv2Error(RuntimeError):
    """simple_switch_grpc could not be started or did not become ready; the message has its log's tail."""


def bmv2_available() -> bool:
    return shutil.which("simple_switch_grpc") is not None and shutil.which("p4c-bm2-ss") is not None


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Bmv2Options:
    """One simple_switch_grpc instance."""

    ports: Mapping[int, str]
    """BMv2 port number -> interface name."""
    device_id: int = 0
    """P4Runtime device id."""
    grpc_port: int = 9559
    """P4Runtime server port on 127.0.0.1 (of ``netns``)."""
    thrift_port: int | None = 9090
    """Thrift runtime port (queue depth/rate); None: BMv2's default (9090) and not probed."""
    cpu_port: int = CPU_PORT
    """Port of packet-in/packet-out."""
    netns: str | None = None
    """Run inside this named network namespace."""
    json: str | None = None
    """Start with this BMv2 JSON; None: ``--no-p4`` (the controller pushes the pipeline)."""
    cpus: str | None = None
    """Pin to these CPUs (``taskset -c``)."""
    log_level: str | None = "warn"
    """BMv2 console log level (``--log-level``); None: BMv2's default."""
    event_log: str | None = None
    """``--log-file`` prefix for BMv2's own packet log (with ``--log-flush``)."""
    pcap_dir: str | None = None
    """Write one pcap per port and direction here (BMv2's ``--pcap``)."""

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        cmd = ["simple_switch_grpc", "--device-id", str(self.device_id)]
        for port, ifname in sorted(self.ports.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        if self.thrift_port is not None:
            cmd += ["--thrift-port", str(self.thrift_port)]
        if self.log_level is not None:
            cmd += ["--log-level", self.log_level]
        if self.event_log is not None:
            cmd += ["--log-file", self.event_log, "--log-flush"]
        if self.pcap_dir is not None:
            cmd += [f"--pcap={self.pcap_dir}"]
        cmd += [self.json] if self.json else ["--no-p4"]
        cmd += ["--", "--grpc-server-addr", self.grpc_address, "--cpu-port", str(self.cpu_port),
                "--priority-queues", str(PRIORITY_QUEUES)]
        if self.cpus is not None:
            cmd = ["taskset", "-c", self.cpus, *cmd]  # taskset execs too: the PID stays the switch's
        if self.netns is not None:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        return cmd


class Bmv2Process(Lifecycle):
    """Start with ``start()`` (or as a context manager), which returns once the gRPC (and Thrift) ports
    answer; ``stop()`` stops exactly this PID."""

    def __init__(self, options: Bmv2Options, log: Path) -> None:
        self.options = options
        self.log = Path(log)
        self.proc: subprocess.Popen | None = None

    @property
    def grpc_address(self) -> str:
        return self.options.grpc_address

    def start(self, timeout: float = 30.0) -> None:
        if shutil.which("simple_switch_grpc") is None:
            raise Bmv2Error(P4_TOOLS_HINT)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.options.command(), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        ports = [self.options.grpc_port] + ([self.options.thrift_port] if self.options.thrift_port else [])
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise Bmv2Error(f"simple_switch_grpc exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._answers(ports):
                return
            if time.monotonic() >= deadline:
                raise Bmv2Error(f"simple_switch_grpc did not open ports {ports} within {timeout:g} s:\n"
                                f"{self.log_tail()}")
            time.sleep(0.1)

    def _answers(self, ports: list[int]) -> bool:
        if self.options.netns is None:
            for port in ports:
                with socket.socket() as s:
                    s.settimeout(0.2)
                    if s.connect_ex(("127.0.0.1", port)) != 0:
                        return False
            return True
        probe = "import socket,sys\nfor p in sys.argv[1:]: socket.create_connection(('127.0.0.1', int(p)), 0.5).close()"
        res = subprocess.run(["ip", "netns", "exec", self.options.netns, sys.executable, "-c", probe,
                              *map(str, ports)], capture_output=True)
        return res.returncode == 0

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10.0)
            self.proc = None

    def close(self) -> None:
        self.stop()
