"""``TrafficManager``: what a P4 switch does outside its match-action tables that the controller configures.

- Per-queue buffers and strict priority: BMv2's queue depths over Thrift (``bmv2_thrift``), or the Tofino traffic
  manager over BfRt (``tofino_tm``), read back from the hardware; the BfRt session stays open for the TM's
  per-queue drop counters.
- The REPORT punt meter (``NetApproxIngress.report_meter``): every cell (one per ingress port) at
  ``report_rate_pps`` / ``report_burst``, read back first so that cells already right are not written.

Neither is fatal: forwarding works without them (the queues keep the target's defaults, reports are not
rate-limited in the data plane), but NetApprox's queueing does not, so a failure is said loudly, in the log,
in ``queue_config_error`` / ``meter_config_error`` and in the metrics.
"""
from __future__ import annotations

import logging
from typing import Any

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.errors import ControllerError, P4RuntimeWriteError, QueueConfigError
from netapprox.controller.p4runtime.bmv2_thrift import set_queue_depths
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.p4runtime.session import P4RuntimeSession
from netapprox.controller.p4runtime.tofino_tm import BfrtTmClient, configure_queues, queue_drops

log = logging.getLogger("netapprox.controller.p4runtime")

REPORT_METER = "NetApproxIngress.report_meter"


class TrafficManager:
    """Queue buffers and priorities, and the REPORT punt meter, of one switch."""

    def __init__(self, name: str, options: P4RuntimeOptions, p4info: P4Info, session: P4RuntimeSession) -> None:
        self.name = name
        self.options = options
        self.session = session
        self._report_meter_id, self._report_meter_size = p4info.meter(REPORT_METER)
        self.queue_config_error: str | None = None
        self.meter_config_error: str | None = None
        self._tm: Any = None  # the BfRt TM client (Tofino), kept for the drop counters
        self._tm_ports: list = []

    def configure(self) -> None:
        """Queue buffers, then the report meter (on every connect)."""
        self._configure_queues()
        self._configure_report_meter()

    def _configure_queues(self) -> None:
        opts = self.options
        try:
            if opts.target == "bmv2" and opts.thrift_port is not None and opts.ports:
                set_queue_depths(opts.ports, opts.buffer_packets, opts.thrift_port,
                                 host=opts.address.rsplit(":", 1)[0], cli=opts.cli, unit=opts.approx_buffer_unit)
            elif opts.target == "tofino" and opts.bfrt_address and opts.ports:
                self._configure_tofino_tm()
        except QueueConfigError as e:
            log.error("switch %r: queue buffers and priorities NOT configured: %s", self.name, e)
            self.queue_config_error = str(e)
        else:
            self.queue_config_error = None

    def _configure_tofino_tm(self) -> None:
        """Strict priority and buffers over BfRt, read back from the hardware; the client stays open for the TM's
        drop counters (``drops``)."""
        opts = self.options
        self.close()
        client = BfrtTmClient(opts.bfrt_address, opts.prog_name, prefix=opts.tm_prefix,
                              timeout_s=opts.connect_timeout_s)
        try:
            self._tm_ports = configure_queues(client, opts.ports, opts.buffer_packets, prefix=opts.tm_prefix,
                                              cells_per_packet=opts.cells_per_packet, pool=opts.tm_pool,
                                              unit=opts.approx_buffer_unit)
        except BaseException:
            client.close()
            raise
        self._tm = client
        log.info("switch %r: Tofino TM configured and verified for ports %s", self.name, sorted(opts.ports))

    def _configure_report_meter(self) -> None:
        """Every cell of ``report_meter`` at ``report_rate_pps`` / ``report_burst`` (cir = pir, cburst = pburst:
        over the rate a REPORT is dropped). Cells already right are not written."""
        opts = self.options
        want = (opts.report_rate_pps, opts.report_burst, opts.report_rate_pps, opts.report_burst)
        have: dict[int, tuple] = {}
        try:
            for entity in self.session.read([p4runtime_pb2.Entity(meter_entry=p4runtime_pb2.MeterEntry(
                    meter_id=self._report_meter_id))], "report meter"):
                c = entity.meter_entry.config
                have[entity.meter_entry.index.index] = (c.cir, c.cburst, c.pir, c.pburst)
        except ControllerError as e:
            log.info("switch %r: cannot read the report meter back (%s); writing every cell", self.name, e)
        config = p4runtime_pb2.MeterConfig(cir=want[0], cburst=want[1], pir=want[2], pburst=want[3])
        updates = [p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY, entity=p4runtime_pb2.Entity(
            meter_entry=p4runtime_pb2.MeterEntry(meter_id=self._report_meter_id, index=p4runtime_pb2.Index(index=i),
                                                 config=config)))
            for i in range(self._report_meter_size) if have.get(i) != want]
        self.meter_config_error = None
        if not updates:
            return
        try:
            self.session.write(updates)
        except P4RuntimeWriteError as e:
            self.meter_config_error = str(e)
            log.error("switch %r: REPORT punt meter not configured (reports are not rate-limited in the data "
                      "plane): %s", self.name, e)

    def drops(self) -> dict[tuple[int, int], int] | None:
        """The TM's per-queue drop counters, or None without a BfRt session (or when reading fails)."""
        if self._tm is None:
            return None
        try:
            return queue_drops(self._tm, self._tm_ports, prefix=self.options.tm_prefix)
        except QueueConfigError as e:
            log.warning("switch %r: reading the TM drop counters failed: %s", self.name, e)
            return None

    def close(self) -> None:
        if self._tm is not None:
            try:
                self._tm.close()
            except Exception as e:  # noqa: BLE001 - closing a broken session must not hide the next error
                log.debug("switch %r: closing the BfRt session: %s", self.name, e)
            self._tm = None
            self._tm_ports = []
