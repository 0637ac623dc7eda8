"""Pure parts of the trials, the figures and the bench: metrics, bounds, summaries."""
from __future__ import annotations

import numpy as np
import pytest

from netapprox.experiments import emulated, figures, metrics, plans
from netapprox.experiments.workloads import JobWorkload

RATE = 20e6


def _job(sizes):
    return JobWorkload(kind="fixed", seed=0, sizes=tuple(sizes), ready_s=(0.0,) * len(sizes))


def test_bounds_equal_sizes_and_strict_bound_picks_smallest():
    job = _job([1000] * 10)
    assert metrics.lower_bound_s(job, 0.5, RATE) == pytest.approx(5 * 1000 * 8 / RATE)
    skew = _job([10, 10, 10, 10000])
    assert metrics.lower_bound_s(skew, 0.5, RATE) == pytest.approx(20 * 8 / RATE)


def test_wire_bound_counts_every_packet_with_its_headers():
    # 1368 bytes: one full packet (32-byte ATP header + 42 bytes of UDP/IPv4/Ethernet); 1369: two packets
    assert metrics.wire_bound_s(_job([1368] * 10), 0.5, RATE) == pytest.approx(5 * 1442 * 8 / RATE)
    assert metrics.wire_bound_s(_job([1369, 1, 1, 1]), 0.5, RATE) == pytest.approx(2 * 75 * 8 / RATE)
    assert metrics.wire_bound_s(_job([1369]), 1.0, RATE) == pytest.approx((1369 + 2 * 74) * 8 / RATE)


def test_job_metrics_atp_summary():
    plan = plans.JobPlan(7, 0, 1, _job([1000] * 10), 0.5)
    tx = {"jct_s": 0.01, "msr_met": True, "packets_sent": 12, "packets_lost": 3, "receiver_confirmed": True,
          "retransmissions": 1, "groups": [{"delivered": 8, "lost": 2, "final_tlr": 0.2}]}
    m = emulated.job_metrics("atp", plan, tx, {"lost_ids": [0, 1]}, RATE)
    assert m["jct_s"] == 0.01 and m["msr_met"] and m["delivered"] == 8
    assert m["delivered_bytes_frac"] == pytest.approx(0.8)
    assert m["msg_loss"] == pytest.approx(0.2) and m["pkt_loss"] == pytest.approx(0.25)
    assert m["jct_over_bound"] == pytest.approx(0.01 / (5 * 8000 / RATE))
    assert m["jct_over_wire_bound"] == pytest.approx(0.01 / (5 * 1074 * 8 / RATE))


def test_job_metrics_tcp_and_udp_and_missing():
    plan = plans.JobPlan(7, 0, 1, _job([1000] * 10), 0.5)
    tcp = emulated.job_metrics("tcp-es", plan, {"jct_s": 0.5, "completed": True, "cc": "cubic",
                                             "tcp_info": {"segs_out": 100, "total_retrans": 5}}, {"delivered": 6}, RATE)
    assert tcp["msr_met"] and tcp["delivered"] == 6 and tcp["pkt_loss"] == pytest.approx(0.05)
    tcp2 = emulated.job_metrics("tcp-es", plan, {"jct_s": 0.5, "completed": True},
                             {"delivered": 6, "bytes_received": 17 + 6 * 1008}, RATE)
    assert tcp2["delivered_bytes_frac"] == pytest.approx(0.6)
    udp = emulated.job_metrics("udp", plan, {"start_wall": 100.0}, {"messages_complete": 4, "packet_loss": 0.4,
                                                                 "target_wall": None}, RATE)
    assert not udp["msr_met"] and udp["jct_s"] is None and udp["msg_loss"] == pytest.approx(0.6)
    udp_ok = emulated.job_metrics("udp", plan, {"start_wall": 100.0}, {"messages_complete": 5, "packet_loss": 0.1,
                                                                    "target_wall": 100.25}, RATE)
    assert udp_ok["msr_met"] and udp_ok["jct_s"] == pytest.approx(0.25)
    gone = emulated.job_metrics("atp", plan, None, None, RATE)
    assert gone["jct_s"] is None and not gone["msr_met"]


def test_flow_fct_stats_classes():
    flows = [{"trace_size": 5_000, "fct_s": 0.01}, {"trace_size": 50_000, "fct_s": 0.03},
             {"trace_size": 20_000_000, "fct_s": 1.0}, {"trace_size": 1_000_000, "fct_s": None}]
    s = metrics.flow_fct_stats(flows)
    assert s["flows_all"] == 4 and s["flows_all_unfinished"] == 1
    assert s["fct_small_mean"] == pytest.approx(0.02) and s["flows_small"] == 2
    assert s["fct_large_mean"] == pytest.approx(1.0)
    assert s["fct_all_mean"] == pytest.approx((0.01 + 0.03 + 1.0) / 3)


def test_unknown_protocol_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="tcp-es"):
        emulated.EmulatedBackend().run_trial(plans.TrialPlan({}, 1, "quic", ()), tmp_path)


def test_range_loss_error_grows_with_loss_like_sqrt():
    vec = figures.gradient_vector(1, 200_000)
    assert figures.range_loss_error(vec, 340, 0.0, 1)["rel_l2_error"] == 0.0
    e = {p: figures.range_loss_error(vec, 340, p, 1) for p in (0.1, 0.35)}
    for p, m in e.items():
        assert m["packet_loss"] == pytest.approx(p, abs=0.03)
        # iid values: the lost energy fraction is the loss rate, so the error is ~sqrt(loss)
        assert m["rel_l2_error"] == pytest.approx(np.sqrt(m["packet_loss"]), rel=0.1)
    assert figures.range_loss_error(vec, 340, 1.0, 1)["rel_l2_error"] == pytest.approx(1.0)


def test_timeline_rows_take_the_queue_echoed_on_acks():
    tl = [{"time": 0.1, "tlr": 0.5, "rate_bps": 1e7, "loss": 0.0, "queues": {"255": 9, "3": 5, "4": 2}}]
    assert figures.timeline_rows(tl, [], 9, 0.0)[0]["queue"] == 3


def test_timeline_rows_normalise_and_fill_queue_from_controller():
    tl = [{"time": 0.0, "tlr": 0.5, "rate_bps": 2e7, "loss": 0.1},
          {"time": 1.0, "tlr": 0.4, "rate_bps": 1e7, "loss": 0.6}]
    changes = [{"wall": 100.5, "assignments": {"9": 3}}]
    rows = figures.timeline_rows(tl, changes, 9, 100.0)
    assert rows[0] == {"time": 0.0, "tlr": 0.5, "rate_mbps": 20.0, "loss": 0.1, "loss_avg10": 0.1}
    assert rows[1]["queue"] == 3 and rows[1]["loss"] == 0.6 and rows[1]["loss_avg10"] == pytest.approx(0.35)


def test_network_loss_counts_switch_drops_and_trims_but_not_aeolus_credits():
    jobs = [{"packets_sent": 60}, {"packets_sent": 40}]
    trial = {"jobs": jobs, "queues": {"switch_drops": 7, "switch_trims": 3}}
    assert metrics.network_loss_frac(trial) == pytest.approx(0.10)
    assert metrics.network_loss_frac({**trial, "aeolus": {"credit_drops": 5}}) == pytest.approx(0.05)
    assert metrics.network_loss_frac({"jobs": [{"segments": 9}], "queues": {"switch_drops": 7}}) is None
