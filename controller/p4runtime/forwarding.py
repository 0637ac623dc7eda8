"""Mirrors ``NetApproxIngress.forwarding`` (p4src/*/include/control/forwarding.p4): ``routes_v4``."""
from __future__ import annotations

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.model import Route, SwitchState
from netapprox.controller.p4runtime.mirror import DesiredTables, TableMirror, action, lpm, unique
from netapprox.controller.p4runtime.p4info import P4Info, ipv4_to_int, mac_to_int

ROUTES_V4 = "NetApproxIngress.forwarding.routes_v4"
ROUTE = "NetApproxIngress.forwarding.route"


class Forwarding:
    """``routes_v4``: IPv4 LPM -> ``route(port, src_mac, dst_mac)``."""

    def __init__(self, p4info: P4Info) -> None:
        self.routes_v4 = TableMirror(p4info, ROUTES_V4)
        self._dst = self.routes_v4.info.field("dst_addr")
        self._route = self.routes_v4.action_of(p4info, ROUTE)
        for p in ("port", "src_mac", "dst_mac"):
            self._route.param(p)

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.routes_v4,)

    def desired(self, state: SwitchState) -> DesiredTables:
        routes = unique(state.routes, lambda r: (r.prefix, r.prefix_len), ROUTES_V4)
        return {self.routes_v4: (routes, self._entry)}

    def _entry(self, r: Route) -> p4runtime_pb2.TableEntry:
        return self.routes_v4.entry([lpm(self._dst, ipv4_to_int(r.prefix), r.prefix_len)],
                                    action(self._route, port=r.port, src_mac=mac_to_int(r.src_mac),
                                           dst_mac=mac_to_int(r.dst_mac)))
