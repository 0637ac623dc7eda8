"""The ECMP groups of a multi-path fabric, computed from its topology (pure).

    routes = ecmp_routes(switches, hosts, links)   # switch name -> frozenset of model.EcmpRoute

Every host gets a /32 route on every switch that reaches it: the group of the switch's ports whose neighbour is
one hop closer to the host (shortest paths over switches only; hosts never forward). On a leaf-spine, a leaf's
route to a host on another leaf holds all its uplinks, and a spine's route holds the one port towards the host's
leaf. The controller installs them as ``SwitchConfig.ecmp_routes``; topo/net.py builds them for the emulated
network, and the ns-3 fabric's routing (experiments/sim/topology.py) makes the same shortest-path choice.
"""
from __future__ import annotations

import collections
from typing import Iterable, Mapping

from netapprox.controller.model import EcmpRoute

Link = tuple[str, "int | None", str, "int | None"]
"""(node a, a's port number or None for a host, node b, b's port or None)."""


def ecmp_routes(switches: Iterable[str], hosts: Mapping[str, str], links: Iterable[Link]) -> dict[str, frozenset[EcmpRoute]]:
    """Per switch, one ``EcmpRoute`` per reachable host (``hosts``: name -> IPv4 address): prefix the host's
    /32, ports the switch's ports on shortest paths towards it."""
    switches = set(switches)
    adj: dict[str, list[tuple[str, int | None]]] = collections.defaultdict(list)  # node -> (neighbour, own port)
    for a, pa, b, pb in links:
        for node, port in ((a, pa), (b, pb)):
            if node in switches and port is None:
                raise ValueError(f"link {a}-{b}: switch {node} needs a port number")
        adj[a].append((b, pa))
        adj[b].append((a, pb))
    out: dict[str, set[EcmpRoute]] = {s: set() for s in switches}
    for host, ip in hosts.items():
        dist = {host: 0}
        queue = collections.deque([host])
        while queue:
            u = queue.popleft()
            if u != host and u not in switches:
                continue  # hosts do not forward
            for v, _ in adj[u]:
                if v not in dist and (v in switches):
                    dist[v] = dist[u] + 1
                    queue.append(v)
        for s in switches:
            if s not in dist:
                continue
            ports = sorted({p for v, p in adj[s] if dist.get(v, -1) == dist[s] - 1})
            if ports:
                out[s].add(EcmpRoute(prefix=ip, prefix_len=32, ports=tuple(ports)))
    return {s: frozenset(r) for s, r in out.items()}
