"""Shared constants of the controller tests (a uniquely named module, so test files can import it whatever
other conftest.py files the test run has loaded)."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from netapprox.controller.p4runtime.fake_server import SHIPPED_P4INFO
from netapprox.hostlib.wire import Report

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
P4INFO = SHIPPED_P4INFO
BMV2_JSON_BYTES = b'{"program": "netapprox-test"}'
QUEUE_BY_JOB_ID = 33554435  # NetApproxIngress.classification.queue_by_job in controller/p4runtime/p4info.txtpb


def report(job: int, seq: int, tlr: float) -> bytes:
    return Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=0.0, msr=0.9, rate_kbps=1000, total=10,
                  delivered=0, lost=0, epoch=seq).encode()


def job_entries(fake) -> dict[int, int]:
    """job id -> queue of the queue_by_job entries a fake P4Runtime server holds."""
    return {int.from_bytes(e.match[0].exact.value, "big"): int.from_bytes(e.action.action.params[0].value, "big")
            for e in fake.entries(QUEUE_BY_JOB_ID)}


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, step: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class Hosts:
    """Reporting hosts: every 20 ms until stopped, each job in ``tlrs`` (job -> TLR, changeable while they run)
    reports its TLR to every port in ``ports`` (each a controller on 127.0.0.1)."""

    def __init__(self, *ports: int, tlrs: dict[int, float] | None = None) -> None:
        self.ports = ports
        self.tlrs = dict(tlrs or {5: 0.30, 6: 0.80})
        self.stop = threading.Event()
        self.seq = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not self.stop.wait(0.02):
                self.seq += 1
                for job, tlr in list(self.tlrs.items()):
                    for port in self.ports:
                        s.sendto(report(job, self.seq, tlr), ("127.0.0.1", port))

    def __enter__(self) -> "Hosts":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def start_controller(config: Path, log: Path, *args: str) -> subprocess.Popen:
    """The controller CLI with ``config`` (and ``args``) as a process of its own, its output appended to ``log``."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "netapprox.controller", "--config", str(config),
                                 "--log-level", "INFO", *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)



def controller_toml(*, address: str, p4info: object, bmv2_json: object, report_port: int, decision_log: object,
                    routes: list[tuple[str, int, str]], controller: str = "", policy: str = "",
                    options: str = "") -> str:
    """The TOML of a controller process for one P4Runtime switch ``s1`` (the tests that run the CLI). ``routes``:
    (prefix, port, destination MAC); ``controller``, ``policy``, ``options``: more lines of those tables."""
    route_lines = "".join(f'  {{ prefix = "{prefix}", port = {port}, src_mac = "02:00:00:00:01:00", '
                          f'dst_mac = "{dst_mac}" }},\n' for prefix, port, dst_mac in routes)
    # A key given in ``controller`` replaces the default (TOML refuses a key twice in a table).
    given = {line.split("=", 1)[0].strip() for line in controller.splitlines() if "=" in line}
    defaults = {"epoch_ms": "20", "decision_log": f'"{decision_log}"', "reconnect_initial_s": "0.05",
                "reconnect_max_s": "0.5"}
    controller_lines = "".join(f"{k} = {v}\n" for k, v in defaults.items() if k not in given)
    # the expected queues of these tests are the paper's k/8 thresholds' (the default policy's differ)
    if not any(line.split("=", 1)[0].strip() == "thresholds" for line in policy.splitlines() if "=" in line):
        policy = "thresholds = [" + ", ".join(repr(k / 8) for k in range(8)) + "]\n" + policy
    return f"""
[controller]
{controller_lines}{controller}
[reports]
bind = "127.0.0.1"
port = {report_port}

[policy]
{policy}
[[switch]]
name = "s1"
kind = "p4runtime"
routes = [
{route_lines}]

[switch.options]
address = "{address}"
p4info = "{p4info}"
bmv2_json = "{bmv2_json}"
{options}"""


def stop_process(proc: subprocess.Popen) -> None:
    """Stop a process this test started, if it still runs: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def scenario_args() -> argparse.Namespace:
    """The command line of a BMv2 scenario script (run by test_ctl_bmv2.run_scenario): the compiled program and
    a work folder."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--p4info", required=True)
    ap.add_argument("--bmv2-json", required=True)
    ap.add_argument("--workdir", required=True, type=Path)
    return ap.parse_args()
