"""The peer transports in ns-3 (experiments/sim/netapprox_peers.h): pFabric's switch queue on hand-made packets
(priority dequeue, the flow's earliest packet first, drop order), then pFabric end to end on a one-switch
topology. One process loads ns-3 once (~15 s); the rest takes a few seconds."""
from __future__ import annotations

import pytest

from netapprox.experiments.plans import JobPlan
from netapprox.experiments.jobs import JobWorkload
from support.skips import requires_ns3

pytestmark = [requires_ns3, pytest.mark.slow]

A, B, C = 0x0A000001, 0x0A000002, 0x0A000003


@pytest.fixture(scope="module")
def sim():
    from netapprox.experiments.sim import native, trial
    from netapprox.experiments.sim.topology import TopologyConfig
    ns, g = native.load()
    return ns, g, trial, TopologyConfig


def _qdisc(g, capacity):
    qd = g.ns3.CreateObject[g.netapprox.PfabricQueueDisc]()
    qd.Configure(1, capacity)
    qd.Initialize()
    return qd


def _data(g, src, job, remaining, port=None):
    port = g.netapprox.kPfPort if port is None else port
    return g.netapprox.MakePfabricItem(src, port, g.netapprox.kPfData, job, remaining, 100)


def _drain(g, qd):
    out = []
    while True:
        item = qd.Dequeue()
        if not item:
            return out
        out.append(int(g.netapprox.PfabricPriorityOf(item)))


def test_pfabric_dequeues_least_remaining_first_and_acks_before_data(sim):
    _ns, g, _trial, _topo = sim
    qd = _qdisc(g, 16)
    for src, job, rem in ((A, 1, 5000), (B, 2, 1000), (C, 3, 3000)):
        assert qd.Enqueue(_data(g, src, job, rem))
    ack = g.netapprox.MakePfabricItem(A, g.netapprox.kPfPort, g.netapprox.kPfAck, 9, 0, 0)
    other = _data(g, B, 4, 7000, port=5000)  # not pFabric's port: no priority of its own, served as an ACK
    assert qd.Enqueue(ack) and qd.Enqueue(other)
    assert list(qd.QueuedPriorities()) == [5000, 1000, 3000, 0, 0]
    assert _drain(g, qd) == [0, 0, 1000, 3000, 5000]
    assert qd.Counters(0).transmitted == 5 and qd.Counters(1).transmitted == 0
    assert int(qd.GetStats().nTotalDequeuedPackets) == 5 and int(qd.GetNPackets()) == 0


def test_pfabric_sends_the_top_flows_earliest_packet(sim):
    """The flow of the highest-priority packet sends its earliest queued packet first (pFabric's rule against
    starvation and reordering), even when that packet's own priority is lower than another flow's."""
    _ns, g, _trial, _topo = sim
    qd = _qdisc(g, 16)
    for src, job, rem in ((A, 1, 3000), (B, 2, 2000), (A, 1, 1500)):
        qd.Enqueue(_data(g, src, job, rem))
    assert _drain(g, qd) == [3000, 1500, 2000]
    # the same job id from another source is another flow
    for src, rem in ((A, 3000), (B, 2000), (C, 1500)):
        qd.Enqueue(_data(g, src, 1, rem))
    assert _drain(g, qd) == [1500, 2000, 3000]


def test_pfabric_drops_the_most_remaining_on_overflow(sim):
    _ns, g, _trial, _topo = sim
    qd = _qdisc(g, 3)
    for rem in (4000, 2000, 3000):
        assert qd.Enqueue(_data(g, A, rem, rem))
    assert qd.Enqueue(_data(g, B, 1, 1000))  # full: the queued 4000 is pushed out
    assert not qd.Enqueue(_data(g, C, 1, 5000))  # full and the worst itself: dropped on arrival
    assert not qd.Enqueue(_data(g, C, 2, 3000))  # ties with the worst queued: the arrival goes
    assert list(qd.DroppedPriorities()) == [4000, 5000, 3000]
    assert list(qd.QueuedPriorities()) == [2000, 3000, 1000]
    st = qd.GetStats()
    assert int(st.nTotalDroppedPacketsBeforeEnqueue) == 2 and int(st.nTotalDroppedPacketsAfterDequeue) == 1
    assert int(qd.GetNPackets()) == 3 and qd.Counters(0).dropped == 3 and qd.Counters(0).maxBacklog == 3
    assert _drain(g, qd) == [1000, 2000, 3000]


def test_pfabric_end_to_end_short_flow_overtakes_and_losses_recovered(sim):
    """Hosts 0 and 1 send a long flow each and host 2 a short one, all to host 3 at once on one switch of
    2-BDP ports: the long flows overflow the receiver's port (drops, timeouts), yet every flow completes, and
    the short one finishes close to its unloaded time (least remaining first) while the long ones wait."""
    _ns, _g, trial, TopologyConfig = sim
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=4, host_gbps=10)
    settings = trial.SimSettings(topology=topo, time_limit_ms=20)
    long_wl, short_wl = JobWorkload("long", 1, (200_000,), (0.0,)), JobWorkload("short", 1, (20_000,), (0.0,))
    alone = trial.run_trial(settings, "pfabric-es", [JobPlan(3, 2, 3, short_wl, 1.0)], seed=1)
    t_alone = alone["jobs"][0]["jct_s"]
    jobs = [JobPlan(1, 0, 3, long_wl, 1.0), JobPlan(2, 1, 3, long_wl, 1.0),
            JobPlan(3, 2, 3, short_wl, 1.0, start_s=20e-6)]
    r = trial.run_trial(settings, "pfabric-es", jobs, seed=1)
    assert r["completed_all"], r["jobs"]
    jct = {j["job_id"]: j["jct_s"] for j in r["jobs"]}
    assert r["queues"]["switch_drops"] > 0 and sum(j["retransmissions"] for j in r["jobs"]) > 0
    assert all(j["delivered"] == 1 and j["bytes_received"] == j["stream_bytes"] for j in r["jobs"])
    assert jct[3] < 1.3 * t_alone, (jct, t_alone)
    assert min(jct[1], jct[2]) > 5 * jct[3]
    dctcp = trial.run_trial(settings, "dctcp-es", jobs, seed=1)
    assert jct[3] < {j["job_id"]: j["jct_s"] for j in dctcp["jobs"]}[3]
