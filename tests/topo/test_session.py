"""Topology files and the interactive session: the examples load, mistakes are one line naming the field,
and a session starts a file's network, its controller, jobs and captures, then stops all of it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from netapprox.topo.topofile import TopologyFileError, load, parse
from support.skips import requires_root

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "topo" / "examples").glob("*.yaml"))
DISSECTOR = REPO / "tools" / "wireshark" / "atp.lua"

BASE = {"switches": ["s1", "s2"], "hosts": {"h1": "s1", "h2": "s2"}, "links": [{"a": "s1", "b": "s2"}]}


def test_the_shipped_examples_load():
    assert {p.stem for p in EXAMPLES} >= {"rack", "dumbbell", "leafspine"}
    for path in EXAMPLES:
        spec = load(path)
        assert spec.hosts and spec.switches and spec.jobs, path
    assert load(REPO / "topo" / "examples" / "leafspine.yaml").has_loop
    assert not load(REPO / "topo" / "examples" / "dumbbell.yaml").has_loop


@pytest.mark.parametrize("change, field", [
    ({"target": "tofino"}, "target"),
    ({"hosts": {"h1": "s9"}}, "hosts.h1.switch"),
    ({"links": [{"a": "s1", "b": "s1"}]}, "links[0]"),
    ({"links": [{"a": "s1", "b": "s2", "rate_mbit": "fast"}]}, "links[0].rate_mbit"),
    ({"links": [{"a": "s1", "b": "s2", "delay_ms": 5}]}, "links[0].delay_ms"),
    ({"hosts": {"h1": {"switch": "s1", "ip": "10.0.0.254"}}}, "hosts.h1.ip"),
    ({"jobs": [{"src": "h1", "dst": "h7"}]}, "jobs[0].dst"),
    ({"jobs": [{"src": "h1", "dst": "h2", "msr": 1.5}]}, "jobs[0].msr"),
    ({"switch": ["s1"]}, "switch"),
    ({"controller": {"epoch_msec": 20}}, "epoch_msec"),
    ({"controller": {"counters_every": "x"}}, "counters_every"),
    ({"controller": {"policy": {"thresholds": [0.0, 0.5]}}}, "thresholds"),
    ({"jobs": [{"src": "h1", "dst": "h2", "rate": "fast"}]}, "jobs[0].rate"),
    ({"jobs": [{"src": "h1", "dst": "h2", "name": "a/b"}]}, "jobs[0].name"),
    ({"jobs": {"src": "h1"}}, "jobs"),
])
def test_a_mistake_is_one_line_naming_the_field(change, field):
    with pytest.raises(TopologyFileError) as e:
        parse({**BASE, **change}, "t.yaml")
    message = str(e.value)
    assert "\n" not in message and message.startswith("t.yaml") and field in message, message


def test_the_cli_reports_a_bad_file_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("switches: [s1]\nhosts: {h1: s2}\n")
    res = subprocess.run([sys.executable, "-m", "netapprox.topo.session", str(bad), "--no-cli"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "hosts.h1.switch" in res.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    res = subprocess.run([sys.executable, "-m", "netapprox.topo.session", str(broken)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not valid JSON" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@requires_root
@pytest.mark.root
@pytest.mark.mininet
@pytest.mark.timeout(180)
def test_a_session_runs_the_files_jobs_with_captures_and_stops_everything(tmp_path):
    spec = tmp_path / "mini.yaml"
    spec.write_text("""
name: mini
switches: [s1, s2]
hosts: {h1: s1, h2: s2}
links: [{a: s1, b: s2, rate_mbit: 20}]
host_rate_mbit: 50
jobs: [{name: J, src: h1, dst: h2, messages: 300, msr: 0.8, rate: 10M}]
controller: {epoch_ms: 20}
""")
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    res = subprocess.run([sys.executable, "-m", "netapprox.topo.session", str(spec), "--no-cli", "--duration", "60",
                          "--pcap", str(tmp_path / "pcap"), "--results", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "out" / "J.json").read_text())
    assert summary["msr_met"], summary
    pcaps = sorted((tmp_path / "pcap").glob("*.pcap"))
    assert {p.name.split("-")[0] for p in pcaps} == {"s1", "s2"} and all(p.stat().st_size > 24 for p in pcaps)
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    # the session's switch namespaces are na<tag>s1 and na<tag>s2 (other programs may make na... namespaces)
    left = {n for n in after - before if n.startswith("na") and n.endswith(("s1", "s2"))}
    assert not left, f"the session left network namespaces behind: {left}"
    if shutil.which("tshark"):  # the captures read in Wireshark's dissector: the job's packets, its reports
        types, token_acks = set(), 0
        for pcap in pcaps:
            out = subprocess.run(["tshark", "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap), "-Y", "natp",
                                  "-T", "fields", "-e", "natp.type", "-e", "natp.job_id", "-e", "natp.error",
                                  "-e", "natp.flags.token"], capture_output=True, text=True, timeout=120)
            rows = [line.split("\t") for line in out.stdout.splitlines()]
            assert all(error == "" for _, _, error, _ in rows), pcap
            types |= {int(t) for t, job, _, _ in rows if job == "1000"}
            token_acks += sum(t == "2" and job == "1000" and token == "1" for t, job, _, token in rows)
        # DATA, ACK, REPORT (to ctl through s1), DONE, NEW_TOKEN (the job proved its address: a token for its next jobs)
        assert types == {1, 2, 3, 4, 7}, types
        assert token_acks > 0  # admission (wire version 2): admitted at once, its ACKs carry a token to echo
