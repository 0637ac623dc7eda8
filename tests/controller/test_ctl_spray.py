"""The P4Runtime driver's ECMP groups against the fake P4Runtime server (controller/p4runtime/fake_server.py).

``SwitchState.ecmp_routes`` becomes ``routes_v4`` -> ``set_ecmp_group(group_id, spray)`` and 16 ``ecmp_members``
entries per group (controller/p4runtime/forwarding.py). The entries the switch ends up holding are evaluated here
the way the P4 program uses them (docs/dataplane.md, Spraying: LPM, then a random bucket for approximate ATP DATA
when the group sprays, else bucket ``flow_hash mod 16``) and must give every packet the next hops
``controller.reference.reference_next_hops`` gives it. The program's own side of that decision is the PTF suite's
(ptf/tests/spraying.py) and tests/controller/test_ctl_bmv2.py's on BMv2.
"""
from __future__ import annotations

import ipaddress
import random

import pytest

from netapprox.controller.config import config_from_dict
from netapprox.controller.errors import ConfigError, ControllerError
from netapprox.controller.model import (ECMP_BUCKETS, EcmpRoute, Route, SwitchState, default_tlr_rules, ecmp_buckets,
                                        flow_hash)
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.reference import approx_atp_header, flow_key, reference_next_hops
from netapprox.hostlib import wire
from support.conformance import PacketSpec

from ctl_fixtures import P4INFO

INFO = P4Info.load(P4INFO)
ROUTES_V4 = INFO.table("NetApproxIngress.forwarding.routes_v4").id
ECMP_MEMBERS = INFO.table("NetApproxIngress.forwarding.ecmp_members").id
ROUTE = INFO.action("NetApproxIngress.forwarding.route").id
SET_ECMP_GROUP = INFO.action("NetApproxIngress.forwarding.set_ecmp_group").id

MACS = ("02:00:00:00:5a:02", "02:00:00:00:5a:03", "02:00:00:00:5a:04")
NEXT = ("02:00:00:00:0b:02", "02:00:00:00:0b:03", "02:00:00:00:0b:04")
WIDE = EcmpRoute("10.250.0.0", 16, (4, 2, 3), src_macs=(MACS[2], MACS[0], MACS[1]),
                 dst_macs=(NEXT[2], NEXT[0], NEXT[1]))
NARROW = EcmpRoute("10.250.7.0", 24, (5, 6))  # inside WIDE: the longer prefix wins
HOST = Route("10.0.0.1", 32, 1, "02:00:00:00:5a:01", "02:00:00:00:0a:01")
STATE = SwitchState(routes=frozenset({HOST}), tlr_rules=default_tlr_rules(), ecmp_routes=frozenset({WIDE, NARROW}))


def _int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _params(entry) -> tuple[int, ...]:
    return tuple(_int(p.value) for p in sorted(entry.action.action.params, key=lambda p: p.param_id))


def _mac(value: int) -> str:
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))


def installed(fake) -> tuple[dict, dict]:
    """What the switch holds: ({(prefix, len): (action id, params)}, {(group, bucket): (port, src, dst MAC)})."""
    routes = {}
    for e in fake.entries(ROUTES_V4):
        m = e.match[0].lpm
        routes[(str(ipaddress.IPv4Address(m.value.rjust(4, b"\0"))), m.prefix_len)] = (e.action.action.action_id,
                                                                                      _params(e))
    members = {}
    for e in fake.entries(ECMP_MEMBERS):
        by_field = {m.field_id: _int(m.exact.value) for m in e.match}
        port, src, dst = _params(e)
        members[(by_field[1], by_field[2])] = (port, _mac(src), _mac(dst))
    return routes, members


def switch_next_hops(fake, packet: bytes) -> dict[int, float]:
    """The egress ports (with their probabilities) the P4 program gives ``packet`` with the entries ``fake``
    holds: routes_v4 by longest prefix; ``set_ecmp_group``: approximate ATP DATA of a spraying group any of the
    16 buckets, every other packet bucket flow_hash mod 16; ecmp_members: bucket -> port."""
    routes, members = installed(fake)
    dst = ipaddress.IPv4Address(packet[16:20])
    hits = [(n, v) for (p, n), v in routes.items() if dst in ipaddress.IPv4Network(f"{p}/{n}")]
    if not hits:
        return {}
    action, params = max(hits)[1]
    if action == ROUTE:
        return {params[0]: 1.0}
    group, spray = params
    if spray and approx_atp_header(packet, wire.DEFAULT_ATP_PORT) is not None:
        ports = [members[(group, b)][0] for b in range(ECMP_BUCKETS)]
        return {p: ports.count(p) / ECMP_BUCKETS for p in sorted(set(ports))}
    return {members[(group, flow_hash(*flow_key(packet)) % ECMP_BUCKETS)][0]: 1.0}


def packets(n: int, seed: int = 7) -> list[bytes]:
    """Approximate ATP DATA, exact ATP, TCP and UDP to addresses in and around both groups."""
    rng = random.Random(seed)
    dsts = ["10.250.0.9", "10.250.7.1", "10.250.7.200", "10.250.255.1", "10.251.0.1", "10.0.0.1"]
    out = []
    for _ in range(n):
        dst, sport = rng.choice(dsts), rng.randrange(1024, 65536)
        kind = rng.randrange(4)
        if kind < 2:
            header = wire.Header(type=wire.PacketType.DATA, flags=wire.Flags.APPROX if kind == 0 else 0, job_id=5,
                                 tlr=8000, pkt_cnt=1)
            out.append(PacketSpec(sport=sport, dst=dst, atp=header, payload=b"x" * 16).bytes())
        else:
            out.append(PacketSpec(proto=6 if kind == 2 else 17, sport=sport, dport=rng.choice((80, 5001)), dst=dst,
                                  payload=b"y").bytes())
    return out


def test_spray_groups_are_installed_as_a_group_route_and_16_members(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    summary = driver.apply(STATE)
    routes, members = installed(fake_server)
    assert routes[("10.0.0.1", 32)] == (ROUTE, (1, 0x0200_0000_5A01, 0x0200_0000_0A01))
    groups = {net: routes[net] for net in (("10.250.0.0", 16), ("10.250.7.0", 24))}
    assert {a for a, _ in groups.values()} == {SET_ECMP_GROUP}
    assert sorted(p[0] for _, p in groups.values()) == [1, 2] and {p[1] for _, p in groups.values()} == {1}
    wide, narrow = groups[("10.250.0.0", 16)][1][0], groups[("10.250.7.0", 24)][1][0]
    macs = {2: (MACS[0], NEXT[0]), 3: (MACS[1], NEXT[1]), 4: (MACS[2], NEXT[2])}
    assert {b: members[(wide, b)] for b in range(ECMP_BUCKETS)} == {
        b: (p, *macs[p]) for b, p in enumerate(ecmp_buckets((2, 3, 4)))}
    zero = "00:00:00:00:00:00"
    assert {b: members[(narrow, b)] for b in range(ECMP_BUCKETS)} == {
        b: (p, zero, zero) for b, p in enumerate((5, 6) * 8)}
    assert len(members) == 2 * ECMP_BUCKETS
    assert summary.inserted == 3 + 2 * ECMP_BUCKETS + len(STATE.tlr_rules)
    writes = len(fake_server.writes)
    assert driver.apply(STATE).writes == 0 and len(fake_server.writes) == writes


def test_spray_entries_forward_every_packet_as_the_reference_decides(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    for state in (STATE, SwitchState(routes=STATE.routes, ecmp_routes=STATE.ecmp_routes, spray=False)):
        driver.apply(state)
        sprayed = hashed = 0
        for pkt in packets(300):
            want = reference_next_hops(state, pkt)
            if ipaddress.IPv4Address(pkt[16:20]) == ipaddress.IPv4Address(HOST.prefix):
                want = {HOST.port: 1.0}  # an ordinary route: not an ECMP decision
            assert switch_next_hops(fake_server, pkt) == want, (state.spray, pkt.hex())
            sprayed += len(want) > 1
            hashed += len(want) == 1
        assert hashed > 100 and (sprayed > 30 if state.spray else sprayed == 0)


def test_spray_off_modifies_only_the_group_routes(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    driver.apply(STATE)
    off = SwitchState(routes=STATE.routes, tlr_rules=STATE.tlr_rules, ecmp_routes=STATE.ecmp_routes, spray=False)
    summary = driver.apply(off)
    assert (summary.inserted, summary.modified, summary.deleted) == (0, 2, 0)
    routes, _ = installed(fake_server)
    assert {p for a, p in routes.values() if a == SET_ECMP_GROUP} == {(1, 0), (2, 0)}


def test_spray_group_ids_stay_when_other_groups_come_and_go(make_driver, fake_server):
    """A group keeps its id (and its 16 entries are not rewritten) while others are removed and added; a new
    group takes the smallest free id."""
    driver = make_driver()
    driver.connect()
    driver.apply(STATE)
    routes, _ = installed(fake_server)
    narrow_id = routes[("10.250.7.0", 24)][1][0]
    new = EcmpRoute("10.9.0.0", 16, (7, 8, 9, 10))
    writes = len(fake_server.writes)
    driver.apply(SwitchState(routes=STATE.routes, tlr_rules=STATE.tlr_rules, ecmp_routes=frozenset({NARROW, new})))
    (write,) = fake_server.writes[writes:]
    touched = {(u.entity.table_entry.table_id, u.entity.table_entry.match[0].exact.value)
               for u in write.updates if u.entity.table_entry.table_id == ECMP_MEMBERS}
    assert all(_int(group) != narrow_id for _, group in touched)
    routes, members = installed(fake_server)
    assert routes[("10.250.7.0", 24)][1][0] == narrow_id
    assert ("10.250.0.0", 16) not in routes
    new_id = routes[("10.9.0.0", 16)][1][0]
    assert new_id == 3 - narrow_id  # the id the removed group freed
    assert [members[(new_id, b)][0] for b in range(ECMP_BUCKETS)] == list(ecmp_buckets((7, 8, 9, 10)))
    assert len(members) == 2 * ECMP_BUCKETS


def test_spray_groups_survive_a_controller_restart_without_writes(make_driver, fake_server):
    first = make_driver()
    first.connect()
    first.apply(STATE)
    first.close()
    writes = len(fake_server.writes)
    second = make_driver()
    second.connect()  # same pipeline: the entries are read back, not pushed again
    assert second.entries_read_back == len(fake_server.entries())
    assert second.apply(STATE).writes == 0 and len(fake_server.writes) == writes


def test_spray_refuses_a_prefix_that_is_both_a_route_and_a_group(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    both = SwitchState(routes=frozenset({Route("10.250.0.0", 16, 1, HOST.src_mac, HOST.dst_mac)}),
                       ecmp_routes=frozenset({WIDE}))
    with pytest.raises(ControllerError, match=r"10\.250\.0\.0/16 is both a route and an ecmp route"):
        driver.apply(both)
    assert fake_server.entries() == []


def test_spray_refuses_more_groups_than_the_table_holds(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    assert driver.forwarding.max_groups == 256  # ECMP_MEMBERS_TABLE_SIZE 4096 / 16 buckets
    many = frozenset(EcmpRoute(f"10.{i // 256}.{i % 256}.0", 24, (1, 2)) for i in range(257))
    with pytest.raises(ControllerError, match=r"257 ecmp routes, but .*ecmp_members holds 256 groups"):
        driver.apply(SwitchState(ecmp_routes=many))
    assert fake_server.entries() == []


def test_spray_member_macs_are_checked_and_read_from_the_config():
    with pytest.raises(ValueError, match="src_macs needs one MAC per port"):
        EcmpRoute("10.250.0.0", 16, (2, 3), src_macs=(MACS[0],))
    with pytest.raises(ValueError, match="dst_macs: not a MAC address"):
        EcmpRoute("10.250.0.0", 16, (2, 3), dst_macs=(NEXT[0], "02:00"))
    route = {"prefix": "10.250.0.0/16", "ports": [4, 2, 3], "src_macs": [MACS[2], MACS[0], MACS[1]],
             "dst_macs": [NEXT[2], NEXT[0], NEXT[1]]}
    cfg = config_from_dict({"switch": [{"name": "leaf1", "ecmp_routes": [route]}]})
    assert cfg.switches[0].ecmp_routes == (WIDE,) and WIDE.member_macs(3) == (MACS[1], NEXT[1])
    with pytest.raises(ConfigError, match=r"ecmp_routes\[0\].*dst_macs.*one MAC per port"):
        config_from_dict({"switch": [{"name": "leaf1", "ecmp_routes": [{**route, "dst_macs": [NEXT[0]]}]}]})
    with pytest.raises(ConfigError, match=r"src_macs\[1\]"):
        config_from_dict({"switch": [{"name": "leaf1",
                                      "ecmp_routes": [{**route, "src_macs": [MACS[0], "x", MACS[1]]}]}]})
