"""A serving receiver under the attacks of docs/hostlib.md's threat model that an admitted host can mount, over
real sockets: repeated FINs of a job declaring the largest N, many such jobs finished at once while the
receiver writes a summary of each (``--serve --json``), and 1 MiB manifests that fail only their last check
(tests/support/atp_attack.py, from four addresses). Checked by counts and bounds, never by wall-clock ratios
(``make bench`` measures how much longer a job takes under attack):

- the receiver's memory stays within a small factor of its budget (RSS peak, from /proc) and below 512 MB;
- every attacking address got back at most 3x the bytes it sent;
- a legitimate job from another address meets its MSR during the attack, and another one after it;
- every finished job's summary is one JSON line of bounded size, written while the receiver serves.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netapprox.hostlib import api
from netapprox.hostlib.config import AtpConfig, JobSpec
from receiver_process import free_port, memory_kb, wait_until_serving

pytestmark = [pytest.mark.usefixtures("cores"), pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read RSS")]

REPO = Path(__file__).resolve().parents[2]
BUDGET_MB = 32


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, memory_kb(self.pid)["VmRSS"])
            except (OSError, AttributeError):
                return


def test_a_serving_receiver_stays_bounded_under_an_admitted_hosts_attacks(tmp_path):
    port = free_port()
    summaries = tmp_path / "jobs.jsonl"
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.hostlib", "recv", "--serve", "--bind", "127.0.0.1",
                           "--port", str(port), "--memory-budget-mb", str(BUDGET_MB), "--json", str(summaries)],
                          cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    attack = None
    try:
        wait_until_serving(port)
        cfg = AtpConfig(max_rate_bps=20e6)

        def legit(job_id: int):
            return api.send_job(("127.0.0.1", port), JobSpec.uniform(job_id, messages=1500, size=1368, msr=0.9),
                                config=cfg, timeout=120)

        assert legit(7).msr_met()
        base_kb = memory_kb(rx.pid)["VmRSS"]
        sampler = RssSampler(rx.pid)
        sampler.start()
        env = dict(os.environ, PYTHONPATH=str(REPO / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        attack = subprocess.Popen([sys.executable, "-m", "support.atp_attack", "127.0.0.1", str(port), "--seconds",
                                   "60", "--sources", "4", "--fins", "2000", "--huge", "20", "--manifests", "2"],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3.0)  # the attack is under way (its jobs admitted, FINs repeating) before the job starts
        during = legit(8)
        time.sleep(1.0)
        attack.send_signal(signal.SIGTERM)
        out, err = attack.communicate(timeout=30)
        counts = json.loads(out.strip().splitlines()[-1])
        after = legit(9)
        sampler.stop.set()
        sampler.join()
        assert during.msr_met() and during.receiver_confirmed
        assert after.msr_met() and after.receiver_confirmed
        assert counts["fins"] > 10_000 and counts["huge_jobs"] > 50 and counts["manifests"] > 5, counts
        for addr, c in counts["sources"].items():
            assert c["received"] <= 3 * c["sent"], (addr, c)
        peak_mb = sampler.peak / 1024
        assert peak_mb < 512, f"receiver RSS peaked at {peak_mb:.0f} MB"
        assert (sampler.peak - base_kb) / 1024 <= 3 * BUDGET_MB + 32, \
            f"RSS grew {(sampler.peak - base_kb) / 1024:.0f} MB with a {BUDGET_MB} MiB budget"
        lines = summaries.read_text().splitlines()
        assert len(lines) >= counts["huge_jobs"] // 2  # written as jobs finished, while the receiver served
        for line in lines:
            assert len(line) < 200_000
            s = json.loads(line)
            assert s["lost"] == sum(b - a for a, b in s["lost_id_ranges"]) or s.get("lost_id_ranges_truncated")
        assert any(json.loads(line)["total"] == 1 << 20 for line in lines)
    finally:
        if attack is not None and attack.poll() is None:
            attack.kill()
            attack.wait()
        rx.send_signal(signal.SIGTERM)
        try:
            rx.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            rx.kill()
            rx.communicate()
