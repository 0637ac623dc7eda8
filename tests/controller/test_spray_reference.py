"""The spraying decision without a switch: the reference model's next hops, the ECMP buckets and flow hash,
the ECMP groups computed from a leaf-spine topology, and how policy and configuration carry them."""
from __future__ import annotations

import zlib

import pytest

from netapprox.controller import policy
from netapprox.controller.config import ConfigError, PolicyConfig, SwitchConfig, config_from_dict
from netapprox.controller.fabric import ecmp_routes
from netapprox.controller.model import ECMP_BUCKETS, EcmpRoute, SwitchState, ecmp_buckets, flow_hash
from netapprox.controller.reference import reference_next_hops, sprays
from netapprox.hostlib import wire
from support.conformance import PacketSpec

GROUP = EcmpRoute(prefix="10.250.0.0", prefix_len=16, ports=(4, 2, 3))
STATE = SwitchState(ecmp_routes=frozenset({GROUP, EcmpRoute(prefix="10.250.1.0", prefix_len=24, ports=(7,))}))


def atp(flags: int = wire.Flags.APPROX, ptype: wire.PacketType = wire.PacketType.DATA, **kw) -> bytes:
    return PacketSpec(atp=wire.Header(type=ptype, flags=flags, job_id=5, tlr=8000, pkt_cnt=1), payload=b"x" * 8,
                      **kw).bytes()


def test_spray_buckets_fill_round_robin_in_port_order():
    assert ecmp_buckets((4, 2, 3)) == (2, 3, 4) * 5 + (2,)
    assert ecmp_buckets((9, 1)) == (1, 9) * 8
    assert len(ecmp_buckets(range(ECMP_BUCKETS))) == ECMP_BUCKETS
    with pytest.raises(ValueError, match="at most 16"):
        EcmpRoute(prefix="10.0.0.0", prefix_len=8, ports=tuple(range(17)))
    with pytest.raises(ValueError, match="distinct"):
        EcmpRoute(prefix="10.0.0.0", prefix_len=8, ports=(1, 1))
    with pytest.raises(ValueError, match="host bits"):
        EcmpRoute(prefix="10.0.0.1", prefix_len=8, ports=(1,))


def test_spray_flow_hash_is_crc32_of_the_five_tuple():
    key = bytes([10, 0, 0, 1, 10, 0, 0, 2, 17, 0x9c, 0x40, 0x1d, 0xb0])
    assert flow_hash("10.0.0.1", "10.0.0.2", 17, 40000, 7600) == zlib.crc32(key)
    assert flow_hash("10.0.0.1", "10.0.0.2", 17, 40000, 7600) != flow_hash("10.0.0.1", "10.0.0.2", 17, 40001, 7600)


def test_spray_reference_sprays_approximate_data_over_the_group():
    hops = reference_next_hops(STATE, atp(dst="10.250.9.9"))
    assert hops == {2: 6 / 16, 3: 5 / 16, 4: 5 / 16}
    assert reference_next_hops(STATE, atp(dst="10.250.1.9")) == {7: 1.0}  # longest prefix
    assert reference_next_hops(STATE, atp(dst="10.251.0.1")) == {}  # no route: bridged


@pytest.mark.parametrize("packet", [
    atp(flags=0, dst="10.250.3.3"),  # ATP without APPROX
    atp(ptype=wire.PacketType.ACK, dst="10.250.3.3"),
    atp(dst="10.250.3.3", ihl=6),  # IP options: no L4 ports read
    atp(dst="10.250.3.3", frag=5),  # not a first fragment
    PacketSpec(proto=6, dport=80, payload=b"GET /", dst="10.250.3.3").bytes(),
    PacketSpec(proto=17, dport=53, payload=b"q", dst="10.250.3.3").bytes(),
], ids=["atp-exact", "atp-ack", "options", "fragment", "tcp", "udp"])
def test_spray_reference_never_splits_non_approximate_flows(packet):
    hops = reference_next_hops(STATE, packet)
    assert len(hops) == 1 and list(hops.values()) == [1.0]
    assert not sprays(STATE, packet)


def test_spray_reference_flow_hash_variant_and_fifo_hash_approximate_flows_too():
    by_flow = {}
    for sport in range(40000, 40064):
        pkt = atp(dst="10.250.3.3", sport=sport)
        for state in (SwitchState(ecmp_routes=STATE.ecmp_routes, spray=False),
                      SwitchState(ecmp_routes=STATE.ecmp_routes, fifo=True)):
            hops = reference_next_hops(state, pkt)
            assert len(hops) == 1
            by_flow.setdefault(sport, set()).update(hops)
    assert all(len(p) == 1 for p in by_flow.values())
    assert set().union(*by_flow.values()) == {2, 3, 4}  # 64 flows spread over the whole group


def test_leafspine_ecmp_groups_from_the_topology():
    # leaf1 (ports 1, 2 hosts; 3, 4 uplinks), leaf2 likewise; spine1/spine2 port 1 to leaf1, 2 to leaf2.
    links = [("h1", None, "leaf1", 1), ("h2", None, "leaf1", 2), ("h3", None, "leaf2", 1), ("h4", None, "leaf2", 2),
             ("leaf1", 3, "spine1", 1), ("leaf1", 4, "spine2", 1), ("leaf2", 3, "spine1", 2), ("leaf2", 4, "spine2", 2)]
    hosts = {"h1": "10.0.0.1", "h2": "10.0.0.2", "h3": "10.0.0.3", "h4": "10.0.0.4"}
    routes = ecmp_routes(["leaf1", "leaf2", "spine1", "spine2"], hosts, links)
    ports = {s: {r.prefix: r.ports for r in rs} for s, rs in routes.items()}
    assert ports["leaf1"] == {"10.0.0.1": (1,), "10.0.0.2": (2,), "10.0.0.3": (3, 4), "10.0.0.4": (3, 4)}
    assert ports["spine1"] == {"10.0.0.1": (1,), "10.0.0.2": (1,), "10.0.0.3": (2,), "10.0.0.4": (2,)}
    assert ports["spine2"] == ports["spine1"]
    with pytest.raises(ValueError, match="needs a port"):
        ecmp_routes(["s1"], {}, [("s1", None, "h1", None)])


def test_spray_policy_and_config_carry_the_groups():
    sw = SwitchConfig(name="leaf1", kind="kernel", options={"ports": ["a"]}, ecmp_routes=(GROUP,))
    state = policy.static_state(sw, PolicyConfig())
    assert state.ecmp_routes == {GROUP} and state.spray
    assert not policy.static_state(sw, PolicyConfig(spray=False)).spray
    fifo = policy.static_state(sw, PolicyConfig(mode="fifo"))
    assert fifo.ecmp_routes == {GROUP} and not fifo.spray
    cfg = config_from_dict({"switch": [{"name": "leaf1", "kind": "kernel", "options": {"ports": ["a"]},
                                        "ecmp_routes": [{"prefix": "10.250.0.0/16", "ports": [4, 2, 3]}]}],
                            "policy": {"spray": False}})
    assert cfg.switches[0].ecmp_routes == (GROUP,) and cfg.policy.spray is False
    with pytest.raises(ConfigError, match="ecmp_routes"):
        config_from_dict({"switch": [{"name": "s", "kind": "kernel", "options": {"ports": ["a"]},
                                      "ecmp_routes": [{"prefix": "10.250.0.0/16", "ports": [1, 1]}]}]})
