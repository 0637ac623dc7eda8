"""The ns-3 adapter (hostlib.sim) on its own: one ATP job between two ns-3 nodes on a point-to-point link.

``ProfiledEndpoint`` runs ``SimEndpoint``'s loop with every step timed: the same job gives the same result
through either, and the profile counts exactly the datagrams the endpoints moved.
"""
from __future__ import annotations

import pytest

from support.skips import requires_ns3

from netapprox.hostlib import core, events
from netapprox.hostlib.config import AtpConfig, JobSpec, Message

pytestmark = [requires_ns3, pytest.mark.slow]

ATP_PORT = 7600


def _run(endpoint_cls, job: JobSpec | None = None) -> dict:
    """One job (default: 300 messages) from node 0 to node 1 (100 Mbit/s, 1 ms): what each side saw."""
    from netapprox.hostlib import sim as host_sim

    ns = host_sim.load()
    host_sim.reset()
    nodes = ns.NodeContainer()
    nodes.Create(2)
    p2p = ns.PointToPointHelper()
    p2p.SetDeviceAttribute("DataRate", ns.StringValue("100Mbps"))
    p2p.SetChannelAttribute("Delay", ns.StringValue("1ms"))
    devices = p2p.Install(nodes)
    ns.InternetStackHelper().Install(nodes)
    addresses = ns.Ipv4AddressHelper()
    addresses.SetBase(ns.Ipv4Address("10.1.1.0"), ns.Ipv4Mask("255.255.255.0"))
    ifs = addresses.Assign(devices)
    tx_ip, rx_ip = ifs.GetAddress(0).Get(), ifs.GetAddress(1).Get()
    cfg = AtpConfig(max_rate_bps=20e6)
    job = job or JobSpec(job_id=5, msr=0.9, messages=tuple(Message(bytes(1000 + i)) for i in range(300)))
    out: dict = {}

    def on_rx(ev: events.Event) -> None:
        if isinstance(ev, events.JobFinished):
            out["result"] = ev.result

    def on_tx(ev: events.Event) -> None:
        if isinstance(ev, events.JobCompleted):
            out["summary"] = ev.summary

    try:
        receiver = core.AtpReceiver(config=cfg, now=0.0)
        rx = endpoint_cls(nodes.Get(1), receiver, port=ATP_PORT, ip=rx_ip, on_event=on_rx)
        tx = endpoint_cls(nodes.Get(0), core.AtpSender(job, config=cfg, peer=(rx_ip, ATP_PORT), now=0.0, isn=1),
                          ip=tx_ip, on_event=on_tx)
        host_sim.call_later(0.001, tx.start)
        ns.Simulator.Stop(ns.Seconds(2.0))
        ns.Simulator.Run()
        host_sim.raise_pending()
        out["received"] = tx.received + rx.received
        out["admission"] = dict(receiver.stats()["admission"])
        tx.close()
        rx.close()
    finally:
        ns.Simulator.Destroy()
        host_sim.reset()
    return out


def test_the_profiled_endpoint_runs_the_same_loop_and_counts_what_it_moved():
    from netapprox.hostlib import sim as host_sim

    plain = _run(host_sim.SimEndpoint)
    host_sim.ProfiledEndpoint.reset_profile()
    profiled = _run(host_sim.ProfiledEndpoint)
    summary = plain["summary"]
    assert summary.receiver_confirmed and summary.msr_met()
    assert profiled["summary"] == summary  # same loop, same simulated times, same job
    assert profiled["result"] == plain["result"]
    calls = host_sim.ProfiledEndpoint.calls
    # nothing is dropped on this link: every datagram a core handed out arrived at the other endpoint
    assert calls["received"] == calls["sent"] == profiled["received"] == plain["received"] > summary.packets_sent
    assert calls["timers"] > 0
    assert all(s > 0 for s in host_sim.ProfiledEndpoint.seconds.values()), host_sim.ProfiledEndpoint.seconds


def test_a_one_packet_job_takes_one_rtt_in_ns3():
    """Admission without a round trip, in ns-3: the announce and the message leave together and the job is
    complete when their ACK returns, one RTT (2 ms) plus serialization, not two RTTs as with a RETRY first."""
    from netapprox.hostlib import sim as host_sim

    out = _run(host_sim.SimEndpoint, JobSpec(job_id=6, msr=1.0, messages=(Message(bytes(1000)),)))
    summary = out["summary"]
    assert summary.receiver_confirmed and summary.msr_met()
    serialization = 3 * (1500 * 8 / 100e6)  # at most: the announce, the data, the ACK, each under one MTU
    assert 2e-3 <= summary.jct_s <= 2e-3 + serialization, summary.jct_s
    assert out["admission"].get("admitted_without_token") == 1 and not out["admission"].get("retries")
