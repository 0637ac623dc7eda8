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


def test_homa_levels_from_the_workload():
    from netapprox.experiments.sim.peers import homa_level, homa_levels
    # half of the bytes go unscheduled: 4 unscheduled levels, each with the same unscheduled bytes
    u, cut = homa_levels([1000] * 8 + [9000] * 2, 1000)
    assert u == round(8 * 10_000 / 26_000) == 3 and len(cut) == 3
    assert [homa_level(s, cut) for s in (500, 1000, 9000)] == [0, 0, 2]
    assert homa_levels([100_000] * 4, 1000) == (1, (100_000,))  # almost all scheduled: one unscheduled level
    assert homa_levels([10] * 4, 1000)[0] == 7  # all unscheduled: every level but one
    with pytest.raises(ValueError):
        homa_levels([], 1000)


def test_homa_switch_strict_priority_and_shared_buffer(sim):
    _ns, g, _trial, _topo = sim
    qd = g.ns3.CreateObject[g.netapprox.HomaQueueDisc]()
    qd.Configure(1, 4)
    qd.Initialize()
    d, grant = g.netapprox.kHomaData, g.netapprox.kHomaGrant
    for prio in (5, 2, 7):
        assert qd.Enqueue(g.netapprox.MakeHomaItem(A, d, prio, 1, 100))
    assert qd.Enqueue(g.netapprox.MakeHomaItem(B, grant, 0, 2, 0))
    assert not qd.Enqueue(g.netapprox.MakeHomaItem(C, d, 0, 3, 100))  # the port's 4 packets are taken: tail drop
    assert qd.Counters(0).dropped == 1 and [qd.Backlog(q) for q in (0, 2, 5, 7)] == [1, 1, 1, 1]
    order = []
    while True:
        item = qd.Dequeue()
        if not item:
            break
        order.append(int(g.netapprox.HomaLevelOf(item)))
    assert order == [0, 2, 5, 7]
    assert int(qd.GetStats().nTotalDroppedPackets) == 1 and int(qd.GetNPackets()) == 0


def _homa_run(trial, TopologyConfig, jobs, hosts=6, **kw):
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=hosts, host_gbps=10)
    return trial.run_trial(trial.SimSettings(topology=topo, time_limit_ms=20, **kw), "homa-es", jobs, seed=1)


def test_homa_grants_srpt_and_overcommitment(sim):
    """Four messages of different lengths arrive at one receiver at once, overcommitment 2: no more than two are
    granted at a time, every grant names a scheduled level, and the messages finish shortest first."""
    _ns, _g, trial, TopologyConfig = sim
    sizes = (60_000, 120_000, 240_000, 480_000)
    jobs = [JobPlan(i + 1, i, 5, JobWorkload("m", i, (s,), (0.0,)), 1.0) for i, s in enumerate(sizes)]
    r = _homa_run(trial, TopologyConfig, jobs, homa_overcommit=2)
    assert r["completed_all"], r["jobs"]
    jct = [j["jct_s"] for j in sorted(r["jobs"], key=lambda j: j["job_id"])]
    assert jct == sorted(jct), jct
    assert all(j["grants"] > 0 and j["bytes_received"] == j["stream_bytes"] for j in r["jobs"])
    homa = r["homa"]
    assert homa["overcommit"] == 2 and homa["unscheduled_levels"] >= 1
    rx = r["homa"]["receivers"]["5"]
    assert rx["max_granted"] == 2
    assert sum(rx["grants_at"][:homa["unscheduled_levels"]]) == 0 and sum(rx["grants_at"]) > 0
    assert rx["grants_at"][7] > 0 and rx["grants_at"][6] > 0  # the two granted at once: the lowest two levels


def test_homa_recovers_losses_by_resend(sim):
    """Eleven senders' unscheduled bursts into one receiver port of 29 packets (the smallest port the
    settings allow): drops, then RESENDs; every message completes."""
    _ns, _g, trial, TopologyConfig = sim
    jobs = [JobPlan(i + 1, i, 11, JobWorkload("m", i, (80_000,), (0.0,)), 1.0) for i in range(11)]
    r = _homa_run(trial, TopologyConfig, jobs, hosts=12, buffer_packets=29)
    assert r["queues"]["switch_drops"] > 0
    assert r["completed_all"] and all(j["bytes_received"] == j["stream_bytes"] for j in r["jobs"]), r["jobs"]
    assert sum(j["retransmissions"] for j in r["jobs"]) > 0 and r["homa"]["receivers"]["11"]["resends"] > 0


def test_peer_smallest_send_over_each_reliable_transport(sim):
    """SmallestSend over DCTCP, pFabric, Homa, Aeolus and ExpressPass: each job delivers exactly its smallest
    ceil(MSR N) messages."""
    _ns, _g, trial, TopologyConfig = sim
    topo = TopologyConfig(kind="clos", leaves=1, spines=1, hosts_per_leaf=4, host_gbps=10)
    settings = trial.SimSettings(topology=topo, time_limit_ms=20)
    sizes = (40_000, 3_000, 25_000, 1_000, 8_000, 60_000, 2_000, 12_000)
    jobs = [JobPlan(i + 1, i, 3, JobWorkload("m", i, sizes, (0.0,) * len(sizes)), 0.5) for i in range(3)]
    want = sum(sorted(sizes)[:4])
    for proto in ("dctcp-sm", "pfabric-sm", "homa-sm", "aeolus-sm", "expresspass-sm"):
        r = trial.run_trial(settings, proto, jobs, seed=1)
        assert r["completed_all"], (proto, r["jobs"])
        for j in r["jobs"]:
            assert j["msr_met"] and j["delivered"] == 4, (proto, j)
            assert j["stream_bytes"] == trial.tcp_stream(jobs[0].workload, 0.5, proto, 1)[0]
            assert j["delivered_bytes_frac"] == pytest.approx(want / sum(sizes)), (proto, j)
