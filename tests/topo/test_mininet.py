"""Mininet smoke tests: the topologies come up, forward, and the controller programs them end to end.

The kernel variant needs root and Mininet's ``mnexec``; the BMv2 variant also needs BMv2 and p4c.
"""
from __future__ import annotations

import json
import shlex
import shutil
import sys
import time

import pytest

from support.skips import requires_p4, requires_root

pytestmark = [requires_root, pytest.mark.mininet, pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("mnexec") is None,
                                 reason="needs Mininet's mnexec (Debian package 'mininet')")]


def report_cmd(job: int, tlr: float, target: str) -> str:
    """A shell command that sends one ATP REPORT for ``job`` to ``target`` (ip:port)."""
    ip, port = target.split(":")
    code = ("import socket; from netapprox.hostlib.wire import Report; "
            f"d = Report(job_id={job}, group_id=0, seq=1, tlr={tlr}, loss=0.0, msr=0.5, rate_kbps=1000, total=10, "
            "delivered=0, lost=0, epoch=1).encode(); "
            f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(d, ('{ip}', {port}))")
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def trafgen(*args) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "netapprox.topo.trafgen", *args])


def check_routes(emu) -> None:
    """The /32 routes computed for the BMv2 target lead from every switch to every host, hop by hop."""
    net = emu.net
    peer = {}
    for link in net.links:
        a, b = link.intf1, link.intf2
        peer[(a.node.name, a.node.ports[a])] = b.node
        peer[(b.node.name, b.node.ports[b])] = a.node
    routes = {sw.name: {r.prefix: r for r in emu.routes(sw)} for sw in net.switches}
    for sw in net.switches:
        for h in net.hosts:
            node, hops = sw, 0
            while node.name in routes and hops < 6:
                r = routes[node.name][h.IP()]
                assert r.dst_mac == h.MAC() and r.prefix_len == 32
                node, hops = peer[(node.name, r.port)], hops + 1
            assert node is h, (sw.name, h.name)


@pytest.mark.parametrize("topology", ["rack", "dumbbell", "leafspine"])
def test_kernel_topologies_forward(topology):
    from netapprox.topo.net import Emulation, EmulationConfig

    with Emulation(EmulationConfig(topology=topology, hosts=2, rate_mbit=20)) as emu:
        assert emu.net.pingAll(timeout=2) == 0.0
        switches = emu.switch_configs()
        assert {s.kind for s in switches} == {"kernel"}
        ns = [s.options["netns"] for s in switches]
        check_routes(emu)
    import subprocess
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in ns), "switch namespace names are removed on stop"


def test_kernel_rack_controller_moves_a_reported_job():
    """REPORT from h1 -> ctl (in-band) -> controller -> KernelDriver -> u32: job 5's packets use queue 2."""
    from netapprox.controller.config import ReportConfig
    from support.paper_policy import ControllerConfig  # the queues below are k/8's
    from netapprox.controller.runtime import Runtime
    from netapprox.topo.net import Emulation, EmulationConfig

    with Emulation(EmulationConfig(topology="rack", hosts=2, rate_mbit=20)) as emu:
        ccfg = ControllerConfig(switches=emu.switch_configs(), reports=ReportConfig(port=-1), epoch_s=0.02)
        sock = emu.report_socket()
        sock.settimeout(3)
        with Runtime(ccfg) as ctl:
            assert ctl.connect(10)
            ctl.epoch()
            h1, h2 = emu.hosts
            h1.cmd(report_cmd(5, 0.3, emu.report_target))
            data, src = sock.recvfrom(2048)
            assert ctl.ingest(data, src[0]) is not None
            assert ctl.epoch().assignments == {5: 2}
            # The job's packets carry TLR 0.9 (queue 7 by the TLR table): the job entry must win.
            rx = h2.popen(trafgen("recv", "--port", "7600", "--duration", "5", "--idle", "1").split(),
                          stdout=-1, text=True)
            assert json.loads(rx.stdout.readline()) == {"ready": True}
            out = h1.cmd(trafgen("send", "--dst", h2.IP(), "--atp", "--approx", "--job", "5", "--tlr", "0.9",
                                 "--rate-mbit", "2", "--count", "40"))
            assert json.loads(out.strip().splitlines()[-1])["sent"] == 40
            got = json.loads(rx.communicate(timeout=10)[0].strip().splitlines()[-1])["received"]
            time.sleep(0.1)
            s1 = ctl.epoch().counters["s1"]  # counters_every = 1: read every epoch
            port_h2 = emu.switch_configs()[0].options["ports"]["s1-eth2"]
            q = {s.qid: s.enqueued for s in s1.queues if s.port == port_h2}
        assert got == 40
        assert q[2] >= 40 and q[7] == 0, q


@requires_p4
def test_bmv2_rack_report_by_packet_in_moves_a_job(tmp_path):
    """BMv2 target: ping through the P4 router; a REPORT punted as packet-in moves job 5 to queue 2; its
    packets arrive stamped 2 and the kernel traffic manager behind the BMv2 port queues them in queue 2."""
    import os

    from pyroute2 import IPRoute

    from netapprox.controller.config import ReportConfig
    from support.paper_policy import ControllerConfig  # the queues below are k/8's
    from netapprox.controller.runtime import Runtime
    from netapprox.controller.kernel import tc as ks
    from netapprox.topo.net import Emulation, EmulationConfig

    cfg = EmulationConfig(topology="rack", hosts=2, rate_mbit=20, target="bmv2", log_dir=str(tmp_path),
                          bmv2_json=os.path.abspath("build/v1model/bmv2.json"))
    if not os.path.exists(cfg.bmv2_json):
        pytest.skip(f"{cfg.bmv2_json} not built: run `make p4`")
    with Emulation(cfg) as emu:
        ccfg = ControllerConfig(switches=emu.switch_configs(), reports=ReportConfig(port=-1), epoch_s=0.02)
        with Runtime(ccfg) as ctl:
            assert ctl.connect(20)
            ctl.epoch()
            h1, h2 = emu.hosts
            assert emu.net.ping([h1, h2], timeout=2) == 0.0
            h1.cmd(report_cmd(5, 0.3, emu.report_target))
            deadline = time.monotonic() + 5
            while ctl.epoch().assignments != {5: 2} and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ctl.assignments == {5: 2}, "the REPORT reached the controller as packet-in"
            rx = h2.popen(trafgen("recv", "--port", "7600", "--duration", "5", "--idle", "1").split(),
                          stdout=-1, text=True)
            assert json.loads(rx.stdout.readline()) == {"ready": True}
            ctl.epoch()
            out = h1.cmd(trafgen("send", "--dst", h2.IP(), "--atp", "--approx", "--job", "5", "--tlr", "0.9",
                                 "--rate-mbit", "2", "--count", "40"))
            assert json.loads(out.strip().splitlines()[-1])["sent"] == 40
            got = json.loads(rx.communicate(timeout=10)[0].strip().splitlines()[-1])
            s1 = emu.net.get("s1")
            port_h2 = next(name for name, port in s1.port_map().items() if port == 2)
            with IPRoute() as ipr:
                tm = {st.qid: st.packets for st in ks.read_port_stats(ipr, ipr.link_lookup(ifname=port_h2)[0])}
        assert got["received"] == 40 and got["by_queue_byte"] == {"2": 40}, got
        assert tm[2] >= 40 and tm[7] == 0, tm


@requires_p4
@pytest.mark.parametrize("topology", ["dumbbell", "leafspine"])
def test_bmv2_topologies_route(tmp_path, topology):
    """Multi-switch BMv2 topologies: the controller installs the computed routes and every host reaches
    every other host."""
    import os

    from netapprox.controller.config import ControllerConfig, ReportConfig
    from netapprox.controller.runtime import Runtime
    from netapprox.topo.net import Emulation, EmulationConfig

    cfg = EmulationConfig(topology=topology, hosts=2, rate_mbit=20, target="bmv2", log_dir=str(tmp_path),
                          bmv2_json=os.path.abspath("build/v1model/bmv2.json"))
    if not os.path.exists(cfg.bmv2_json):
        pytest.skip(f"{cfg.bmv2_json} not built: run `make p4`")
    with Emulation(cfg) as emu:
        ccfg = ControllerConfig(switches=emu.switch_configs(), reports=ReportConfig(port=-1), epoch_s=0.02)
        with Runtime(ccfg) as ctl:
            assert ctl.connect(20)
            ctl.epoch()
            assert emu.net.pingAll(timeout=2) == 0.0


def test_kernel_leafspine_controller_sprays_approximate_data():
    """Kernel leaf-spine (2 leaves, 2 spines): the controller installs the ECMP groups of every switch from the
    topology; h1 -> h3 approximate ATP DATA leaves leaf1 over both uplinks, a non-approximate flow over one,
    and every datagram arrives."""
    from netapprox.topo.net import EmulationConfig

    leafspine_sprays(EmulationConfig(topology="leafspine", hosts=2, rate_mbit=50))


@requires_p4
def test_bmv2_leafspine_controller_sprays_approximate_data(tmp_path):
    """The same on BMv2 switches: every switch's ECMP groups as routes_v4 -> set_ecmp_group and ecmp_members
    (docs/dataplane.md, Spraying), each member rewriting the MACs of its port."""
    import os

    from netapprox.topo.net import EmulationConfig

    cfg = EmulationConfig(topology="leafspine", hosts=2, rate_mbit=50, target="bmv2", log_dir=str(tmp_path),
                          bmv2_json=os.path.abspath("build/v1model/bmv2.json"))
    if not os.path.exists(cfg.bmv2_json):
        pytest.skip(f"{cfg.bmv2_json} not built: run `make p4`")
    leafspine_sprays(cfg)


def leafspine_sprays(cfg) -> None:
    """h1 -> h3 across a leaf-spine under the controller: approximate ATP DATA over both of leaf1's uplinks, a
    non-approximate flow over one, every datagram delivered."""
    from netapprox.controller.config import ControllerConfig, ReportConfig
    from netapprox.controller.runtime import Runtime
    from netapprox.topo.net import Emulation

    with Emulation(cfg) as emu:
        switches = emu.switch_configs()
        leaf = emu.net.get("leaf1")
        uplinks = {leaf.ports[i] for i in leaf.intfList()
                   if i.link and {i.link.intf1.node.name, i.link.intf2.node.name} & {"spine1", "spine2"}}
        assert len(uplinks) == 2 and all(s.ecmp_routes for s in switches)
        ccfg = ControllerConfig(switches=switches, reports=ReportConfig(port=-1), epoch_s=0.02)
        with Runtime(ccfg) as ctl:
            assert ctl.connect(20)
            ctl.epoch()
            assert emu.net.pingAll(timeout=2) == 0.0
            h1, h3 = emu.hosts[0], emu.hosts[2]

            def sent_up(*args: str) -> dict[int, int]:
                before = ctl.epoch().counters["leaf1"]
                rx = h3.popen(trafgen("recv", "--port", "7600", "--duration", "8", "--idle", "1").split(),
                              stdout=-1, text=True)
                assert json.loads(rx.stdout.readline()) == {"ready": True}
                out = h1.cmd(trafgen("send", "--dst", h3.IP(), "--atp", "--rate-mbit", "4", "--count", "200",
                                     "--size", "400", *args))
                assert json.loads(out.strip().splitlines()[-1])["sent"] == 200
                assert json.loads(rx.communicate(timeout=15)[0].strip().splitlines()[-1])["received"] == 200
                time.sleep(0.1)
                after = ctl.epoch().counters["leaf1"]
                count = lambda c, p: sum(q.transmitted for q in c.queues if q.port == p)  # noqa: E731
                return {p: count(after, p) - count(before, p) for p in uplinks}

            sprayed = sent_up("--approx", "--tlr", "0.2", "--sport", "41000")
            assert sum(sprayed.values()) >= 200 and min(sprayed.values()) >= 50, sprayed
            hashed = sent_up("--sport", "41001")  # ATP without APPROX: one path
            assert sum(hashed.values()) >= 200 and min(hashed.values()) <= 5, hashed
