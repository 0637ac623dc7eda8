"""Data-center topologies in ns-3: a k-ary fat-tree and a 2-tier leaf-spine Clos, with flow-hash ECMP.

    net = Network(ns, g, TopologyConfig(kind="fattree", k=4), switch_mode="netapprox", buffer_packets=1000)
    net.hosts[0].ip                # host 0's IPv4 address (int); net.hosts[0].node is its ns-3 node
    net.switches["e0_1"]           # a controller.sim.switch.SimSwitch: its tables and port queue discs

Every switch port (the egress of a switch-side device) carries a NetApprox queue disc (``SimSwitch``); in
``switch_mode="fifo"`` the same queue disc with one queue holding the whole buffer (the network-oblivious
baseline); in ``switch_mode="pfabric"`` / ``"homa"`` pFabric's queue / Homa's priority queues on every switch port
and host NIC (experiments.sim.peers).
Hosts have a FIFO of ``host_queue_packets`` under their NIC. Devices hold one packet
(``TxQueue`` 1p), so packets wait in the queue discs, where the policy applies. Switches route with
``EcmpRouting`` (netapprox_sim_apps.h): for every host, every next hop on a shortest path, chosen per
flow by a hash of the 5-tuple and a per-switch seed.

Fat-tree (Al-Fares et al., SIGCOMM 2008): k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 core
switches, k/2 hosts per edge switch (k^3/4 hosts: 16 at k=4, 128 at k=8, 432 at k=12), every link at the
host rate: full bisection bandwidth. Clos: ``leaves`` leaf switches with ``hosts_per_leaf`` hosts each,
every leaf linked to every one of ``spines`` spine switches; fabric links default to
hosts_per_leaf x host rate / spines (no oversubscription).
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

from netapprox.controller.sim.switch import SimSwitch, queue_limits
from netapprox.experiments.sim.peers import AeolusSwitch, HomaSwitch, PfabricSwitch

PPP_HEADER = 2
"""Bytes ns-3's point-to-point device adds to an IP packet."""
BG_BASE = (10 << 24) | (128 << 16)
"""Host i's background address is 10.128.0.0 + i."""


@dataclasses.dataclass(frozen=True)
class TopologyConfig:
    """Shape, link rates and delays. Recorded in every result file."""

    kind: str = "fattree"
    """``fattree`` or ``clos``."""
    k: int = 4
    """Fat-tree arity (even): k^3/4 hosts."""
    leaves: int = 9
    """Clos: leaf (top-of-rack) switches."""
    spines: int = 4
    """Clos: spine switches."""
    hosts_per_leaf: int = 16
    """Clos: hosts under each leaf."""
    host_gbps: float = 40.0
    """Host link rate, Gbit/s."""
    fabric_gbps: float | None = None
    """Switch-to-switch link rate; None: the host rate (fat-tree) or no oversubscription (Clos)."""
    link_delay_us: float = 1.0
    """Propagation delay of every link, µs."""
    mtu: int = 1500
    """IP MTU of every link."""

    def __post_init__(self) -> None:
        if self.kind not in ("fattree", "clos"):
            raise ValueError(f"topology kind {self.kind!r}: choose fattree or clos")
        if self.kind == "fattree" and (self.k < 2 or self.k % 2):
            raise ValueError(f"fat-tree arity k={self.k} must be even and >= 2")
        if self.kind == "clos" and min(self.leaves, self.spines, self.hosts_per_leaf) < 1:
            raise ValueError("a Clos needs at least one leaf, one spine and one host per leaf")
        if not self.host_gbps > 0 or not self.link_delay_us >= 0:
            raise ValueError("link rates must be positive and delays non-negative")

    @property
    def n_hosts(self) -> int:
        if self.kind == "fattree":
            return self.k ** 3 // 4
        return self.leaves * self.hosts_per_leaf

    @property
    def fabric_rate_gbps(self) -> float:
        if self.fabric_gbps is not None:
            return self.fabric_gbps
        if self.kind == "fattree":
            return self.host_gbps
        return self.host_gbps * self.hosts_per_leaf / self.spines

    @property
    def max_hops(self) -> int:
        """Links on the longest host-to-host path."""
        return 6 if self.kind == "fattree" else 4

    def base_rtt_s(self, packet_bytes: int = 1500, ack_bytes: int = 64) -> float:
        """RTT of the longest path with empty queues: propagation both ways, one data packet and one ACK
        serialized at every hop (store and forward)."""
        hops = self.max_hops
        host_bits, fabric_hops = 8.0 * (packet_bytes + PPP_HEADER), hops - 2
        ser = 2 * host_bits / (self.host_gbps * 1e9) + fabric_hops * host_bits / (self.fabric_rate_gbps * 1e9)
        ser_ack = ser * (ack_bytes + PPP_HEADER) / (packet_bytes + PPP_HEADER)
        return 2 * hops * self.link_delay_us * 1e-6 + ser + ser_ack

    def short(self) -> str:
        """A plot-title label: ``k=8 fat-tree, 40G``."""
        shape = f"k={self.k} fat-tree" if self.kind == "fattree" else f"Clos {self.leaves}x{self.hosts_per_leaf}"
        return f"{shape}, {self.host_gbps:g}G"

    def describe(self) -> str:
        if self.kind == "fattree":
            return (f"k={self.k} fat-tree, {self.n_hosts} hosts, {5 * self.k ** 2 // 4} switches, "
                    f"{self.host_gbps:g} Gbit/s links, {self.link_delay_us:g} µs per link")
        return (f"2-tier Clos, {self.leaves} leaves x {self.hosts_per_leaf} hosts, {self.spines} spines, "
                f"{self.host_gbps:g} Gbit/s host links, {self.fabric_rate_gbps:g} Gbit/s fabric links, "
                f"{self.link_delay_us:g} µs per link")


@dataclasses.dataclass
class Host:
    index: int
    node: Any
    device: Any
    ip: int
    ip_str: str
    switch: str
    """Name of the switch the host hangs off."""
    bg_ip: int = 0
    """A second address of the host (same NIC, same switch port): background traffic goes there, so it
    crosses the same queues as the host's ATP traffic without reaching its ATP receiver."""


@dataclasses.dataclass
class _Link:
    a: str
    b: str
    gbps: float


def _fattree(k: int) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, str]]]:
    """(switch names, (host's switch, host index), switch links) of a k-ary fat-tree."""
    half = k // 2
    switches, hosts, links = [], [], []
    cores = [f"c{i}_{j}" for i in range(half) for j in range(half)]
    switches += cores
    for pod in range(k):
        aggs = [f"a{pod}_{i}" for i in range(half)]
        edges = [f"e{pod}_{i}" for i in range(half)]
        switches += aggs + edges
        for e in edges:
            for a in aggs:
                links.append((e, a))
            for _ in range(half):
                hosts.append((e, len(hosts)))
        for i, a in enumerate(aggs):
            for j in range(half):
                links.append((a, f"c{i}_{j}"))
    return switches, hosts, links


def _clos(leaves: int, spines: int, per_leaf: int) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, str]]]:
    switches = [f"s{i}" for i in range(spines)] + [f"l{i}" for i in range(leaves)]
    hosts = [(f"l{i}", i * per_leaf + h) for i in range(leaves) for h in range(per_leaf)]
    links = [(f"l{i}", f"s{j}") for i in range(leaves) for j in range(spines)]
    return switches, hosts, links


def _switches(names: list[str], switch_mode: str, *, buffer_packets: int, pfabric_packets: int,
              aeolus: tuple[int, int], trim: bool, approx_unit: int) -> dict[str, SimSwitch]:
    """One simulated switch per name, of the kind ``switch_mode`` names (``Network``'s arguments)."""
    if switch_mode == "pfabric":
        return {n: PfabricSwitch(n, capacity_packets=pfabric_packets) for n in names}
    if switch_mode == "homa":
        return {n: HomaSwitch(n, capacity_packets=buffer_packets) for n in names}
    if switch_mode == "aeolus":
        return {n: AeolusSwitch(n, capacity_packets=buffer_packets, threshold_packets=aeolus[0],
                                credit_queue=aeolus[1]) for n in names}
    return {n: SimSwitch(n, buffer_packets=buffer_packets, fifo=switch_mode == "fifo",
                         trim=trim and switch_mode == "netapprox", approx_unit=approx_unit) for n in names}


class Network:
    """Builds the topology into the current ns-3 simulation (call once per simulation run)."""

    def __init__(self, ns: Any, g: Any, topo: TopologyConfig, *, switch_mode: str, buffer_packets: int,
                 host_queue_packets: int = 1000, seed: int = 1, trim: bool = False, spray: bool = False,
                 approx_unit: int = 1, pfabric_packets: int = 0,
                 aeolus: tuple[int, int] = (8, 8), host_ecn_pkts: int = 0) -> None:
        """``switch_mode="pfabric"``: every switch port and every host NIC runs pFabric's queue
        (``experiments.sim.peers``), switch ports of ``pfabric_packets`` packets, host NICs of
        ``host_queue_packets``. ``switch_mode="homa"``: Homa's 8 priority queues sharing ``buffer_packets`` on every
        switch port, ``host_queue_packets`` on every host NIC. ``switch_mode="aeolus"``: Aeolus' port (``peers.AeolusSwitch``) of
        ``buffer_packets`` with ``aeolus`` = (selective-drop threshold, credit queue) packets on every switch port; on
        host NICs the same credit rate limiter and ``host_queue_packets``, no selective dropping. ``host_ecn_pkts`` > 0
        (the other modes): every host NIC's FIFO is the oblivious switch's queue disc (one queue of
        ``host_queue_packets``) marking CE on ECN-capable packets at that depth, as every queue of ns-2's
        data-center setups does (DCTCP's K on every link, the host's too) instead of a FIFO that never marks."""
        if switch_mode not in ("netapprox", "fifo", "pfabric", "homa", "aeolus"):
            raise ValueError(f"switch mode {switch_mode!r}: netapprox, fifo, pfabric, homa or aeolus")
        self.topo = topo
        self.switch_mode = switch_mode
        self.spray = spray
        if topo.kind == "fattree":
            names, host_at, links = _fattree(topo.k)
        else:
            names, host_at, links = _clos(topo.leaves, topo.spines, topo.hosts_per_leaf)
        rng = random.Random(seed)
        self.switches: dict[str, SimSwitch] = _switches(
            names, switch_mode, buffer_packets=buffer_packets, pfabric_packets=pfabric_packets, aeolus=aeolus,
            trim=trim, approx_unit=approx_unit)
        stack = ns.InternetStackHelper()
        stack.SetRoutingHelper(ns.Ipv4StaticRoutingHelper())
        self._nodes: dict[str, Any] = {}
        for n in names:
            node = ns.CreateObject["ns3::Node"]()
            self._nodes[n] = node
        host_nodes = [ns.CreateObject["ns3::Node"]() for _ in host_at]
        for node in list(self._nodes.values()) + host_nodes:
            stack.Install(node)

        p2p = ns.PointToPointHelper()
        p2p.SetChannelAttribute("Delay", ns.TimeValue(ns.NanoSeconds(int(round(topo.link_delay_us * 1000)))))
        p2p.SetDeviceAttribute("Mtu", ns.UintegerValue(topo.mtu))
        p2p.SetQueue("ns3::DropTailQueue", "MaxSize", ns.QueueSizeValue(ns.QueueSize("1p")))
        host_tc = ns.TrafficControlHelper()
        host_tc.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize",
                                 ns.QueueSizeValue(ns.QueueSize(f"{host_queue_packets}p")))
        addr = ns.Ipv4AddressHelper()
        addr.SetBase(ns.Ipv4Address("10.0.0.0"), ns.Ipv4Mask("255.255.255.252"))

        # neighbour tables for routing: switch -> [(neighbour switch or host index, device, peer ip)]
        self._ports: dict[str, list[tuple[str | int, Any, int]]] = collections.defaultdict(list)
        self.hosts: list[Host] = []
        self.host_ecn_qdiscs: list[Any] = []  # host_ecn_pkts: the hosts' marking queue discs
        self._host_tables: list[Any] = []  # and their tables, kept alive with them

        def rate(gbps: float) -> Any:
            return ns.DataRateValue(ns.DataRate(f"{gbps:g}Gbps"))

        p2p.SetDeviceAttribute("DataRate", rate(topo.host_gbps))
        for (sw, idx), hnode in zip(host_at, host_nodes):
            devs = p2p.Install(hnode, self._nodes[sw])
            hdev, sdev = devs.Get(0), devs.Get(1)
            if switch_mode == "pfabric":  # pFabric hosts also send the flow with the least remaining first
                g.netapprox.InstallPfabricQueueDisc(hdev, 0, host_queue_packets)
            elif switch_mode == "homa":  # Homa hosts send by the same priorities
                g.netapprox.InstallHomaQueueDisc(hdev, 0, host_queue_packets)
            elif switch_mode == "aeolus":  # the host's own unscheduled burst is never dropped selectively
                g.netapprox.InstallAeolusQueueDisc(hdev, 0, host_queue_packets, host_queue_packets, aeolus[1])
            elif host_ecn_pkts > 0:
                tables = g.netapprox.Tables.Create()
                tables.SetFifo(True)
                tables.SetEcn(0, host_ecn_pkts)
                limits = g.std.vector["uint32_t"](queue_limits(host_queue_packets, fifo=True))
                self.host_ecn_qdiscs.append(g.netapprox.InstallQueueDisc(hdev, tables, 0, limits))
                self._host_tables.append(tables)
            else:
                host_tc.Install(hdev)
            self.switches[sw].add_port(sdev, len(self._ports[sw]) + 1)
            ifs = addr.Assign(devs)
            addr.NewNetwork()
            hip, sip = ifs.GetAddress(0).Get(), ifs.GetAddress(1).Get()
            self._ports[sw].append((idx, sdev, hip))
            ns.Ipv4StaticRoutingHelper().GetStaticRouting(hnode.GetObject["ns3::Ipv4"]()).SetDefaultRoute(
                ns.Ipv4Address(sip), 1)
            bg_ip = BG_BASE + idx
            hipv4 = hnode.GetObject["ns3::Ipv4"]()
            hipv4.AddAddress(hipv4.GetInterfaceForDevice(hdev),
                             ns.Ipv4InterfaceAddress(ns.Ipv4Address(bg_ip), ns.Ipv4Mask("255.255.255.255")))
            self.hosts.append(Host(idx, hnode, hdev, hip, _ip_str(hip), sw, bg_ip))
        p2p.SetDeviceAttribute("DataRate", rate(topo.fabric_rate_gbps))
        for a, b in links:
            devs = p2p.Install(self._nodes[a], self._nodes[b])
            da, db = devs.Get(0), devs.Get(1)
            self.switches[a].add_port(da, len(self._ports[a]) + 1)
            self.switches[b].add_port(db, len(self._ports[b]) + 1)
            ifs = addr.Assign(devs)
            addr.NewNetwork()
            self._ports[a].append((b, da, ifs.GetAddress(1).Get()))
            self._ports[b].append((a, db, ifs.GetAddress(0).Get()))
        self.routing: dict[str, Any] = {}
        self._install_routes(ns, g, rng)

    @property
    def nodes(self) -> dict[str, Any]:
        return self._nodes

    def switch_ports(self, switch: str) -> list[tuple[int, str | int]]:
        """(port number, neighbour: switch name or host index) of a switch."""
        return [(i + 1, peer) for i, (peer, _dev, _ip) in enumerate(self._ports[switch])]

    def host_port(self, host: int) -> tuple[str, int]:
        """(switch, port) whose egress queue feeds ``host``."""
        sw = self.hosts[host].switch
        for port, peer in self.switch_ports(sw):
            if peer == host:
                return sw, port
        raise KeyError(host)

    def _install_routes(self, ns: Any, g: Any, rng: random.Random) -> None:
        # BFS over switches from every switch with hosts: distance of every switch to that host switch.
        adj: dict[str, list[str]] = {s: [p for p, _d, _ip in ports if isinstance(p, str)]
                                     for s, ports in self._ports.items()}
        hosts_of: dict[str, list[Host]] = collections.defaultdict(list)
        for h in self.hosts:
            hosts_of[h.switch].append(h)
        dist_to: dict[str, dict[str, int]] = {}
        for target in hosts_of:
            dist = {target: 0}
            queue = collections.deque([target])
            while queue:
                s = queue.popleft()
                for n in adj.get(s, ()):
                    if n not in dist:
                        dist[n] = dist[s] + 1
                        queue.append(n)
            dist_to[target] = dist
        for s, node in self._nodes.items():
            routing = ns.CreateObject[g.netapprox.EcmpRouting]()
            routing.SetSeed(rng.getrandbits(32))
            routing.SetSprayApproximate(self.spray)
            ipv4 = node.GetObject["ns3::Ipv4"]()
            for target, hs in hosts_of.items():
                if target == s:
                    for peer, dev, ip in self._ports[s]:
                        if isinstance(peer, int):
                            routing.AddRoute(ip, ipv4.GetInterfaceForDevice(dev), ip)
                            routing.AddRoute(BG_BASE + peer, ipv4.GetInterfaceForDevice(dev), ip)
                    continue
                d = dist_to[target].get(s)
                if d is None:
                    continue
                hops = [(ipv4.GetInterfaceForDevice(dev), ip) for peer, dev, ip in self._ports[s]
                        if isinstance(peer, str) and dist_to[target].get(peer) == d - 1]
                for h in hs:
                    for iface, gw in hops:
                        routing.AddRoute(h.ip, iface, gw)
                        routing.AddRoute(h.bg_ip, iface, gw)
            g.netapprox.InstallEcmp(node, routing)
            self.routing[s] = routing


def _ip_str(value: int) -> str:
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
