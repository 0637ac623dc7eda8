"""Every command line refuses a bad value before it starts anything: exit status 2 and a single line on stderr
that names the field (a TOML key, a topology-file field or an option), no traceback.

atp-send/atp-recv have their own cases in tests/hostlib/test_hostlib_io.py; topology files in
tests/topo/test_session.py; the controller's TOML keys one by one in tests/controller/test_ctl_config.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def assert_one_line(res: subprocess.CompletedProcess, field: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and field in lines[0], (res.returncode, res.stderr)


@pytest.mark.parametrize("toml, field", [
    ('[controller]\ncounters_every = "x"\n', "[controller] counters_every"),
    ("[policy]\nthresholds = [0.0, 0.5]\n", "[policy] thresholds"),
    ('[reports]\nport = "7601"\n', "[reports] port"),
    ('[[switch]]\nname = "s1"\n[switch.options]\nthrift_port = "x"\n', "options.thrift_port"),
    ('[[switch]]\nname = "s1"\n[switch.options]\nthirft_port = 9090\n', "thirft_port"),
    ("[controller\n", "invalid TOML"),
])
def test_controller_config_file(tmp_path, toml, field):
    config = tmp_path / "ctl.toml"
    config.write_text(toml)
    assert_one_line(run("netapprox.controller", "--config", str(config), "--report-port", "-1", cwd=tmp_path), field)


@pytest.mark.parametrize("flags, field", [
    (["--epoch-ms", "-5"], "--epoch-ms"),
    (["--report-port", "x"], "--report-port"),
    (["--metrics-bind", "no such host!"], "--metrics-bind"),
    (["--report-key-file", "missing.key"], "--report-key-file"),
    (["--decision-log", "/proc/netapprox/decisions.jsonl"], "decision_log"),
    (["--log-level", "LOUD"], "--log-level"),
])
def test_controller_flags(tmp_path, flags, field):
    config = tmp_path / "ctl.toml"
    config.write_text("[reports]\nport = -1\n")
    assert_one_line(run("netapprox.controller", "--config", str(config), *flags, cwd=tmp_path), field)


@pytest.mark.parametrize("args, field", [
    (["alltoall", "--set", "msrs=x"], "--set msrs"),
    (["alltoall", "--set", "msrs=0.5,1.5"], "--set msrs"),
    (["coexist", "--set", "protocols=atp,tcpes"], "--set protocols"),
    (["alltoall", "--set", "nonsense=1"], "--set nonsense"),
    (["alltoall", "--hosts", "1"], "--hosts"),
    (["alltoall", "--rate-mbit", "fast"], "--rate-mbit"),
    (["alltoall", "--out", "/proc/netapprox-results"], "--out"),
])
def test_experiments(tmp_path, args, field):
    assert_one_line(run("netapprox.experiments", *args, cwd=tmp_path), field)


@pytest.mark.parametrize("args, field", [
    (["--metrics-port", "99999"], "--metrics-port"),
    (["--bottleneck-mbit", "0"], "--bottleneck-mbit"),
    (["--messages", "many"], "--messages"),
    (["--results", "/proc/netapprox-demo"], "--results"),
])
def test_demo(tmp_path, args, field):
    assert_one_line(run("netapprox.topo.demo", *args, cwd=tmp_path), field)


@pytest.mark.parametrize("topology, args, field", [
    ("switches: [s1]\nhosts: {h1: s1}\ncontroller: {counters_every: x}\n", [], "counters_every"),
    ("switches: [s1]\nhosts: {h1: s1}\njobs: [{src: h1, dst: h1, rate: fast}]\n", [], "jobs[0].rate"),
    ("switches: [s1]\nhosts: {h1: s1}\n", ["--duration", "-1"], "--duration"),
    ("switches: [s1]\nhosts: {h1: s1}\n", ["--pcap", "/proc/netapprox-pcap"], "--pcap"),
])
def test_session(tmp_path, topology, args, field):
    path = tmp_path / "t.yaml"
    path.write_text(topology)
    assert_one_line(run("netapprox.topo.session", str(path), "--no-cli", *args, cwd=tmp_path), field)
