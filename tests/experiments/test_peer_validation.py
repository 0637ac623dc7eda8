"""The peers' validation summaries (experiments/sim/validate.py) without running ns-3."""
from __future__ import annotations

import pytest

from netapprox.experiments.sim import validate as V


def test_peer_validation_normalizes_by_the_unloaded_time_and_splits_small_flows():
    topo = V.PFABRIC_TOPOLOGY
    one = V.unloaded_fct_s(topo, 1448, True)  # one full packet between two hosts of one leaf
    assert one == pytest.approx(2 * 1502 * 8 / 10e9 + 4e-6)
    # across the spine: two more links of propagation both ways, two store-and-forwards at 40 Gbit/s
    assert V.unloaded_fct_s(topo, 1448, False) - one == pytest.approx(4e-6 + 2 * 1502 * 8 / 40e9)
    recs = [{"jct_s": 2 * V.unloaded_fct_s(topo, 1448, True), "bytes": 1448, "src": 0, "dst": 1},
            {"jct_s": 3 * V.unloaded_fct_s(topo, 200_000, False), "bytes": 200_000, "src": 0, "dst": 16},
            {"jct_s": None, "bytes": 5000, "src": 1, "dst": 2}]
    s = V.summarize(recs, topo)
    assert (s["flows"], s["failed"], s["small_flows"]) == (3, 1, 1)
    assert s["small_mean"] == pytest.approx(2.0) and s["all_mean"] == pytest.approx(2.5)
    rows = [{"load": 0.6, "seed": 1, "protocol": p, "small_mean": m, "small_p99": m, "all_mean": m, "all_p99": m,
             "failed": 0} for p, m in (("pfabric-es", 1.2), ("dctcp-es", 3.0))]
    (t,) = V.table(rows)
    assert t["dctcp_over_pfabric"]["small_mean"] == pytest.approx(2.5)



def test_peer_validation_pairs_name_their_ratio():
    rows = [{"load": 0.8, "seed": 1, "protocol": p, "small_mean": m, "small_p99": m, "all_mean": m, "all_p99": m,
             "failed": 0} for p, m in (("homa-es", 2.0), ("pfabric-es", 1.0))]
    (t,) = V.table(rows, V.PAIRS["homa"])
    assert t["homa"]["small_p99"] == 2.0 and t["pfabric_over_homa"]["small_p99"] == pytest.approx(0.5)
