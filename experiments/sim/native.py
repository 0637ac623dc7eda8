"""ns-3 with everything the simulations compile into it: the switch (controller/sim), the host shim
(hostlib.sim) and the routing and baseline applications (``netapprox_sim_apps.h`` next to this file) and the peer transports'
switches and hosts (``netapprox_peers.h``).

    ns, g = native.load()       # ns-3's namespace and cppyy.gbl; ~15 s the first time in a process
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from netapprox.controller.sim import native as switch_native
from netapprox.hostlib import sim as host_sim

HERE = Path(__file__).resolve().parent


def load() -> tuple[Any, Any]:
    ns = switch_native.load()
    g = switch_native.cpp()
    host_sim.load()
    switch_native.include(HERE / "netapprox_sim_apps.h")
    switch_native.include(HERE / "netapprox_peers.h")
    return ns, g
