"""The analytics evaluation's parts that need no testbed (experiments/analytics_eval.py): Fig. 16 over the
simulated link, the rows each transport delivered, the Fig. 15 summary, and the figure registry."""
from __future__ import annotations

from pathlib import Path

import pytest

from netapprox.experiments import analytics_eval as A
from netapprox.experiments.baselines import sample_messages


def test_analytics_fig16_groups_give_every_key_its_bound_and_one_bound_does_not(tmp_path: Path):
    res = A.fig16([1], tmp_path, lambda line: None)
    s = res["summary"]
    assert all(v["met_all_seeds"] for v in s["with_groups"].values())
    assert not all(v["met_all_seeds"] for v in s["without_groups"].values())
    rows = res["rows"]
    assert {r["key"] for r in rows} == {"airport", "other"}
    airport = next(r for r in rows if r["key"] == "airport")
    assert 0.02 * 20_000 < airport["rows_of_key"] < 0.2 * 20_000  # the rarer key


def test_analytics_eval_delivered_rows_per_transport():
    assert A.delivered_ids("tcp-es", 100, 0.3, {"delivered": 30}) == list(range(30))
    assert A.delivered_ids("tcp-ss", 100, 0.3, {"job_id": 7}) == sample_messages(100, 0.3, 7)
    assert A.delivered_ids("atp-s1", 5, 0.6, {"lost_ids": [1, 3]}) == [0, 2, 4]
    assert A.delivered_ids("atp-s1", 5, 0.6, None) is None


def test_analytics_eval_fig15_summary_is_ratios_of_the_same_seed():
    """ATP-S1 against the TCPs' first stage; ATP-S1&2 against the TCPs' whole job (both stages), per seed."""
    rows = [{"seed": s, "e_max": 0.05, "protocol": p, "s1_jct_s": j1, "jct_s": j, "measured_error": 0.01,
             "msr": 0.1}
            for s, js in ((1, ((1.0, 1.0), (1.5, 1.6), (2.0, 2.5), (4.0, 4.5))),
                          (2, ((3.0, 3.0), (3.0, 3.3), (3.0, 3.3), (3.0, 3.3))))
            for p, (j1, j) in zip(A.FIG15_PROTOCOLS, js)]
    s = A.summarize_fig15(rows)["0.05"]
    assert s["atp_over_tcp_es_per_seed"] == [0.5, 1.0] and s["atp_over_tcp_es"] == pytest.approx(0.75)
    assert s["atp_over_tcp_ss_per_seed"] == [0.25, 1.0]
    assert s["atp_s12_over_tcp_es_per_seed"] == pytest.approx([1.6 / 2.5, 1.0])
    assert s["atp_s12_over_tcp_ss_per_seed"] == pytest.approx([1.6 / 4.5, 1.0])
    assert s["jct_mean_s"]["atp-s12"] == pytest.approx(2.45) and s["s1_jct_mean_s"]["tcp-es"] == pytest.approx(2.5)
    assert s["error_over_emax"]["atp-s12"] == pytest.approx(0.2)


def test_analytics_eval_fig15_summary_of_the_link_and_the_bound():
    """ATP-S1's strict-priority bound against TCP-ES's first stage of the same seed; each ATP's stage over its bound."""
    rows = [{"seed": 1, "e_max": 0.1, "protocol": "atp-s1", "s1_jct_s": 0.3, "jct_s": 0.3, "bound_s": 0.28,
             "s1_over_bound": 0.3 / 0.28, "link_use": 1.0, "msr": 0.06},
            {"seed": 1, "e_max": 0.1, "protocol": "tcp-es", "s1_jct_s": 0.1, "jct_s": 0.15, "link_use": 0.9},
            {"seed": 2, "e_max": 0.1, "protocol": "atp-s1", "s1_jct_s": 0.2, "jct_s": 0.2, "bound_s": 0.2,
             "s1_over_bound": 1.0, "link_use": 0.8, "msr": 0.06},
            {"seed": 2, "e_max": 0.1, "protocol": "tcp-es", "s1_jct_s": 0.4, "jct_s": 0.45}]
    s = A.summarize_fig15(rows)["0.1"]
    assert s["bound_over_tcp_es_per_seed"] == pytest.approx([2.8, 0.5])
    assert s["bound_over_tcp_es"] == pytest.approx(1.65)
    assert s["s1_over_bound_mean"] == {"atp-s1": pytest.approx((0.3 / 0.28 + 1.0) / 2)}
    assert s["link_use_mean"] == {"atp-s1": pytest.approx(0.9), "tcp-es": pytest.approx(0.9)}


def test_analytics_eval_fig15_runs_s2_after_s1_for_the_two_stage_transports():
    """The S2 job: one partial aggregate (36 bytes) per stratum, from the first stage's receiver to the reducer,
    started once the first stage's sender ended, at MSR 1."""
    from netapprox.analytics.job import AnalyticsJob, Query
    from netapprox.analytics.partials import PARTIAL
    job = AnalyticsJob(A.trips(2000, 1), [Query("avg", 0.1)], seed=1)
    wl = A.s2_workload(job, 1)
    assert wl.sizes == (PARTIAL.size,) * len(job.strata) and PARTIAL.size == 36
    assert set(A.TWO_STAGE) == set(A.FIG15_PROTOCOLS) - {"atp-s1"}


def test_analytics_eval_registry_and_bad_figure(tmp_path: Path, capsys):
    assert {"fig15", "fig16"} <= set(A.FIGURES)
    with pytest.raises(ValueError):
        A.register("fig16", lambda seeds, out, progress: {})
    assert A.main(["--figures", "fig99", "--out", str(tmp_path)]) == 2
    assert "fig99" in capsys.readouterr().err


def test_analytics_eval_strict_priority_bound_counts_the_flows_carried_meanwhile():
    """A job below the flows ends once the link carried it and every flow byte carried while it ran: a flow of one
    second of the link from 0 s delays a half-second job started at 0 s to 1.5 s, one started at 0.5 s to 1 s,
    and does not delay one started after it; flows without an FCT are not counted."""
    rate = 20e6
    second = rate / 8 / A.TCP_WIRE  # a flow's payload that takes the link one second
    flows = [{"start_s": 0.0, "fct_s": 1.0, "size": second}, {"start_s": 0.2, "fct_s": None, "size": second}]
    assert A.flow_bytes_during(flows, 0.25, 0.75) == pytest.approx(rate / 8 / 2)
    assert A.flow_bytes_during(flows, 2.0, 3.0) == 0.0
    job = rate / 8 / 2
    assert A.strict_priority_bound(job, flows, 0.0, rate) == pytest.approx(1.5, abs=1e-4)
    assert A.strict_priority_bound(job, flows, 0.5, rate) == pytest.approx(1.0, abs=1e-4)
    assert A.strict_priority_bound(job, flows, 1.0, rate) == pytest.approx(0.5)


def test_analytics_eval_flows_next_to_atp_compare_the_same_flows():
    """The flows that started during ATP-S1's first stage, their mean FCT next to ATP-S1 over next to TCP-ES."""
    atp = {"seed": 1, "protocol": "atp-s1", "stage_start_s": 0.3, "s1_jct_s": 0.5,
           "flow_fct_s": {"0": [0.1, 9.0], "1": [0.4, 0.02], "2": [0.7, 0.04], "3": [0.9, 5.0]}}
    es = {"seed": 1, "protocol": "tcp-es", "stage_start_s": 0.3, "s1_jct_s": 0.2,
          "flow_fct_s": {"0": [0.1, 1.0], "1": [0.4, 0.05], "2": [0.7, 0.07], "3": [0.9, 1.0]}}
    assert A.flows_next_to_atp([atp, es]) == pytest.approx([0.03 / 0.06])
    assert A.flows_next_to_atp([atp]) == []


def test_analytics_eval_sources_hosts_plan_and_bad_count(tmp_path: Path, capsys):
    """Fig. 15 with several sources: the sources on every host but the worker (1) and the flows' sender (2); each
    source's job is its random part of the trips, what TCP sends per source is what its ATP job needed over the
    simulated link (a fraction of its rows, below 1 at 10 %); ``--sources 0`` is one line."""
    from netapprox.experiments import analytics_sources as S
    assert S.source_hosts(3) == [0, 3, 4] and S.source_hosts(1) == [0] and S.reducer_host(3) == 5
    p = S.plan(1, 0.1, A.trips(3000, 1), 3, 20e6)
    assert [len(j.rows) for j in p.job.jobs] == [1000, 1000, 1000]
    assert len(p.fractions) == 3 and all(0 < f < 1 for f in p.fractions)
    assert p.sim["met"] and p.sim["rows"] == pytest.approx(sum(f * 1000 for f in p.fractions))
    assert S.s2_workload(p.job, 1).sizes == (36,) * sum(len(j.strata) for j in p.job.jobs)
    assert A.main(["--figures", "fig15", "--sources", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "sources 0: must be an integer >= 1" in err and err.count("\n") == 1


def test_analytics_eval_sources_summary_is_ratios_of_the_same_seed():
    """The several-sources rows: ATP-S1's first stage (first start to last source's end) over each TCP's first
    stage, ATP-S1&2's whole job over each TCP's whole job (S2 included), of the same seed, and the trial's
    strict-priority bound over TCP-ES's first stage."""
    from netapprox.experiments import analytics_sources as S
    rows = [{"seed": s, "e_max": 0.05, "protocol": p, "s1_jct_s": j1, "jct_s": j, "measured_error": 0.01 * (i + 1),
             "reported_error": 0.04, "rows": 100, "per_source": [{"pkt_loss": 0.1 * i}],
             **({"bound_s": j1 / 2, "s1_over_bound": 2.0} if p == "atp-s1" else {})}
            for s, js in ((1, ((1.0, 1.0), (1.2, 1.6), (2.0, 2.5), (4.0, 4.5))),
                          (2, ((3.0, 3.0), (3.0, 3.3), (3.0, 3.3), (1.5, 1.65))))
            for i, (p, (j1, j)) in enumerate(zip(S.PROTOCOLS, js))]
    s = S.summarize(rows)["0.05"]
    assert S.PROTOCOLS == ("atp-s1", "atp-s12", "tcp-es", "tcp-ss")
    assert s["atp_over_tcp_es_per_seed"] == [0.5, 1.0] and s["atp_over_tcp_ss_per_seed"] == [0.25, 2.0]
    assert s["atp_over_tcp_es"] == pytest.approx(0.75)
    assert s["atp_s12_over_tcp_es_per_seed"] == pytest.approx([1.6 / 2.5, 1.0])
    assert s["atp_s12_over_tcp_ss_per_seed"] == pytest.approx([1.6 / 4.5, 3.3 / 1.65])
    assert s["bound_over_tcp_es_per_seed"] == pytest.approx([0.25, 0.5])
    assert s["error_over_emax"] == {"atp-s1": pytest.approx(0.2), "atp-s12": pytest.approx(0.4),
                                    "tcp-es": pytest.approx(0.6), "tcp-ss": pytest.approx(0.8)}
    assert s["pkt_loss_mean"]["tcp-es"] == pytest.approx(0.2)
