"""The announce flood over real sockets: an ``atp-recv --serve`` process under a flood of forged announces
(tests/support/atp_flood.py) keeps its memory within its budget, and a job sent meanwhile finishes within
twice the time the same job took alone, measured side by side in this test (twice alone, before and after
the flood, twice under it: a change in the machine's load during the test should not count against the
flood)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netapprox.hostlib import api, wire
from netapprox.hostlib.config import AtpConfig, JobSpec
from hostlib_sim import announce

pytestmark = pytest.mark.usefixtures("cores")

REPO = Path(__file__).resolve().parents[2]
BUDGET_MB = 32


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, from /proc."""
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) for k in ("VmRSS", "VmHWM")}


def wait_until_serving(port: int, timeout: float = 10.0) -> None:
    """The receiver answers a token-less announce (an ACK: admitted at once, or a RETRY) once it is up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s.sendto(announce(1, [(0, 0.5, [0])], 1), ("127.0.0.1", port))
            try:
                if wire.decode(s.recv(2048))[0].type in (wire.PacketType.RETRY, wire.PacketType.ACK):
                    return
            except (socket.timeout, ConnectionRefusedError):
                pass
    raise AssertionError(f"receiver on port {port} did not answer within {timeout} s")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the receiver's RSS")
def test_announce_flood_over_loopback_keeps_memory_in_budget_and_a_job_within_2x():
    port = free_port()
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.hostlib", "recv", "--serve", "--bind", "127.0.0.1",
                           "--port", str(port), "--memory-budget-mb", str(BUDGET_MB)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flood = None
    try:
        wait_until_serving(port)
        cfg = AtpConfig(max_rate_bps=20e6)

        def job(job_id):
            return api.send_job(("127.0.0.1", port), JobSpec.uniform(job_id, messages=2500, size=1368, msr=0.9),
                                config=cfg, timeout=60)
        alone = [job(77)]
        base = memory_kb(rx.pid)["VmRSS"]
        env = dict(os.environ, PYTHONPATH=str(REPO / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        flood_started = time.monotonic()
        flood = subprocess.Popen([sys.executable, "-m", "support.atp_flood", "127.0.0.1", str(port), "--seconds", "60",
                                  "--rate", "1500", "--echo", "4", "--echo-rate", "50", "--hold", "600"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert flood.stdout.readline().strip() == "parked"  # the hostile host has filled its slots and memory
        time.sleep(1.0)  # and the receiver has read what it sent
        loaded = [job(78), job(79)]
        # the flood's size must not depend on how fast the jobs were: at least 5 s of it (~7,500 announces)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - flood_started)))
        flood.terminate()
        out, err = flood.communicate(timeout=30)
        assert flood.returncode == 0, err
        counts = json.loads(out.strip().splitlines()[-1])
        mem = memory_kb(rx.pid)
        alone.append(job(80))
        rx.terminate()
        rx_out, rx_err = rx.communicate(timeout=10)
    finally:
        for p in (flood, rx):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert rx.returncode == 0 and "Traceback" not in rx_err
    assert all(s.receiver_confirmed and s.msr_met() for s in alone + loaded)
    t_alone, t_loaded = (sum(s.jct_s for s in runs) / 2 for runs in (alone, loaded))
    assert t_loaded <= 2 * t_alone, (f"JCT under the flood {[round(s.jct_s, 3) for s in loaded]} s, alone "
                                     f"{[round(s.jct_s, 3) for s in alone]} s")
    grown_mb = (mem["VmHWM"] - base) / 1024
    assert grown_mb <= BUDGET_MB + 8, f"receiver grew {grown_mb:.1f} MiB under a {BUDGET_MB} MiB budget"
    assert counts["announces"] > 5000 and counts["echo_admissions"] > 60 and counts["parked_packets"] > 20000
    stats = rx_out.strip().splitlines()[-1]  # --serve prints the receiver's counters when it stops
    peak_mb = float(re.search(r"memory peak ([\d.]+) of ([\d.]+) MiB", stats).group(1))
    assert BUDGET_MB / 2 < peak_mb <= BUDGET_MB, stats  # the hostile host did push memory to the budget
    for reason in ("memory_budget", "source_share"):
        assert re.search(rf"\b{reason} \d+", stats), stats
