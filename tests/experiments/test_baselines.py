"""Baseline transports over loopback, small N: they deliver what they promise and report it."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from netapprox.experiments import baselines as b
from netapprox.experiments.workloads import make_job


def _free_port(kind=socket.SOCK_STREAM) -> int:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _run_receiver(fn, *args, **kwargs):
    """Run a blocking receiver in a thread; its summary lands in the returned dict under 'out'."""
    box = {}

    def target():
        box["out"] = fn(*args, **kwargs)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def test_pick_congestion_control_prefers_dctcp_then_cubic():
    assert b.pick_congestion_control("reno cubic dctcp") == "dctcp"
    assert b.pick_congestion_control("reno bbr cubic") == "cubic"
    assert b.pick_congestion_control("reno") == "reno"
    assert b.pick_congestion_control("") == "unknown"


def test_msr_target_and_sampling():
    assert b.msr_target(0.5, 10) == 5
    assert b.msr_target(0.51, 10) == 6
    assert b.msr_target(0.3, 10) == 3  # 0.3*10 is 3.0000000000000004 in floating point
    assert b.msr_target(1.0, 7) == 7
    with pytest.raises(ValueError):
        b.msr_target(0.0, 10)
    s = b.sample_messages(100, 0.9, seed=4)
    assert len(s) == 90 and len(set(s)) == 90 and s == sorted(s)
    assert s == b.sample_messages(100, 0.9, seed=4)
    assert s != b.sample_messages(100, 0.9, seed=5)


@pytest.mark.parametrize("mode", ["es", "ss"])
def test_tcp_baseline_stops_at_msr(tmp_path, mode):
    port = _free_port()
    ready = tmp_path / "ready"
    t, box = _run_receiver(b.tcp_receive, ("127.0.0.1", port), jobs=1, timeout=20, ready_file=str(ready))
    while not ready.exists():
        pass
    job = make_job("fbhd", seed=2, n=40, max_size=50_000)
    out = b.tcp_send(("127.0.0.1", port), job, job_id=9, msr=0.5, mode=mode, seed=1, timeout=20)
    t.join(20)
    assert out["completed"] and out["jct_s"] > 0
    assert out["target"] == 20 and out["cc"] in ("cubic", "dctcp")
    rx = box["out"]["jobs"][0]
    assert rx["job_id"] == 9 and rx["target"] == 20 and rx["completed"]
    assert rx["delivered"] >= 20
    if mode == "ss":
        assert rx["delivered"] == 20  # SampleSend sends exactly the sample
    assert rx["target_wall"] <= out["end_wall"] + 0.05


def test_tcp_es_honours_ready_times(tmp_path):
    port = _free_port()
    ready = tmp_path / "ready"
    t, box = _run_receiver(b.tcp_receive, ("127.0.0.1", port), jobs=1, timeout=20, ready_file=str(ready))
    job = make_job("fbkv", seed=3, n=50, offered_bps=400_000)  # ~0.35 s of production
    while not ready.exists():
        pass
    out = b.tcp_send(("127.0.0.1", port), job, job_id=1, msr=1.0, mode="es", timeout=20)
    t.join(20)
    # With MSR 1 the sender cannot finish before the last message is produced.
    assert out["jct_s"] >= job.ready_s[-1]
    assert box["out"]["jobs"][0]["delivered"] == 50


def test_udp_blast_paces_and_reports_loss_free_on_loopback(tmp_path):
    port = _free_port(socket.SOCK_DGRAM)
    ready = tmp_path / "ready"
    job = make_job("fbhd", seed=5, n=30, max_size=20_000)
    t, box = _run_receiver(b.udp_receive, ("127.0.0.1", port), jobs=1, msr=0.5, n=job.n, timeout=20,
                           ready_file=str(ready))
    while not ready.exists():
        pass
    rate = 8e6
    out = b.udp_send(("127.0.0.1", port), job, job_id=3, rate_bps=rate, tlr=0.5)
    t.join(20)
    rx = box["out"]["jobs"][0]
    assert rx["packets_sent"] == out["packets_sent"] > job.n
    assert rx["packet_loss"] == pytest.approx(0.0, abs=0.01)
    assert rx["messages_complete"] >= job.n - 1
    # Pacing: the measured rate is at most the requested rate (+ timer slack).
    measured = out["bytes_sent"] * 8 / out["duration_s"]
    assert measured <= rate * 1.1
    assert rx["target_wall"] is not None


def test_udp_blast_packets_are_atp_data_with_tlr():
    from netapprox.hostlib import wire
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2)
    job = make_job("fbkv", seed=1, n=3)
    b.udp_send(rx.getsockname(), job, job_id=77, rate_bps=1e6, tlr=0.4, end_copies=1)
    hdr, payload = wire.decode(rx.recv(2048))
    rx.close()
    assert hdr.type == wire.PacketType.DATA and hdr.approx and hdr.job_id == 77
    assert hdr.tlr == wire.tlr_to_q15(0.4) and len(payload) == job.sizes[0]


def test_udp_blast_sends_no_message_once_the_stop_file_exists(tmp_path):
    """Background cycling for ``duration_s`` ends early when the trial's jobs are done (``--stop-file``)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    stop = tmp_path / "jobs-done"
    job = make_job("fbkv", seed=1, n=3)
    stop.touch()
    out = b.udp_send(rx.getsockname(), job, job_id=78, rate_bps=1e6, duration_s=30.0, end_copies=1,
                     stop_file=str(stop))
    rx.close()
    assert out["packets_sent"] == 0  # not 30 s of cycling
    stop.unlink()
    threading.Timer(0.2, stop.touch).start()
    out = b.udp_send(("127.0.0.1", 9), job, job_id=79, rate_bps=1e6, duration_s=30.0, end_copies=1,
                     stop_file=str(stop))
    assert 0 < out["packets_sent"] and out["duration_s"] < 30.0

def test_cli_writes_json(tmp_path):
    port = _free_port()
    rx_json, tx_json, ready = tmp_path / "rx.json", tmp_path / "tx.json", tmp_path / "ready"
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.experiments.baselines", "tcp-recv", f"127.0.0.1:{port}",
                           "--timeout", "20", "--json", str(rx_json), "--ready-file", str(ready)])
    try:
        import time
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        subprocess.run([sys.executable, "-m", "netapprox.experiments.baselines", "tcp-send", f"127.0.0.1:{port}",
                        "--msr", "0.8", "--n", "20", "--json", str(tx_json)], check=True, timeout=30)
        rx.wait(timeout=20)
    finally:
        if rx.poll() is None:
            rx.kill()
    tx, rxo = json.loads(tx_json.read_text()), json.loads(rx_json.read_text())
    assert tx["protocol"] == "tcp-es" and tx["completed"] and tx["target"] == 16
    assert rxo["jobs"][0]["delivered"] >= 16


def test_start_after_waits_for_every_file_and_names_the_missing_one(tmp_path):
    """A stage that follows several senders (Fig. 15's S2 after three sources) starts once every done file exists;
    one that never comes is one line naming it. The trial runner passes every job of ``JobPlan.after``."""
    from netapprox.experiments import emulated
    from netapprox.experiments.hostprog import wait_for_file
    from netapprox.experiments.jobs import JobWorkload
    from netapprox.experiments.plans import JobPlan
    a, b = tmp_path / "done1", tmp_path / "done2"
    a.write_bytes(b"")
    with pytest.raises(SystemExit, match="done2: not there") as err:
        wait_for_file([str(a), str(b)], timeout=0.05)
    assert "\n" not in str(err.value)
    b.write_bytes(b"")
    wait_for_file([str(a), str(b)], timeout=0.05)
    wait_for_file(str(a), timeout=0.05)
    wl = JobWorkload(kind="partials", seed=1, sizes=(36,), ready_s=(0.0,))
    assert emulated._afters(JobPlan(4, 1, 5, wl, 1.0, after=(1, 2, 3))) == (1, 2, 3)
    assert emulated._afters(JobPlan(2, 1, 3, wl, 1.0, after=1)) == (1,)
    assert emulated._afters(JobPlan(1, 0, 1, wl, 1.0)) == ()
