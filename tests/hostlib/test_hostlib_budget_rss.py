"""The memory budget measured as the operating system sees it: the peak RSS of a serving receiver process
(``atp-recv --serve``) under a mix of floods (off-path announces from many addresses, a host that echoes its tokens
and parks data until the budget is full), replies driven by bursts of duplicates, and large jobs, stays within the
RSS of the same process idle plus its budget plus ``RSS_SLACK_MB`` (docs/hostlib.md, Threat model: what that
constant holds). A memory bound, read from /proc (VmHWM), never a timing assert; both cores."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netapprox.hostlib import api, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message
from hostlib_sim import announce, token_of
from receiver_process import free_port, memory_kb, wait_until_serving

pytestmark = [pytest.mark.usefixtures("cores"), pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read RSS")]

REPO = Path(__file__).resolve().parents[2]
BUDGET_MB = 16
RSS_SLACK_MB = 8
"""What a receiver process may hold beyond its idle RSS and its budget: the interpreter's and the allocator's slack
around the charged structures (freed blocks not returned at once), the native receive buffers' growth, and the
events and summaries on their way to the application (docs/hostlib.md)."""


def drive_replies(port: int, stop: threading.Event, counts: dict) -> None:
    """Admit one job (validated) and send bursts of duplicates of its packets: each draws an ACK (ack_every 16,
    every burst at once), so replies pile up between the receiver's sends."""
    dst = ("127.0.0.1", port)
    groups = [(0, 0.5, range(1000))]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        s.sendto(announce(900, groups, 1000, seq=0), dst)
        token = token_of([wire.decode(s.recv(2048))])
        s.sendto(announce(900, groups, 1000, seq=1, token=token), dst)
        s.setblocking(False)
        packets = [wire.encode(wire.Header(flags=wire.Flags.APPROX, job_id=900, msg_id=m, pkt_cnt=2, seq=2 + m),
                               b"r" * 1300) for m in range(200)]
        while not stop.is_set():
            for p in packets:
                try:
                    s.sendto(p, dst)
                    counts["sent"] += 1
                except BlockingIOError:
                    break
            while True:
                try:
                    s.recv(2048)
                    counts["replies"] += 1
                except (BlockingIOError, ConnectionRefusedError):
                    break
            time.sleep(0.005)


def large_job(port: int, job_id: int, results: list) -> None:
    """A job of large messages (16 KiB each, 2 MiB in all) that must be reassembled in the receiver's buffers."""
    job = JobSpec(job_id=job_id, messages=tuple(Message(bytes([job_id % 256]) * (16 << 10)) for _ in range(128)),
                  msr=0.9)
    try:
        results.append(api.send_job(("127.0.0.1", port), job, config=AtpConfig(max_rate_bps=50e6), timeout=20))
    except api.AtpError as err:  # under this load a job may time out: it was load, not the thing measured
        results.append(err)


def test_receiver_rss_stays_within_its_budget_plus_a_constant_under_floods_replies_and_large_jobs():
    port = free_port()
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.hostlib", "recv", "--serve", "--bind", "127.0.0.1",
                           "--port", str(port), "--memory-budget-mb", str(BUDGET_MB)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flood = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        wait_until_serving(port)
        warm: list = []
        large_job(port, 50, warm)  # the serving path warmed up (imports, buffers) before the idle RSS is read
        idle_kb = memory_kb(rx.pid)["VmRSS"]
        env = dict(os.environ, PYTHONPATH=str(REPO / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        flood = subprocess.Popen([sys.executable, "-m", "support.atp_flood", "127.0.0.1", str(port), "--seconds", "8",
                                  "--rate", "2000", "--spoof", "16", "--echo", "2", "--echo-rate", "20",
                                  "--echo-jobs", "8", "--hold", "2000"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        counts = {"sent": 0, "replies": 0}
        results: list = []
        threads = [threading.Thread(target=drive_replies, args=(port, stop, counts), daemon=True)]
        threads += [threading.Thread(target=large_job, args=(port, 60 + k, results), daemon=True) for k in range(3)]
        for t in threads:
            t.start()
        flood.communicate(timeout=60)
        stop.set()
        for t in threads:
            t.join(30)
        mem = memory_kb(rx.pid)
        rx.terminate()
        out, err = rx.communicate(timeout=10)
    finally:
        stop.set()
        for p in (flood, rx):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert rx.returncode == 0 and "Traceback" not in err, err
    stats = out.strip().splitlines()[-1]  # the receiver's counters when it stopped
    peak_mb = float(re.search(r"memory peak ([\d.]+) of ([\d.]+) MiB", stats).group(1))
    assert BUDGET_MB / 2 < peak_mb <= BUDGET_MB, stats  # the load filled the pool and more, and no more was charged
    assert counts["replies"] > 1000, (stats, counts)
    grown_mb = (mem["VmHWM"] - idle_kb) / 1024
    print(f"idle RSS {idle_kb / 1024:.1f} MiB, peak {mem['VmHWM'] / 1024:.1f} MiB: grew {grown_mb:.1f} MiB "
          f"with a {BUDGET_MB} MiB budget ({stats})")
    assert grown_mb <= BUDGET_MB + RSS_SLACK_MB, \
        f"receiver RSS grew {grown_mb:.1f} MiB, over its {BUDGET_MB} MiB budget + {RSS_SLACK_MB} MiB"
