"""BMv2 per-queue buffers and rates over Thrift (P4Runtime has no queue configuration entity).

The one BMv2 Thrift client of the project: the P4Runtime driver sizes queues with it, the PTF suite also sets
queue rates with it.

BMv2's ``simple_switch`` serves priority queues from the highest ``standard_metadata.priority`` down
(queueing.h, ``QueueingLogicPriRL``: priority 0 is the lowest), while logical queue 0 is the highest. So
BMv2 priority = 7 - logical queue (``bmv2_priority``); the P4 program sets ``priority`` that way, see
docs/dataplane.md. Capacities are in packets: ``set_queue_depth <pkts> <port> <priority>``.

Two ways to send them: ``SimpleSwitchThrift`` speaks the few Thrift calls directly (TBinaryProtocol over
TCP, multiplexed service ``simple_switch``; no ``thrift`` package needed), or ``run_cli`` drives
``simple_switch_CLI --thrift-port N`` with ``set_queue_depth`` commands on stdin (needs a Python with
``thrift`` for the CLI).
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import re
import shutil
import socket
import struct
import subprocess
from typing import Iterable

from netapprox.controller.errors import ConfigError, QueueConfigError
from netapprox.controller.model import NUM_QUEUES, queue_buffer_packets

log = logging.getLogger("netapprox.controller.p4runtime")

MIN_BMV2_VERSION = (1, 15, 1)
"""BMv2 releases before 1.15.1 number priority queues the other way round and share ``enq_qdepth`` across them;
the program's logical queue -> priority mapping (docs/dataplane.md) is right only from 1.15.1 on."""


class Bmv2VersionError(ConfigError):
    """The BMv2 on this host is older than ``MIN_BMV2_VERSION`` (or does not say its version)."""


def parse_bmv2_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from ``simple_switch_grpc --version`` output (e.g. ``1.15.5-693e69e6``)."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


@functools.lru_cache(maxsize=8)
def bmv2_version(binary: str = "simple_switch_grpc") -> tuple[tuple[int, int, int] | None, str] | None:
    """(version, its text) of the BMv2 executable on PATH, or None when there is none."""
    exe = shutil.which(binary)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    text = (out.stdout + out.stderr).strip()
    return parse_bmv2_version(text), text


def check_bmv2_version(binary: str = "simple_switch_grpc") -> tuple[int, int, int] | None:
    """The version of ``binary`` on PATH (None when there is none); raises ``Bmv2VersionError`` when it is
    below 1.15.1 or unreadable."""
    found = bmv2_version(binary)
    if found is None:
        return None
    version, text = found
    want = ".".join(map(str, MIN_BMV2_VERSION))
    if version is None:
        raise Bmv2VersionError(f"cannot tell the version of {binary} ({text!r}); NetApprox needs BMv2 >= {want}")
    if version < MIN_BMV2_VERSION:
        raise Bmv2VersionError(f"{binary} is BMv2 {'.'.join(map(str, version))}; NetApprox needs BMv2 >= {want} "
                               "(older releases number priority queues the other way round, so every job would "
                               "land in the wrong queue): upgrade behavioral-model")
    return version


def check_local_bmv2(switch: str, address: str, binary: str = "simple_switch_grpc") -> None:
    """At start-up: when ``switch`` runs on this host (a loopback P4Runtime address), check its BMv2's version."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        log.info("switch %r at %s: not on this host, BMv2 version not checked (NetApprox needs >= 1.15.1)",
                 switch, address)
        return
    try:
        if check_bmv2_version(binary) is None:
            log.info("switch %r: %s not on PATH, BMv2 version not checked (NetApprox needs >= 1.15.1)", switch, binary)
    except Bmv2VersionError as e:
        raise Bmv2VersionError(f"switch {switch!r}: {e}") from None


def bmv2_priority(qid: int) -> int:
    """BMv2 ``standard_metadata.priority`` of logical queue ``qid`` (0 = highest logical = BMv2 7)."""
    return NUM_QUEUES - 1 - qid


def queue_depth_commands(ports: Iterable[int], total_packets: int, unit: int = 1) -> list[str]:
    """``set_queue_depth`` commands: queue k >= 1 gets ``unit`` x (8 - k) packets, queue 0 the rest of
    ``total_packets``."""
    return [f"set_queue_depth {depth} {port} {prio}" for port, prio, depth in queue_depths(ports, total_packets, unit)]


def run_cli(commands: list[str], thrift_port: int, *, cli: str = "simple_switch_CLI", timeout: float = 20.0) -> str:
    """Run ``commands`` through the BMv2 CLI; raise ``QueueConfigError`` with the CLI's words on failure."""
    exe = shutil.which(cli)
    if exe is None:
        raise QueueConfigError(f"{cli!r} not found on PATH; it comes with BMv2 built with Thrift "
                               "(or set the switch option thrift_port to none to skip queue sizing)")
    argv = [exe, "--thrift-port", str(thrift_port)]
    try:
        proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise QueueConfigError(f"{' '.join(argv)} did not finish within {timeout}s") from None
    out = proc.stdout + proc.stderr
    bad = [line for line in out.splitlines()
           if any(w in line for w in ("Error", "Invalid", "Could not connect", "Traceback"))]
    if proc.returncode != 0 or bad:
        raise QueueConfigError(f"{' '.join(argv)} failed (exit {proc.returncode}): "
                               + ("; ".join(bad[:3]) or out.strip()[-300:]))
    return out


def queue_depths(ports: Iterable[int], total_packets: int, unit: int = 1) -> list[tuple[int, int, int]]:
    """(port, BMv2 priority, depth in packets) for every port and logical queue (``unit``: the switch option
    ``approx_buffer_unit``, ``model.queue_buffer_packets``)."""
    return [(port, bmv2_priority(qid), queue_buffer_packets(qid, total_packets, unit=unit))
            for port in sorted(set(ports)) for qid in range(NUM_QUEUES)]


_VERSION_1 = 0x80010000
_CALL, _EXCEPTION = 1, 3
_T_STOP, _T_I32, _T_I64, _T_STRING, _T_STRUCT = 0, 8, 10, 11, 12


class SimpleSwitchThrift:
    """The ``simple_switch`` Thrift service calls for queue sizing, spoken directly.

    ``set_egress_priority_queue_depth(port, priority, depth_pkts)`` returns nothing on success and raises
    ``InvalidQueueOperation`` (reply field 1) for a bad port or priority."""

    SERVICE = "simple_switch"

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise QueueConfigError(f"cannot reach BMv2's Thrift server at {host}:{port}: {e} (start "
                                   "simple_switch_grpc with --thrift-port, or unset thrift_port)") from None
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "SimpleSwitchThrift":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_egress_priority_queue_depth(self, port: int, priority: int, depth_pkts: int) -> None:
        """Capacity of one (port, BMv2 priority) queue, packets (BMv2's default is 64)."""
        self._call("set_egress_priority_queue_depth", ((_T_I32, port), (_T_I32, priority), (_T_I32, depth_pkts)))

    def set_egress_priority_queue_rate(self, port: int, priority: int, rate_pps: int) -> None:
        """Rate limit of one (port, BMv2 priority) queue, packets/s; 0 removes the limit."""
        self._call("set_egress_priority_queue_rate", ((_T_I32, port), (_T_I32, priority), (_T_I64, rate_pps)))

    def _call(self, method: str, args: tuple[tuple[int, int], ...]) -> None:
        self._seq += 1
        name = f"{self.SERVICE}:{method}".encode()
        msg = [struct.pack("!II", _VERSION_1 | _CALL, len(name)), name, struct.pack("!i", self._seq)]
        for field_id, (ttype, value) in enumerate(args, start=1):
            msg.append(struct.pack("!bh", ttype, field_id) + struct.pack("!i" if ttype == _T_I32 else "!q", value))
        msg.append(struct.pack("!b", _T_STOP))
        try:
            self._sock.sendall(b"".join(msg))
            mtype = self._read_i32() & 0xFF
            self._read_exact(self._read_i32())  # method name
            self._read_i32()  # sequence id
            body = self._read_struct()
        except (OSError, struct.error) as e:
            raise QueueConfigError(f"BMv2 Thrift {method}: {e}") from None
        call = f"BMv2 Thrift {method}({', '.join(str(v) for _, v in args)})"
        if mtype == _EXCEPTION:
            detail = body.get(1, body)
            text = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
            raise QueueConfigError(f"{call}: {text}")
        if 1 in body:
            raise QueueConfigError(f"{call}: InvalidQueueOperation {body[1]} (is the port added to the switch?)")

    def _read_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise OSError("connection closed by the switch")
            buf += chunk
        return buf

    def _read_i32(self) -> int:
        return struct.unpack("!i", self._read_exact(4))[0]

    def _read_struct(self) -> dict[int, object]:
        fields: dict[int, object] = {}
        while True:
            ttype = self._read_exact(1)[0]
            if ttype == _T_STOP:
                return fields
            field_id = struct.unpack("!h", self._read_exact(2))[0]
            if ttype == _T_I32:
                fields[field_id] = self._read_i32()
            elif ttype == _T_I64:
                fields[field_id] = struct.unpack("!q", self._read_exact(8))[0]
            elif ttype == _T_STRING:
                fields[field_id] = self._read_exact(self._read_i32())
            elif ttype == _T_STRUCT:
                fields[field_id] = self._read_struct()
            else:
                raise OSError(f"unexpected Thrift type {ttype} in reply")


def set_queue_depths(ports: Iterable[int], total_packets: int, thrift_port: int, *, host: str = "127.0.0.1",
                     cli: str | None = None, unit: int = 1) -> list[tuple[int, int, int]]:
    """Size every (port, queue): over Thrift directly, or through ``cli`` when given. Returns what was set."""
    depths = queue_depths(ports, total_packets, unit)
    if cli:
        run_cli([f"set_queue_depth {d} {p} {prio}" for p, prio, d in depths], thrift_port, cli=cli)
        return depths
    with SimpleSwitchThrift(thrift_port, host) as sw:
        for port, prio, depth in depths:
            sw.set_egress_priority_queue_depth(port, prio, depth)
    return depths
