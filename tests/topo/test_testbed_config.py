"""The emulated rack tells ATP senders the queue sizes its switch installs (no namespaces needed)."""
from __future__ import annotations

import pytest

from netapprox.controller.kernel import tc
from netapprox.hostlib.config import AtpConfig
from netapprox.topo.testbed import TestbedConfig as RackConfig


@pytest.mark.parametrize("switch,buffer", [("netapprox", 64), ("netapprox", 100), ("fifo", 64)])
def test_queue_packets_are_the_buffers_the_driver_installs(switch, buffer):
    cfg = RackConfig(switch=switch, buffer_packets=buffer, controller=switch == "netapprox")
    shape = tc.PortShape(rate_mbit=cfg.rate_mbit, buffer_packets=cfg.port_buffer_packets)
    sizes = cfg.queue_packets
    assert sizes[0] * shape.mtu_bytes == shape.queue0_bytes()
    if switch == "fifo":  # one queue: every packet goes to queue 0, whose buffer is the whole port's
        assert sizes == (buffer,) + (0,) * 7
    else:
        assert [q * shape.mtu_bytes for q in sizes[1:]] == [shape.queue_bytes(q) for q in range(1, 8)]
        assert sum(sizes) == buffer and sizes[1:] == (7, 6, 5, 4, 3, 2, 1)
    AtpConfig(queue_packets=sizes)  # what hostlib takes


def test_the_default_rack_is_not_hostlibs_default():
    assert RackConfig().queue_packets == (36, 7, 6, 5, 4, 3, 2, 1)
    assert AtpConfig().queue_packets[0] == 64  # a larger port's: why the rack's experiments pass theirs
