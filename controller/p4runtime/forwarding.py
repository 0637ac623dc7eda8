"""Mirrors ``NetApproxIngress.forwarding`` (p4src/*/include/control/forwarding.p4): ``routes_v4`` and
``ecmp_members``.

A ``Route`` is one ``routes_v4`` entry, ``route(port, src_mac, dst_mac)``. An ``EcmpRoute`` (a multi-path prefix:
``SwitchState.ecmp_routes``) is a ``routes_v4`` entry ``set_ecmp_group(group_id, spray)`` and the ``ECMP_BUCKETS``
``ecmp_members`` entries of its group, bucket b -> ``route`` to the port ``model.ecmp_buckets`` puts in bucket b,
with that member's MACs (``EcmpRoute.member_macs``, as a ``Route`` carries them). ``spray`` is the state's: the
program then picks a random bucket for approximate ATP DATA and the flow hash's bucket for everything else
(docs/dataplane.md, Spraying), the decision ``controller.reference.reference_next_hops`` makes.

Group ids are the controller's: a prefix keeps the id it was installed with while it stays in the state; a new
prefix takes the smallest id no other group holds (from 1), so adding or removing one group rewrites no other.
"""
from __future__ import annotations

import dataclasses
import itertools

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.errors import ControllerError
from netapprox.controller.model import ECMP_BUCKETS, EcmpRoute, Route, SwitchState
from netapprox.controller.p4runtime.mirror import DesiredTables, TableMirror, action, exact, lpm, unique
from netapprox.controller.p4runtime.p4info import P4Info, ipv4_to_int, mac_to_int

ROUTES_V4 = "NetApproxIngress.forwarding.routes_v4"
ECMP_MEMBERS = "NetApproxIngress.forwarding.ecmp_members"
ROUTE = "NetApproxIngress.forwarding.route"
SET_ECMP_GROUP = "NetApproxIngress.forwarding.set_ecmp_group"


@dataclasses.dataclass(frozen=True, order=True)
class EcmpGroup:
    """A ``routes_v4`` entry ``set_ecmp_group``: a multi-path prefix, its group and whether the switch sprays."""

    prefix: str
    prefix_len: int
    group_id: int
    spray: bool


@dataclasses.dataclass(frozen=True, order=True)
class EcmpMember:
    """An ``ecmp_members`` entry: bucket ``bucket`` of group ``group_id`` -> ``route(port, src_mac, dst_mac)``."""

    group_id: int
    bucket: int
    port: int
    src_mac: str
    dst_mac: str


class Forwarding:
    """``routes_v4``: IPv4 LPM -> ``route(port, src_mac, dst_mac)`` or ``set_ecmp_group(group_id, spray)``;
    ``ecmp_members``: (group, bucket) -> ``route``."""

    def __init__(self, p4info: P4Info) -> None:
        self.routes_v4 = TableMirror(p4info, ROUTES_V4)
        self.ecmp_members = TableMirror(p4info, ECMP_MEMBERS)
        self._dst = self.routes_v4.info.field("dst_addr")
        self._route = self.routes_v4.action_of(p4info, ROUTE)
        for p in ("port", "src_mac", "dst_mac"):
            self._route.param(p)
        self._set_group = self.routes_v4.action_of(p4info, SET_ECMP_GROUP)
        for p in ("group_id", "spray"):
            self._set_group.param(p)
        self._member_route = self.ecmp_members.action_of(p4info, ROUTE)
        self._group = self.ecmp_members.info.field("group_id")
        self._bucket = self.ecmp_members.info.field("bucket")
        # 0 when the P4Info gives no size: no limit checked here (the switch refuses what does not fit).
        self.max_groups = self.ecmp_members.info.size // ECMP_BUCKETS

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        # Members first: within one Write a group's members are inserted before the route that names it.
        return (self.ecmp_members, self.routes_v4)

    def desired(self, state: SwitchState) -> DesiredTables:
        routes = unique(state.routes, lambda r: (r.prefix, r.prefix_len), ROUTES_V4)
        groups = self.groups(state)
        both = sorted(set(routes) & set(groups))
        if both:
            raise ControllerError(f"{ROUTES_V4}: {both[0][0]}/{both[0][1]} is both a route and an ecmp route")
        members = {(m.group_id, m.bucket): m for r in state.ecmp_routes
                   for m in self.members(r, groups[(r.prefix, r.prefix_len)].group_id)}
        return {self.ecmp_members: (members, self._member_entry),
                self.routes_v4: ({**routes, **groups}, self._entry)}

    def groups(self, state: SwitchState) -> dict[tuple[str, int], EcmpGroup]:
        """(prefix, prefix length) -> its ``set_ecmp_group`` entry: installed prefixes keep their group id, new
        ones take the smallest free id from 1."""
        wanted = sorted((r.prefix, r.prefix_len) for r in state.ecmp_routes)
        if self.max_groups and len(wanted) > self.max_groups:
            raise ControllerError(f"{len(wanted)} ecmp routes, but {ECMP_MEMBERS} holds {self.max_groups} groups of "
                                  f"{ECMP_BUCKETS} buckets (ECMP_GROUPS in p4src/shared/sizes.p4)")
        installed = {(g.prefix, g.prefix_len): g.group_id for g, _ in self.routes_v4.installed.values()
                     if isinstance(g, EcmpGroup)}
        ids = {k: installed[k] for k in wanted if k in installed}
        used = set(ids.values())
        free = (g for g in itertools.count(1) if g not in used)
        for k in wanted:
            if k not in ids:
                ids[k] = next(free)
        spray = state.spray and not state.fifo
        return {k: EcmpGroup(k[0], k[1], ids[k], spray) for k in wanted}

    @staticmethod
    def members(route: EcmpRoute, group_id: int) -> list[EcmpMember]:
        """The ``ECMP_BUCKETS`` members of ``route`` as group ``group_id``: bucket b -> ``route.buckets[b]``."""
        return [EcmpMember(group_id, b, port, *route.member_macs(port)) for b, port in enumerate(route.buckets)]

    def _entry(self, r: Route | EcmpGroup) -> p4runtime_pb2.TableEntry:
        key = [lpm(self._dst, ipv4_to_int(r.prefix), r.prefix_len)]
        if isinstance(r, EcmpGroup):
            return self.routes_v4.entry(key, action(self._set_group, group_id=r.group_id, spray=int(r.spray)))
        return self.routes_v4.entry(key, action(self._route, port=r.port, src_mac=mac_to_int(r.src_mac),
                                                dst_mac=mac_to_int(r.dst_mac)))

    def _member_entry(self, m: EcmpMember) -> p4runtime_pb2.TableEntry:
        return self.ecmp_members.entry([exact(self._group, m.group_id), exact(self._bucket, m.bucket)],
                                       action(self._member_route, port=m.port, src_mac=mac_to_int(m.src_mac),
                                              dst_mac=mac_to_int(m.dst_mac)))
