"""The peer transports' simulated switches and their settings (C++ in ``netapprox_peers.h``): pFabric,
Homa, Aeolus (on ExpressPass-style credits).

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


HOMA_PORT = 7900
"""UDP port of Homa's packets (``kHomaPort``)."""
LEVELS = 8
"""Priority queues per switch port (as the NetApprox switch: 8, queue 0 served first)."""


def homa_levels(sizes: list[int] | tuple[int, ...], rtt_bytes: int) -> tuple[int, tuple[int, ...]]:
    """Homa's unscheduled priorities from the workload (Montazeri et al. 2018, §3.4): (U, cut-offs). Levels
    0..U-1 carry unscheduled packets, U in proportion to the share of the bytes that go unscheduled (the first
    ``rtt_bytes`` of every message), at least 1 and at most 7 (one level is left for scheduled packets). The
    cut-offs split the messages, smallest first, so that every unscheduled level carries the same unscheduled
    bytes: a message of ``size`` bytes uses level ``homa_level(size, cutoffs)``."""
    if not sizes or rtt_bytes < 1:
        raise ValueError("homa_levels needs message sizes and a positive RTTbytes")
    ordered = sorted(int(s) for s in sizes)
    unsched = [min(s, rtt_bytes) for s in ordered]
    total = sum(ordered)
    u = min(LEVELS - 1, max(1, round(LEVELS * sum(unsched) / total))) if total else 1
    cutoffs, acc, level, whole = [], 0, 0, sum(unsched)
    for s, b in zip(ordered, unsched):
        acc += b
        while level < u - 1 and acc >= whole * (level + 1) / u:
            cutoffs.append(s)
            level += 1
    while len(cutoffs) < u - 1:
        cutoffs.append(ordered[-1])
    cutoffs.append(ordered[-1])
    return u, tuple(cutoffs)


def homa_level(size: int, cutoffs: tuple[int, ...]) -> int:
    """The unscheduled level of a message of ``size`` bytes: the first whose cut-off is at least ``size``."""
    for i, c in enumerate(cutoffs):
        if size <= c:
            return i
    return len(cutoffs) - 1


class HomaSwitch(SimSwitch):
    """A switch node whose every port runs ``netapprox::HomaQueueDisc``: 8 strict-priority queues sharing
    ``capacity_packets`` (the NetApprox port's buffer), a Homa packet in the queue its header names."""

    def __init__(self, name: str, *, capacity_packets: int) -> None:
        if capacity_packets < 1:
            raise ValueError(f"homa switch {name}: capacity_packets {capacity_packets} < 1")
        super().__init__(name, buffer_packets=capacity_packets, fifo=True)
        self.capacity_packets = capacity_packets

    def add_port(self, device: Any, port: int) -> Any:
        if port in self._ports:
            raise ValueError(f"switch {self.name}: port {port} added twice")
        qd = switch_native.cpp().netapprox.InstallHomaQueueDisc(device, port, self.capacity_packets)
        self._ports[port] = qd
        return qd


AEOLUS_PORT = 8000
"""UDP port of Aeolus' packets (``kAeolusPort``)."""


class AeolusSwitch(SimSwitch):
    """A switch node whose every port runs ``netapprox::AeolusQueueDisc``: credits in a queue of
    ``credit_queue`` served at most once per data packet time of the port's link (ExpressPass' credit rate
    limiter), everything else in one FIFO of ``capacity_packets``, where an unscheduled packet finding
    ``threshold_packets`` or more is dropped (Aeolus' selective dropping)."""

    def __init__(self, name: str, *, capacity_packets: int, threshold_packets: int, credit_queue: int) -> None:
        if capacity_packets < 1 or credit_queue < 1 or not 0 <= threshold_packets <= capacity_packets:
            raise ValueError(f"aeolus switch {name}: capacity {capacity_packets}, threshold {threshold_packets}, "
                             f"credit queue {credit_queue}: need 0 <= threshold <= capacity, both queues >= 1")
        super().__init__(name, buffer_packets=capacity_packets, fifo=True)
        self.capacity_packets = capacity_packets
        self.threshold_packets = threshold_packets
        self.credit_queue = credit_queue

    def add_port(self, device: Any, port: int) -> Any:
        if port in self._ports:
            raise ValueError(f"switch {self.name}: port {port} added twice")
        qd = switch_native.cpp().netapprox.InstallAeolusQueueDisc(device, port, self.capacity_packets,
                                                                  self.threshold_packets, self.credit_queue)
        self._ports[port] = qd
        return qd
