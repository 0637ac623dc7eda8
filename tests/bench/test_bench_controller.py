"""``make bench``'s controller part runs against the current controller (a tiny run of each measurement; the
numbers themselves are only judged by ``make bench``)."""
from __future__ import annotations

from netapprox.bench import controller as B


def test_each_controller_measurement_runs_on_a_tiny_scale():
    epochs = B.bench_epochs(100, 3)
    assert epochs["epoch_ms_median"] >= 0 and epochs["updates_per_epoch_median"] >= 0
    ingest = B.bench_ingest(rate=2000.0, seconds=0.2, jobs=100)
    assert ingest["accepted"] > 0
    flood = B.bench_forged_flood(seconds=0.2, rate=200.0, forged_rate=1000.0, jobs=10)
    assert flood["flooded"]["accepted"] > 0 and flood["flooded"]["dropped"]["bad_mac"] > 0
    latency = B.bench_latency(samples=2, jobs=100, churn=0.1)
    assert latency["samples"] == 2


def test_the_latency_probe_reports_again_each_epoch_until_its_move_is_written(monkeypatch):
    """A probe's report the kernel dropped under the churn is not the end of its move: the probe reports again every
    epoch (as a host does) and the latency counts from the first report; nothing written is a timeout (None)."""
    import socket
    import struct
    import time
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as notify, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as switch:
        notify.bind(("127.0.0.1", 0))
        calls = []

        def resend():  # the switch writes the probe's entry once the third report arrived
            calls.append(time.perf_counter())
            if len(calls) == 2:
                switch.sendto(struct.pack("!Bd", 2, time.perf_counter()), notify.getsockname())
        t0 = time.perf_counter()
        stamp = B._await_write(notify, 2, t0, resend)
        assert len(calls) == 2 and stamp is not None and stamp - t0 >= 2 * B.EPOCH_S * 0.9
        monkeypatch.setattr(B, "SAMPLE_TIMEOUT_S", 3 * B.EPOCH_S)
        calls.clear()
        assert B._await_write(notify, 2, time.perf_counter(), lambda: calls.append(1)) is None and len(calls) >= 2
