"""A few simulated milliseconds of the ns-3 data plane (experiments/sim, controller/sim, hostlib.sim).

One process loads ns-3 once (~15 s); each trial then takes a few seconds. The switch test checks the queue
disc's traffic manager (per-queue buffers, strict priority, the queue stamp) with controlled UDP traffic;
the fat-tree tests run real ATP (hostlib) with the controller's runtime in the loop, and DCTCP-EarlySend on
the network-oblivious switch.
"""
from __future__ import annotations

import pytest

from netapprox.experiments.plans import Background, JobPlan
from support.skips import requires_ns3

pytestmark = [requires_ns3, pytest.mark.slow]


@pytest.fixture(scope="module")
def sim():
    from netapprox.experiments.sim import trial
    from netapprox.experiments.sim.topology import TopologyConfig
    from netapprox.experiments.workloads import make_job, pick_receivers
    trial.native.load()
    return trial, TopologyConfig, make_job, pick_receivers


@pytest.mark.parametrize("buffer,unit,protocol,q4,q0", [(100, None, "atp", 4, 72), (1000, None, "atp", 68, 524),
                                                        (1000, None, "atp-kmtu", 4, 972), (1000, 2, "atp", 8, 944)])
def test_switch_queues_buffers_priority_and_stamp(sim, buffer, unit, protocol, q4, q0):
    """Queue k >= 1 holds u x (8 - k) packets: u = 1 (the paper's k-MTU) at 100 packets a port, 17 by default at
    1000 (half of the port), whatever ``approx_buffer_unit`` says, and 1 for the ``atp-kmtu`` variant."""
    ns3_trial, TopologyConfig, _make_job, _pick = sim
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=3, host_gbps=10)
    settings = ns3_trial.SimSettings(topology=topo, buffer_packets=buffer, approx_buffer_unit=unit,
                                     time_limit_ms=5)
    rate = 10e9
    # hosts 0 and 1 each blast at line rate into host 2: approximate (TLR 0.75 -> queue 4 of the default
    # thresholds, [0.7, 0.8), q4 packets) and non-approximate (queue 0, the q0 packets left, strict priority)
    bg = [Background(0, 2, rate, 0.0, 1e-3, tlr=0.75), Background(1, 2, rate * 0.9, 0.0, 1e-3)]
    r = ns3_trial.run_trial(settings, protocol, [], seed=1, background=bg)
    per_queue = r["queues"]["per_queue"]
    assert per_queue[4]["max_backlog"] == q4, per_queue[4]
    assert per_queue[4]["dropped"] > 0
    assert per_queue[0]["dropped"] == 0 and per_queue[0]["max_backlog"] <= q0
    assert all(per_queue[q]["enqueued"] == 0 for q in (1, 2, 3, 5, 6, 7))
    seen = r["background_rx"][2]["queue_byte"]
    assert set(seen) == {0, 4}, seen  # the last switch stamped the logical queue into every ATP DATA packet
    assert seen[0] > seen[4] > 0  # queue 0 has strict priority over queue 4


def test_fat_tree_atp_with_the_controller_in_the_loop(sim):
    ns3_trial, TopologyConfig, make_job, pick_receivers = sim
    settings = ns3_trial.SimSettings(topology=TopologyConfig(kind="fattree", k=4), time_limit_ms=20)
    hosts = list(range(16))
    dst = pick_receivers(7, hosts, hosts)
    jobs = [JobPlan(100 + h, h, dst[h], make_job("fbkv", 700 + h, 400), 0.5 if h % 2 else 0.9) for h in hosts]
    r = ns3_trial.run_trial(settings, "atp", jobs, seed=7, timeline_job=100)
    assert r["completed_all"]
    assert all(j["msr_met"] and j["jct_s"] > 0 for j in r["jobs"]), [j for j in r["jobs"] if not j["msr_met"]]
    ctl = r["controller"]
    assert ctl["epochs"] > 1 and ctl["decisions"]["new"] == len(jobs)  # every job got a queue_by_job entry
    assert ctl["table_writes"]["insert"] >= len(jobs) * 20  # ... on each of the 20 switches
    assert ctl["reports_accepted"] > len(jobs) and ctl["reports_dropped"] == 0
    assert r["sim_end_s"] < 0.02
    stamped = {q for row in r["timeline"] for q in row["queues"] if int(q) != 0xFF}
    assert stamped and stamped <= {"1", "2"}, stamped  # MSR 0.9: TLR <= 0.1 -> queue 1 (queue 2 at most)
    # every job's loss stayed within its bound
    assert all(j["msg_loss"] <= 1 - j["msr"] + 1e-9 for j in r["jobs"])


def test_fat_tree_dctcp_incast_marks_ecn(sim):
    ns3_trial, TopologyConfig, make_job, _pick = sim
    settings = ns3_trial.SimSettings(topology=TopologyConfig(kind="fattree", k=4), time_limit_ms=20)
    jobs = [JobPlan(200 + h, h, 0, make_job("fbkv", 800 + h, 300), 0.9) for h in range(1, 16)]
    r = ns3_trial.run_trial(settings, "dctcp-es", jobs, seed=3)
    assert r["completed_all"] and all(j["msr_met"] for j in r["jobs"])
    assert r["queues"]["switch_ce_marks"] > 0  # 15 senders into one port: the queue passed K = 65
    assert r["queues"]["receiver_port_max_pkts"] > settings.ecn_threshold_pkts
    assert sum(j["ecn_reductions"] for j in r["jobs"]) > 0  # and DCTCP reacted


def test_an_exception_in_a_simulator_callback_stops_the_trial_and_is_raised(sim):
    ns3_trial, TopologyConfig, make_job, _pick = sim
    from netapprox.hostlib import sim as host_sim

    class Broken(ns3_trial.Trial):
        def _on_check(self):
            raise ValueError("boom")

    settings = ns3_trial.SimSettings(topology=TopologyConfig(kind="fattree", k=4), time_limit_ms=5)
    trial = Broken(settings, "dctcp-es", [JobPlan(1, 0, 5, make_job("fbkv", 1, 50), 0.5)], seed=1)
    with pytest.raises(host_sim.SimulationError, match="ValueError: boom"):
        trial.run()
    # the next trial in the same process starts clean
    r = ns3_trial.run_trial(settings, "dctcp-es", [JobPlan(1, 0, 5, make_job("fbkv", 1, 50), 0.5)], seed=1)
    assert r["completed_all"]


def test_shifting_workload_runs_the_tuned_policy_against_fixed_thresholds(sim, tmp_path):
    """The shifting-workload figure end to end at a small scale: every setting's trial runs the same jobs, the
    tuned policy changes the thresholds (its decision log's 'tuning' events are in the record), a fixed one
    never does, every job meets its MSR, and the default/best-fixed and adaptive/best-fixed rows hold a ratio per
    phase."""
    from netapprox.experiments.figures import EXPERIMENTS, SHIFT_PHASES
    from netapprox.experiments.sim.backend import SimBackend, SimScale
    from netapprox.experiments.sim.topology import TopologyConfig
    from netapprox.experiments.sweep import Sweep
    backend = SimBackend(SimScale(TopologyConfig(k=4), fbkv_n=200, fbhd_n=10))
    rf = EXPERIMENTS["shift"]([1], tmp_path, Sweep(backend), settings=("default", "adaptive", "fixed-k8"),
                              phase_s=0.15e-3, load=0.7, receivers=2)
    runs = {r["params"]["setting"]: r for r in rf.runs}
    assert set(runs) == {"default", "adaptive", "fixed-k8", "default/best-fixed", "adaptive/best-fixed"}
    jobs = {s: sorted((j["job_id"], j["start_s"]) for j in runs[s]["raw"]["jobs"])
            for s in ("default", "adaptive", "fixed-k8")}
    assert jobs["adaptive"] == jobs["fixed-k8"] == jobs["default"] and len(jobs["adaptive"]) >= 6
    for s in ("default", "adaptive", "fixed-k8"):
        m = runs[s]["metrics"]
        assert m["msr_met_frac"] == 1.0 and m["jct_mean_s"] > 0
        assert all(m[f"jct_{name}_s"] is not None for name, _, _ in SHIFT_PHASES)
    assert runs["adaptive"]["metrics"]["tuning_changes"] > 0 and runs["fixed-k8"]["metrics"]["tuning_changes"] == 0
    assert runs["adaptive"]["raw"]["controller"]["policy_mode"] == "adaptive"
    assert runs["fixed-k8"]["raw"]["controller"]["policy_mode"] == "netapprox"
    assert runs["default"]["raw"]["controller"]["policy_mode"] == "netapprox"
    assert runs["default"]["metrics"]["tuning_changes"] == 0
    for row in ("default/best-fixed", "adaptive/best-fixed"):
        ratios = runs[row]["metrics"]
        assert set(ratios) == {"jct_mean_ratio"} | {f"jct_{name}_ratio" for name, _, _ in SHIFT_PHASES}
    # the baselines are every fixed setting of the run: the default (finishing rule) and fixed-k8
    assert rf.notes[-1]["baseline_pool"] == ["default", "fixed-k8"]
    assert rf.notes[-1]["best_fixed_in_hindsight"]["jct_mean_s"] in ("default", "fixed-k8")


def test_trimming_switches_turn_drops_into_headers_the_receiver_answers(sim):
    """The trimmed-packet path in the ns-3 data plane (protocol ``atp-trim``: switches trim approximate DATA that
    finds its queue full, docs/wire-format.md, Trimmed DATA): an incast's drops become trims, the headers reach
    the receiver, which answers each with a TRIM ACK, and the senders learn those losses without a timer."""
    ns3_trial, TopologyConfig, make_job, _pick = sim
    # the paper's k-MTU buffers (the default's, 17 times larger, hold most of this incast)
    settings = ns3_trial.SimSettings(topology=TopologyConfig(kind="fattree", k=4), time_limit_ms=20,
                                     approx_buffer_unit=1)
    jobs = [JobPlan(200 + h, h, 0, make_job("fbkv", 800 + h, 300), 0.5) for h in range(1, 16)]
    r = ns3_trial.run_trial(settings, "atp-trim", jobs, seed=3)
    assert r["completed_all"] and all(j["msr_met"] for j in r["jobs"])
    q = r["queues"]
    assert q["switch_trims"] > 0 and q["switch_trims"] > q["switch_drops"], (q["switch_trims"], q["switch_drops"])
    assert sum((j.get("losses_found_by") or {}).get("trim", 0) for j in r["jobs"]) > 0


@pytest.mark.parametrize("protocol,spread", [("atp", True), ("atp-flowhash", False)])
def test_the_fabric_sprays_approximate_data_unless_told_otherwise(sim, protocol, spread):
    """``SimSettings.spray`` (on by default): each approximate ATP DATA packet takes the next equal-cost next hop,
    so one job's packets leave its edge switch over both uplinks; ``atp-flowhash`` keeps flow hashing (one uplink
    carries the job)."""
    ns3_trial, TopologyConfig, make_job, _pick = sim

    class Probe(ns3_trial.Trial):
        def _collect(self, sim_end):
            out = super()._collect(sim_end)
            sw, _ = self.net.host_port(0)
            host_facing = {self.net.host_port(h.index) for h in self.net.hosts}
            out["uplink_tx"] = [sum(int(qd.Counters(q).transmitted) for q in range(8))
                                for port, qd in sorted(self.net.switches[sw].ports.items())
                                if (sw, port) not in host_facing]
            return out

    settings = ns3_trial.SimSettings(topology=TopologyConfig(kind="fattree", k=4), time_limit_ms=20)
    job = JobPlan(300, 0, 15, make_job("fbkv", 901, 2000), 0.9)  # pod 0 to pod 3
    r = Probe(settings, protocol, [job], seed=5).run()
    assert r["completed_all"] and r["jobs"][0]["msr_met"]
    tx = r["uplink_tx"]
    assert len(tx) == 2 and sum(tx) >= r["jobs"][0]["packets_sent"], tx
    if spread:
        assert min(tx) >= 0.3 * sum(tx), tx
    else:
        assert min(tx) <= 0.05 * sum(tx), tx


@pytest.mark.parametrize("host_ecn", [True, False])
def test_dctcp_hosts_mark_ecn_instead_of_overflowing_their_nic_queue(sim, host_ecn):
    """One 6 MB DCTCP flow alone on a 10 Gbit/s path: its own NIC is the bottleneck. A NIC FIFO that never marks
    lets slow start outgrow the 1000-packet queue and drop; marking at K (``tcp_host_ecn``, every switch
    port's rule) holds the window down without a drop, as in the pFabric paper's DCTCP setting."""
    ns3_trial, TopologyConfig, _make_job, _pick = sim
    from netapprox.experiments.jobs import JobWorkload
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=2, host_gbps=10.0)
    settings = ns3_trial.SimSettings(topology=topo, time_limit_ms=40, tcp_host_ecn=host_ecn)
    job = JobPlan(1, 0, 1, JobWorkload("websearch", 1, (6_000_000,), (0.0,)), 1.0)
    r = ns3_trial.run_trial(settings, "dctcp-es", [job], seed=1)
    assert r["completed_all"] and r["queues"]["switch_drops"] == 0
    if host_ecn:
        assert r["queues"]["host_drops"] == 0 and r["queues"]["host_ce_marks"] > 0
        assert r["jobs"][0]["timeouts"] == 0
    else:
        assert r["queues"]["host_drops"] > 0 and r["queues"]["host_ce_marks"] == 0
