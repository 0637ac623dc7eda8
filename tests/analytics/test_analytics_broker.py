"""The broker stage (analytics/broker.py): rows appended to a Redis stream, a feeder cutting them into time windows
and sending each over ATP (loopback) to a consumer, each window at the MSR planned from the windows before it.
Runs its own redis-server on a loopback port and stops it (skipped, saying why, without redis-server or the
client)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

redis = pytest.importorskip("redis", reason="the redis client is not installed (the 'analytics' extra)")
if shutil.which("redis-server") is None:
    pytest.skip("no redis-server on PATH (tools/setup-system.sh installs it)", allow_module_level=True)

from netapprox.analytics import AnalyticsError, AnalyticsJob, Query, Row, broker, correlated_rows  # noqa: E402
from support.processes import counting_receiver  # noqa: E402


def _port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def broker_at():
    port = _port(socket.SOCK_STREAM)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                broker.connect(f"127.0.0.1:{port}")
                break
            except AnalyticsError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_broker_feeder_sends_each_time_window_over_atp(broker_at):
    b = broker.connect(broker_at)
    rows = correlated_rows(2800, seed=9)
    counts = (1000, 1000, 800)  # rows in [0, 10), [10, 20), [20, 30) s
    times = [10.0 * k + 10.0 * i / n for k, n in enumerate(counts) for i in range(n)]
    assert broker.produce(b, "trips", rows, times) == 2800
    dest = f"127.0.0.1:{_port(socket.SOCK_DGRAM)}"
    got: dict[int, int] = {}
    t = counting_receiver(dest, 3, AnalyticsJob.config(), got)
    out = broker.feed(b, "trips", dest, Query("avg", 0.1), seconds=10.0, first=900, seed=9, wait_s=30)
    t.join(60)
    assert [a.rows for a in out] == [1000, 1000, 800]
    assert [a.plan.basis for a in out] == ["heuristic", "previous window", "previous window"]
    assert [a.plan.size.total for a in out] == [900, pytest.approx(1000), pytest.approx(1000)]  # N from the rate
    assert out[2].size_error == pytest.approx(0.25)
    assert got == {k + 1: a.received for k, a in enumerate(out)}  # the consumer has what the feeder counted
    for k, a in enumerate(out):
        truth = sum(r.value for r in rows[1000 * k:1000 * k + counts[k]]) / counts[k]
        assert abs(a.estimate.value - truth) <= 1.5 * a.estimate.half_width + 1e-9


def test_broker_bad_input_is_one_line(broker_at):
    with pytest.raises(AnalyticsError, match="no broker \\(Redis\\) answers at 127.0.0.1:1"):
        broker.connect("127.0.0.1:1")
    b = broker.connect(broker_at)
    with pytest.raises(AnalyticsError, match="2 rows but 1 arrival times"):
        broker.produce(b, "t", [Row(1.0), Row(2.0)], [0.0])
    broker.produce(b, "late", [Row(1.0), Row(2.0)], [5.0, 1.0])
    with pytest.raises(AnalyticsError, match="out of arrival order"):
        list(broker.time_windows(broker.consume(b, "late"), 10.0))
