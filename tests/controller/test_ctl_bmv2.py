"""The controller against a real BMv2 simple_switch_grpc running the NetApprox P4 program.

Compiles p4src/ with p4c into a temporary directory, creates a network namespace with two veth pairs
(switch ports swp1/swp2, host ends h1/h2), starts simple_switch_grpc there (PID kept and stopped), and runs
tests/controller/bmv2_scenario.py in the namespace: the controller connects, reports change a job's TLR
(over UDP and as packet-in), and ATP probes must come out stamped with the queue that follows the TLR,
within one epoch of the report.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.topo.bmv2 import Bmv2Options, Bmv2Process
from support.skips import requires_p4, requires_root

from ctl_fixtures import P4INFO

REPO = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("bmv2_scenario.py")
GRPC_PORT, THRIFT_PORT = 9559, 9090

pytestmark = [requires_p4, pytest.mark.p4]


def sh(*cmd: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", netns] if netns else []) + list(cmd)
    res = subprocess.run(full, capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {res.stderr.strip()}")
    return res


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("p4build")
    res = subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "--std", "p4-16", "-I", str(REPO / "p4src"),
                          "--p4runtime-files", str(out / "p4info.txtpb"), "-o", str(out / "bmv2.json"),
                          str(REPO / "p4src" / "v1model" / "netapprox.p4")],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"p4c-bm2-ss failed to compile p4src/v1model/netapprox.p4:\n{res.stderr[-2000:]}")
    return out


@pytest.fixture
def bmv2(netns_with_veths, tmp_path):
    ns, log = netns_with_veths, tmp_path / "bmv2.log"
    options = Bmv2Options(ports={1: "swp1", 2: "swp2"}, device_id=1, grpc_port=GRPC_PORT, thrift_port=THRIFT_PORT,
                          netns=ns, log_level=None)
    with Bmv2Process(options, log):
        yield ns, log


@pytest.fixture
def netns_with_veths():
    """A fresh network namespace with two veth pairs, switch ports swp1/swp2 and host ends h1/h2."""
    with veth_netns(2) as ns:
        yield ns


@contextlib.contextmanager
def veth_netns(pairs: int):
    """A fresh network namespace with ``pairs`` veth pairs, switch ports swp1.. and host ends h1.."""
    ns = f"nactl{secrets.token_hex(3)}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "set", "lo", "up", netns=ns)
        for i in range(1, pairs + 1):
            sh("ip", "link", "add", f"swp{i}", "type", "veth", "peer", "name", f"h{i}", netns=ns)
            for dev in (f"swp{i}", f"h{i}"):
                sh("sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1", netns=ns, check=False)
                sh("ip", "link", "set", dev, "up", netns=ns)
        yield ns
    finally:
        sh("ip", "netns", "del", ns, check=False)


def _contract(p4info_path: Path) -> dict:
    m = P4Info.load(p4info_path).message
    out: dict = {}
    for t in m.tables:
        out[t.preamble.name] = sorted((f.name, f.bitwidth, f.match_type) for f in t.match_fields), \
            len(t.direct_resource_ids), t.size
    for a in m.actions:
        out[a.preamble.name] = sorted((p.name, p.bitwidth) for p in a.params)
    for c in list(m.counters) + list(m.direct_counters):
        out[c.preamble.name] = c.spec.unit
    for c in m.controller_packet_metadata:
        out[c.preamble.name] = [(x.id, x.name, x.bitwidth) for x in c.metadata]
    return out


def test_hand_written_p4info_fixture_matches_the_compiled_program(compiled):
    """The fake-server tests use controller/p4runtime/p4info.txtpb; it must keep matching what p4c makes of p4src/."""
    assert _contract(P4INFO) == _contract(compiled / "p4info.txtpb")


@requires_root
@pytest.mark.root
def test_queue_byte_follows_reported_tlr_within_one_epoch(compiled, bmv2):
    ns, log = bmv2
    epoch_ms = 50.0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, str(SCENARIO), "--grpc-port", str(GRPC_PORT),
                          "--thrift-port", str(THRIFT_PORT), "--p4info", str(compiled / "p4info.txtpb"),
                          "--bmv2-json", str(compiled / "bmv2.json"), "--epoch-ms", str(epoch_ms)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert res.returncode == 0, f"scenario failed:\n{res.stderr[-3000:]}\nswitch log:\n{log.read_text()[-1500:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["up"], out
    assert out["queue_config_error"] is None, out
    assert out["before"] == 7, out  # no job entry yet: the packet's TLR 0.95 -> queue_by_tlr -> 7
    for step in out["steps"]:
        assert step["latency_s"] is not None, f"queue byte never became {step['expected']}: {out}"
        # the write goes out at the next epoch boundary; allow the write and probe round trip on top
        assert step["latency_s"] <= epoch_ms / 1000.0 + 0.1, step
    assert out["enqueued_port2"].get("7", 0) >= 1 and out["enqueued_port2"].get("2", 0) >= 1, out
    assert sum(out["job_packets"].values()) >= 1, out


def run_scenario(script: str, compiled: Path, ns: str, tmp_path: Path) -> tuple[dict, str]:
    """Run ``script`` (beside this file) in namespace ``ns`` with the compiled program; (its JSON, its logs)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, str(Path(__file__).with_name(script)),
                          "--p4info", str(compiled / "p4info.txtpb"), "--bmv2-json", str(compiled / "bmv2.json"),
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=200, env=env, cwd=REPO)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(tmp_path.glob("*.log")))
    assert res.returncode == 0, f"{script} failed:\n{res.stderr[-3000:]}\n{logs}"
    return json.loads(res.stdout.strip().splitlines()[-1]), logs


@requires_root
@pytest.mark.root
@pytest.mark.timeout(240)
def test_controller_and_switch_restarts_on_bmv2(compiled, netns_with_veths, tmp_path):
    """bmv2_restart_scenario.py: the controller killed and restarted under 200 packets/s, then the switch
    restarted. No packet lost, nothing re-pushed, counters kept; the new switch re-armed within 2 s."""
    out, logs = run_scenario("bmv2_restart_scenario.py", compiled, netns_with_veths, tmp_path)
    assert out["armed"], f"{out}\n{logs}"
    assert out["sent"] >= 400 and out["lost"] == 0, out  # not a packet of a route lost across the restart
    assert out["cookie_unchanged"], out  # the pipeline was not pushed again
    assert out["entries_after_controller_restart"] == out["entries"], out
    assert out["job_counter_after"] > out["job_counter_before"] > 0, out  # the entry and its counter lived on
    assert out["enqueued_after"] > out["enqueued_before"], out
    assert out["queues"].get("2", 0) == sum(out["queues"].values()), out  # job 42 (TLR 0.30): queue 2 throughout
    assert out["switch_rearmed_s"] is not None and out["switch_rearmed_s"] < 2.0, out
    assert out["controllers_alive"], out


@requires_root
@pytest.mark.root
@pytest.mark.timeout(240)
def test_replicas_failover_on_bmv2_after_kill_minus_nine_of_the_primary(compiled, netns_with_veths, tmp_path):
    """bmv2_failover_scenario.py: two controller replicas, traffic flowing, kill -9 of the primary with a job move
    reported at that moment. The backup takes over within 2 epochs, no non-approximate packet is lost, the tables
    read back equal the desired state, and the job moves resume."""
    out, logs = run_scenario("bmv2_failover_scenario.py", compiled, netns_with_veths, tmp_path)
    assert out["armed"] and out["backup_ready"], f"{out}\n{logs}"
    assert out["takeover_ms"] is not None and out["move_ms"] is not None, f"{out}\n{logs}"
    assert out["takeover_ms"] <= 2 * out["epoch_ms"], out  # the bar: the backup takes over within 2 epochs ...
    assert out["move_ms"] <= 2 * out["epoch_ms"] + out["report_interval_ms"], out  # ... and writes the next report
    assert out["sent_non_approx"] >= 300 and out["lost_non_approx"] == 0, out
    assert out["tables_equal_desired"] and out["cookie_unchanged"], out
    assert out["resumed"] and out["replica1_alive"], out
    assert out["replica1_refused_writes"] == 0, out


@requires_root
@pytest.mark.root
@pytest.mark.timeout(240)
def test_sprayed_flow_spreads_over_the_ecmp_group_on_bmv2(compiled, tmp_path):
    """bmv2_spray_scenario.py: the driver installs one ECMP group (ports 2 and 3, 8 buckets each) on BMv2. One
    approximate ATP flow of 240 packets leaves by both ports, each within 4.5 standard deviations of its bucket
    share, nothing lost or duplicated; every non-approximate flow, and the approximate flow once spraying is off,
    leaves by exactly the port the reference's flow hash names; every member rewrites its own MACs."""
    with veth_netns(3) as ns:
        options = Bmv2Options(ports={1: "swp1", 2: "swp2", 3: "swp3"}, device_id=1, grpc_port=GRPC_PORT,
                              thrift_port=THRIFT_PORT, netns=ns, log_level=None)
        with Bmv2Process(options, tmp_path / "bmv2.log"):
            out, logs = run_scenario("bmv2_spray_scenario.py", compiled, ns, tmp_path)
    assert out["inserted"] == 1 + 1 + 16 + 8, out  # the host route, the group route, 16 members, 8 TLR entries
    sprayed = out["sprayed"]
    n, counts, share = sprayed["sent"], sprayed["counts"], sprayed["share"]
    assert share == {"2": 0.5, "3": 0.5}, share
    assert sum(counts.values()) == n, counts  # nothing lost, nothing duplicated
    for port, p in share.items():
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[port] - n * p) <= 4.5 * sd, (counts, share)
    used = set()
    for flow in out["hashed"] + out["spray_off"]:
        (port,) = flow["reference"]  # one port: the flow hash's
        assert {p: c for p, c in flow["counts"].items() if c} == {port: 4}, flow
        used.add(port)
    assert used == {"2", "3"}, out  # the hash spreads flows over the group
    assert out["spray_off_writes"] == [0, 1, 0], out  # only the group route changes
    print(f"sprayed flow: {counts} of {n} packets by port; hashed flows by port: "
          f"{sorted(next(iter(f['reference'])) for f in out['hashed'])}")
    assert [tuple(m) for m in out["macs_seen"]] == [tuple(m) for m in out["macs_wanted"]], out
