"""What the tests that run a receiver in a process of its own share: a free port, the process's memory, and
waiting until it answers."""
from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from netapprox.hostlib import wire
from hostlib_sim import announce


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, from /proc."""
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) for k in ("VmRSS", "VmHWM")}


def wait_until_serving(port: int, timeout: float = 10.0) -> None:
    """The receiver answers a token-less announce (an ACK: admitted at once, or a RETRY) once it is up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s.sendto(announce(1, [(0, 0.5, [0])], 1), ("127.0.0.1", port))
            try:
                if wire.decode(s.recv(2048))[0].type in (wire.PacketType.RETRY, wire.PacketType.ACK):
                    return
            except (socket.timeout, ConnectionRefusedError):
                pass
    raise AssertionError(f"receiver on port {port} did not answer within {timeout} s")
