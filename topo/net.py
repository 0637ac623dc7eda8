"""An emulated NetApprox network: a Mininet topology on the kernel or BMv2 target, ready for a controller.

    with Emulation(EmulationConfig(topology="dumbbell", hosts=2, bottleneck_mbit=30)) as emu:
        emu.switch_configs()      # controller.config.SwitchConfig per switch (kind kernel or p4runtime)
        emu.report_socket()       # UDP socket bound in the ``ctl`` host (kernel target: in-band reports)
        emu.hosts[0].popen([...]) # Mininet hosts

Everything is removed by ``close()`` (Mininet's own ``net.stop()``: hosts, switches, links; switch PIDs;
namespace names), also on errors and Ctrl-C when used as a context manager. Never ``mn -c``.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import socket
from pathlib import Path
from typing import Any

from mininet.log import setLogLevel
from mininet.net import Mininet

from netapprox.controller import fabric
from netapprox.controller.config import SwitchConfig
from netapprox.controller.config import report_key as config_report_key
from netapprox.controller.model import ClassRule, EcmpRoute, Route
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, DEFAULT_REPORT_PORT
from netapprox.topo.netns import Lifecycle, socket_in_netns, unique_tag, wait_until
from netapprox.topo.bmv2 import P4_TOOLS_HINT, bmv2_available
from netapprox.topo.switches import BMv2Switch, KernelSwitch, NaLink
from netapprox.topo.topologies import CTL_IP, TOPOLOGIES, FileTopo

TARGETS = ("kernel", "bmv2")


@dataclasses.dataclass(frozen=True)
class EmulationConfig:
    """Shape of the emulated network."""

    topology: str = "rack"
    """``rack`` (one switch), ``dumbbell`` (two switches, one bottleneck link) or ``leafspine``."""
    hosts: int = 4
    """rack: hosts on the switch; dumbbell: hosts per side; leafspine: hosts per leaf."""
    rate_mbit: float = 100.0
    """Host link rate, Mbit/s (switch egress towards hosts)."""
    bottleneck_mbit: float | None = None
    """dumbbell: the s1-s2 link; leafspine: leaf-spine links. None: ``rate_mbit``."""
    leaves: int = 2
    """leafspine: number of leaves."""
    spines: int = 2
    """leafspine: number of spines."""
    buffer_packets: int = 64
    """Per-port buffer, MTU-sized packets: queue k >= 1 holds ``approx_buffer_unit`` x (8 - k), queue 0 the rest."""
    approx_buffer_unit: int | None = None
    """The switches' ``approx_buffer_unit``; None: every data plane's default (``model.half_buffer_unit``: 1 for
    64-packet ports)."""
    target: str = "kernel"
    """``kernel`` (Linux bridge + HTB/u32) or ``bmv2`` (simple_switch_grpc + kernel qdisc as TM)."""
    atp_port: int = DEFAULT_ATP_PORT
    """ATP UDP port."""
    class_rules: tuple[ClassRule, ...] = ()
    """queue_by_class entries every switch starts with (the controller's config should carry the same)."""
    bmv2_json: str = "build/v1model/bmv2.json"
    """BMv2 target: the compiled P4 program (``make p4``); its p4info.txtpb sits next to it."""
    log_dir: str = "results"
    """Where switch logs go."""
    spec: Any = None
    """A topology file's network (``topo.topofile.TopologySpec``), with ``topology="file"``."""
    pcap: str | None = None
    """Write one pcap per switch interface into this directory (as p4-utils does): ``tcpdump`` on kernel
    switches (``<switch>-<interface>.pcap``), BMv2's own ``--pcap`` on BMv2 (``<switch>/<port>_in|out.pcap``)."""

    def __post_init__(self) -> None:
        if self.topology == "file":
            if self.spec is None:
                raise ValueError("topology 'file' needs spec (topo.topofile.load)")
        elif self.topology not in TOPOLOGIES:
            raise ValueError(f"topology {self.topology!r}: choose one of {', '.join(TOPOLOGIES)}")
        if self.target not in TARGETS:
            raise ValueError(f"target {self.target!r}: choose one of {', '.join(TARGETS)}")


class TargetUnavailable(RuntimeError):
    """The requested target's tools are missing; the message says what to install."""


class Emulation(Lifecycle):
    """A running Mininet network of NetApprox switches (see module docstring)."""

    def __init__(self, config: EmulationConfig) -> None:
        self.config = config
        self.tag = unique_tag(2)[:3]
        self.net = None
        self._sockets: list[socket.socket] = []

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        setLogLevel("warning")
        if cfg.target == "bmv2":
            if not bmv2_available():
                raise TargetUnavailable(P4_TOOLS_HINT)
            if not os.path.exists(cfg.bmv2_json):
                raise TargetUnavailable(f"{cfg.bmv2_json} not found: run `make p4` first (needs p4c-bm2-ss)")
            switch = functools.partial(BMv2Switch, rate_mbit=cfg.rate_mbit, buffer_packets=cfg.buffer_packets,
                                       approx_buffer_unit=cfg.approx_buffer_unit,
                                       atp_port=cfg.atp_port, class_rules=cfg.class_rules,
                                       json_path=cfg.bmv2_json, log_dir=cfg.log_dir, tag=self.tag, pcap_dir=cfg.pcap)
        else:
            switch = functools.partial(KernelSwitch, rate_mbit=cfg.rate_mbit, buffer_packets=cfg.buffer_packets,
                                       approx_buffer_unit=cfg.approx_buffer_unit,
                                       atp_port=cfg.atp_port, class_rules=cfg.class_rules, stp=self._loops(),
                                       tag=self.tag, pcap_dir=cfg.pcap)
        if cfg.topology == "file":
            topo = FileTopo(spec=cfg.spec)
        else:
            topo = TOPOLOGIES[cfg.topology](hosts=cfg.hosts, rate_mbit=cfg.rate_mbit,
                                            bottleneck_mbit=cfg.bottleneck_mbit, leaves=cfg.leaves, spines=cfg.spines)
        self.net = Mininet(topo=topo, switch=switch, link=NaLink, controller=None, build=False,
                           autoSetMacs=False, autoStaticArp=False, waitConnected=False)
        self.net.build()
        for h in self.net.hosts:
            for intf in h.intfList():
                h.cmd(f"ethtool -K {intf.name} tx off")
            for key in ("all", "default"):
                h.cmd(f"sysctl -qw net.ipv6.conf.{key}.disable_ipv6=1")
        self.net.start()
        if cfg.target == "bmv2":
            self.net.staticArp()  # P4 routes by IP; hosts need the peers' MACs without ARP through BMv2
        if self._loops() and cfg.target == "kernel":
            if not wait_until(lambda: all(s.stp_converged() for s in self.net.switches), timeout=30, interval=0.5):
                raise RuntimeError("STP did not converge within 30 s")

    def _loops(self) -> bool:
        """Whether the switches form a loop (the kernel target's bridges then run STP)."""
        if self.config.topology == "file":
            return self.config.spec.has_loop
        return self.config.topology == "leafspine"

    def close(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets.clear()
        if self.net is not None:
            net, self.net = self.net, None
            net.stop()

    # -- access ---------------------------------------------------------------------------------------------
    @property
    def hosts(self) -> list:
        """Workload hosts in order (h1..hN; a topology file's in its order), without ``ctl``."""
        hs = [h for h in self.net.hosts if h.name != "ctl"]
        if self.config.topology == "file":
            order = {h.name: i for i, h in enumerate(self.config.spec.hosts)}
            return sorted(hs, key=lambda h: order[h.name])
        return sorted(hs, key=lambda h: int(h.name[1:]))

    @property
    def ctl(self):
        return self.net.get("ctl")

    @property
    def report_target(self) -> str:
        """Where hosts send REPORTs: ``ip:port`` of the controller's in-band address."""
        return f"{CTL_IP}:{DEFAULT_REPORT_PORT}"

    @property
    def report_key_file(self) -> str:
        """The report key of this network's controller and hosts (``log_dir/report.key``, mode 0600)."""
        return os.path.abspath(os.path.join(self.config.log_dir, "report.key"))

    def report_key(self, key: bytes | None = None) -> bytes:
        """The key the controller checks REPORTs with: ``key`` written to ``report_key_file`` (a topology
        file's own), else the file's, created with a new key the first time."""
        path = Path(self.report_key_file)
        if key is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            return key
        return config_report_key(path, create=True, where="emulation report key")

    @property
    def report_args(self) -> list[str]:
        """A sender's arguments to report to this network's controller, signed (``atp-send``)."""
        return ["--report-to", self.report_target, "--report-key-file", self.report_key_file]

    def report_socket(self, port: int = DEFAULT_REPORT_PORT) -> socket.socket:
        """A UDP socket bound to ``port`` inside the ``ctl`` host: REPORTs sent to ``report_target`` arrive
        here (kernel target). Closed by ``close()``."""
        s = socket_in_netns(self.ctl.pid)
        s.bind(("0.0.0.0", port))
        self._sockets.append(s)
        return s

    def switch_configs(self):
        """``controller.config.SwitchConfig`` for every switch, with this network's driver options; on a topology
        with a loop, every switch's ECMP groups (``ecmp_routes``), otherwise BMv2 switches get ``routes`` (one
        shortest path per host) and kernel switches bridge."""
        groups = self.ecmp_routes()
        out = []
        for sw in self.net.switches:
            kind = "p4runtime" if isinstance(sw, BMv2Switch) else "kernel"
            ecmp = tuple(sorted(groups.get(sw.name, ())))
            routes = tuple(self.routes(sw)) if kind == "p4runtime" and not groups else ()
            out.append(SwitchConfig(name=sw.name, kind=kind, options=sw.driver_options(), routes=routes,
                                    ecmp_routes=ecmp, class_rules=tuple(self.config.class_rules)))
        return tuple(out)

    def ecmp_routes(self) -> dict[str, frozenset[EcmpRoute]]:
        """On a topology with a loop (the leaf-spine): every switch's ECMP groups, a /32 per host over its ports on
        shortest paths (``controller.fabric.ecmp_routes``); on BMv2 each member rewrites the MACs as ``routes``
        does (source: the switch's port, destination: the host). Empty for loop-free topologies."""
        if not self._loops():
            return {}
        names = {s.name for s in self.net.switches}
        links = []
        for link in self.net.links:
            ends = []
            for intf in (link.intf1, link.intf2):
                ends += [intf.node.name, intf.node.port_map()[intf.name] if intf.node.name in names else None]
            links.append(tuple(ends))
        groups = fabric.ecmp_routes(names, {h.name: h.IP() for h in self.net.hosts}, links)
        if self.config.target == "bmv2":
            groups = {sw.name: frozenset(self._with_macs(sw, r) for r in groups[sw.name]) for sw in self.net.switches}
        return groups

    def _with_macs(self, switch, route: EcmpRoute) -> EcmpRoute:
        """``route`` with each member's MACs: the switch's interface on that port, the host's own."""
        intf = {port: name for name, port in switch.port_map().items()}
        host = next(h for h in self.net.hosts if h.IP() == route.prefix)
        return dataclasses.replace(route, src_macs=tuple(switch.intf(intf[p]).MAC() for p in route.ports),
                                   dst_macs=(host.MAC(),) * len(route.ports))

    def routes(self, switch) -> list[Route]:
        """BMv2 target: a /32 route per host on ``switch``, along a shortest path (BFS over the topology;
        among equal paths, the spine is picked by the destination host's number)."""
        net = self.net
        adj: dict[str, list[tuple[str, Any]]] = collections.defaultdict(list)
        for link in net.links:
            a, b = link.intf1, link.intf2
            adj[a.node.name].append((b.node.name, a))
            adj[b.node.name].append((a.node.name, b))
        out = []
        for h in net.hosts:
            # BFS from the host: distance of every node to it.
            dist = {h.name: 0}
            queue = collections.deque([h.name])
            while queue:
                u = queue.popleft()
                for v, _ in adj[u]:
                    if v not in dist and (v == switch.name or v in {s.name for s in net.switches}):
                        dist[v] = dist[u] + 1
                        queue.append(v)
            if switch.name not in dist:
                continue
            options = sorted(((v, intf) for v, intf in adj[switch.name] if dist.get(v, 1 << 30) == dist[switch.name] - 1),
                             key=lambda o: (o[0], o[1].name))
            if not options:
                continue
            nxt, intf = options[int(h.name[1:]) % len(options)] if h.name[1:].isdigit() else options[0]
            port = switch.port_map()[intf.name]
            out.append(Route(prefix=h.IP(), prefix_len=32, port=port, src_mac=intf.MAC(), dst_mac=h.MAC()))
        return out
