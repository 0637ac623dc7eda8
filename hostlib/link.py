"""The rate of the link a datagram to a peer leaves by: the default R_max (``AtpConfig.max_rate_bps=None``).

The route to the peer is the kernel's own answer: a UDP socket connected to the peer (no packet is sent) gets the
local address the kernel picked, and the interface holding that address is the egress interface. Its speed is
``/sys/class/net/<interface>/speed`` (Mbit/s), which Ethernet drivers, veth (10,000) and most virtual NICs report.

- a peer on this host (loopback, or one of the host's own addresses): ``LOOPBACK_RATE_BPS``, 10 Gbit/s (the path
  is a memory copy; the sender's pacing and CPU are the limits);
- an interface that reports no speed (``-1``, or the file cannot be read: some virtual NICs, tunnels):
  ``DEFAULT_MAX_RATE_BPS``, 1 Gbit/s.

Linux only (``/sys``); elsewhere every peer gets ``DEFAULT_MAX_RATE_BPS``. Only adapters that do I/O call this;
the sans-I/O cores take ``None`` as ``DEFAULT_MAX_RATE_BPS``.
"""
from __future__ import annotations

import dataclasses
import fcntl
import ipaddress
import socket
import struct
from pathlib import Path
from typing import Any

from netapprox.hostlib.config import DEFAULT_MAX_RATE_BPS, AtpConfig

LOOPBACK_RATE_BPS = 10e9
SYS_CLASS_NET = Path("/sys/class/net")
_SIOCGIFADDR = 0x8915


@dataclasses.dataclass(frozen=True)
class LinkRate:
    """R_max for a peer and where it came from (printed in ``atp-send``'s summary)."""

    rate_bps: float
    source: str
    """``"eth0 link speed"``, ``"loopback"``, ``"default (eth0 reports no speed)"``, ``"given"``, ..."""

    def describe(self) -> str:
        return f"{format_rate(self.rate_bps)} ({self.source})"


def format_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def egress_interface(peer: tuple[Any, ...]) -> str | None:
    """The interface a datagram to ``peer`` (``(host, port, ...)``) leaves by, ``"lo"`` for this host, or
    ``None`` when it cannot be told (no route, not Linux)."""
    family = socket.AF_INET6 if ":" in str(peer[0]) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(peer[:2] if family == socket.AF_INET else peer)
            local = s.getsockname()[0]
    except OSError:
        return None
    addr = ipaddress.ip_address(local.split("%")[0])
    if addr.is_loopback or addr == ipaddress.ip_address(str(peer[0]).split("%")[0]):
        return "lo"
    return _interface_with_address(addr)


def _interface_with_address(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if addr.version == 6:
        try:
            lines = Path("/proc/net/if_inet6").read_text().splitlines()
        except OSError:
            return None
        want = addr.exploded.replace(":", "")
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and fields[0] == want:
                return fields[5]
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == str(addr):
                return name
    return None


def interface_speed_bps(name: str) -> float | None:
    """``/sys/class/net/<name>/speed`` in bit/s, or ``None`` when the interface reports none."""
    try:
        mbit = int((SYS_CLASS_NET / name / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return mbit * 1e6 if mbit > 0 else None


def link_rate(peer: tuple[Any, ...]) -> LinkRate:
    """R_max for sending to ``peer`` when none is configured (see the module docstring)."""
    name = egress_interface(peer)
    if name == "lo":
        return LinkRate(LOOPBACK_RATE_BPS, "loopback")
    if name is None:
        return LinkRate(DEFAULT_MAX_RATE_BPS, "default: the egress interface is unknown")
    speed = interface_speed_bps(name)
    if speed is None:
        return LinkRate(DEFAULT_MAX_RATE_BPS, f"default: {name} reports no speed")
    return LinkRate(speed, f"{name} link speed")


def resolve_rate(config: AtpConfig, peer: tuple[Any, ...]) -> tuple[AtpConfig, LinkRate]:
    """``config`` with ``max_rate_bps`` set: kept when given, else the egress link's rate towards ``peer``."""
    if config.max_rate_bps is not None:
        return config, LinkRate(config.max_rate_bps, "given")
    rate = link_rate(peer)
    initial = config.initial_rate_bps
    if initial is not None and initial > rate.rate_bps:  # a starting rate above the link's is the link's
        initial = rate.rate_bps
    return dataclasses.replace(config, max_rate_bps=rate.rate_bps, initial_rate_bps=initial), rate
