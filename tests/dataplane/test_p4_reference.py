"""The P4 program on BMv2 against the reference model: hypothesis-generated tables written through P4Runtime and
generated packets, a few hundred examples (tests/dataplane/p4_reference_scenario.py does the work inside the
namespace and says what it checks). Needs p4c, BMv2 and root, as the PTF suite does."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from support.skips import requires_p4, requires_root

REPO = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("p4_reference_scenario.py")
BUILD = REPO / "build" / "v1model"
GRPC_PORT = 9559
EXAMPLES = 300
REASONS = ("truncated", "bad_version", "bad_type", "bad_tlr", "bad_index", "ttl_expired", "ipv4_checksum")
"""The drop reasons the generated packets must reach; not ``bad_flags``: wire version 2 defines every flag bit."""

pytestmark = [requires_p4, requires_root, pytest.mark.p4, pytest.mark.root, pytest.mark.slow,
              pytest.mark.timeout(900)]


def sh(*cmd: str, netns: str | None = None) -> None:
    full = (["ip", "netns", "exec", netns] if netns else []) + list(cmd)
    res = subprocess.run(full, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {res.stderr.strip()}")


@pytest.fixture
def bmv2(tmp_path):
    """A namespace with veths swp<i> (switch port i) - h<i> (i = 1..3) and simple_switch_grpc on the swp side."""
    from netapprox.topo.bmv2 import Bmv2Options, Bmv2Process

    subprocess.run(["make", "-C", str(REPO), "p4"], check=True, capture_output=True)
    ns = f"naref{secrets.token_hex(3)}"
    sh("ip", "netns", "add", ns)
    log = tmp_path / "bmv2.log"
    try:
        for key in ("all", "default"):
            sh("sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1", netns=ns)
        sh("ip", "link", "set", "lo", "up", netns=ns)
        for i in (1, 2, 3):
            sh("ip", "link", "add", f"swp{i}", "type", "veth", "peer", "name", f"h{i}", netns=ns)
            for dev in (f"swp{i}", f"h{i}"):
                sh("ip", "link", "set", dev, "up", netns=ns)
        options = Bmv2Options(ports={1: "swp1", 2: "swp2", 3: "swp3"}, device_id=1, grpc_port=GRPC_PORT,
                              thrift_port=None, netns=ns, log_level="warn")
        with Bmv2Process(options, log):
            yield ns, log
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_the_p4_program_on_bmv2_agrees_with_the_reference(bmv2):
    ns, log = bmv2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, str(SCENARIO), "--grpc-port", str(GRPC_PORT),
                          "--device-id", "1", "--p4info", str(BUILD / "p4info.txtpb"), "--bmv2-json",
                          str(BUILD / "bmv2.json"), "--examples", str(EXAMPLES)],
                         capture_output=True, text=True, timeout=840, env=env, cwd=REPO)
    assert res.returncode == 0, f"BMv2 disagrees with the reference:\n{res.stderr[-6000:]}\n" \
                                f"--- BMv2 log ---\n{log.read_text(errors='replace')[-1500:]}"
    stats = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"P4 on BMv2 vs reference: {stats}")
    assert stats["examples"] >= EXAMPLES, stats
    # Not vacuous: every fate, every queue, every drop reason, the guard and the job counters were exercised.
    for key in ("forward", "cpu", "drop", "discard", "guarded", "job_hits", *REASONS, *(f"q{q}" for q in range(8))):
        assert stats.get(key, 0) > 0, (key, stats)
