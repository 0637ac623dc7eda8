"""atp-recv / atp-send at the edges a first user meets: a port in use, a destination nobody listens on, no
command at all. Each is one line on stderr and a documented exit status (hostlib/__main__.py), with both cores
(the ``cores`` fixture; ``NETAPPROX_PURE_PYTHON`` carries the choice into the subprocesses)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from netapprox.hostlib import api
from netapprox.hostlib.config import JobSpec
from netapprox.hostlib.errors import BindError, PeerUnreachableError

pytestmark = pytest.mark.usefixtures("cores")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netapprox.hostlib", *args], capture_output=True, text=True,
                          timeout=timeout)


def closed_port() -> int:
    """A UDP port on 127.0.0.1 that nothing listens on (bound, noted, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_receiver_on_a_port_in_use_is_refused():
    with api.ReceiverEndpoint(("127.0.0.1", 0)) as first:
        port = first.bound[1]
        with pytest.raises(BindError, match=f"cannot bind UDP 127.0.0.1:{port}: Address already in use"):
            api.ReceiverEndpoint(("127.0.0.1", port))
        res = cli("recv", "--bind", "127.0.0.1", "--port", str(port), "--timeout", "5")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and lines == [f"atp-recv: error: cannot bind UDP 127.0.0.1:{port}: "
                                             "Address already in use"], (res.returncode, res.stderr)
    assert not res.stdout


def test_a_send_to_a_closed_port_fails_at_the_icmp_port_unreachable():
    port = closed_port()
    with pytest.raises(PeerUnreachableError, match=f"cannot reach UDP 127.0.0.1:{port}: Connection refused"):
        api.send_job(("127.0.0.1", port), JobSpec.uniform(7, messages=10, size=100, msr=1.0), timeout=60)
    # --idle-timeout 50: the job fails on the refusal, long before it would fail for silence
    res = cli("send", f"127.0.0.1:{port}", "--messages", "10", "--idle-timeout", "50", timeout=45)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith(f"atp-send: error: cannot reach UDP 127.0.0.1:{port}: Connection refused"), lines


def test_a_transfer_on_the_connected_socket_completes():
    """The sender's socket is connected to the receiver now: a job still completes over it."""
    import threading

    with api.ReceiverEndpoint(("127.0.0.1", 0)) as rx:
        port = rx.bound[1]
        t = threading.Thread(target=rx.serve, kwargs={"jobs": 1, "timeout": 30})
        t.start()
        summary = api.send_job(("127.0.0.1", port), JobSpec.uniform(8, messages=50, size=100, msr=1.0), timeout=30)
        t.join()
    assert summary.msr_met()


def test_no_command_is_one_line_and_help_lists_both_commands():
    res = cli()
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "{send,recv}" in res.stderr
    res = cli("--help")
    assert res.returncode == 0 and not res.stderr and "send" in res.stdout and "recv" in res.stdout


def test_summaries_say_what_they_count():
    """The sender's pacing rate may exceed R_max (pacing gain), and it is called so; messages the receiver lacks
    are "not delivered" (lost or never sent), next to the packets declared lost in the network; the RETRY of
    address validation is explained where it is counted."""
    port = closed_port()
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.hostlib", "recv", "--bind", "127.0.0.1", "--port",
                           str(port), "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(50):
            tx = cli("send", f"127.0.0.1:{port}", "--messages", "400", "--msr", "0.5", "--rate", "100M")
            if "cannot reach" not in tx.stderr:  # the receiver was not bound yet
                break
        out, err = rx.communicate(timeout=60)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    assert tx.returncode == 0 and rx.returncode == 0, (tx.stderr, err)
    assert "final pacing rate" in tx.stdout and "final rate" not in tx.stdout
    assert "R_max 100 Mbit/s" in tx.stdout and "x R_max to catch up after a stall" in tx.stdout
    assert ", not delivered " in tx.stdout and ", lost " not in tx.stdout
    assert "declared lost in the network" in tx.stdout
    assert "not delivered" in out and ", lost " not in out
    assert " 0 RETRY(s)" in out or "RETRY(s) (address validation: " in out, out
