"""The report socket drained in batches: the C helper (recvmmsg, decoding, HMAC in C) and the pure-Python loop it
replaces give the same reports and the same drop reasons as ``wire.Report.decode``, datagram for datagram, over a
real UDP socket."""
from __future__ import annotations

import hmac
import random
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller import reports
from netapprox.controller.config import ControllerConfig, PolicyConfig, ReportConfig
from netapprox.controller.reports import RECV_BATCH, ReportIngest, receive_batch
from netapprox.controller.runtime import Runtime
from netapprox.hostlib.wire import Header, MalformedPacket, PacketType, Report, encode

KEY = b"report-key"

requires_native = pytest.mark.skipif(not reports.NATIVE, reason="the C helper controller/_reportrx.c is not built "
                                                                "(pip install -e . builds it when gcc is present)")
PATHS = [pytest.param(True, marks=requires_native, id="native"), pytest.param(False, id="python")]


def report(job=5, group=0, seq=1, tlr=0.3, loss=0.01, key=None) -> bytes:
    return Report(job_id=job, group_id=group, seq=seq, tlr=tlr, loss=loss, msr=0.9, rate_kbps=1000, total=100,
                  delivered=10, lost=3, epoch=seq).encode(key)


def mutations(seed: int, n: int) -> list[bytes]:
    """Valid signed and unsigned reports, and each with a few random bytes changed or cut short."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        data = bytearray(report(job=rng.randrange(0, 5), seq=i + 1, tlr=rng.random(), loss=rng.random(),
                                key=KEY if i % 2 else None))
        kind = rng.randrange(4)
        if kind == 1:
            for _ in range(rng.randrange(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            data = data[:rng.randrange(len(data))]
        elif kind == 3:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        out.append(bytes(data))
    return out


@pytest.fixture
def sockets():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield rx, tx
    rx.close()
    tx.close()


def send_and_drain(rx, tx, datagrams, key, native):
    """Send every datagram, then drain them all with ``receive_batch``: the (source, item) list."""
    for data in datagrams:
        tx.sendto(data, rx.getsockname())
    got = []
    for _ in range(10000):
        batch = receive_batch(rx, key, native=native)
        got += batch
        if len(got) >= len(datagrams):
            break
    return got


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "hmac"])
def test_batches_give_exactly_what_the_wire_decoder_gives(sockets, native, key):
    rx, tx = sockets
    datagrams = mutations(seed=7, n=300) + [b"", b"\x00" * 5, encode(Header(type=PacketType.DATA, job_id=5))]
    got = send_and_drain(rx, tx, datagrams, key, native)
    assert [source for source, _ in got] == ["127.0.0.1"] * len(datagrams)
    for data, (_, item) in zip(datagrams, got):
        try:
            want: Report | str = Report.decode(data, key=key)
        except MalformedPacket as e:
            want = e.reason
        assert type(item) is type(want) and item == want  # the report, or the reason it is malformed
    assert 0 < sum(type(item) is Report for _, item in got) < len(datagrams)


@pytest.mark.parametrize("native", PATHS)
def test_ingest_counts_the_same_drops_either_way(sockets, native):
    rx, tx = sockets
    datagrams = mutations(seed=11, n=400) + [report(job=0, key=KEY), report(job=3, seq=1, key=b"wrong")]
    config = ReportConfig(key=KEY, rate_per_host=1e9, burst=10**6)
    via_bytes = ReportIngest(config)
    expected = [via_bytes.receive(d, "127.0.0.1", 0.0) for d in datagrams]
    ingest = ReportIngest(config)
    got = [ingest.receive(item, source, 0.0) for source, item in send_and_drain(rx, tx, datagrams, KEY, native)]
    assert got == expected
    assert ingest.accepted == via_bytes.accepted > 0
    assert ingest.dropped == via_bytes.dropped and ingest.dropped["bad_mac"] > 0 and ingest.dropped["bad_job"] > 0


@requires_native
@settings(max_examples=200, deadline=None)
@given(key=st.binary(max_size=150), data=st.binary(max_size=300))
def test_c_hmac_is_hmac_sha256(key, data):
    from netapprox.controller import _reportrx

    assert _reportrx.hmac_sha256(key, data) == hmac.digest(key, data, "sha256")


@requires_native
def test_a_batch_is_bounded(sockets):
    rx, tx = sockets
    for seq in range(1, RECV_BATCH + 11):
        tx.sendto(report(seq=seq), rx.getsockname())
    first = []
    while not first:
        first = receive_batch(rx, None)
    assert len(first) <= RECV_BATCH
    assert receive_batch(rx, None, max_batch=10**6)  # clamped to the helper's buffer, not an allocation


@pytest.mark.parametrize("native", PATHS)
def test_runtime_drains_the_socket_in_batches(monkeypatch, native):
    """The runtime picks the C helper when it is built and the Python loop otherwise; either way every report
    waiting on the socket (several batches) is ingested in one drain."""
    if not native:
        monkeypatch.setattr(reports, "_native", None)
    config = ControllerConfig(reports=ReportConfig(bind="127.0.0.1", port=0, key=KEY, rate_per_host=1e9,
                                                   burst=10**6), policy=PolicyConfig(), counters_every=0)
    n = 3 * RECV_BATCH + 5
    with Runtime(config, drivers={}, background_connect=False) as rt, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        for job in range(1, n + 1):
            tx.sendto(report(job=job, key=KEY), rt.report_address)
        tx.sendto(report(job=n + 1), rt.report_address)  # unsigned: bad_mac
        accepted = 0
        for _ in range(200):  # loopback delivery is immediate, but give the kernel a moment
            accepted += rt.epoch(now=1.0).reports_accepted
            if accepted >= n:
                break
        assert accepted == n
        assert sorted(rt.assignments) == list(range(1, n + 1))
        assert rt.core.ingest_stats.dropped["bad_mac"] == 1


def test_without_the_helper_the_python_loop_is_selected(tmp_path):
    """As on a machine where ``pip install`` could not build the helper: importing it fails, ``NATIVE`` is False
    and ``receive_batch`` still drains the socket (in a fresh interpreter, with the import blocked)."""
    import subprocess
    import sys

    script = f"""
import importlib.abc, socket, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "netapprox.controller._reportrx":
            raise ImportError("not built")
sys.meta_path.insert(0, Block())
from netapprox.controller import reports
assert not reports.NATIVE and reports._native is None
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0)); rx.setblocking(False)
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.sendto({report(key=KEY)!r}, rx.getsockname())
got = []
while not got:
    got = reports.receive_batch(rx, {KEY!r})
ingest = reports.ReportIngest(reports.ReportConfig(key={KEY!r}))
assert ingest.receive(got[0][1], got[0][0], 0.0).job_id == 5
print("python loop")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "python loop"


@pytest.mark.parametrize("native", PATHS)
def test_an_ipv6_report_socket_names_its_senders(native):
    try:
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        rx.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    rx.setblocking(False)
    with rx, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
        got = send_and_drain(rx, tx, [report(), report(seq=2, key=KEY)], None, native)
    assert [source for source, _ in got] == ["::1", "::1"]
    assert all(type(item) is Report for _, item in got)
