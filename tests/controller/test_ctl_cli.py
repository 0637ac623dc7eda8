"""``netapprox-controller`` as a first user meets it: no switch reachable (exit status 1, one line naming the
switches), a report port in use (exit status 2, one line), and ``--dry-run``: the epoch loop against the shipped
fake P4Runtime server, on reports sent to it and on a recorded stream, each decision printed."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from ctl_fixtures import report

from netapprox.controller.p4runtime.fake_server import SHIPPED_P4INFO

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[2] / "controller" / "examples"


def config(tmp_path: Path, *, address: str = "127.0.0.1:1", report_port: int = -1, policy: str = "") -> Path:
    (tmp_path / "bmv2.json").write_text("{}")
    path = tmp_path / "ctl.toml"
    path.write_text(f"""
[controller]
epoch_ms = 20
metrics_port = -1
{policy}[reports]
bind = "127.0.0.1"
port = {report_port}
[[switch]]
name = "s1"
[switch.options]
address = "{address}"
p4info = "{SHIPPED_P4INFO}"
bmv2_json = "{tmp_path / 'bmv2.json'}"
check_bmv2_version = false
connect_timeout_s = 0.3
[[switch]]
name = "s2"
[switch.options]
address = "127.0.0.1:2"
p4info = "{SHIPPED_P4INFO}"
bmv2_json = "{tmp_path / 'bmv2.json'}"
check_bmv2_version = false
connect_timeout_s = 0.3
""")
    return path


def controller(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netapprox.controller", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_no_reachable_switch_is_an_error_naming_the_switches(tmp_path):
    res = controller("--config", str(config(tmp_path)), "--duration", "1", "--log-level", "ERROR", cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith("netapprox-controller: error: no switch ever connected: s1 (") and "; s2 (" in lines[0]


def test_a_report_port_in_use_is_one_line_and_exit_status_2(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        res = controller("--config", str(config(tmp_path, report_port=port)), "--duration", "1", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"netapprox-controller: error: cannot bind UDP 127.0.0.1:{port} (reports): Address already in use"], res.stderr


def test_dry_run_replays_a_recorded_stream_and_prints_each_decision(tmp_path):
    # a one-epoch finishing horizon, so that the jobs' TLRs move them (the default puts them in queue 1 for good)
    res = controller("--config", str(config(tmp_path, policy="[policy]\nfinish_epochs = 1\n")), "--dry-run", "--replay",
                     str(FIXTURES / "reports-fairness-k8-seed1.jsonl"), "--epoch-ms", "0.05", "--log-level", "ERROR",
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    # the static entries to both fake switches first, then the three jobs as the recording introduces them
    assert out[0].startswith("epoch 1 t=0s: 0 report(s), 0 job(s) placed; writes s1 +") and ", s2 +" in out[0]
    assert [line.split(":")[0].strip() for line in out if ": new," in line] == ["job 1", "job 2", "job 3"]
    assert any(": moved, queue " in line for line in out)


def test_dry_run_places_the_jobs_hosts_report(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "netapprox.controller", "--config",
                             str(config(tmp_path, address="127.0.0.1:1", report_port=port)), "--dry-run",
                             "--duration", "6", "--log-level", "ERROR"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("epoch 1 ")  # connected to its fake switches: reports count now
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for seq in range(1, 6):
                s.sendto(report(77, seq, 0.3), ("127.0.0.1", port))
                time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "  job 77: new, queue " in out, out


def test_a_metrics_port_in_use_is_one_line_and_exit_status_2(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = controller("--config", str(config(tmp_path)), "--metrics-bind", "127.0.0.1", "--metrics-port",
                         str(port), "--duration", "1", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"netapprox-controller: error: cannot bind TCP 127.0.0.1:{port} (metrics): Address already in use"], res.stderr
