"""``CounterReader``: the P4 program's counters in one Read (docs/architecture.md, P4Info contract).

Per (port, queue) ``enqueued_packets`` (after classification) and ``transmitted_packets`` (packets and bytes,
index ``port * 8 + qid``), the per-job direct counter of ``queue_by_job``, the ``malformed_packets`` drop
reasons (``Validation``) and ``queue0_guard_packets``. Tail drops are enqueued - transmitted, or the Tofino
TM's own per-queue counter when a BfRt session is open (``tm.TrafficManager.drops``).
"""
from __future__ import annotations

from typing import Callable

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.model import NUM_QUEUES, Counters, QueueStats
from netapprox.controller.p4runtime.classification import Classification
from netapprox.controller.p4runtime.p4info import P4Info, decode
from netapprox.controller.p4runtime.session import P4RuntimeSession
from netapprox.controller.p4runtime.validation import Validation

ENQUEUED_PACKETS = "NetApproxIngress.enqueued_packets"
TRANSMITTED_PACKETS = "NetApproxEgress.transmitted_packets"
QUEUE0_GUARD_PACKETS = "NetApproxIngress.classification.queue0_guard_packets"


class CounterReader:
    """Reads the counters of one switch; ``ports`` empty: every cell the switch has counted."""

    def __init__(self, p4info: P4Info, session: P4RuntimeSession, ports: tuple[int, ...],
                 classification: Classification, validation: Validation,
                 tm_drops: Callable[[], dict[tuple[int, int], int] | None]) -> None:
        self.session = session
        self.ports = ports
        self.classification = classification
        self.validation = validation
        self.tm_drops = tm_drops
        self.enqueued_id = p4info.counter_id(ENQUEUED_PACKETS)
        self.transmitted_id = p4info.counter_id(TRANSMITTED_PACKETS)
        self.guard_id = p4info.counter_id(QUEUE0_GUARD_PACKETS)
        self.queue0_guard_packets = 0
        """Approximate packets the data plane moved out of queue 0 (as of the last ``read``)."""

    def _entities(self) -> list[p4runtime_pb2.Entity]:
        entities = []
        for counter_id in (self.enqueued_id, self.transmitted_id):
            if self.ports:
                for port in sorted(self.ports):
                    for qid in range(NUM_QUEUES):
                        entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                            counter_id=counter_id, index=p4runtime_pb2.Index(index=port * NUM_QUEUES + qid))))
            else:
                entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(counter_id=counter_id)))
        entities.append(p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
            table_entry=p4runtime_pb2.TableEntry(table_id=self.classification.queue_by_job.info.id))))
        entities += self.validation.counter_entities()
        entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
            counter_id=self.guard_id, index=p4runtime_pb2.Index(index=0))))
        return entities

    def read(self) -> Counters:
        enq: dict[int, int] = {}
        tx: dict[int, tuple[int, int]] = {}
        jobs: dict[int, int] = {}
        other = []
        for entity in self.session.read(self._entities(), "counters"):
            kind = entity.WhichOneof("entity")
            if kind == "counter_entry":
                c = entity.counter_entry
                if c.counter_id == self.enqueued_id:
                    enq[c.index.index] = c.data.packet_count
                elif c.counter_id == self.transmitted_id:
                    tx[c.index.index] = (c.data.packet_count, c.data.byte_count)
                elif c.counter_id == self.guard_id:
                    self.queue0_guard_packets = c.data.packet_count
                else:
                    other.append(c)
            elif kind == "direct_counter_entry":
                d = entity.direct_counter_entry
                for m in d.table_entry.match:
                    jobs[decode(m.exact.value)] = d.data.packet_count
        tm_drops = self.tm_drops()
        queues = []
        for index in sorted(set(enq) | set(tx)):
            e_count, (t_count, t_bytes) = enq.get(index, 0), tx.get(index, (0, 0))
            port, qid = divmod(index, NUM_QUEUES)
            if not self.ports and e_count == 0 and t_count == 0:
                continue
            # Tofino with BfRt: the TM's own drop counter; otherwise enqueued - transmitted.
            dropped = tm_drops[(port, qid)] if tm_drops and (port, qid) in tm_drops else max(0, e_count - t_count)
            queues.append(QueueStats(port=port, qid=qid, enqueued=e_count, transmitted=t_count,
                                     dropped=dropped, transmitted_bytes=t_bytes))
        return Counters(queues=tuple(queues), job_packets=jobs, malformed=self.validation.drops(other))
