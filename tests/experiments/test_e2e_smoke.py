"""One tiny end-to-end trial on the emulated rack (root only): ATP and TCP-ES deliver an FBKV job."""
from __future__ import annotations

import os
import shutil

import pytest

ROOT = os.geteuid() == 0 and shutil.which("ip") is not None and os.path.isdir("/var/run") and shutil.which("ss")

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not ROOT, reason="needs root, iproute2 (ip, ss) to build network namespaces")]


def test_atp_and_tcp_es_complete_a_small_job(tmp_path):
    from netapprox.experiments.emulated import run_on_testbed
    from netapprox.experiments.plans import JobPlan, TrialPlan
    from netapprox.experiments.workloads import make_job
    from netapprox.topo.testbed import Testbed, TestbedConfig

    # 2,000 messages (~750 KB): at 20 Mbit/s the ATP job outlasts its first epochs, so it reports (a 400-message
    # job now completes before its first epoch ends and sends no REPORT)
    job = make_job("fbkv", 1, 2000)
    with Testbed(TestbedConfig(hosts=2, rate_mbit=20), tmp_path) as tb:
        ns = list(tb.lab.host_ns) + [tb.lab.switch_ns]
        results = {p: run_on_testbed(tb, TrialPlan({"protocol": p}, 1, p, (JobPlan(1, 0, 1, job, 0.5),)),
                                     timeout=20)["jobs"][0]
                   for p in ("atp", "tcp-es")}
        assert tb.reports_relayed > 0  # ATP's REPORTs reached the in-process controller
    for p, m in results.items():
        assert m["msr_met"], (p, m)
        assert m["jct_s"] is not None and m["jct_s"] > 0
        assert m["delivered"] >= 200
    assert results["atp"]["msg_loss"] <= 0.5
    # everything the testbed created is gone
    import subprocess
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in ns)


@pytest.mark.skipif(shutil.which("mnexec") is None, reason="needs Mininet's mnexec (Debian package 'mininet')")
def test_leafspine_testbed_runs_an_atp_job_across_the_spines(tmp_path):
    """The leaf-spine testbed (Mininet, 2 leaves x 2 spines, the controller driving every switch): an ATP job
    from a host of leaf 1 to a host of leaf 2 meets its MSR, its REPORTs reach the controller, and every switch
    has its ECMP groups."""
    from netapprox.experiments.emulated import run_on_testbed
    from netapprox.experiments.plans import JobPlan, TrialPlan
    from netapprox.experiments.workloads import make_job
    from netapprox.topo.testbed import Testbed, TestbedConfig

    job = make_job("fbkv", 1, 2000)
    cfg = TestbedConfig(hosts=4, rate_mbit=20, topology="leafspine", uplink_mbit=10)
    with Testbed(cfg, tmp_path) as tb:
        switches = tb.runtime.core.switches
        assert set(switches) == {"leaf1", "leaf2", "spine1", "spine2"}
        assert all(s.ecmp_routes for s in switches.values())
        for h in range(4):  # every host resolved every other before the first trial (Testbed._learn_fabric)
            neigh = tb.lab.run(h, ["ip", "neigh", "show"], check=False).stdout.splitlines()
            for other in (o for o in range(4) if o != h):
                assert any(line.startswith(tb.ip(other) + " ") and "lladdr" in line for line in neigh), (h, neigh)
        m = run_on_testbed(tb, TrialPlan({"protocol": "atp"}, 1, "atp", (JobPlan(1, 0, 2, job, 0.5),)),
                           timeout=20)["jobs"][0]
        tb.wait_epochs(2)  # the job's last REPORTs may still wait on the controller's socket
        assert tb.reports_relayed > 0
    assert m["msr_met"] and m["jct_s"] > 0, m
