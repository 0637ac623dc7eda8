"""Real sockets on loopback: the blocking API, the asyncio adapter, reports, and the CLI."""
from __future__ import annotations

import array
import asyncio
import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netapprox.hostlib import aio, api, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, pattern_bytes
from hostlib_sim import announce, token_of
from support.ports import udp_port_bound
from support.processes import stop_if_running

pytestmark = pytest.mark.usefixtures("cores")

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Background(threading.Thread):
    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as err:  # handed to the test
            self.error = err


def test_send_and_receive_over_loopback_with_reports(tmp_path):
    port, ctl = free_port(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))
    ctl.settimeout(5)
    rx = Background(lambda: api.receive_job(("127.0.0.1", port), timeout=20))
    rx.start()
    time.sleep(0.2)
    job = JobSpec.uniform(31, messages=400, size=2000, msr=0.8, groups=[(2, 1.0, 50)])
    cfg = AtpConfig(max_rate_bps=20e6, report_key=b"k3y")
    summary = api.send_job(("127.0.0.1", port), job, config=cfg, report_to=ctl.getsockname(),
                           timeline=tmp_path / "tl.jsonl")
    rx.join(10)
    assert rx.error is None and rx.result is not None
    res = rx.result
    assert summary.receiver_confirmed and summary.msr_met()
    assert res.delivered >= math.ceil(0.8 * 400) + 50 and set(res.lost_ids) == set(summary.lost_ids)
    assert all(data == pattern_bytes(i, 2000) for i, data in res.messages.items())
    report = wire.Report.decode(ctl.recv(2048), key=b"k3y")
    assert report.job_id == 31 and report.group_id in (0, 2) and report.total in (400, 50)
    lines = [json.loads(x) for x in (tmp_path / "tl.jsonl").read_text().splitlines()]
    assert lines and set(lines[0]) >= {"epoch", "time", "group", "tlr", "rate_bps", "loss", "queues"}
    assert json.loads(json.dumps(summary.as_dict()))["job_id"] == 31
    assert json.loads(json.dumps(res.as_dict()))["total"] == 450
    ctl.close()


def test_float_vector_over_loopback():
    port = free_port()
    rx = Background(lambda: api.receive_job(("127.0.0.1", port), timeout=20))
    rx.start()
    time.sleep(0.2)
    values = [i / 7 for i in range(5000)]
    api.send_job(("127.0.0.1", port), JobSpec.from_vector(32, values, msr=0.9), config=AtpConfig(max_rate_bps=20e6))
    rx.join(10)
    res = rx.result
    assert res.vector_len == 5000 and len(res.vector) == 5000
    kept = [i for i in range(5000) if not any(a <= i < b for a, b in res.lost_ranges)]
    assert len(kept) >= 0.9 * 5000
    as_f32 = array.array("f", values)
    assert all(res.vector[i] == as_f32[i] for i in kept)
    assert all(res.vector[i] == 0.0 for a, b in res.lost_ranges for i in range(a, b))


def test_receive_times_out_with_a_clear_error():
    with pytest.raises(api.ReceiveTimeout, match="0 of 1 job"):
        api.receive_job(("127.0.0.1", free_port()), timeout=0.3)


def test_receive_jobs_serves_overlapping_jobs_and_keeps_partial_results_on_timeout():
    port = free_port()
    rx = Background(lambda: api.receive_jobs(("127.0.0.1", port), count=3, timeout=4))
    rx.start()
    time.sleep(0.2)
    senders = [Background(lambda j=j: api.send_job(("127.0.0.1", port), JobSpec.uniform(j, messages=200, size=1368,
                                                                                         msr=0.9),
                                                   config=AtpConfig(max_rate_bps=10e6)))
               for j in (41, 42)]
    for s in senders:
        s.start()
    for s in senders:
        s.join(20)
        assert s.error is None and s.result.receiver_confirmed
    rx.join(20)
    assert isinstance(rx.error, api.ReceiveTimeout) and "2 of 3" in str(rx.error)
    assert sorted(r.job_id for r in rx.error.partial) == [41, 42]


def test_sender_fails_when_nobody_answers():
    """A bound socket that never answers (a closed port fails sooner: test_hostlib_cli_exits.py)."""
    job = JobSpec.uniform(33, messages=5, size=100)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        with pytest.raises(api.JobFailedError, match="no acknowledgement"):
            api.send_job(silent.getsockname(), job, config=AtpConfig(idle_timeout_s=0.3, max_rate_bps=1e6))


def test_asyncio_adapter_both_ways():
    async def main():
        port = free_port()
        job = JobSpec.uniform(34, messages=100, size=1368, msr=0.9)
        for precise in (False, True):
            rx = asyncio.create_task(aio.receive_job_async(("127.0.0.1", port), timeout=10))
            await asyncio.sleep(0.1)
            s = await aio.send_job_async(("127.0.0.1", port), job, config=AtpConfig(max_rate_bps=10e6),
                                         precise=precise)
            r = await rx
            assert s.receiver_confirmed and r.delivered >= 90 and r.job_id == 34
    asyncio.run(main())


def run_cli(*args, timeout=30, **kw):
    return subprocess.run([PY, "-m", "netapprox.hostlib", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.parametrize("args, message", [
    (["send", "127.0.0.1", "--msr", "1.5"], "MSR"),
    (["send", "127.0.0.1", "--group", "1:x:3"], "GROUP:MSR:MESSAGES"),
    (["send", "127.0.0.1", "--group", "0:0.5:3"], "group id"),
    (["send", "127.0.0.1", "--rate", "fast"], "rate"),
    (["send", "127.0.0.1:99999"], "port"),
    (["send", "127.0.0.1", "--messages", "0"], "nothing to send"),
    (["send", "127.0.0.1", "--job-id", "0"], "--job-id"),
    (["send", "127.0.0.1", "--json", "no-such-dir/summary.json"], "--json"),
    (["recv", "--vector-out", "no-such-dir/v.bin"], "--vector-out"),
    (["send", "127.0.0.1", "--vector", "10", "--messages", "3"], "--vector"),
    (["recv", "--timeout", "-1"], "must be > 0"),
    (["bogus"], "usage"),
])
def test_cli_rejects_bad_input_with_exit_2(args, message):
    p = run_cli(*args)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_cli_send_and_receive(tmp_path):
    port = free_port()
    rx = subprocess.Popen([PY, "-m", "netapprox.hostlib", "recv", "--bind", "127.0.0.1", "--port", str(port), "--timeout",
                           "30", "--json", str(tmp_path / "r.json")], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        tx = run_cli("send", f"127.0.0.1:{port}", "--job-id", "35", "--messages", "300", "--msr", "0.8",
                     "--group", "1:1.0:20", "--rate", "20M", "--priority", "2", "--deadline-ms", "100",
                     "--json", str(tmp_path / "s.json"), "--timeline", str(tmp_path / "t.jsonl"))
        out, err = rx.communicate(timeout=30)
    finally:
        stop_if_running(rx)
    assert tx.returncode == 0, tx.stderr
    assert rx.returncode == 0, err
    assert "job 35: MSR met" in tx.stdout and "group 1:" in tx.stdout and tx.stderr == ""
    assert "job 35 from 127.0.0.1" in out and err == ""
    s = json.loads((tmp_path / "s.json").read_text())
    r = json.loads((tmp_path / "r.json").read_text())
    assert s["receiver_confirmed"] and s["msr_met"] and r["job_id"] == 35 and r["lost_ids"] == s["lost_ids"]
    assert (tmp_path / "t.jsonl").read_text().count("\n") >= 1


def test_cli_receiver_serves_until_sigterm_and_exits_cleanly():
    port = free_port()
    rx = subprocess.Popen([PY, "-m", "netapprox.hostlib", "recv", "--serve", "--bind", "127.0.0.1", "--port", str(port)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # it binds its port after its signal handlers are in place
        while not udp_port_bound(port):  # read, never bound: a probe's bind would race the receiver's
            assert rx.poll() is None, f"the receiver exited {rx.returncode} before it bound: {rx.stderr.read()}"
            assert time.monotonic() < deadline, "the receiver never bound its port"
            time.sleep(0.05)
        assert rx.poll() is None
        rx.send_signal(signal.SIGTERM)
        out, err = rx.communicate(timeout=10)
    finally:
        stop_if_running(rx)
    assert rx.returncode == 0 and "Traceback" not in err


def test_cli_sender_reports_failure_with_exit_1():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))
        p = run_cli("send", f"127.0.0.1:{silent.getsockname()[1]}", "--messages", "3", "--idle-timeout", "0.3")
    assert p.returncode == 1 and "no acknowledgement" in p.stderr and "Traceback" not in p.stderr


def test_console_script_entry_points_parse_arguments(capsys):
    from netapprox.hostlib import __main__ as cli
    for main in (cli.send_main, cli.recv_main):
        with pytest.raises(SystemExit) as exc:
            main(["--help"])
        assert exc.value.code == 0
    assert "atp-send" in capsys.readouterr().out


def test_sender_binds_a_chosen_local_address():
    port = free_port()
    rx = Background(lambda: api.receive_job(("127.0.0.1", port), timeout=20))
    rx.start()
    time.sleep(0.2)
    api.send_job(f"127.0.0.1:{port}", JobSpec.uniform(36, messages=5, size=10), bind="127.0.0.1:0")
    rx.join(10)
    assert rx.result.peer[0] == "127.0.0.1" and rx.result.delivered == 5


def test_parse_address_forms():
    assert api.parse_address("h") == ("h", 7600)
    assert api.parse_address("h:9") == ("h", 9)
    assert api.parse_address("[::1]:9") == ("::1", 9)
    assert api.parse_address(("h", "9")) == ("h", 9)
    with pytest.raises(ValueError, match="out of range"):
        api.parse_address("h:0")
    assert api.parse_address("h:0", any_port=True) == ("h", 0)


def test_cli_receiver_rejects_an_oversized_job_with_exit_1():
    port = free_port()
    rx = subprocess.Popen([PY, "-m", "netapprox.hostlib", "recv", "--bind", "127.0.0.1", "--port", str(port),
                           "--max-messages", "10", "--timeout", "20"], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        tx = run_cli("send", f"127.0.0.1:{port}", "--messages", "11", "--idle-timeout", "0.5")
        out, err = rx.communicate(timeout=20)
    finally:
        stop_if_running(rx)
    assert rx.returncode == 1 and "rejected" in err and "max_messages" in err and "Traceback" not in err
    assert tx.returncode == 1 and "rejecting job" in tx.stderr


def test_ce_marked_datagrams_are_acknowledged_with_ece():
    """The receiver reads the IP ECN bits (IP_RECVTOS) and sets ECE on the ACK of a CE-marked packet."""
    port = free_port()
    with api.ReceiverEndpoint(("127.0.0.1", port)) as ep, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.settimeout(5)
        server = Background(lambda: ep.serve(timeout=1.5))
        server.start()
        hello = announce(9, [(0, 0.5, [0, 1])], 2, seq=100)
        tx.sendto(hello, ("127.0.0.1", port))
        answer = wire.decode(tx.recv(2048))
        assert answer[0].seq == 100 and answer[0].type in (wire.PacketType.RETRY, wire.PacketType.ACK)
        tx.sendto(announce(9, [(0, 0.5, [0, 1])], 2, seq=101, token=token_of([answer])), ("127.0.0.1", port))
        answers = [wire.decode(tx.recv(2048))[0].type for _ in range(2)]  # validated: its NEW_TOKEN, then its ACK
        assert answers == [wire.PacketType.NEW_TOKEN, wire.PacketType.ACK]
        for seq, tos in ((0, 0x00), (1, 0x03)):  # ECN not-ECT, then CE
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            h = wire.Header(flags=wire.Flags.APPROX, job_id=9, msg_id=seq, seq=102 + seq)
            tx.sendto(wire.encode(h, b"x"), ("127.0.0.1", port))
        acks = [wire.decode(tx.recv(2048))[0] for _ in range(2)]
        server.join(5)
    assert [(a.seq, bool(a.flags & wire.Flags.ECE)) for a in acks] == [(102, False), (103, True)]
