"""The peer transports' simulated switches and their settings (C++ in ``netapprox_peers.h``).

    sw = PfabricSwitch("e0_0", capacity_packets=pfabric_buffer_packets(topo))
    sw.add_port(device, 1)           # a pFabric queue disc on that egress device

A ``PfabricSwitch`` is a ``controller.sim.switch.SimSwitch`` whose ports run pFabric's queue (one queue of about
two bandwidth-delay products, least remaining bytes first, most remaining dropped first) instead of the
NetApprox queue disc: the controller's driver still programs its (unused) tables, reads its counters (all in
queue 0) and finds no buffers to change.
"""
from __future__ import annotations

import math
from typing import Any

from netapprox.controller.sim import native as switch_native
from netapprox.controller.sim.switch import SimSwitch

PFABRIC_PORT = 7800
"""UDP port of pFabric's packets (``kPfPort`` in netapprox_peers.h)."""
PFABRIC_HEADER = 24
"""Bytes of pFabric's header in every datagram (``kPfHeader``)."""


def bdp_packets(topo: Any, mtu: int = 1500) -> int:
    """One bandwidth-delay product of ``topo`` (its longest path's unloaded RTT at the host rate), in MTU packets,
    rounded up."""
    return max(1, math.ceil(topo.host_gbps * 1e9 * topo.base_rtt_s() / 8 / (mtu + 2)))


def pfabric_buffer_packets(topo: Any) -> int:
    """pFabric's per-port buffer: two bandwidth-delay products (Alizadeh et al. 2013, §4: 36 KB at 10 Gbit/s and
    a 12 µs RTT)."""
    return 2 * bdp_packets(topo)


class PfabricSwitch(SimSwitch):
    """A switch node whose every port runs ``netapprox::PfabricQueueDisc`` holding ``capacity_packets``."""

    def __init__(self, name: str, *, capacity_packets: int) -> None:
        if capacity_packets < 1:
            raise ValueError(f"pfabric switch {name}: capacity_packets {capacity_packets} < 1")
        super().__init__(name, buffer_packets=capacity_packets, fifo=True)
        self.capacity_packets = capacity_packets

    def add_port(self, device: Any, port: int) -> Any:
        if port in self._ports:
            raise ValueError(f"switch {self.name}: port {port} added twice")
        qd = switch_native.cpp().netapprox.InstallPfabricQueueDisc(device, port, self.capacity_packets)
        self._ports[port] = qd
        return qd
