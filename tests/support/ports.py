"""Local UDP ports for tests: whether a port is bound, read from the kernel's table without binding it.

A probe that binds the port to test it holds that port for a moment, and the process under test that binds it in
that moment fails with "Address already in use"; reading /proc/net/udp (and /proc/net/udp6) takes nothing.
"""
from __future__ import annotations


def udp_port_bound(port: int) -> bool:
    """Whether a UDP socket of this host (any address, IPv4 or IPv6) is bound to ``port`` (Linux /proc/net/udp*)."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except FileNotFoundError:
            continue
        if any(row.split()[1].endswith(suffix) for row in rows):
            return True
    return False
