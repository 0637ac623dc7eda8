"""``P4RuntimeDriver``: the NetApprox P4 program on BMv2 ``simple_switch_grpc`` and Tofino (``kind = "p4runtime"``).

The driver mirrors the P4 program: one object per P4 control owns its tables and a copy of what it installed
(``Forwarding`` <-> ``NetApproxIngress.forwarding``, ``Classification`` <-> ``NetApproxIngress.classification``,
``Ecn`` <-> ``NetApproxEgress.ecn``, ``Validation`` <-> ``NetApproxIngress.validation``). ``apply`` asks each
control for its desired entries, diffs them against the installed copies and sends all changes in one batched
Write (deletes, then modifies, then inserts). An unchanged state sends nothing.

``connect``: the session (arbitration as primary), the pipeline (BMv2 JSON or the Tofino device config,
VERIFY_AND_COMMIT), per-queue buffers (BMv2 Thrift or Tofino BfRt), then the last applied state. Packet-in
frames come out of ``drain_packet_in`` with their ingress port.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from p4.v1 import p4runtime_pb2

from netapprox.controller.drivers import Driver
from netapprox.controller.errors import ConfigError, P4RuntimeWriteError, PipelineError, QueueConfigError
from netapprox.controller.model import NUM_QUEUES, Counters, QueueStats, SwitchState, WriteSummary
from netapprox.controller.p4runtime.bmv2_thrift import set_queue_depths
from netapprox.controller.p4runtime.classification import Classification
from netapprox.controller.p4runtime.ecn import Ecn
from netapprox.controller.p4runtime.forwarding import Forwarding
from netapprox.controller.p4runtime.mirror import Change, pending_changes
from netapprox.controller.p4runtime.options import P4RuntimeOptions, options_from_mapping
from netapprox.controller.p4runtime.p4info import P4Info, decode
from netapprox.controller.p4runtime.session import P4RuntimeSession
from netapprox.controller.p4runtime.validation import Validation

log = logging.getLogger("netapprox.controller.p4runtime")

ENQUEUED_PACKETS = "NetApproxIngress.enqueued_packets"
TRANSMITTED_PACKETS = "NetApproxEgress.transmitted_packets"


def build_tofino_device_config(prog_name: str, tofino_bin: bytes, context_json: bytes) -> bytes:
    """PI/Stratum-bf packing: each of program name, tofino.bin and context.json prefixed by its length
    (little-endian int32). Stratum-bfrt wants its BfPipelineConfig instead: pass it as ``device_config``."""
    name = prog_name.encode()
    return b"".join(struct.pack("<i", len(part)) + part for part in (name, tofino_bin, context_json))


class P4RuntimeDriver(Driver):
    """A NetApprox switch over P4Runtime (BMv2 simple_switch_grpc, Tofino)."""

    def __init__(self, name: str, options: P4RuntimeOptions, *, p4info: P4Info | None = None) -> None:
        self.name = name
        self.options = options
        try:
            self.p4info = p4info or P4Info.load(options.p4info)
        except FileNotFoundError:
            raise ConfigError(f"switch {name!r}: P4Info {options.p4info!r} not found (run `make p4`, or set the "
                              "switch option p4info)") from None
        tofino = options.target == "tofino"
        self.forwarding = Forwarding(self.p4info)
        self.classification = Classification(self.p4info)
        self.ecn = Ecn(self.p4info, depth_unit=options.cells_per_packet if tofino else 1)
        self.validation = Validation(self.p4info)
        self._enqueued_id = self.p4info.counter_id(ENQUEUED_PACKETS)
        self._transmitted_id = self.p4info.counter_id(TRANSMITTED_PACKETS)
        self._lock = threading.RLock()
        self.session = P4RuntimeSession(name, options, self.p4info)
        self._desired: SwitchState | None = None
        self.pipeline_pushes = 0
        self.queue_config_error: str | None = None
        self.tm_client_factory: Callable[[], Any] | None = None  # tests inject a fake BfRt client

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "P4RuntimeDriver":
        return cls(name, options_from_mapping(name, options))

    @property
    def controls(self) -> tuple[Forwarding | Classification | Ecn | Validation, ...]:
        return (self.forwarding, self.classification, self.ecn, self.validation)

    # --- connect ---

    def connect(self) -> None:
        with self._lock:
            self.session.open()
            try:
                if self.options.push_pipeline:
                    self.session.set_pipeline(self._pipeline_config())
                    self.pipeline_pushes += 1
                self._configure_queues()
                for control in self.controls:
                    for table in control.tables:
                        table.installed.clear()
                if self._desired is not None:
                    self._write(self._desired)
            except BaseException:
                self.session.close()
                raise
            log.info("switch %r: connected to %s as primary (election id %s)", self.name, self.options.address,
                     self.options.election_id)

    def _pipeline_config(self) -> p4runtime_pb2.ForwardingPipelineConfig:
        opts = self.options
        try:
            if opts.target == "bmv2":
                device = Path(opts.bmv2_json).read_bytes()
            elif opts.device_config:
                device = Path(opts.device_config).read_bytes()
            elif opts.tofino_bin and opts.tofino_context:
                device = build_tofino_device_config(opts.prog_name, Path(opts.tofino_bin).read_bytes(),
                                                    Path(opts.tofino_context).read_bytes())
            else:
                raise PipelineError(f"switch {self.name!r}: target tofino needs the option device_config, or "
                                    "tofino_bin and tofino_context (from `make p4-tna`)")
        except FileNotFoundError as e:
            raise PipelineError(f"switch {self.name!r}: pipeline artifact {e.filename!r} not found "
                                "(run `make p4`, or fix the switch options)") from None
        cookie = int.from_bytes(hashlib.sha256(self.p4info.message.SerializeToString(deterministic=True)
                                               + device).digest()[:8], "big")
        return p4runtime_pb2.ForwardingPipelineConfig(p4info=self.p4info.message, p4_device_config=device,
                                                      cookie=p4runtime_pb2.ForwardingPipelineConfig.Cookie(
                                                          cookie=cookie))

    def _configure_queues(self) -> None:
        opts = self.options
        try:
            if opts.target == "bmv2" and opts.thrift_port is not None and opts.ports:
                set_queue_depths(opts.ports, opts.buffer_packets, opts.thrift_port,
                                 host=opts.address.rsplit(":", 1)[0], cli=opts.cli)
            elif opts.target == "tofino" and (opts.bfrt_address or self.tm_client_factory) and opts.ports:
                from netapprox.controller.p4runtime.tofino_tm import BfrtTmClient, configure_queues

                client = (self.tm_client_factory() if self.tm_client_factory else
                          BfrtTmClient(opts.bfrt_address, opts.prog_name, prefix=opts.tm_prefix))
                try:
                    configure_queues(client, opts.ports, opts.buffer_packets, prefix=opts.tm_prefix,
                                     cells_per_packet=opts.cells_per_packet, pool=opts.tm_pool)
                finally:
                    client.close()
        except QueueConfigError as e:
            # Forwarding works without it (queues keep the target's default size); say so loudly.
            log.error("switch %r: queue buffers not configured: %s", self.name, e)
            self.queue_config_error = str(e)
        else:
            self.queue_config_error = None

    # --- writes ---

    def apply(self, desired: SwitchState) -> WriteSummary:
        with self._lock:
            self.session.check_up()
            self._desired = desired
            return self._write(desired)

    def pending_changes(self, desired: SwitchState) -> list[Change]:
        """The updates ``apply(desired)`` would send, in order: deletes, modifies, inserts."""
        return pending_changes(self.controls, desired)

    def _write(self, desired: SwitchState) -> WriteSummary:
        changes = self.pending_changes(desired)
        if not changes:
            return WriteSummary()
        try:
            self.session.write([c.update() for c in changes])
        except P4RuntimeWriteError as e:
            failed = {err.index: err for err in e.errors}
            if -1 not in failed:  # the switch said which updates failed: the others are in
                for index, change in enumerate(changes):
                    err = failed.get(index)
                    if err is None:
                        change.commit()
                    else:
                        change.heal(err.code)
            raise
        for change in changes:
            change.commit()
        kinds = collections.Counter(c.kind for c in changes)
        return WriteSummary(inserted=kinds[p4runtime_pb2.Update.INSERT], modified=kinds[p4runtime_pb2.Update.MODIFY],
                            deleted=kinds[p4runtime_pb2.Update.DELETE])

    # --- reads ---

    def read_counters(self) -> Counters:
        with self._lock:
            self.session.check_up()
            entities = []
            for counter_id in (self._enqueued_id, self._transmitted_id):
                if self.options.ports:
                    for port in sorted(self.options.ports):
                        for qid in range(NUM_QUEUES):
                            entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                                counter_id=counter_id, index=p4runtime_pb2.Index(index=port * NUM_QUEUES + qid))))
                else:
                    entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                        counter_id=counter_id)))
            entities.append(p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
                table_entry=p4runtime_pb2.TableEntry(table_id=self.classification.queue_by_job.info.id))))
            entities += self.validation.counter_entities()
            enq: dict[int, int] = {}
            tx: dict[int, tuple[int, int]] = {}
            jobs: dict[int, int] = {}
            other = []
            for entity in self.session.read(entities, "counters"):
                kind = entity.WhichOneof("entity")
                if kind == "counter_entry":
                    c = entity.counter_entry
                    if c.counter_id == self._enqueued_id:
                        enq[c.index.index] = c.data.packet_count
                    elif c.counter_id == self._transmitted_id:
                        tx[c.index.index] = (c.data.packet_count, c.data.byte_count)
                    else:
                        other.append(c)
                elif kind == "direct_counter_entry":
                    d = entity.direct_counter_entry
                    for m in d.table_entry.match:
                        jobs[decode(m.exact.value)] = d.data.packet_count
            queues = []
            for index in sorted(set(enq) | set(tx)):
                e_count, (t_count, t_bytes) = enq.get(index, 0), tx.get(index, (0, 0))
                port, qid = divmod(index, NUM_QUEUES)
                if not self.options.ports and e_count == 0 and t_count == 0:
                    continue
                queues.append(QueueStats(port=port, qid=qid, enqueued=e_count, transmitted=t_count,
                                         dropped=max(0, e_count - t_count), transmitted_bytes=t_bytes))
            return Counters(queues=tuple(queues), job_packets=jobs, malformed=self.validation.drops(other))

    def drain_packet_in(self) -> list[tuple[bytes, int | None]]:
        return self.session.drain_packet_in()

    def close(self) -> None:
        with self._lock:
            self.session.close()
