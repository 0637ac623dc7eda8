"""make bench's scale row, from synthetic rows: every peer transport runs in it, and ATP is compared with the
fastest of all of them (the pool is every peer configuration the run holds), per MSR, on the mean and the p99."""
import dataclasses
import json
import os

import pytest

from netapprox.bench import sim as S
from netapprox.bench.__main__ import HEADLINE_KEYS, bars
from netapprox.experiments.sim.trial import PEER_PROTOCOLS, TCP_PROTOCOLS


def _rows(jct, p99=None, seeds=(1, 2), msrs=S.MSRS):
    """One row per seed, MSR and protocol of ``jct`` (protocol -> mean JCT; seed 2 takes 10 % longer)."""
    p99 = p99 or {p: 2 * v for p, v in jct.items()}
    return [{"seed": s, "msr": m, "protocol": p, "jct_mean_s": v * (1 + 0.1 * (s - 1)), "jct_p99_s": p99[p],
             "network_loss_frac": 0.01, "queue_mean_pkts": 3.0, "delivered_bytes_frac": 0.5, "jobs_failed": 0,
             "msr_met_frac": 1.0}
            for s in seeds for m in msrs for p, v in jct.items()]


def test_the_row_runs_atp_and_every_peer_transport():
    assert S.PROTOCOLS[0] == "atp"
    assert set(S.PROTOCOLS[1:]) == set(TCP_PROTOCOLS) | set(PEER_PROTOCOLS)
    for base in ("dctcp", "pfabric", "homa", "aeolus", "expresspass"):
        assert {f"{base}-es", f"{base}-ss", f"{base}-sm"} <= set(S.PROTOCOLS), base
    assert {"sim_atp_over_best_peer", "sim_atp_p99_over_best_peer"} <= set(HEADLINE_KEYS)


@pytest.mark.parametrize("fastest", S.PEERS)
def test_best_peer_is_the_fastest_of_every_peer_in_the_run(fastest):
    jct = {p: 100e-6 for p in S.PEERS}
    jct["atp"], jct[fastest] = 40e-6, 50e-6
    cmp = S.compare(_rows(jct))
    assert cmp["peer_pool"] == sorted(S.PEERS)
    for m in map(str, S.MSRS):
        assert cmp["best_peer"][m] == {"mean": fastest, "p99": fastest}
        assert cmp["headline"]["sim_atp_over_best_peer"][m] == pytest.approx(0.8)
        assert cmp["headline"]["sim_atp_p99_over_best_peer"][m] == pytest.approx(0.8)
        assert cmp["per_seed"]["sim_atp_over_best_peer"][m] == pytest.approx([0.8, 0.8])


def test_best_by_mean_and_best_by_p99_are_chosen_apart_and_a_slower_atp_shows():
    jct = {"atp": 60e-6, "dctcp-es": 90e-6, "homa-sm": 50e-6, "pfabric-sm": 55e-6}
    p99 = {"atp": 70e-6, "dctcp-es": 200e-6, "homa-sm": 140e-6, "pfabric-sm": 100e-6}
    cmp = S.compare(_rows(jct, p99), msrs=(0.5,))
    assert cmp["best_peer"]["0.5"] == {"mean": "homa-sm", "p99": "pfabric-sm"}
    assert cmp["headline"]["sim_atp_over_best_peer"]["0.5"] == pytest.approx(1.2)
    assert cmp["headline"]["sim_atp_p99_over_best_peer"]["0.5"] == pytest.approx(0.7)
    assert cmp["headline"]["sim_atp_over_dctcp_es"]["0.5"] == pytest.approx(60 / 90)
    assert bars(cmp["headline"], None)["sim_atp_over_best_peer_lt_1"] is False


def test_a_peer_missing_a_seed_is_no_candidate_and_the_table_names_every_protocol():
    jct = {"atp": 60e-6, "dctcp-es": 90e-6, "homa-sm": 30e-6}
    rows = [r for r in _rows(jct, msrs=(0.5,)) if not (r["protocol"] == "homa-sm" and r["seed"] == 2)]
    assert S.best_peer(rows, 0.5) == ("dctcp-es", pytest.approx(94.5e-6))
    table = "\n".join(S.peer_table(rows, (0.5,)))
    for p in jct:
        assert f"`{p}`" in table


def test_rows_from_a_sim_alltoall_result_keep_its_fbkv_trials(tmp_path):
    runs = [{"seed": 1, "params": {"workload": w, "msr": m, "protocol": p},
             "metrics": {"jct_mean_s": 1e-4, "jct_p99_s": 2e-4, "jobs_failed": 0}}
            for w in ("fbkv", "fbhd") for m in (0.5, 0.9) for p in ("atp", "homa-sm")]
    runs.append({"seed": 1, "params": {"workload": "fbkv", "msr": 0.5, "protocol": "atp/dctcp-es"},
                 "metrics": {"jct_ratio": 0.3}, "raw": None})  # the ratios a result adds are no trials
    rows, msrs = S.rows_from_result({"runs": runs})
    assert msrs == (0.5, 0.9) and len(rows) == 4 and {r["protocol"] for r in rows} == {"atp", "homa-sm"}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"runs": runs}))
    assert S.main(["--result", str(path)]) == 0
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"runs": [{**r, "seed": 2} for r in runs]}))
    assert S.main(["--result", str(path), str(other)]) == 0
    assert S.main(["--result", str(tmp_path / "missing.json")]) == 2


def test_slowdown_is_jct_over_the_unloaded_time_per_size_bucket():
    from netapprox.experiments.sim.topology import TopologyConfig
    topo = TopologyConfig(k=4)
    rtt = topo.base_rtt_s()
    need = [1e-6 * (i + 1) for i in range(6)]  # two jobs per bucket
    runs = [{"seed": 1, "params": {"workload": "fbkv", "msr": 0.5, "protocol": p}, "metrics": {},
             "raw": {"jobs": [{"strict_bound_s": n, "jct_s": f * (n + rtt)} for n in need]}}
            for p, f in (("atp", 2.0), ("homa-sm", 3.0))]
    doc = {"config": {"scale": {"topo": dataclasses.asdict(topo)}}, "runs": runs}
    lines = S.slowdown_table(doc, ["atp", "homa-sm"])
    assert len(lines) == 2 + 3
    for line in lines[2:]:
        assert line.endswith("| 2.00 / 2.00 | 3.00 / 3.00 |"), line
    assert lines[2].startswith("| 0.5 | 1.0-3.0 |") and lines[4].startswith("| 0.5 | 5.0-6.0 |")


def test_runs_from_a_trial_cache_join_the_result_files(tmp_path):
    trial = {"protocol": "homa-sm", "seed": 3, "jobs": [{"jct_s": 2e-5, "msr_met": True, "msr": 0.7, "n": 10}],
             "queues": {}}
    (tmp_path / "ab").mkdir()
    for name, code, proto in (("ab/old.json", "c0", "atp"), ("ab/new.json", "c1", "homa-sm")):
        (tmp_path / name).write_text(json.dumps({"key": name, "code": code, "protocol": proto, "trial": trial,
                                                 "label": f"workload=fbkv msr=0.7 protocol={proto} seed=3"}))
        os.utime(tmp_path / name, (1000 + int(code[1]), 1000 + int(code[1])))  # c1, new.json, is the newer
    runs = S.runs_from_cache(tmp_path)
    assert [(r["seed"], r["params"]) for r in runs] == [(3, {"workload": "fbkv", "msr": 0.7, "protocol": "homa-sm"})]
    assert runs[0]["metrics"]["jct_mean_s"] == pytest.approx(2e-5)
    first = [{**runs[0], "metrics": {"jct_mean_s": 1.0}}]
    merged = S.merged_runs(first, runs)
    assert len(merged) == 1 and merged[0]["metrics"]["jct_mean_s"] == 1.0
