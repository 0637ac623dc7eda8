"""The few BMv2 simple_switch Thrift calls the PTF suite needs (queue rate and depth), spoken directly.

simple_switch_CLI does the same through the `thrift` Python package and BMv2's generated bindings, which
are not part of the project's environment. The wire protocol for these calls is small: BMv2's runtime
server speaks TBinaryProtocol (strict) over a buffered TCP transport, multiplexed by service name
("simple_switch:<method>"). Each method takes i32/i64 arguments and returns an i32 (0 on success) or
raises InvalidQueueOperation (field 1).
"""
from __future__ import annotations

import socket
import struct

_VERSION_1 = 0x80010000
_CALL, _REPLY, _EXCEPTION = 1, 2, 3
_T_STOP, _T_I32, _T_I64, _T_STRUCT, _T_STRING = 0, 8, 10, 12, 11


class ThriftError(RuntimeError):
    """The switch refused a call (bad port/priority) or answered something unexpected."""


class SimpleSwitchThrift:
    """One connection to simple_switch's Thrift server. ``with SimpleSwitchThrift(port) as sw: ...``"""

    SERVICE = "simple_switch"

    def __init__(self, port: int = 9090, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "SimpleSwitchThrift":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the calls (simple_switch.thrift) ---------------------------------------------------------
    def set_egress_priority_queue_rate(self, port: int, priority: int, rate_pps: int) -> None:
        """Rate limit of one (port, priority) queue, packets/s; 0 removes the limit."""
        self._call("set_egress_priority_queue_rate", [(_T_I32, port), (_T_I32, priority), (_T_I64, rate_pps)])

    def set_egress_priority_queue_depth(self, port: int, priority: int, depth_pkts: int) -> None:
        """Capacity of one (port, priority) queue, packets (BMv2 default 64)."""
        self._call("set_egress_priority_queue_depth", [(_T_I32, port), (_T_I32, priority), (_T_I32, depth_pkts)])

    # --- binary protocol --------------------------------------------------------------------------
    def _call(self, method: str, args: list[tuple[int, int]]) -> int:
        self._seq += 1
        name = f"{self.SERVICE}:{method}".encode()
        msg = struct.pack("!II", _VERSION_1 | _CALL, len(name)) + name + struct.pack("!i", self._seq)
        for field_id, (ttype, value) in enumerate(args, start=1):
            msg += struct.pack("!bh", ttype, field_id)
            msg += struct.pack("!i" if ttype == _T_I32 else "!q", value)
        msg += struct.pack("!b", _T_STOP)
        self._sock.sendall(msg)
        return self._read_reply(method)

    def _read_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ThriftError("connection closed by the switch")
            buf += chunk
        return buf

    def _read_i32(self) -> int:
        return struct.unpack("!i", self._read_exact(4))[0]

    def _read_string(self) -> bytes:
        return self._read_exact(self._read_i32())

    def _skip(self, ttype: int) -> object:
        if ttype == _T_I32:
            return self._read_i32()
        if ttype == _T_I64:
            return struct.unpack("!q", self._read_exact(8))[0]
        if ttype == _T_STRING:
            return self._read_string()
        if ttype == _T_STRUCT:
            return self._read_struct()
        raise ThriftError(f"unexpected Thrift type {ttype} in reply")

    def _read_struct(self) -> dict[int, object]:
        fields = {}
        while True:
            ttype = struct.unpack("!b", self._read_exact(1))[0]
            if ttype == _T_STOP:
                return fields
            field_id = struct.unpack("!h", self._read_exact(2))[0]
            fields[field_id] = self._skip(ttype)

    def _read_reply(self, method: str) -> int:
        header = self._read_i32()
        mtype = header & 0xFF
        self._read_string()  # method name
        self._read_i32()  # seq id
        body = self._read_struct()
        if mtype == _EXCEPTION:
            raise ThriftError(f"{method}: application exception {body}")
        if 1 in body:
            raise ThriftError(f"{method}: InvalidQueueOperation {body[1]}")
        return int(body.get(0, 0))
