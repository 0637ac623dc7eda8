"""The simulated switch (ns-3 queue disc, controller/sim) implements the logical tables.

``Tables::Classify`` is the C++ every simulated packet goes through; ``reference_queue`` evaluates the tables
of docs/architecture.md directly. They must agree on every packet, for every rule kind and every TLR value,
as the kernel switch's u32 layout must (test_kernel_compiler.py, whose packet builders and random tables
this test reuses). Loading ns-3 takes ~15 s, once per test process.
"""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from netapprox.controller.model import (
    ClassRule, EcnRule, JobRule, SwitchState, TagRule, TlrRule, default_tlr_rules, queue_for_tlr)
from netapprox.controller.reference import reference_queue
from netapprox.hostlib import wire
from support.conformance import kernel_states, packets, ranks_are_unique
from support.skips import requires_ns3
from test_kernel_compiler import ATP, _rules, atp_data, ipv4_udp

pytestmark = [requires_ns3, pytest.mark.slow]


@pytest.fixture(scope="module")
def cpp():
    from netapprox.controller.sim import native
    return native.cpp()


def sim_queue(cpp, state: SwitchState, pkt: bytes) -> int:
    from netapprox.controller.sim.switch import write_state
    tables = cpp.netapprox.Tables.Create()
    write_state(tables, state)
    return tables.ClassifyBytes(pkt, len(pkt))


def both(cpp, state, pkt):
    return sim_queue(cpp, state, pkt), reference_queue(state, pkt, ATP)


def test_every_tlr_value_lands_where_the_reference_and_queue_for_tlr_put_it(cpp):
    from netapprox.controller.sim.switch import write_state
    tables = cpp.netapprox.Tables.Create()
    state = SwitchState(tlr_rules=default_tlr_rules())
    write_state(tables, state)
    mismatches = []
    for tlr in range(wire.TLR_ONE + 1):
        pkt = atp_data(tlr=tlr)
        got = tables.ClassifyBytes(pkt, len(pkt))
        want = reference_queue(state, pkt, ATP)
        if got != want or want != queue_for_tlr(tlr / wire.TLR_ONE):
            mismatches.append((tlr, got, want))
    assert not mismatches, mismatches[:10]


def test_table_order_job_then_tag_then_tlr_then_default(cpp):
    state = SwitchState(
        job_rules=frozenset({JobRule(42, 2)}),
        tag_rules=frozenset({TagRule(rank=1, priority_lo=0, priority_hi=9, deadline_lo_us=0,
                                     deadline_hi_us=999, qid=5)}),
        tlr_rules=frozenset({TlrRule(0, 0x3FFF, 3)}),
        class_rules=frozenset({ClassRule(rank=1, ip_proto=17, ip_proto_mask=0xFF, l4_dport=5201,
                                         l4_dport_mask=0xFFFF, qid=6)}),
        ecn_rules=frozenset({EcnRule(0, 20)}),
    )
    tagged = wire.Flags.APPROX | wire.Flags.TAGGED
    cases = {
        "job beats tag and tlr": (atp_data(job=42, flags=tagged, priority=1, deadline=10, tlr=0), 2),
        "tag beats tlr": (atp_data(job=1, flags=tagged, priority=9, deadline=999, tlr=0), 5),
        "tag range miss -> tlr": (atp_data(job=1, flags=tagged, priority=10, deadline=10, tlr=0), 3),
        "untagged ignores tag table": (atp_data(job=1, priority=1, deadline=10, tlr=0), 3),
        "no tlr match -> queue 7": (atp_data(job=1, tlr=0x4000), 7),
        "non-approx ATP -> class default 0": (atp_data(job=42, flags=0), 0),
        "ACK is never approximate": (atp_data(job=42, ptype=wire.PacketType.ACK), 0),
        "other UDP port is not ATP": (atp_data(job=42, dport=ATP + 5), 0),
        "IP options: not classified as ATP": (atp_data(job=42, ihl=6), 0),
        "class rule for non-ATP": (ipv4_udp(bytes(100), 5201), 6),
        "l4_dport is not read for other protocols": (ipv4_udp(bytes(100), 5201, proto=47), 0),
        "truncated ATP header is not ATP": (atp_data(job=42)[:50], 0),
        "not IPv4": (b"\x60" + atp_data(job=42)[1:], 0),
    }
    for name, (pkt, q) in cases.items():
        assert both(cpp, state, pkt) == (q, q), name


def test_job_ranks_go_to_queue_one_plus_rank(cpp):
    """The controller's job-rank state (``[policy] rank_levels`` 3) on the ns-3 switch: rank r to queue 1 + r
    whatever the TLR, a priority above the ranks and an untagged packet by their TLR."""
    from netapprox.controller import policy
    from netapprox.controller.config import PolicyConfig, SwitchConfig
    state = policy.static_state(SwitchConfig(name="s1"), PolicyConfig(rank_levels=3))
    tagged = wire.Flags.APPROX | wire.Flags.TAGGED
    for priority, want in ((0, 1), (1, 2), (2, 3), (3, 6)):
        assert both(cpp, state, atp_data(job=6, tlr=0x7800, flags=tagged, priority=priority)) == (want, want)
    assert both(cpp, state, atp_data(job=6, tlr=0x7800, priority=0)) == (6, 6)


def test_port_zero_rule_matches_protocols_without_ports(cpp):
    state = SwitchState(class_rules=frozenset({ClassRule(rank=1, ip_proto=0, ip_proto_mask=0, l4_dport=0,
                                                         l4_dport_mask=0xFFFF, qid=5)}))
    assert both(cpp, state, ipv4_udp(bytes(40), 0, proto=47)) == (5, 5)
    assert both(cpp, state, ipv4_udp(bytes(40), 80, proto=6)) == (0, 0)


def test_fifo_state_puts_everything_in_queue_0(cpp):
    from netapprox.controller.config import PolicyConfig, SwitchConfig
    from netapprox.controller.policy import fifo_state
    state = fifo_state(SwitchConfig(name="s"), PolicyConfig(mode="fifo"))
    for pkt in (atp_data(tlr=0x7000), atp_data(tlr=0), ipv4_udp(bytes(10), 80, proto=6), atp_data(flags=0)):
        assert both(cpp, state, pkt) == (0, 0)


def test_surplus_goes_lowest_and_approximate_traffic_never_enters_queue_0(cpp):
    state = SwitchState(job_rules=frozenset({JobRule(3, 0)}), tlr_rules=frozenset({TlrRule(0, 0x1000, 0)}))
    assert both(cpp, state, atp_data(job=3, tlr=wire.TLR_ONE)) == (7, 7)  # surplus before queue_by_job
    assert both(cpp, state, atp_data(job=3, tlr=0x100)) == (1, 1)  # the guard: a rule saying 0 gives 1
    assert both(cpp, state, atp_data(job=4, tlr=0x100)) == (1, 1)
    assert both(cpp, state, atp_data(job=4, tlr=0x100, flags=0)) == (0, 0)  # not approximate: queue 0


@settings(max_examples=400, deadline=None)
@given(state=_rules, job=st.integers(1, 7), tlr=st.integers(0, 0x8000), flags=st.integers(0, 0x1F),
       priority=st.integers(0, 255), deadline=st.sampled_from([0, 17, 999, 5000, 5001, wire.NO_DEADLINE]),
       ptype=st.sampled_from(list(wire.PacketType)), dport=st.sampled_from([ATP, 5201, 80, 0, 0x1450]),
       proto=st.sampled_from([17, 17, 6, 1, 47, 0x12]))
def test_sim_switch_agrees_with_the_logical_tables(cpp, state, job, tlr, flags, priority, deadline, ptype, dport,
                                                    proto):
    assume(ranks_are_unique(state))  # rules with the same rank overlap ambiguously (in P4 too)
    pkt = atp_data(job=job, tlr=tlr, flags=flags, priority=priority, deadline=deadline, ptype=ptype, dport=dport,
                   proto=proto)
    sim, ref = both(cpp, state, pkt)
    assert sim == ref


@settings(max_examples=300, deadline=None)
@given(state=kernel_states(), pkts=st.lists(packets(), min_size=1, max_size=8))
def test_sim_switch_agrees_with_the_reference_on_generated_packets(cpp, state, pkts):
    """Every kind of packet (tests/support/conformance.py), malformed ones too: other IP versions, IHL < 5,
    options, fragments, off-spec ATP fields, headers cut short."""
    from netapprox.controller.sim.switch import write_state
    tables = cpp.netapprox.Tables.Create()
    write_state(tables, state)
    for spec in pkts:
        pkt = spec.bytes()
        assert tables.ClassifyBytes(pkt, len(pkt)) == reference_queue(state, pkt, ATP), spec


def test_sim_driver_diffs_and_writes_incrementally(cpp):
    from netapprox.controller.model import TableUpdates
    from netapprox.controller.sim.driver import SimDriver
    from netapprox.controller.sim.switch import SimSwitch
    sw = SimSwitch("s1", buffer_packets=100)
    drv = SimDriver("s1", sw)
    drv.connect()
    state = SwitchState(tlr_rules=default_tlr_rules(), ecn_rules=frozenset({EcnRule(0, 20)}),
                        job_rules=frozenset({JobRule(7, 2), JobRule(9, 5)}))
    first = drv.apply(state)
    assert (first.inserted, first.modified, first.deleted) == (8 + 1 + 2, 0, 0)
    assert drv.apply(state).writes == 0  # re-applying an unchanged state writes nothing
    pkt = atp_data(job=9, tlr=0)
    assert sw.tables.ClassifyBytes(pkt, len(pkt)) == 5
    moved = drv.apply_updates(lambda: state, TableUpdates(static=False, jobs={9: 3, 7: None, 11: 1}))
    assert (moved.inserted, moved.modified, moved.deleted) == (1, 1, 1)
    assert sw.tables.ClassifyBytes(pkt, len(pkt)) == 3
    assert sw.tables.NumJobs() == 2
    # a switch that lost its tables (a new simulation) gets everything back on connect
    sw.tables.ClearStatic()
    for job in (9, 11):
        sw.tables.DeleteJob(job)
    drv.connect()
    assert sw.tables.ClassifyBytes(pkt, len(pkt)) == 3
    assert sw.tables.ClassifyBytes(atp_data(job=1, tlr=0x7000), len(pkt)) == 7
    assert drv.read_counters().queues == ()  # no ports in this test


def test_sim_driver_writes_the_tuners_queue_buffers(cpp):
    """Mode adaptive shares the approximate queues' buffer out (SwitchState.queue_buffers): the simulated switch's
    ports take it (queue 0 keeps the rest), and an empty tuple gives the k-MTU buffers back."""
    from netapprox.controller.sim import native
    from netapprox.controller.sim.driver import SimDriver
    from netapprox.controller.sim.switch import SimSwitch
    ns = native.load()
    nodes = ns.NodeContainer()
    nodes.Create(2)
    ns.InternetStackHelper().Install(nodes)
    devices = ns.PointToPointHelper().Install(nodes.Get(0), nodes.Get(1))
    sw = SimSwitch("s1", buffer_packets=100)
    qd = sw.add_port(devices.Get(0), port=1)
    drv = SimDriver("s1", sw)
    drv.connect()
    state = SwitchState(tlr_rules=default_tlr_rules())
    drv.apply(state)
    assert [qd.Limit(q) for q in range(8)] == [72, 7, 6, 5, 4, 3, 2, 1]
    tuned = SwitchState(tlr_rules=default_tlr_rules(), queue_buffers=(12, 9, 2, 2, 1, 1, 1))
    assert drv.apply(tuned).writes == 0  # no table entry changed, only the buffers
    assert [qd.Limit(q) for q in range(8)] == [72, 12, 9, 2, 2, 1, 1, 1]
    drv.apply(state)
    assert [qd.Limit(q) for q in range(8)] == [72, 7, 6, 5, 4, 3, 2, 1]
    drv.apply(SwitchState(tlr_rules=default_tlr_rules(), queue_buffers=(20, 10, 10, 5, 5, 5, 5)))
    assert [qd.Limit(q) for q in range(8)] == [40, 20, 10, 10, 5, 5, 5, 5]  # more for them: less for queue 0
    ns.Simulator.Destroy()


def test_sim_switch_scales_the_approximate_queues_by_its_buffer_unit(cpp):
    """``approx_unit`` u: queue k holds u x (8 - k) packets and the tuner's shares count in units of u; the
    simulations' default unit leaves queue 0 half of a 1000-packet port; a unit too large for the port is an
    error before any port is built."""
    from netapprox.controller.sim import native
    from netapprox.controller.sim.driver import SimDriver
    from netapprox.controller.sim.switch import SimSwitch
    from netapprox.experiments.sim.trial import SimSettings
    ns = native.load()
    nodes = ns.NodeContainer()
    nodes.Create(2)
    ns.InternetStackHelper().Install(nodes)
    devices = ns.PointToPointHelper().Install(nodes.Get(0), nodes.Get(1))
    unit = SimSettings().approx_unit
    assert unit == 17 and SimSettings(approx_buffer_unit=1).approx_unit == 1
    sw = SimSwitch("s1", buffer_packets=1000, approx_unit=unit)
    qd = sw.add_port(devices.Get(0), port=1)
    drv = SimDriver("s1", sw)
    drv.connect()
    drv.apply(SwitchState(tlr_rules=default_tlr_rules()))
    assert [qd.Limit(q) for q in range(8)] == [524, 119, 102, 85, 68, 51, 34, 17]
    drv.apply(SwitchState(tlr_rules=default_tlr_rules(), queue_buffers=(12, 9, 2, 2, 1, 1, 1)))
    assert [qd.Limit(q) for q in range(8)] == [524, 204, 153, 34, 34, 17, 17, 17]
    with pytest.raises(ValueError, match="nothing for queue 0"):
        SimSettings(buffer_packets=100, approx_buffer_unit=4)
    ns.Simulator.Destroy()


def test_overlapping_entries_are_evaluated_in_reference_order(cpp):
    """Where entries overlap, the first in the reference's order wins: TLR rules by (lo, hi, qid), tag and
    class rules by rank (larger first)."""
    state = SwitchState(
        tlr_rules=frozenset({TlrRule(0, 0x8000, 5), TlrRule(0x1000, 0x2000, 2)}),
        tag_rules=frozenset({TagRule(rank=1, priority_lo=0, priority_hi=255, deadline_lo_us=0,
                                     deadline_hi_us=wire.NO_DEADLINE, qid=6),
                             TagRule(rank=2, priority_lo=5, priority_hi=9, deadline_lo_us=0,
                                     deadline_hi_us=wire.NO_DEADLINE, qid=3)}),
        class_rules=frozenset({ClassRule(rank=1, ip_proto=17, ip_proto_mask=0xFF, l4_dport=0, l4_dport_mask=0,
                                         qid=4),
                               ClassRule(rank=3, ip_proto=17, ip_proto_mask=0xFF, l4_dport=5201,
                                         l4_dport_mask=0xFFFF, qid=1)}),
    )
    tagged = wire.Flags.APPROX | wire.Flags.TAGGED
    assert both(cpp, state, atp_data(tlr=0x1500)) == (5, 5)
    assert both(cpp, state, atp_data(flags=tagged, priority=7, tlr=0x1500)) == (3, 3)
    assert both(cpp, state, atp_data(flags=tagged, priority=20, tlr=0x1500)) == (6, 6)
    assert both(cpp, state, ipv4_udp(bytes(40), 5201)) == (1, 1)
    assert both(cpp, state, ipv4_udp(bytes(40), 80)) == (4, 4)
