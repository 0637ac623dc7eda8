"""One simulated NetApprox switch: its logical tables (C++, one set per switch) and one queue disc per egress port.

    sw = SimSwitch("edge0", buffer_packets=1000)   # loads ns-3 and netapprox_switch.h
    sw.add_port(device, port=1)                     # before the device gets an IPv4 address
    write_state(sw.tables, state)                   # what SimDriver does with a SwitchState
    sw.queue_disc(1).Counters(0).transmitted

``write_state`` and ``write_job`` are the only code that turns ``controller.model`` values into the C++
tables; the classification test (tests/controller/test_sim_switch.py) checks the result against
``controller.reference.reference_queue`` for every rule kind. Port buffers follow the rule of the other data
planes: queue k >= 1 holds ``approx_unit`` x (8 - k) packets (1: the NetApprox paper's k-MTU buffers, §5),
queue 0 the rest (``model.queue_buffer_packets``).
A ``fifo`` port (the network-oblivious baseline switch) is the same queue disc with the controller's ``fifo``
state (every packet in queue 0) and queue 0 holding the whole buffer.
"""
from __future__ import annotations

from typing import Any, Iterable

from netapprox.controller.model import NUM_QUEUES, EcnRule, SwitchState, queue_buffer_packets
from netapprox.controller.reference import class_order, tag_order
from netapprox.controller.sim import native


def queue_limits(buffer_packets: int, *, fifo: bool = False, approx: tuple[int, ...] = (), unit: int = 1) -> list[int]:
    """Per logical queue buffer (packets) of a port with ``buffer_packets`` in all; ``approx``: the approximate
    queues' buffers in units of ``unit`` packets (``SwitchState.queue_buffers``; empty: 8 - k units)."""
    if fifo:
        return [buffer_packets] + [1] * (NUM_QUEUES - 1)
    return [queue_buffer_packets(q, buffer_packets, approx, unit) for q in range(NUM_QUEUES)]


def write_static(tables: Any, state: SwitchState) -> None:
    """Replace the ordered tables (queue_by_class, queue_by_tag, queue_by_tlr) and ecn_thresholds."""
    tables.ClearStatic()
    tables.SetFifo(state.fifo)
    for r in sorted(state.class_rules, key=class_order):
        tables.AddClass(r.ip_proto, r.ip_proto_mask, r.l4_dport, r.l4_dport_mask, r.qid)
    for r in sorted(state.tag_rules, key=tag_order):
        tables.AddTag(r.priority_lo, r.priority_hi, r.deadline_lo_us, r.deadline_hi_us, r.qid)
    for r in sorted(state.tlr_rules):
        tables.AddTlr(r.tlr_lo, r.tlr_hi, r.qid)
    for e in sorted(state.ecn_rules):
        tables.SetEcn(e.qid, e.depth_pkts)


def write_job(tables: Any, job_id: int, qid: int | None) -> None:
    """Set (or, with ``qid`` None, delete) one queue_by_job entry."""
    if qid is None:
        tables.DeleteJob(job_id)
    else:
        tables.SetJob(job_id, qid)


def write_state(tables: Any, state: SwitchState) -> None:
    """The whole ``state`` into ``tables`` (routes do not apply: the simulated network routes by ECMP)."""
    write_static(tables, state)
    for job in list(_installed_jobs(tables)):
        tables.DeleteJob(job)
    for r in state.job_rules:
        tables.SetJob(r.job_id, r.qid)


def _installed_jobs(tables: Any) -> Iterable[int]:
    return [int(p.first) for p in tables.jobs]


class SimSwitch:
    """A switch node's NetApprox data plane in ns-3. ``fifo``: the network-oblivious variant (one queue). ``trim``:
    approximate ATP DATA that finds its queue full is trimmed (its header goes on, flagged TRIM) instead of
    dropped, a traffic-manager setting like the buffers (netapprox_switch.h). ``approx_unit``: approximate queue
    k holds ``approx_unit`` x (8 - k) packets (the switch option ``approx_buffer_unit``; 1: the paper's k-MTU)."""

    def __init__(self, name: str, *, buffer_packets: int, fifo: bool = False, trim: bool = False,
                 approx_unit: int = 1) -> None:
        self.name = name
        self.buffer_packets = buffer_packets
        self.fifo = fifo
        self.approx_unit = approx_unit
        self.limits = queue_limits(buffer_packets, fifo=fifo, unit=approx_unit)
        g = native.cpp()
        self._g = g
        self.tables = g.netapprox.Tables.Create()
        self.tables.trim = trim
        self._ports: dict[int, Any] = {}

    def add_port(self, device: Any, port: int) -> Any:
        """Install the queue disc on ``device`` (an ns-3 NetDevice of this switch's node) as port ``port``."""
        if port in self._ports:
            raise ValueError(f"switch {self.name}: port {port} added twice")
        limits = self._g.std.vector["uint32_t"](self.limits)
        qd = self._g.netapprox.InstallQueueDisc(device, self.tables, port, limits)
        self._ports[port] = qd
        return qd

    def set_queue_buffers(self, approx: tuple[int, ...]) -> None:
        """Give every port's approximate queues 1..7 the buffers ``approx`` (in units of ``approx_unit`` packets;
        empty: 8 - k), queue 0 the rest of the port buffer. A fifo switch keeps its one queue."""
        if self.fifo:
            return
        limits = queue_limits(self.buffer_packets, approx=approx, unit=self.approx_unit)
        if limits == self.limits:
            return
        self.limits = limits
        vec = self._g.std.vector["uint32_t"](limits)
        for qd in self._ports.values():
            qd.SetLimits(vec)

    @property
    def ports(self) -> dict[int, Any]:
        return self._ports

    def queue_disc(self, port: int) -> Any:
        return self._ports[port]

    def ecn_rule(self, depth_pkts: int) -> EcnRule:
        return EcnRule(qid=0, depth_pkts=depth_pkts)
