"""Mininet topologies: a single rack, a dumbbell and a small leaf-spine.

Each link carries its rate as the link option ``rate_mbit``; the switch classes (topo/switches.py) shape
their egress port on that link to it. Hosts are ``h1..hN`` (10.0.0.1..N/24); with ``ctl_host=True`` one
more host, ``ctl`` (10.0.0.254), hangs off the first switch: the controller's in-band address on the kernel
target, where REPORTs are sent.
"""
from __future__ import annotations

from mininet.topo import Topo

CTL_IP = "10.0.0.254"


def host_ip(i: int) -> str:
    """IP of host ``h<i>`` (1-based)."""
    return f"10.0.0.{i}"


class _Base(Topo):
    def _host(self, i: int) -> str:
        return self.addHost(f"h{i}", ip=f"{host_ip(i)}/24", mac=f"00:00:00:00:00:{i:02x}")

    def _ctl(self, switch: str, rate_mbit: float) -> None:
        ctl = self.addHost("ctl", ip=f"{CTL_IP}/24", mac="00:00:00:00:00:fe")
        self.addLink(ctl, switch, rate_mbit=rate_mbit)


class SingleRack(_Base):
    """One switch ``s1`` and ``hosts`` hosts, every link at ``rate_mbit``."""

    def build(self, hosts: int = 4, rate_mbit: float = 100.0, ctl_host: bool = True, **_):
        s1 = self.addSwitch("s1")
        for i in range(1, hosts + 1):
            self.addLink(self._host(i), s1, rate_mbit=rate_mbit)
        if ctl_host:
            self._ctl(s1, rate_mbit)


class Dumbbell(_Base):
    """``s1`` (hosts h1..hK) and ``s2`` (hosts hK+1..h2K) joined by one ``bottleneck_mbit`` link."""

    def build(self, hosts: int = 2, rate_mbit: float = 100.0, bottleneck_mbit: float | None = None,
              ctl_host: bool = True, **_):
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        for i in range(1, hosts + 1):
            self.addLink(self._host(i), s1, rate_mbit=rate_mbit)
        for i in range(hosts + 1, 2 * hosts + 1):
            self.addLink(self._host(i), s2, rate_mbit=rate_mbit)
        self.addLink(s1, s2, rate_mbit=bottleneck_mbit or rate_mbit)
        if ctl_host:
            self._ctl(s1, rate_mbit)


class LeafSpine(_Base):
    """``leaves`` leaf switches (``hosts`` hosts each) fully meshed to ``spines`` spine switches.

    The kernel target forwards unicast IPv4 by the ECMP groups the controller installs (every spine carries
    traffic; approximate ATP DATA is sprayed per packet) and bridges the rest over an STP tree; the BMv2
    target routes (one spine per destination host, chosen by the route computation in topo/net.py).
    """

    def build(self, hosts: int = 2, leaves: int = 2, spines: int = 2, rate_mbit: float = 100.0,
              bottleneck_mbit: float | None = None, ctl_host: bool = True, **_):
        spine_names = [self.addSwitch(f"spine{j}", dpid=f"{0x100 + j:x}") for j in range(1, spines + 1)]
        n = 0
        for i in range(1, leaves + 1):
            leaf = self.addSwitch(f"leaf{i}", dpid=f"{i:x}")
            for _ in range(hosts):
                n += 1
                self.addLink(self._host(n), leaf, rate_mbit=rate_mbit)
            for spine in spine_names:
                self.addLink(leaf, spine, rate_mbit=bottleneck_mbit or rate_mbit)
        if ctl_host:
            self._ctl("leaf1", rate_mbit)


TOPOLOGIES = {"rack": SingleRack, "dumbbell": Dumbbell, "leafspine": LeafSpine}


class FileTopo(Topo):
    """The network of a topology file (``topo.topofile.TopologySpec``), plus the ``ctl`` host on its first
    switch."""

    def build(self, spec=None, ctl_host: bool = True, **_):
        for name in spec.switches:
            self.addSwitch(name, dpid=f"{spec.switches.index(name) + 1:x}")
        for h in spec.hosts:
            last = int(h.ip.rsplit(".", 1)[1])
            host = self.addHost(h.name, ip=f"{h.ip}/24", mac=f"00:00:00:00:00:{last:02x}")
            self.addLink(host, h.switch, rate_mbit=spec.host_rate_mbit)
        for link in spec.links:
            self.addLink(link.a, link.b, rate_mbit=link.rate_mbit)
        if ctl_host:
            ctl = self.addHost("ctl", ip=f"{CTL_IP}/24", mac="00:00:00:00:00:fe")
            self.addLink(ctl, spec.switches[0], rate_mbit=spec.host_rate_mbit)
