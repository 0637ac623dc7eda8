"""Ring-allreduce workers over loopback: the ring forms, iterations take at least the compute time."""
from __future__ import annotations

import threading

import pytest

from netapprox.experiments import ddnn


def test_network_time_matches_thesis_formula():
    # 100 MB model, 2 workers, 1 Gbit/s: 100e6 * 2 * (1/2) * 8 / 1e9 = 0.8 s
    assert ddnn.network_time_s(100_000_000, 2, 1e9) == pytest.approx(0.8)


def test_three_workers_on_loopback():
    peers = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    out = {}

    def worker(rank):
        out[rank] = ddnn.run_worker(rank, peers, model_bytes=300_000, compute_s=0.05, duration_s=0.5, port=5977)

    ts = [threading.Thread(target=worker, args=(r,)) for r in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert sorted(out) == [0, 1, 2]
    for r in out.values():
        assert len(r["iterations"]) >= 2
        assert all(it["iteration_s"] >= 0.05 for it in r["iterations"])
        assert all(it["allreduce_s"] > 0 for it in r["iterations"])


def test_bad_rank_is_rejected():
    with pytest.raises(ValueError):
        ddnn.run_worker(3, ["127.0.0.1", "127.0.0.2"], model_bytes=10, compute_s=0, duration_s=0)
