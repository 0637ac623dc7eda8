"""KernelDriver: programs the Linux kernel switch through pyroute2 (the ``kernel`` kind of controller.drivers).

The kernel switch is a bridge in its own network namespace; every egress port carries an HTB
strict-priority tree (8 logical queues) and one u32 classifier whose entries mirror the P4 tables
(docs/architecture.md, docs/emulation.md). This driver owns those trees and entries:

Errors that mean "the switch is not (or no longer) there" raise ``controller.errors.SwitchUnavailable``, so the
controller's loop reconnects; bad options raise ``ConfigError`` (``controller/kernel/options.py``), a wrong call order
``KernelDriverError``.

- ``connect()`` builds the queue tree on each port (kept when it already has the right shape, so counters
  survive a reconnect), removes any u32 entries it did not write, and re-installs the last applied state.
- ``apply(state)`` compiles the state to u32 entries, diffs them against its installed copy and writes only
  the difference (``replace`` for new entries and new targets, ``del`` then ``replace`` for entries whose
  keys changed, since a u32 replace keeps a node's keys; ``del`` for removed ones), on every port. An
  unchanged state writes nothing. Counts in the returned ``WriteSummary`` are per port (one entry on a
  3-port switch counts 3).
- ``read_counters()`` reads per-queue packets and drops of each port's leaf fifos.

- the queue stamp (option ``stamp_queue``, default on): an eBPF classifier per queue writes the queue into
  the ATP queue byte of DATA packets, as the P4 program does (``self.stamping`` says whether it is attached).

- ECN: the ``ecn_thresholds`` entry of queue 0 becomes CE marking in queue 0's stamper (a virtual queue
  drained at line rate; changing the threshold re-attaches it, one write per port).
- ECMP (a multi-path fabric): a state's ``ecmp_routes`` become the forwarding program on every port's ingress
  (``forward.py``, ``forward.bpf.c``: approximate ATP DATA sprayed per packet over a route's ports when the
  state sprays, everything else by flow hash); packets no route holds, and every packet of a state without
  routes, are bridged. A change of routes or of ``spray`` re-attaches it (one write per port).
- buffers: a state's ``queue_buffers`` (policy mode ``adaptive``: the tuner's shares of the approximate queues'
  buffer, in units of ``approx_buffer_unit`` MTUs) change the fifos' byte limits in place (one write per port;
  packets and counters stay).

Not implemented by this target (documented in docs/emulation.md): ``routes`` (the switch bridges, or forwards
by ``ecmp_routes``),
ECN thresholds on queues other than 0 (ignored, logged once), per-job hit counters (``job_packets`` is empty).
"""
from __future__ import annotations

import logging
from typing import Mapping

from pyroute2 import IPRoute

from netapprox.controller.drivers import Driver
from netapprox.controller.errors import KernelSwitchError, SwitchUnavailable
from netapprox.controller.kernel import compiler, forward, stamp, tc
from netapprox.controller.kernel.options import KernelDriverOptions
from netapprox.controller.model import Counters, QueueStats, SwitchState, WriteSummary

log = logging.getLogger(__name__)


class KernelDriverError(KernelSwitchError):
    """The kernel switch could not be programmed (bad options, call order); the message names the fix."""


class KernelDriver(Driver):
    """One kernel switch. Not thread-safe: call it from the controller's epoch loop only."""

    OPTIONS = "kernel"

    def __init__(self, name: str, options: KernelDriverOptions) -> None:
        self.name = name
        self.options = options
        self._ipr = None
        self._ifindex: dict[str, int] = {}
        self._htid: dict[str, int | None] = {}
        self._job_nodes = compiler.JobNodes()
        self._installed: dict[int, compiler.U32Entry] = {}  # node -> entry, identical on every port
        self._state = SwitchState()
        self._warned_ecn = False
        self.stamping = False
        """Whether the queue stamper is attached (after ``connect``)."""
        self._ecn_q0: int | None = None
        self._buffers: tuple[int, ...] = ()  # the approximate queues' buffers on the ports (policy mode adaptive)
        self._forward: tuple | None = None  # (ecmp routes, spray) attached; () none; None unknown (after connect)

    # -- Driver --------------------------------------------------------------------------------------------
    def connect(self) -> None:
        self.close()
        try:
            # flags=0: never create the namespace (pyroute2 defaults to O_CREAT).
            self._ipr = IPRoute(netns=self.options.netns, flags=0) if self.options.netns else IPRoute()
        except OSError as exc:
            raise SwitchUnavailable(self.name, f"cannot open network namespace {self.options.netns!r}: {exc}. "
                                    "Is the switch running (ip netns list)?") from exc
        for ifname in self.options.ports:
            idx = self._ipr.link_lookup(ifname=ifname)
            if not idx:
                self.close()
                raise SwitchUnavailable(self.name, f"no interface {ifname!r} in namespace "
                                        f"{self.options.netns or '(current)'} (switch not started, or stopped)")
            self._ifindex[ifname] = idx[0]
            shape = self.options.shape(ifname)
            if not tc.port_has_shape(self._ipr, idx[0], shape, self._buffers):
                tc.build_port(self._ipr, idx[0], shape)
                tc.set_queue_limits(self._ipr, idx[0], shape, self._buffers)
            tc.flush_filters(self._ipr, idx[0])
            self._htid[ifname] = None
        self.stamping = False
        self._ecn_q0 = None  # attach_stamps installs queue 0's stamper without ECN marking
        if self.options.stamp_queue:
            try:
                stamp.attach_stamps(self.options.netns, list(self.options.ports), self.options.atp_port)
                self.stamping = True
            except KernelSwitchError as exc:
                log.warning("%s: no queue stamp (the ATP queue byte stays 0xFF): %s", self.name, exc)
        state, self._state, self._installed = self._state, SwitchState(), {}
        self._forward = None
        self._job_nodes = compiler.JobNodes()
        self.apply(state)

    def apply(self, desired: SwitchState) -> WriteSummary:
        if self._ipr is None:
            raise KernelDriverError(f"{self.name}: apply() before connect()")
        want_ecn = min((r.depth_pkts for r in desired.ecn_rules if r.qid == 0), default=None)
        unsupported = [r.qid for r in desired.ecn_rules if r.qid != 0] if self.stamping else \
            [r.qid for r in desired.ecn_rules]
        if unsupported and not self._warned_ecn:
            why = "marks ECN on queue 0 only" if self.stamping else "marks no ECN without the eBPF stamper"
            log.warning("%s: the kernel switch %s; ecn_thresholds for queue(s) %s ignored", self.name, why,
                        sorted(set(unsupported)))
            self._warned_ecn = True
        ecn_writes = 0
        if self.stamping and want_ecn != self._ecn_q0:
            try:
                stamp.attach_queue0(self.options.netns, {i: self.options.shape(i) for i in self._ifindex}, want_ecn,
                                 self.options.atp_port)
            except KernelSwitchError as exc:
                raise SwitchUnavailable(self.name, f"setting queue 0's ECN threshold failed: {exc}") from exc
            self._ecn_q0 = want_ecn
            ecn_writes = len(self._ifindex)
        if desired.queue_buffers != self._buffers:  # policy mode adaptive: the tuner's buffers, in place
            try:
                for ifname, idx in self._ifindex.items():
                    tc.set_queue_limits(self._ipr, idx, self.options.shape(ifname), desired.queue_buffers)
            except Exception as exc:
                raise SwitchUnavailable(self.name, f"setting the queue buffers failed: {exc}") from exc
            self._buffers = desired.queue_buffers
            ecn_writes += len(self._ifindex)
        want_forward = (desired.ecmp_routes, desired.spray and not desired.fifo) if desired.ecmp_routes else ()
        if want_forward != self._forward:
            ifnames = list(self._ifindex)
            try:
                if want_forward:
                    ifindex = {self.options.ports[n]: i for n, i in self._ifindex.items()}
                    obj = forward.forward_object(desired.ecmp_routes, ifindex, want_forward[1], self.options.atp_port)
                    forward.attach_forward(self.options.netns, ifnames, obj)
                else:
                    forward.detach_forward(self.options.netns, ifnames)
            except KernelSwitchError as exc:
                if "no port" in str(exc):
                    raise KernelDriverError(f"{self.name}: {exc}") from exc
                raise SwitchUnavailable(self.name, f"setting the ECMP forwarding failed: {exc}") from exc
            self._forward = want_forward
            ecn_writes += len(self._ifindex) if want_forward or self._state.ecmp_routes else 0
        wanted = compiler.compile_filters(desired, self.options.atp_port, self._job_nodes)
        changed = [e for n, e in sorted(wanted.items()) if self._installed.get(n) != e]
        removed = sorted(set(self._installed) - set(wanted))
        inserted = sum(1 for e in changed if e.node not in self._installed)
        modified = len(changed) - inserted
        for ifname, idx in self._ifindex.items():
            try:
                for entry in changed:
                    old = self._installed.get(entry.node)
                    if old is not None and old.keys != entry.keys:
                        # A u32 replace keeps the node's old keys (the kernel copies its selector; only the
                        # target changes): new keys need the node deleted and added again.
                        tc.delete_entry(self._ipr, idx, self._htid[ifname], entry.node)
                    tc.write_entry(self._ipr, idx, self._htid[ifname], entry)
                    if self._htid[ifname] is None:
                        self._htid[ifname] = tc.root_htid(self._ipr, idx)
                for node in removed:
                    tc.delete_entry(self._ipr, idx, self._htid[ifname], node)
            except Exception as exc:
                # The port is now partly written: forget what we believe is installed so that the next
                # connect() rewrites everything.
                self._installed = {}
                raise SwitchUnavailable(self.name, f"writing u32 entries on {ifname} failed: {exc}; "
                                        "connect() re-installs the whole state") from exc
        self._installed = wanted
        self._state = desired
        n = len(self._ifindex)
        return WriteSummary(inserted=inserted * n, modified=modified * n + ecn_writes, deleted=len(removed) * n)

    def read_counters(self) -> Counters:
        if self._ipr is None:
            raise KernelDriverError(f"{self.name}: read_counters() before connect()")
        try:
            stats = tc.read_stats(self._ipr, self._ifindex.values())
            bad_version = tc.read_dropped(self._ipr, self._ifindex.values())
        except Exception as exc:
            raise SwitchUnavailable(self.name, f"reading queue statistics failed: {exc}") from exc
        queues = []
        for ifname, idx in self._ifindex.items():
            port = self.options.ports[ifname]
            for s in stats[idx]:
                queues.append(QueueStats(port=port, qid=s.qid, enqueued=s.packets + s.drops + s.backlog_packets,
                                         transmitted=s.packets, dropped=s.drops, transmitted_bytes=s.bytes,
                                         backlog=s.backlog_packets))
        return Counters(queues=tuple(queues), malformed={"bad_version": bad_version} if bad_version else {})

    def close(self) -> None:
        if self._ipr is not None:
            try:
                self._ipr.close()
            finally:
                self._ipr = None
                self._ifindex = {}
                self._htid = {}

    # -- helpers for tests and the demo --------------------------------------------------------------------
    @property
    def installed(self) -> Mapping[int, compiler.U32Entry]:
        """The u32 entries this driver believes are on every port (node id -> entry)."""
        return dict(self._installed)

    @property
    def state(self) -> SwitchState:
        """The last state applied."""
        return self._state
