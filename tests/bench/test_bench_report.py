"""make bench's bookkeeping, from synthetic rows: which trials run where, the summaries, the headline, the bars,
the markdown and the CSV (the network itself is exercised by tests/experiments/test_e2e_smoke.py)."""
import csv
import io
import json

import pytest

from netapprox.bench import network as N
from netapprox.bench.__main__ import HEADLINE_KEYS, bars, headline, markdown, summarize
from netapprox.experiments.results import Progress, write_csv
from netapprox.experiments.emulated import Scale
from netapprox.experiments.plans import switch_for


def test_every_comparison_puts_atp_on_netapprox_and_the_baselines_on_the_fifo_switch():
    plan = N.trials([1, 2], Scale())
    assert plan, "the bench has trials"
    for t in plan:
        if t.section in ("yield", "queues"):
            continue  # extra rows, named for what they measure: they pick their switch on purpose
        assert t.kind == ("netapprox" if t.protocol.startswith("atp") else "fifo"), t.label
    assert {t.kind for t in plan if t.section == "queues"} == {"netapprox", "fifo"}
    assert {t.kind for t in plan if t.section == "yield"} == {"netapprox"}
    contention = [t for t in plan if t.section == "contention"]
    assert len(contention) == len(N.CONTENTION_PATTERNS) * len(N.MSRS) * 2 * len(N.CONTENTION_PROTOCOLS)
    assert {t.rate_mbit for t in plan if t.section == "idle"} == set(N.IDLE_RATES_MBIT)
    assert switch_for("atp-fixprio") == "static" and switch_for("udp") == "fifo"


def _row(section, protocol, seed, jcts, **kw):
    return {"section": section, "protocol": protocol, "seed": seed, "switch": switch_for(protocol),
            "jcts_s": jcts, "msr_met": [True] * len(jcts), **kw}


def _rows():
    rows = []
    for seed in (1, 2):
        for msr in N.MSRS:
            for pattern in N.CONTENTION_PATTERNS:
                rows.append(_row("contention", "atp", seed, [0.1 * seed, 0.3 * seed], pattern=pattern, msr=msr))
                rows.append(_row("contention", "tcp-es", seed, [0.4 * seed, 0.4 * seed], pattern=pattern, msr=msr))
                rows.append(_row("contention", "tcp-ss", seed, [0.8 * seed, 0.8 * seed], pattern=pattern, msr=msr))
            rows.append(_row("background", "atp", seed, [1.0], msr=msr))
            rows.append(_row("background", "tcp-es", seed, [4.0], msr=msr))
            rows.append(_row("idle", "atp", seed, [0.5], rate_mbit=20.0, msr=msr, jct_over_wire_bound=1.0 + seed / 10, jct_over_bound=1.2))
        rows.append(_row("coexist", "atp", seed, [2.0, 2.0], fct_all_mean=0.01, fct_all_p99=0.1, fct_small_mean=0.001))
        rows.append(_row("coexist", "tcp-es", seed, [3.0, 3.0], fct_all_mean=0.1, fct_all_p99=0.2, fct_small_mean=0.01,
                         flows_all_unfinished=1))
    rows[0]["msr_met"] = [True, False]
    return rows


def test_summary_headline_and_bars():
    s = summarize(_rows())
    c = s["contention"]["alltoall-fbkv/0.5"]
    assert c["atp_over_tcp_es"] == pytest.approx(0.5)  # mean JCT over jobs and seeds: 0.3 / 0.6
    assert c["atp_over_tcp_ss"] == pytest.approx(0.25)
    assert c["atp_over_tcp_es_per_seed"] == [pytest.approx(0.5), pytest.approx(0.5)]
    assert s["background"]["0.9"]["atp_over_tcp_es"] == pytest.approx(0.25)
    assert s["coexist"]["fct_mean_ratio"] == pytest.approx(0.1) and s["coexist"]["fct_p99_ratio"] == pytest.approx(0.5)
    assert s["coexist"]["tcp-es"]["flows_unfinished"] == 2
    assert s["msr_met"]["jobs"] == 2 * (3 * 3 * 2 + 3 + 3 + 2) and s["msr_met"]["met"] == s["msr_met"]["jobs"] - 1
    h = headline(s, {"controller": {"headline": {"controller_reports_per_s": 123}}, "sim": {"skipped": "no ns-3"}})
    assert set(h) == set(HEADLINE_KEYS)
    assert h["atp_over_tcp_es_fifo"] == {"0.5": pytest.approx(0.5), "0.7": pytest.approx(0.5), "0.9": pytest.approx(0.5)}
    assert h["atp_over_bound_idle"]["20"]["0.7"] == pytest.approx(1.15)
    assert h["nonapprox_fct_netapprox_over_fifo"] == {"mean": pytest.approx(0.1), "p99": pytest.approx(0.5)}
    assert h["controller_reports_per_s"] == 123 and h["sim_atp_over_dctcp_es"] is None
    b = bars(h, s)
    assert b["atp_over_tcp_es_alltoall-fbkv_le_0.5"] is True
    assert b["atp_over_bound_idle_le_1.10"] is False  # 1.15 on average
    assert b["msr_met_fraction_is_1"] is False
    assert b["nonapprox_fct_le_0.3_of_tcp_es_fifo"] is False  # p99 ratio 0.5


def test_a_job_that_did_not_finish_leaves_the_mean_unknown():
    rows = [_row("contention", "atp", 1, [0.1, None], pattern="incast-fbkv", msr=0.5),
            _row("contention", "tcp-es", 1, [0.4], pattern="incast-fbkv", msr=0.5),
            _row("contention", "tcp-ss", 1, [0.4], pattern="incast-fbkv", msr=0.5)]
    c = summarize(rows)["contention"]["incast-fbkv/0.5"]
    assert c["jct_mean_s"]["atp"] is None and c["atp_over_tcp_es"] is None
    assert c["jobs_done"]["atp"] == 1 and c["jobs"]["atp"] == 2


def test_markdown_and_csv(tmp_path):
    rows = _rows()
    s = summarize(rows)
    h = headline(s, {})
    doc = {"headline": h, "bars": bars(h, s), "summary": s, "rows": rows,
           "meta": {"finished_utc": "now", "git_commit": "abc", "seeds": [1, 2], "duration_s": 60.0,
                    "scale": {"rate_mbit": 20, "buffer_packets": 64},
                    "environment": {"tcp_cc": "cubic", "tcp_ecn": "2", "tcp_rto_min_ms": 200, "tcp_initcwnd": 10}},
           "controller": {"error": "boom"}}
    md = markdown(doc)
    assert "| alltoall-fbkv | 0.5 | 0.300 | 0.600 | 1.200 | 0.500 | 0.250 |" in md
    assert json.loads(md.split("```")[1]) == json.loads(json.dumps(h))
    assert "not measured: boom" in md and "**17/18**" not in md
    write_csv(rows, tmp_path / "b.csv")
    back = list(csv.DictReader(io.StringIO((tmp_path / "b.csv").read_text())))
    assert len(back) == len(rows) and json.loads(back[0]["jcts_s"]) == rows[0]["jcts_s"]


def test_progress_says_what_remains():
    lines = []
    p = Progress(4, lines.append)
    p.step("a", "ok")
    p.note("testbed")
    assert lines[0].startswith("[  1/4 ") and "left] a: ok" in lines[0] and "testbed" in lines[1]


def test_leafspine_row_plans_spray_flowhash_and_tcp_es_on_the_leaf_spine():
    plan = [t for t in N.trials([1, 2, 3], Scale()) if t.section == "leafspine"]
    assert len(plan) == len(N.LEAFSPINE_MSRS) * 3 * sum(N.LEAFSPINE_RUNS[p] for p in N.LEAFSPINE_PROTOCOLS)
    runs = {p: sorted(t.params["run"] for t in plan if t.protocol == p and t.seed == 1 and t.params["msr"] == 0.5)
            for p in N.LEAFSPINE_PROTOCOLS}  # spray and flow hash alike: the ratio's two sides get as many runs
    assert runs["atp"] == runs["atp-flowhash"] == [1, 2, 3] and runs["tcp-es"] == [1]
    assert len({t.label for t in plan}) == len(plan)
    assert {t.topology for t in plan} == {"leafspine"} and {t.params["msr"] for t in plan} == {0.5, 0.7}
    assert {(t.protocol, t.kind) for t in plan} == {("atp", "netapprox"), ("atp-flowhash", "netapprox"),
                                                     ("tcp-es", "fifo")}
    for seed in (1, 2, 3):  # every protocol of a seed runs the same jobs
        assert len({t.plan.jobs for t in plan if t.seed == seed and t.params["msr"] == 0.5}) == 1
    sc = N.leafspine_scale(Scale())
    assert (sc.topology, sc.leaves, sc.spines, sc.hosts) == ("leafspine", 2, 2, 4)
    assert sc.testbed().uplink_mbit == Scale().rate_mbit / 2
    assert all(t.topology == "rack" for t in N.trials([1], Scale()) if t.section != "leafspine")


def test_leafspine_summary_headline_and_bars():
    rows = []
    for seed in (1, 2):
        for msr in N.LEAFSPINE_MSRS:
            for proto, jct in (("atp", 0.2), ("atp-flowhash", 0.4), ("tcp-es", 1.0)):
                rows.append(_row("leafspine", proto, seed, [jct * seed, jct * seed], pattern="alltoall-fbkv", msr=msr))
    rows[0]["jcts_s"] = [0.2, 0.6]  # seed 1, MSR 0.5, ATP: mean 0.4 = flow hash's
    s = summarize(rows)
    assert s["leafspine"]["0.5"]["spray_over_flowhash_per_seed"] == [pytest.approx(1.0), pytest.approx(0.5)]
    h = headline(s, {})
    # mean JCT over every job of both seeds: MSR 0.5 ATP 0.4, flow hash 0.6, TCP-ES 1.5; MSR 0.7 0.3, 0.6, 1.5
    assert h["leafspine_atp_over_tcp_es"] == {"0.5": pytest.approx(0.4 / 1.5), "0.7": pytest.approx(0.2)}
    assert h["leafspine_spray_over_flowhash"] == {"0.5": pytest.approx(0.4 / 0.6), "0.7": pytest.approx(0.5)}
    b = bars(h, s)
    assert b["leafspine_atp_over_tcp_es_le_0.5"] is True and b["leafspine_spray_over_flowhash_le_0.9"] is True
    rows[0]["jcts_s"] = [1.0, 1.4]  # ATP at MSR 0.5 now slower than flow hashing: the bar fails
    h = headline(summarize(rows), {})
    assert bars(h, summarize(rows))["leafspine_spray_over_flowhash_le_0.9"] is False
    meta = {"finished_utc": "now", "git_commit": "abc", "seeds": [1, 2], "duration_s": 60.0,
            "scale": {"rate_mbit": 20, "buffer_packets": 64},
            "environment": {"tcp_cc": "cubic", "tcp_ecn": "2", "tcp_rto_min_ms": 200, "tcp_initcwnd": 10}}
    md = markdown({"meta": meta, "summary": s, "headline": h, "bars": b})
    assert "leaf-spine" in md and "| 0.7 | 0.300 | 0.600 | 1.500 | 0.200 | 0.500 |" in md
    # a second run of a seed: its jobs count in the means and the per-seed ratios like the first run's
    rows.append(_row("leafspine", "atp-flowhash", 2, [1.4, 1.4], pattern="alltoall-fbkv", msr=0.7, run=2))
    s = summarize(rows)
    assert s["leafspine"]["0.7"]["runs"] == {"atp": 2, "atp-flowhash": 3, "tcp-es": 2}
    assert s["leafspine"]["0.7"]["spray_over_flowhash_per_seed"] == [pytest.approx(0.5), pytest.approx(0.4 / 1.1)]
    assert s["leafspine"]["0.7"]["jct_mean_s"]["atp-flowhash"] == pytest.approx((0.4 * 2 + 0.8 * 2 + 1.4 * 2) / 6)
def test_loss_section_headline_and_bars():
    """The loss section's summary: per pattern, the worse core's mean JCT / ideal over the seeds; a run that failed or
    broke a guarantee leaves its pattern unknown, and an unknown pattern does not meet the bar."""
    from netapprox.bench import loss

    def row(pattern, impl, seed, ratio, guarantee=True):
        return {"pattern": pattern, "impl": impl, "seed": seed, "jct_over_ideal": ratio, "guarantee": guarantee}
    rows = [row(p, impl, seed, r + (0.2 if impl == "python" else 0.0))
            for p, r in (("random_0.3", 1.1), ("random_0.6", 1.5), ("random_0.9", 2.5), ("burst", 2.0))
            for impl in loss.IMPLS for seed in (1, 2, 3)]
    s = loss.summarize(rows)
    assert s["random_0.3"]["per_core"] == {"native": pytest.approx(1.1), "python": pytest.approx(1.3)}
    assert s["random_0.3"]["worst"] == pytest.approx(1.3)
    h = headline(None, {"loss": {"headline": {"atp_jct_under_loss_over_ideal": {p: v["worst"] for p, v in s.items()}}}})
    assert h["atp_jct_under_loss_over_ideal"] == {"random_0.3": pytest.approx(1.3), "random_0.6": pytest.approx(1.7),
                                                  "random_0.9": pytest.approx(2.7), "burst": pytest.approx(2.2)}
    assert bars(h, None)["atp_jct_under_loss_over_ideal_le_2_le_3"] is True
    rows[-1] = {"pattern": "burst", "impl": "python", "seed": 3, "error": "timed out"}
    s = loss.summarize(rows)
    assert s["burst"]["per_core"]["python"] is None and s["burst"]["worst"] is None
    h["atp_jct_under_loss_over_ideal"] = {p: v["worst"] for p, v in s.items()}
    assert bars(h, None)["atp_jct_under_loss_over_ideal_le_2_le_3"] is False
    rows[0] = row("random_0.3", "native", 1, 1.0, guarantee=False)
    assert loss.summarize(rows)["random_0.3"]["per_core"]["native"] is None


def test_loss_ideal_is_the_needed_bytes_over_the_surviving_share_of_the_link():
    from netapprox.bench import loss
    need = 310 + 155  # MSR 1.0 of 310 messages, MSR 0.5 of 310
    assert loss.ideal_s(0.0) == pytest.approx(need * (1000 + 32 + 42) * 8 / 20e6)
    assert loss.ideal_s(0.9) == pytest.approx(10 * loss.ideal_s(0.0))
    assert loss.PATTERNS["burst"][1] == pytest.approx(1 / 3)
    assert len({loss.content(i) for i in range(loss.MESSAGES)}) == loss.MESSAGES
