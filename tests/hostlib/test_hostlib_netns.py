"""ATP between two network namespaces through a Linux bridge whose egress towards the receiver is shaped
(HTB 20 Mbit/s into a 5-packet pfifo), so loss is real congestion loss, not emulated (no netem here).

    [na-h-XXXX-a] veth --- [na-h-XXXX-br: bridge, port to b shaped] --- veth [na-h-XXXX-b]
"""
from __future__ import annotations

import json
import math
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import stop_if_running
from support.skips import requires_root

pytestmark = [requires_root, pytest.mark.root, pytest.mark.timeout(150), pytest.mark.usefixtures("cores")]

REPO = Path(__file__).resolve().parents[2]


def sh(*cmd: str) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


@pytest.fixture
def shaped_pair():
    """Three namespaces (hosts a, b and the bridge), torn down whatever happens."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs iproute2 (ip, tc)")
    tag = f"na-h-{secrets.token_hex(3)}"
    a, b, br = f"{tag}-a", f"{tag}-b", f"{tag}-br"
    created: list[str] = []
    try:
        for ns in (a, b, br):
            sh("ip", "netns", "add", ns)
            created.append(ns)
        for host, addr in ((a, "10.66.0.1/24"), (b, "10.66.0.2/24")):
            side = host[-1]
            sh("ip", "link", "add", "eth0", "netns", host, "type", "veth", "peer", "name", f"p{side}", "netns", br)
            sh("ip", "-n", host, "addr", "add", addr, "dev", "eth0")
            sh("ip", "-n", host, "link", "set", "eth0", "up")
            sh("ip", "-n", host, "link", "set", "lo", "up")
            if shutil.which("ethtool"):
                sh("ip", "netns", "exec", host, "ethtool", "-K", "eth0", "tx", "off")
        sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        for port in ("pa", "pb"):
            sh("ip", "-n", br, "link", "set", port, "master", "br0")
            sh("ip", "-n", br, "link", "set", port, "up")
        sh("ip", "-n", br, "link", "set", "br0", "up")
        # static neighbours: the first ARP exchange over a fresh bridge can take a second here, and the
        # sender would spend it at R_min without any ACK
        macs = {h: json.loads(sh("ip", "-n", h, "-j", "link", "show", "eth0"))[0]["address"] for h in (a, b)}
        sh("ip", "-n", a, "neigh", "replace", "10.66.0.2", "lladdr", macs[b], "dev", "eth0", "nud", "permanent")
        sh("ip", "-n", b, "neigh", "replace", "10.66.0.1", "lladdr", macs[a], "dev", "eth0", "nud", "permanent")
        # the bottleneck: bridge egress towards b
        sh("ip", "netns", "exec", br, "tc", "qdisc", "add", "dev", "pb", "root", "handle", "1:", "htb", "default", "1")
        sh("ip", "netns", "exec", br, "tc", "class", "add", "dev", "pb", "parent", "1:", "classid", "1:1", "htb",
           "rate", "20mbit", "ceil", "20mbit", "burst", "3028", "cburst", "3028")
        sh("ip", "netns", "exec", br, "tc", "qdisc", "add", "dev", "pb", "parent", "1:1", "handle", "10:", "pfifo",
           "limit", "5")
        yield a, b, br, "10.66.0.2"
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def drops(br: str) -> int:
    out = sh("ip", "netns", "exec", br, "tc", "-s", "qdisc", "show", "dev", "pb")
    return sum(int(x) for x in re.findall(r"dropped (\d+)", out))


def test_atp_over_a_shaped_bridge_meets_the_msr_under_congestion_loss(shaped_pair, tmp_path):
    a, b, br, b_addr = shaped_pair
    n, msr = 3000, 0.8
    rx = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-m", "netapprox.hostlib", "recv", "--port", "7600",
                           "--timeout", "60", "--json", str(tmp_path / "r.json")],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # wait until the receiver's port is bound
        for _ in range(100):
            if ":7600" in sh("ip", "netns", "exec", b, "ss", "-uln"):
                break
            subprocess.run(["sleep", "0.05"])
        tx = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-m", "netapprox.hostlib", "send", f"{b_addr}:7600",
                             "--job-id", "77", "--messages", str(n), "--msr", str(msr), "--group", "1:1.0:100",
                             "--rate", "100M", "--json", str(tmp_path / "s.json"),
                             "--timeline", str(tmp_path / "t.jsonl")],
                            cwd=REPO, capture_output=True, text=True, timeout=90)
        out, err = rx.communicate(timeout=30)
    finally:
        stop_if_running(rx)
    assert tx.returncode == 0, tx.stderr
    assert rx.returncode == 0, err
    s = json.loads((tmp_path / "s.json").read_text())
    r = json.loads((tmp_path / "r.json").read_text())
    assert s["receiver_confirmed"] and s["msr_met"]
    groups = {g["group_id"]: g for g in r["groups"]}
    assert groups[0]["delivered"] >= math.ceil(msr * n) and groups[1]["delivered"] == 100
    assert drops(br) > 0 and s["packets_lost"] > 0  # the loss was real: the shaped queue overflowed
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert min(x["rate_bps"] for x in lines) < 100e6  # rate control reacted to the loss
