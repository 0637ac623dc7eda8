"""The kernel switch's u32 layout implements the logical tables (no root needed).

``u32_queue(compile_filters(state), pkt)`` evaluates the compiled entries exactly as the kernel does (first
match in node-id order, 32-bit words & mask == value); ``reference_queue(state, pkt)`` evaluates the tables
of docs/architecture.md directly. They must agree on every packet.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from netapprox.controller.model import ClassRule, JobRule, SwitchState, TagRule, TlrRule, default_tlr_rules
from netapprox.hostlib import wire
from netapprox.controller.kernel import compiler as ks
from netapprox.controller.model import prefix_split
from netapprox.controller.reference import reference_queue
from support.conformance import headers_complete, kernel_states, packets, ranks_are_unique

ATP = wire.DEFAULT_ATP_PORT


def ipv4_udp(payload: bytes, dport: int, sport: int = 40000, proto: int = 17, ihl: int = 5) -> bytes:
    options = bytes(4 * (ihl - 5))
    total = 4 * ihl + 8 + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, total, 0, 0, 64, proto, 0, bytes([10, 0, 0, 1]),
                     bytes([10, 0, 0, 2])) + options
    return ip + struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def atp_data(job=7, tlr=0, flags=wire.Flags.APPROX, priority=0, deadline=wire.NO_DEADLINE,
             ptype=wire.PacketType.DATA, dport=ATP, proto=17, ihl=5) -> bytes:
    hdr = wire.Header(type=ptype, flags=int(flags), job_id=job, tlr=tlr, priority=priority, deadline_us=deadline)
    return ipv4_udp(wire.encode(hdr, bytes(16)), dport, proto=proto, ihl=ihl)


def both(state: SwitchState, pkt: bytes) -> tuple[int, int]:
    return ks.u32_queue(ks.compile_filters(state, ATP), pkt), reference_queue(state, pkt, ATP)


@pytest.mark.parametrize("lo,hi,bits", [(0, 0xFFFF, 16), (0, 0, 16), (5, 5, 8), (3, 200, 8), (4096, 8191, 16),
                                        (1, 0xFFFFFFFE, 32), (0x8000, 0x8000, 16)])
def test_prefix_split_covers_exactly_the_range(lo, hi, bits):
    parts = prefix_split(lo, hi, bits)
    if bits <= 16:
        covered = {x for x in range(1 << bits) if any(x & m == v for v, m in parts)}
        assert covered == set(range(lo, hi + 1))
    assert len(parts) <= 2 * bits
    for v, m in parts:
        assert v & ~m & ((1 << bits) - 1) == 0


def test_default_tlr_thresholds_are_one_masked_match_each():
    entries = [e for e in ks.compile_filters(SwitchState(tlr_rules=default_tlr_rules())).values()
               if e.table == "queue_by_tlr"]
    assert len(entries) == 9  # [k/8, (k+1)/8) for k = 0..7, plus 1.0 exactly
    assert ks.u32_queue({e.node: e for e in entries}, atp_data(tlr=0x8000)) == 7


@pytest.mark.parametrize("tlr,queue", [(0, 1), (4095, 1), (4096, 1), (8191, 1), (8192, 2), (16383, 3),
                                       (16384, 4), (0x7000, 7), (0x7FFF, 7), (0x8000, 7)])
def test_tlr_thresholds(tlr, queue):
    state = SwitchState(tlr_rules=default_tlr_rules())
    assert both(state, atp_data(tlr=tlr)) == (queue, queue)


def test_table_order_surplus_then_job_then_tag_then_tlr_then_default():
    state = SwitchState(
        job_rules=frozenset({JobRule(42, 2)}),
        tag_rules=frozenset({TagRule(rank=1, priority_lo=0, priority_hi=9, deadline_lo_us=0,
                                     deadline_hi_us=999, qid=5)}),
        tlr_rules=frozenset({TlrRule(0, 0x3FFF, 3)}),
        class_rules=frozenset({ClassRule(rank=1, ip_proto=17, ip_proto_mask=0xFF, l4_dport=5201,
                                         l4_dport_mask=0xFFFF, qid=6)}),
    )
    tagged = wire.Flags.APPROX | wire.Flags.TAGGED
    cases = {
        "job beats tag and tlr": (atp_data(job=42, flags=tagged, priority=1, deadline=10, tlr=0), 2),
        "surplus (tlr 1.0) beats the job": (atp_data(job=42, tlr=wire.TLR_ONE), 7),
        "surplus beats the tag": (atp_data(job=1, flags=tagged, priority=1, deadline=10, tlr=wire.TLR_ONE), 7),
        "tag beats tlr": (atp_data(job=1, flags=tagged, priority=9, deadline=999, tlr=0), 5),
        "tag range miss -> tlr": (atp_data(job=1, flags=tagged, priority=10, deadline=10, tlr=0), 3),
        "untagged ignores tag table": (atp_data(job=1, priority=1, deadline=10, tlr=0), 3),
        "no tlr match -> queue 7": (atp_data(job=1, tlr=0x4000), 7),
        "non-approx ATP -> class default 0": (atp_data(job=42, flags=0), 0),
        "ACK is never approximate": (atp_data(job=42, ptype=wire.PacketType.ACK), 0),
        "other UDP port is not ATP": (atp_data(job=42, dport=ATP + 5), 0),
        "IP options: not classified as ATP": (atp_data(job=42, ihl=6), 0),
        "class rule for non-ATP": (ipv4_udp(bytes(100), 5201), 6),
        "class rule does not touch approx DATA": (atp_data(job=9, tlr=0x7000, dport=ATP), 7),
        "l4_dport is not read for other protocols": (ipv4_udp(bytes(100), 5201, proto=47), 0),
    }
    for name, (pkt, q) in cases.items():
        assert both(state, pkt) == (q, q), name


def test_class_rules_never_see_approximate_data():
    """A class rule on the ATP port itself applies to non-approximate ATP only: approximate DATA that no
    approximate table matches still goes to queue 7 (table 5), never to the class rule's queue."""
    state = SwitchState(class_rules=frozenset({ClassRule(rank=9, ip_proto=17, ip_proto_mask=0xFF, l4_dport=ATP,
                                                         l4_dport_mask=0xFFFF, qid=6)}))
    assert both(state, atp_data(job=3, tlr=0x1000)) == (7, 7)
    assert both(state, atp_data(job=3, flags=0)) == (6, 6)
    assert both(state, atp_data(job=3, ptype=wire.PacketType.ACK)) == (6, 6)


def test_port_zero_rule_matches_protocols_without_ports():
    """P4 sets l4_dport = 0 for non-TCP/UDP packets, so a rule on port 0 catches them (and TCP/UDP port 0)."""
    state = SwitchState(class_rules=frozenset({ClassRule(rank=1, ip_proto=0, ip_proto_mask=0, l4_dport=0,
                                                         l4_dport_mask=0xFFFF, qid=5)}))
    assert both(state, ipv4_udp(bytes(40), 0, proto=47)) == (5, 5)
    assert both(state, ipv4_udp(bytes(40), 0, proto=17)) == (5, 5)
    assert both(state, ipv4_udp(bytes(40), 80, proto=6)) == (0, 0)
    assert both(state, ipv4_udp(bytes(40), 80, proto=1)) == (5, 5)


def test_job_nodes_are_stable_so_a_move_is_one_replace():
    nodes = ks.JobNodes()
    s1 = ks.compile_filters(SwitchState(job_rules=frozenset({JobRule(1, 2), JobRule(9, 3)})), ATP, nodes)
    s2 = ks.compile_filters(SwitchState(job_rules=frozenset({JobRule(1, 2), JobRule(9, 5), JobRule(4, 1)})),
                            ATP, nodes)
    changed = {n for n in s2 if s1.get(n) != s2[n]}
    assert len(changed) == 2  # job 9 moved (same node), job 4 added
    job9 = [e for e in s2.values() if e.table == "queue_by_job" and e.qid == 5]
    assert job9 and job9[0].node in s1


def test_too_many_entries_is_a_clear_error():
    rules = frozenset(TagRule(rank=1, priority_lo=1, priority_hi=254, deadline_lo_us=1 + i,
                              deadline_hi_us=0xFFFFFFF0, qid=3) for i in range(40))
    with pytest.raises(ks.TableFull, match="queue_by_tag"):
        ks.compile_filters(SwitchState(tag_rules=rules))


_rules = st.builds(
    SwitchState,
    job_rules=st.lists(st.builds(JobRule, job_id=st.integers(1, 6), qid=st.integers(0, 7)),
                       unique_by=lambda r: r.job_id, max_size=3).map(frozenset),
    tag_rules=st.lists(st.builds(lambda r, a, b, c, d, q: TagRule(r, min(a, b), max(a, b), min(c, d), max(c, d), q),
                                 st.integers(1, 3), st.integers(0, 255), st.integers(0, 255),
                                 st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 7)),
                       max_size=2).map(frozenset),
    tlr_rules=st.lists(st.builds(lambda a, b, q: TlrRule(min(a, b), max(a, b), q), st.integers(0, 0x8000),
                                 st.integers(0, 0x8000), st.integers(0, 7)), max_size=3).map(frozenset),
    class_rules=st.lists(st.builds(ClassRule, rank=st.integers(1, 3), ip_proto=st.sampled_from([6, 17, 1, 0x10]),
                                   ip_proto_mask=st.sampled_from([0, 0xFF, 0xF0]),
                                   l4_dport=st.sampled_from([0, 80, 5201, ATP, 0x1400]),
                                   l4_dport_mask=st.sampled_from([0, 0xFFFF, 0xFF00]), qid=st.integers(0, 7)),
                         max_size=3).map(frozenset),
)


@settings(max_examples=300, deadline=None)
@given(state=_rules, job=st.integers(1, 7), tlr=st.integers(0, 0x8000), flags=st.integers(0, 0x1F),
       priority=st.integers(0, 255), deadline=st.sampled_from([0, 17, 999, 5000, 5001, wire.NO_DEADLINE]),
       ptype=st.sampled_from(list(wire.PacketType)), dport=st.sampled_from([ATP, 5201, 80, 0, 0x1450]),
       proto=st.sampled_from([17, 17, 6, 1, 47, 0x12]))
def test_u32_layout_agrees_with_the_logical_tables(state, job, tlr, flags, priority, deadline, ptype, dport, proto):
    assume(ranks_are_unique(state))  # rules with the same rank overlap ambiguously (in P4 too)
    pkt = atp_data(job=job, tlr=tlr, flags=flags, priority=priority, deadline=deadline, ptype=ptype, dport=dport,
                   proto=proto)
    u32, ref = both(state, pkt)
    assert u32 == ref
    if ptype == wire.PacketType.DATA and flags & wire.Flags.APPROX and dport == ATP and proto == 17:
        assert ref != 0, "approximate traffic in queue 0: the guard failed"


@settings(max_examples=500, deadline=None)
@given(state=kernel_states(), pkts=st.lists(packets(), min_size=1, max_size=8))
def test_u32_layout_agrees_with_the_reference_on_generated_packets(state, pkts):
    """The pre-check of tests/controller/test_kernel_agreement.py (which runs the same on the real kernel): every
    kind of packet, malformed ones too (other IP versions, IHL < 5, options, fragments, wrong checksums). A
    packet cut short inside a header is left out (``headers_complete``: u32 stops at a read past the end)."""
    entries = ks.compile_filters(state, ATP)
    for spec in pkts:
        pkt = spec.bytes()
        if headers_complete(pkt):
            assert ks.u32_queue(entries, pkt) == reference_queue(state, pkt, ATP), spec


def test_a_fifo_switch_puts_every_packet_in_queue_0():
    """Policy mode fifo (the baselines' network-oblivious switch): surplus, job, tag and TLR rules do not apply
    and nothing is guarded into queue 1; the kernel switch compiles it to its catch-all entry alone."""
    state = SwitchState(fifo=True, job_rules=frozenset({JobRule(42, 2)}), tlr_rules=default_tlr_rules())
    for pkt in (atp_data(job=42, tlr=0), atp_data(job=7, tlr=wire.TLR_ONE), atp_data(job=7, tlr=0x7000),
                atp_data(job=42, flags=0), ipv4_udp(bytes(100), 5201)):
        assert both(state, pkt) == (0, 0)
    assert [e.table for e in ks.compile_filters(state).values()] == ["default"]


def test_the_p4_driver_refuses_a_fifo_state():
    from netapprox.controller.errors import ConfigError
    from netapprox.controller.p4runtime.driver import P4RuntimeDriver
    d = P4RuntimeDriver.__new__(P4RuntimeDriver)
    d.name = "s1"
    with pytest.raises(ConfigError, match="fifo needs a kernel"):
        d._set_desired(SwitchState(fifo=True))


def test_job_ranks_compile_to_queue_one_plus_rank():
    """The controller's job-rank rules (``[policy] rank_levels``) in the kernel switch's u32 layout: a TAGGED
    approximate packet of rank r goes to queue 1 + r, whatever its TLR; a priority above the ranks by its TLR."""
    from netapprox.controller import policy
    from netapprox.controller.config import PolicyConfig, SwitchConfig
    state = policy.static_state(SwitchConfig(name="s1"), PolicyConfig(rank_levels=3))
    tagged = wire.Flags.APPROX | wire.Flags.TAGGED
    for priority, want in ((0, 1), (1, 2), (2, 3), (3, 6)):
        assert both(state, atp_data(job=6, tlr=0x7800, flags=tagged, priority=priority)) == (want, want)
    assert both(state, atp_data(job=6, tlr=0x7800, priority=0)) == (6, 6)  # untagged: TLR 0.94, queue 6 (T_6 0.875)
