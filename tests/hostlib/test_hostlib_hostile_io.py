"""The announce flood over real sockets: an ``atp-recv --serve`` process under a flood of forged announces
(tests/support/atp_flood.py) keeps its memory within its budget, admits no job for an announce without a token,
and still serves every legitimate job sent before, under and after the flood, each meeting its MSR.

Everything here is a count or a bound: the flood's size is a number of announces (the test waits for the
flooder to report it, whatever the machine's speed), the memory a number of bytes against the budget, the jobs
complete or not. How much longer a job takes under the flood is a ratio of wall-clock times, which a loaded
machine moves: ``make bench`` measures it (``bench/hostlib.py: measure_job_under_flood``)."""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netapprox.hostlib import api
from netapprox.hostlib.config import AtpConfig, JobSpec
from hostlib_sim import announce
from receiver_process import free_port, memory_kb, wait_until_serving

pytestmark = pytest.mark.usefixtures("cores")

REPO = Path(__file__).resolve().parents[2]
BUDGET_MB = 32


FLOOD_ANNOUNCES = 7500
"""Off-path forged announces the flood sends at least (5 s of it at 1,500/s on an idle machine)."""


def read_until(proc: subprocess.Popen, wanted: str, seen: set[str], timeout: float) -> None:
    """Read ``proc``'s stdout lines into ``seen`` until ``wanted`` is among them (a deadline, not a measurement)."""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise AssertionError(f"the flooder did not say {wanted!r} within {timeout} s (said {sorted(seen)})")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the flooder exited before saying {wanted!r}: {proc.stderr.read()[-2000:]}")
        seen.add(line.strip())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the receiver's RSS")
def test_announce_flood_over_loopback_keeps_memory_in_budget_and_every_job_served():
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
        before = [job(77)]
        base = memory_kb(rx.pid)["VmRSS"]
        env = dict(os.environ, PYTHONPATH=str(REPO / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        flood = subprocess.Popen([sys.executable, "-m", "support.atp_flood", "127.0.0.1", str(port), "--seconds", "120",
                                  "--rate", "1500", "--echo", "4", "--echo-rate", "50", "--hold", "600",
                                  "--report-at", str(FLOOD_ANNOUNCES)],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said: set[str] = set()
        read_until(flood, "parked", said, timeout=60)  # the hostile host has filled its slots and memory
        under = [job(78), job(79)]
        # The flood lasts until both jobs are done and it has sent its announces, however fast either goes.
        read_until(flood, f"reached {FLOOD_ANNOUNCES}", said, timeout=100)
        flood.terminate()
        out, err = flood.communicate(timeout=30)
        assert flood.returncode == 0, err
        counts = json.loads(out.strip().splitlines()[-1])
        mem = memory_kb(rx.pid)
        after = [job(80)]
        rx.terminate()
        rx_out, rx_err = rx.communicate(timeout=10)
    finally:
        for p in (flood, rx):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert rx.returncode == 0 and "Traceback" not in rx_err
    for s in before + under + after:
        assert s.receiver_confirmed and s.msr_met(), s
    grown_mb = (mem["VmHWM"] - base) / 1024
    assert grown_mb <= BUDGET_MB + 8, f"receiver grew {grown_mb:.1f} MiB under a {BUDGET_MB} MiB budget"
    assert counts["announces"] >= FLOOD_ANNOUNCES and counts["echo_admissions"] > 60 \
        and counts["parked_packets"] > 20000, counts
    stats = rx_out.strip().splitlines()[-1]  # --serve prints the receiver's counters when it stops
    peak_mb = float(re.search(r"memory peak ([\d.]+) of ([\d.]+) MiB", stats).group(1))
    assert BUDGET_MB / 2 < peak_mb <= BUDGET_MB, stats  # the hostile host did push memory to the budget
    for reason in ("memory_budget", "source_share"):
        assert re.search(rf"\b{reason} \d+", stats), stats
    # Under pressure a job is admitted only for an announce that echoes a token: with a token, the 4 legitimate jobs
    # and the echoing host's at most; the off-path announces got in only while the receiver was not under pressure
    # (without a token), and it did switch to tokens.
    admitted = int(re.search(r"admitted (\d+) job", stats).group(1))
    at_once = re.search(r"\((\d+) without a token\)", stats)
    with_token = admitted - (int(at_once.group(1)) if at_once else 0)
    assert with_token <= 4 + counts["echo_admissions"] and admitted >= 4, (admitted, counts, stats)
    assert re.search(r"switched to tokens \d+x", stats), stats
