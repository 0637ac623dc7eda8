"""Mirrors ``NetApproxIngress.validation`` (p4src/*/include/control/validation.p4) and its drop counter.

The control has no tables: it flags malformed ATP packets, which the ingress drops and counts in
``NetApproxIngress.malformed_packets`` (index = drop reason, ``MALFORMED_*``/``DROPPED_*`` in
p4src/shared/define.p4; tests/controller/test_p4_validation.py checks the names below against that file).
This class reads the counter; the PTF file of the same name (ptf/tests/validation.py) checks the data plane.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.model import SwitchState
from netapprox.controller.p4runtime.mirror import DesiredTables, TableMirror
from netapprox.controller.p4runtime.p4info import P4Info

MALFORMED_PACKETS = "NetApproxIngress.malformed_packets"
DROP_REASONS: tuple[str, ...] = ("truncated", "bad_version", "bad_type", "bad_flags", "bad_tlr", "bad_index",
                                 "ttl_expired", "ipv4_checksum")
"""Drop reason names by counter index; the ATP ones are hostlib.wire.MalformedPacket reasons."""


class Validation:
    """No tables to program; ``counter_entities`` / ``drops`` read ``malformed_packets``."""

    def __init__(self, p4info: P4Info) -> None:
        self.counter_id = p4info.counter_id(MALFORMED_PACKETS)

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return ()

    def desired(self, state: SwitchState) -> DesiredTables:
        return {}

    def counter_entities(self) -> list[p4runtime_pb2.Entity]:
        """One wildcard read of the whole counter."""
        return [p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(counter_id=self.counter_id))]

    def drops(self, entries: Iterable[p4runtime_pb2.CounterEntry]) -> Mapping[str, int]:
        """reason -> packets, from the counter entries a Read returned (other counters are ignored)."""
        out: dict[str, int] = {}
        for c in entries:
            if c.counter_id == self.counter_id and c.index.index < len(DROP_REASONS):
                out[DROP_REASONS[c.index.index]] = c.data.packet_count
        return out
