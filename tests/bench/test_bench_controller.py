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
