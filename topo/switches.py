"""Mininet switch classes: ``KernelSwitch`` (Linux bridge + HTB/u32, no P4 toolchain) and ``BMv2Switch``.

Both shape every egress port with the same traffic manager (controller/kernel/tc.py: HTB root at the link
rate, 8 strict-priority classes, a large bfifo under queue 0 and 8 - k packets under queue k, times
``approx_buffer_unit``; unset, every data plane's one default ``model.half_buffer_unit``: 1 on 64-packet
ports). They differ in who classifies:

- ``KernelSwitch``: the switch is a bridge in its own network namespace; u32 filters on each egress port
  implement the logical tables. The controller programs them with ``controller.kernel.driver.KernelDriver``
  (``switch.driver_options()``).
- ``BMv2Switch``: ``simple_switch_grpc`` runs the P4 pipeline (parse, route, classify, stamp the logical
  queue into the ATP ``queue`` byte of DATA packets, ECN); it has no port shaper, so the kernel qdisc on each
  of its egress interfaces is the traffic manager, classifying by that stamp (``controller.kernel.compiler.stamp_filters``). The
  controller programs the P4 tables with ``controller.p4runtime.driver.P4RuntimeDriver``.

Per-link rates come from the link options (``net.addLink(a, b, rate_mbit=20)``), else the switch's
``rate_mbit``. Interface names are unique per run (``na`` + tag), PIDs are kept and only those are stopped.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from mininet.link import Link
from mininet.node import Switch
from pyroute2 import IPRoute

from netapprox.controller.kernel import compiler, tc
from netapprox.controller.kernel.driver import KernelDriver
from netapprox.controller.model import ClassRule, SwitchState, default_tlr_rules, resolve_buffer_unit
from netapprox.hostlib.wire import DEFAULT_ATP_PORT
from netapprox.topo.bmv2 import Bmv2Options, Bmv2Process, free_tcp_port
from netapprox.topo.netns import run, stop_process, unique_tag


def start_captures(node, pcap_dir: str) -> list[subprocess.Popen]:
    """One ``tcpdump`` per interface of ``node`` (in its namespace), writing ``<node>-<interface>.pcap`` into
    ``pcap_dir`` unbuffered; returns the processes (stop them by PID)."""
    if shutil.which("tcpdump") is None:
        raise RuntimeError("pcap capture needs tcpdump (Debian: tcpdump; make setup installs it)")
    Path(pcap_dir).mkdir(parents=True, exist_ok=True)
    procs = []
    for intf in node.intfList():
        if intf.name == "lo":
            continue
        path = Path(pcap_dir).resolve() / f"{node.name}-{intf.name}.pcap"
        # --immediate-mode: libpcap otherwise hands packets over in blocks (up to a second's worth), and the
        # block in progress is lost when tcpdump is stopped: the last second before the stop went missing.
        procs.append(node.popen(["tcpdump", "-i", intf.name, "--immediate-mode", "-U", "-q", "-w", str(path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def intf_rate(intf, default: float) -> float:
    return float(intf.params.get("rate_mbit", default)) if intf is not None else default


class NaLink(Link):
    """A Mininet veth link; a node with an ``intf_prefix`` (switches in the root namespace, such as BMv2) gets
    interfaces named ``<intf_prefix>-<port>``, unique per run and at most 15 characters."""

    def intfName(self, node, n):  # noqa: N802 (Mininet's name)
        prefix = getattr(node, "intf_prefix", None)
        return f"{prefix}-{n}" if prefix else f"{node.name}-eth{n}"


class KernelSwitch(Switch):
    """A Linux bridge in its own network namespace with NetApprox queues on every port."""

    def __init__(self, name: str, rate_mbit: float = 100.0, buffer_packets: int = 64,
                 atp_port: int = DEFAULT_ATP_PORT, stp: bool = False, class_rules: tuple[ClassRule, ...] = (),
                 tag: str | None = None, pcap_dir: str | None = None, approx_buffer_unit: int | None = None,
                 **params: Any) -> None:
        params["inNamespace"] = True
        super().__init__(name, **params)
        self.pcap_dir = pcap_dir
        self.captures: list[subprocess.Popen] = []
        self.rate_mbit = rate_mbit
        self.buffer_packets = buffer_packets
        self.approx_buffer_unit = resolve_buffer_unit(approx_buffer_unit, buffer_packets)
        self.atp_port = atp_port
        self.stp = stp
        self.class_rules = tuple(class_rules)
        self.netns_name = f"na{tag or unique_tag()}{name}"
        self._attached = False

    def port_map(self) -> dict[str, int]:
        return {intf.name: port for port, intf in sorted(self.intfs.items()) if intf.name != "lo"}

    def driver_options(self) -> dict[str, Any]:
        """Options for ``controller.kernel.driver.KernelDriver.from_options`` (the controller's switch entry)."""
        rates = {intf.name: intf_rate(intf, self.rate_mbit) for intf in self.intfList() if intf.name != "lo"}
        return {"netns": self.netns_name, "ports": self.port_map(), "rate_mbit": self.rate_mbit,
                "port_rates_mbit": rates, "buffer_packets": self.buffer_packets,
                "approx_buffer_unit": self.approx_buffer_unit, "atp_port": self.atp_port}

    def default_state(self) -> SwitchState:
        """What the switch does before a controller connects: TLR thresholds and the class rules."""
        return SwitchState(tlr_rules=default_tlr_rules(), class_rules=frozenset(self.class_rules))

    def start(self, controllers) -> None:
        run(["ip", "netns", "attach", self.netns_name, str(self.pid)])
        self._attached = True
        for key in ("all", "default"):
            self.cmd(f"sysctl -qw net.ipv6.conf.{key}.disable_ipv6=1")
        stp = 1 if self.stp else 0
        # Kernel STP timers: forward_delay 2 s (the minimum), hello 1 s; without STP forward at once. No
        # multicast snooping (multicast is flooded, as on the P4 switch): a snooping bridge sends IGMP reports
        # of its own out of every port.
        self.cmd(f"ip link add br0 type bridge stp_state {stp} forward_delay {200 if stp else 0} hello_time 100 "
                 "mcast_snooping 0")
        for intf in self.intfList():
            if intf.name != "lo":
                self.cmd(f"ip link set {intf.name} master br0 up")
        self.cmd("ip link set br0 up")
        driver = KernelDriver.from_options(self.name, self.driver_options())
        try:
            driver.connect()
            driver.apply(self.default_state())
        finally:
            driver.close()
        if self.pcap_dir:
            self.captures = start_captures(self, self.pcap_dir)

    def stp_converged(self) -> bool:
        """All ports forwarding or blocking (not listening/learning)."""
        out = self.cmd("bridge link show")
        states = [line.split(" state ")[1].split()[0] for line in out.splitlines() if " state " in line]
        return bool(states) and all(s in ("forwarding", "blocking", "disabled") for s in states)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's name)
        for capture in self.captures:
            stop_process(capture)
        self.captures.clear()
        if self._attached:
            subprocess.run(["ip", "netns", "delete", self.netns_name], capture_output=True)
            self._attached = False
        super().stop(deleteIntfs)


# ---------------------------------------------------------------------------------------------------------
# BMv2


class BMv2Switch(Switch):
    """``simple_switch_grpc --priority-queues 8`` with a CPU port and Thrift; kernel qdiscs as the TM.

    Runs in the root namespace (BMv2's gRPC port must be reachable by the controller), so its interfaces get
    unique names (``intf_prefix``). ``start`` waits until the gRPC port answers; ``stop`` stops that PID.
    """

    def __init__(self, name: str, json_path: str | None = None, rate_mbit: float = 100.0, buffer_packets: int = 64,
                 atp_port: int = DEFAULT_ATP_PORT, class_rules: tuple[ClassRule, ...] = (),
                 device_id: int = 0, log_dir: str | None = None, tag: str | None = None, pcap_dir: str | None = None,
                 approx_buffer_unit: int | None = None, **params: Any) -> None:
        params["inNamespace"] = False
        super().__init__(name, **params)
        self.intf_prefix = f"na{tag or unique_tag()[:3]}{name}"
        if len(self.intf_prefix) > 12:
            raise ValueError(f"switch name {name!r} too long for unique interface names (max 7 characters)")
        self.json_path = json_path
        self.rate_mbit = rate_mbit
        self.buffer_packets = buffer_packets
        self.approx_buffer_unit = resolve_buffer_unit(approx_buffer_unit, buffer_packets)
        self.atp_port = atp_port
        self.class_rules = tuple(class_rules)
        self.device_id = device_id
        self.grpc_port = free_tcp_port()
        self.thrift_port = free_tcp_port()
        self.log_dir = Path(log_dir or "results")
        self.bmv2: Bmv2Process | None = None
        self.pcap_dir = pcap_dir

    def port_map(self) -> dict[str, int]:
        return {intf.name: port for port, intf in sorted(self.intfs.items()) if intf.name != "lo"}

    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def driver_options(self) -> dict[str, Any]:
        """Options for ``controller.p4runtime.driver.P4RuntimeDriver.from_options``."""
        # No thrift_port: BMv2's own queues keep their default depth (64 packets) so that they never drop;
        # the kernel qdisc behind each port is the traffic manager with the k-packet buffers.
        opts = {"address": self.grpc_address(), "device_id": self.device_id, "target": "bmv2",
                "ports": sorted(self.port_map().values()), "buffer_packets": self.buffer_packets,
                "approx_buffer_unit": self.approx_buffer_unit}
        if self.json_path:
            opts["bmv2_json"] = self.json_path
            opts["p4info"] = str(Path(self.json_path).with_name("p4info.txtpb"))
        return opts

    def start(self, controllers) -> None:
        ports = {port: intf.name for port, intf in sorted(self.intfs.items()) if intf.name != "lo"}
        # No program: the controller pushes the pipeline (P4Runtime SetForwardingPipelineConfig).
        pcap = None
        if self.pcap_dir:
            pcap = Path(self.pcap_dir).resolve() / self.name
            pcap.mkdir(parents=True, exist_ok=True)
        self.bmv2 = Bmv2Process(Bmv2Options(ports=ports, device_id=self.device_id, grpc_port=self.grpc_port,
                                            thrift_port=self.thrift_port, pcap_dir=str(pcap) if pcap else None),
                                self.log_dir / f"bmv2-{self.name}.log")
        self.bmv2.start(timeout=20.0)
        self.install_tm()

    def install_tm(self) -> None:
        """The HTB strict-priority tree on every egress interface, classified by BMv2's queue stamp."""
        entries = compiler.stamp_filters(self.class_rules, self.atp_port)
        with IPRoute() as ipr:
            for intf in self.intfList():
                if intf.name == "lo":
                    continue
                idx = ipr.link_lookup(ifname=intf.name)[0]
                tc.build_port(ipr, idx, tc.PortShape(rate_mbit=intf_rate(intf, self.rate_mbit),
                                                     buffer_packets=self.buffer_packets,
                                                     approx_unit=self.approx_buffer_unit))
                htid = None
                for node in sorted(entries):
                    tc.write_entry(ipr, idx, htid, entries[node])
                    htid = htid or tc.root_htid(ipr, idx)
                run(["ethtool", "-K", intf.name, "tx", "off"], check=False)

    def stop_process(self) -> None:
        if self.bmv2 is not None:
            self.bmv2.stop()

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803
        self.stop_process()
        super().stop(deleteIntfs)
