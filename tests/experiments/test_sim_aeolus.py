"""Aeolus on ExpressPass-style credits in ns-3 (experiments/sim/netapprox_peers.h): the switch port on
hand-made packets (credit rate limiting and the credit queue, selective dropping of unscheduled packets above
the threshold), then both transports end to end on a one-switch topology. One process loads ns-3 once
(~15 s); the rest takes a few seconds."""
from __future__ import annotations

import pytest

from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.plans import JobPlan
from support.skips import requires_ns3

pytestmark = [requires_ns3, pytest.mark.slow]

A, B = 0x0A000001, 0x0A000002
GAP_NS = 1000


@pytest.fixture(scope="module")
def sim():
    from netapprox.experiments.sim import native, trial
    from netapprox.experiments.sim.topology import TopologyConfig
    ns, g = native.load()
    return ns, g, trial, TopologyConfig


def _qdisc(g, capacity=16, threshold=4, credits=8):
    qd = g.ns3.CreateObject[g.netapprox.AeolusQueueDisc]()
    qd.Configure(1, capacity, threshold, credits, GAP_NS, False)
    qd.Initialize()
    return qd


def _item(g, type_, flags=0, src=A):
    payload = 100 if type_ == g.netapprox.kAeData else 0
    return g.netapprox.MakeAeolusItem(src, type_, flags, 1, payload)


def _types(g, qd):
    out = []
    while True:
        item = qd.Dequeue()
        if not item:
            return out
        out.append(int(g.netapprox.AeolusTypeOf(item)))


def _advance(ns, gap_ns):
    ns.Simulator.Stop(ns.NanoSeconds(gap_ns))
    ns.Simulator.Run()


def test_credits_rate_limited_and_credit_queue_bounded(sim):
    """Ten credits into a credit queue of 8: two dropped. With data queued, one credit leaves per gap and the
    data is served in between; after the gap, the next credit."""
    ns, g, _trial, _topo = sim
    qd = _qdisc(g)
    c, d = g.netapprox.kAeCredit, g.netapprox.kAeData
    accepted = [bool(qd.Enqueue(_item(g, c))) for _ in range(10)]
    assert accepted == [True] * 8 + [False] * 2 and int(qd.CreditDrops()) == 2
    for _ in range(3):
        assert qd.Enqueue(_item(g, d))
    assert _types(g, qd) == [c, d, d, d]  # the second credit waits for its gap
    assert qd.Backlog(7) == 7 and qd.Backlog(0) == 0
    _advance(ns, GAP_NS)
    assert _types(g, qd) == [c]
    _advance(ns, GAP_NS)
    assert _types(g, qd) == [c]
    assert qd.Counters(7).transmitted == 3 and qd.Counters(0).transmitted == 3


def test_unscheduled_dropped_above_threshold_scheduled_kept(sim):
    """Threshold 4, buffer 16: unscheduled DATA is dropped once 4 packets wait, scheduled DATA and control
    packets are queued up to the buffer, credits are apart."""
    _ns, g, _trial, _topo = sim
    qd = _qdisc(g, capacity=16, threshold=4)
    d, u = g.netapprox.kAeData, g.netapprox.kAeUnsched
    unsched = [bool(qd.Enqueue(_item(g, d, u))) for _ in range(6)]
    assert unsched == [True] * 4 + [False] * 2 and int(qd.UnscheduledDrops()) == 2
    sched = [bool(qd.Enqueue(_item(g, d, 0, src=B))) for _ in range(10)]
    assert all(sched) and qd.Backlog(0) == 14
    assert qd.Enqueue(_item(g, g.netapprox.kAeProbe)) and qd.Enqueue(_item(g, g.netapprox.kAeAck))
    assert not qd.Enqueue(_item(g, d, 0))  # the buffer of 16 is full: tail drop for everything
    assert not qd.Enqueue(_item(g, d, u))
    assert qd.Enqueue(_item(g, g.netapprox.kAeCredit))
    assert int(qd.UnscheduledDrops()) == 3 and qd.Counters(0).dropped == 4 and qd.Counters(7).dropped == 0


def _run(trial, TopologyConfig, proto, jobs, hosts=6, **kw):
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=hosts, host_gbps=10)
    return trial.run_trial(trial.SimSettings(topology=topo, time_limit_ms=20, **kw), proto, jobs, seed=1)


def test_aeolus_first_rtt_unscheduled_expresspass_waits_for_credits(sim):
    """One short message on an empty network: Aeolus sends it all unscheduled before any credit and finishes
    sooner than ExpressPass, which sends every packet on a credit, by at least the REQUEST's way out and the
    first credit's way back (four link delays)."""
    _ns, _g, trial, TopologyConfig = sim
    jobs = [JobPlan(1, 0, 1, JobWorkload("m", 1, (8_000,), (0.0,)), 1.0)]
    ae = _run(trial, TopologyConfig, "aeolus-es", jobs)
    ep = _run(trial, TopologyConfig, "expresspass-es", jobs)
    (a,), (e,) = ae["jobs"], ep["jobs"]
    assert ae["completed_all"] and ep["completed_all"]
    assert a["unscheduled_sent"] == a["packets_sent"] > 0 and e["unscheduled_sent"] == 0
    assert e["credits"] >= e["packets_sent"] and a["retransmissions"] == e["retransmissions"] == 0
    delay = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=6, host_gbps=10).link_delay_us * 1e-6
    assert e["jct_s"] - a["jct_s"] >= 4 * delay, (a["jct_s"], e["jct_s"], delay)


def test_aeolus_incast_drops_unscheduled_and_recovers_on_credits(sim):
    """Ten senders' first-RTT bursts into one receiver: the switch drops unscheduled packets above the
    threshold (nothing else), the probes reveal them, credits resend them; every message completes whole."""
    _ns, _g, trial, TopologyConfig = sim
    jobs = [JobPlan(i + 1, i, 10, JobWorkload("m", i, (60_000,), (0.0,)), 1.0) for i in range(10)]
    r = _run(trial, TopologyConfig, "aeolus-es", jobs, hosts=11)
    assert r["completed_all"] and all(j["bytes_received"] == j["stream_bytes"] for j in r["jobs"]), r["jobs"]
    ae = r["aeolus"]
    assert ae["unscheduled_drops"] > 0 and ae["unscheduled_packets"] > 0
    assert sum(j["probe_losses"] for j in r["jobs"]) >= ae["unscheduled_drops"]
    assert sum(j["retransmissions"] for j in r["jobs"]) >= ae["unscheduled_drops"]
    assert r["queues"]["switch_drops"] == ae["unscheduled_drops"] + ae["credit_drops"]


def test_scheduled_losses_recovered_after_the_timeout(sim):
    """A receiver port of 29 packets whose threshold is the whole buffer: the ten first-RTT bursts fill it, so
    credited (scheduled) packets arriving behind them are tail-dropped; credits keep coming but do not reset the
    sender's timer, which resends them; every message completes whole."""
    _ns, _g, trial, TopologyConfig = sim
    jobs = [JobPlan(i + 1, i, 10, JobWorkload("m", i, (60_000,), (0.0,)), 1.0) for i in range(10)]
    r = _run(trial, TopologyConfig, "aeolus-es", jobs, hosts=11, buffer_packets=29, aeolus_threshold_packets=29)
    ae = r["aeolus"]
    assert r["queues"]["switch_drops"] > ae["unscheduled_drops"] + ae["credit_drops"]  # tail drops too
    assert sum(j["timeouts"] for j in r["jobs"]) > 0
    assert r["completed_all"] and all(j["bytes_received"] == j["stream_bytes"] for j in r["jobs"]), r["jobs"]
