"""Forged reports do not spend a real host's report budget (issue: the controller's report path).

A real host reports at 40 per second, within its token bucket (50 per second, burst 10); a forger sends 5,000
reports per second that name the real host's source address: unsigned, signed with the wrong key, replays of the
host's own earlier (authenticated) reports, and garbage. Virtual time, counts only: every report of the real host
is accepted, exactly as without the flood, and every forged one is counted under its reason. Three ways in, the
same result: datagram bytes (``ReportIngest.receive``, as packet-in and ``Runtime.ingest`` feed them) and the
report socket drained by ``receive_batch``, with the C helper and with the pure-Python loop.
"""
from __future__ import annotations

import socket

import pytest

from netapprox.controller import reports
from netapprox.controller.config import ReportConfig
from netapprox.controller.reports import ReportIngest, receive_batch
from netapprox.hostlib.wire import Report

KEY = b"report-key"
HOST = "127.0.0.1"  # the real host's address, which the forger spoofs (over loopback: every datagram's source)
CONFIG = ReportConfig(key=KEY, rate_per_host=50.0, burst=10)
SECONDS = 2.0
REAL_PER_S, FORGED_PER_S = 40, 5000

PATHS = [pytest.param("bytes", id="bytes"),
         pytest.param("native", id="native", marks=pytest.mark.skipif(
             not reports.NATIVE, reason="the C helper controller/_reportrx.c is not built (pip install -e . builds "
                                        "it when gcc is present)")),
         pytest.param("python", id="python")]


def real_report(seq: int, key: bytes | None = KEY) -> bytes:
    return Report(job_id=7, group_id=seq % 2, seq=seq, tlr=0.25, loss=0.01, msr=0.9, rate_kbps=1000, total=100,
                  delivered=seq, lost=0, epoch=seq).encode(key)


def forged(i: int, replayable: list[bytes]) -> tuple[bytes, str]:
    """The i-th forged datagram and the reason it must be dropped for."""
    kind = i % 4
    if kind == 0:
        return real_report(10_000 + i, key=None), "bad_mac"  # unsigned: no tag where one is required
    if kind == 1:
        return real_report(10_000 + i, key=b"guessed key"), "bad_mac"
    if kind == 2 and replayable:
        return replayable[i % len(replayable)], "stale_seq"  # a captured real report, sent again
    return bytes(20), "truncated"


def schedule() -> tuple[list[tuple[float, bytes]], int, dict[str, int]]:
    """(time, datagram) in time order, the real reports among them, and the forged ones by reason."""
    events: list[tuple[float, int, bytes]] = []
    real = [(k / REAL_PER_S, real_report(k + 1)) for k in range(int(SECONDS * REAL_PER_S))]
    sent_real: list[bytes] = []
    reasons: dict[str, int] = {}
    r = 0
    for i in range(int(SECONDS * FORGED_PER_S)):
        t = i / FORGED_PER_S
        while r < len(real) and real[r][0] <= t:
            events.append((real[r][0], 0, real[r][1]))
            sent_real.append(real[r][1])
            r += 1
        data, why = forged(i, sent_real)
        events.append((t, 1, data))
        reasons[why] = reasons.get(why, 0) + 1
    events += [(t, 0, d) for t, d in real[r:]]
    return [(t, d) for t, _, d in events], len(real), reasons


def ingest_all(path: str, timed: list[tuple[float, bytes]]) -> ReportIngest:
    """Every datagram through one ReportIngest at its virtual time, by ``path``."""
    ingest = ReportIngest(CONFIG)
    if path == "bytes":
        for t, data in timed:
            ingest.receive(data, HOST, t)
        return ingest
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind((HOST, 0))
        rx.setblocking(False)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        for start in range(0, len(timed), 500):  # a chunk at a time, so the socket's buffer never overflows
            chunk = timed[start:start + 500]
            for _, data in chunk:
                tx.sendto(data, rx.getsockname())
            got: list[tuple[str, Report | str]] = []
            for _ in range(10_000):
                got += receive_batch(rx, KEY, native=path == "native")
                if len(got) >= len(chunk):
                    break
            assert len(got) == len(chunk)
            for (t, _), (source, item) in zip(chunk, got):
                ingest.receive(item, source, t)
    return ingest


@pytest.mark.parametrize("path", PATHS)
def test_a_5k_per_second_forged_flood_does_not_reduce_the_real_hosts_accepted_reports(path):
    timed, n_real, forged_by_reason = schedule()
    alone = ingest_all("bytes", [(k / REAL_PER_S, real_report(k + 1)) for k in range(n_real)])
    assert alone.accepted == n_real == 80 and not alone.dropped  # within its budget, every report counts
    flooded = ingest_all(path, timed)
    assert flooded.accepted == alone.accepted
    # each forged report is counted under its reason; none spent a token (nothing is rate limited)
    assert dict(flooded.dropped) == forged_by_reason
    assert forged_by_reason["bad_mac"] == 5000 and forged_by_reason["stale_seq"] > 2000


def test_forged_reports_from_many_spoofed_hosts_create_no_per_host_state():
    """A forger cycling through 10,000 spoofed source addresses (beyond the 4,096 buckets kept) must not evict the
    real host's bucket: were it evicted, the host's next reports would find a full bucket again and more than its
    burst would be accepted at one instant."""
    ingest = ReportIngest(CONFIG)
    accepted = sum(ingest.receive(real_report(seq), HOST, 0.0) is not None for seq in range(1, 2 * CONFIG.burst + 1))
    assert accepted == CONFIG.burst  # the bucket is empty now
    for i in range(10_000):
        spoofed = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        assert ingest.receive(real_report(100_000 + i, key=b"guessed key"), spoofed, 0.0) is None
    late = [ingest.receive(real_report(seq), HOST, 0.0) for seq in range(1000, 1000 + CONFIG.burst)]
    assert late == [None] * CONFIG.burst  # still empty: the flood did not reset it
    assert ingest.dropped == {"rate_limited": 2 * CONFIG.burst, "bad_mac": 10_000}
