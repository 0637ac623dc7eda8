"""P4Info lookups by name (with "Did you mean" errors) and P4Runtime value encoding.

Values are encoded as P4Runtime canonical bytestrings (big-endian, no leading zero bytes, at least one byte),
which BMv2 (PI) and Stratum accept since P4Runtime 1.3. Widths are checked against the P4Info.
"""
from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path
from typing import Mapping

from google.protobuf import text_format
from netapprox.controller.p4runtime.protos import p4info_pb2

from netapprox.controller.errors import P4InfoError


@dataclasses.dataclass(frozen=True)
class Field:
    id: int
    name: str
    bitwidth: int
    match_type: int = 0  # p4info_pb2.MatchField.MatchType for match fields; 0 for action params


@dataclasses.dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    fields: Mapping[str, Field]
    action_ids: frozenset[int]
    direct_counter_id: int | None
    size: int = 0
    """Entries the table holds (P4Info ``size``; 0 when the P4Info does not say)."""

    def field(self, name: str) -> Field:
        try:
            return self.fields[name]
        except KeyError:
            raise P4InfoError("match field", name, self.fields, where=f"table {self.name!r}") from None


@dataclasses.dataclass(frozen=True)
class ActionInfo:
    id: int
    name: str
    params: Mapping[str, Field]

    def param(self, name: str) -> Field:
        try:
            return self.params[name]
        except KeyError:
            raise P4InfoError("parameter", name, self.params, where=f"action {self.name!r}") from None


class P4Info:
    """Index over a ``p4info_pb2.P4Info``. Names resolve by full name (``NetApproxIngress.forwarding.routes_v4``),
    by the P4Info alias, or by a unique dotted suffix (so ``pipe.NetApproxIngress...`` from bf-p4c matches)."""

    def __init__(self, message: p4info_pb2.P4Info) -> None:
        self.message = message
        self._tables: dict[str, TableInfo] = {}
        self._actions: dict[str, ActionInfo] = {}
        self._counters: dict[str, int] = {}
        self._direct_counters: dict[str, int] = {}
        self._meters: dict[str, tuple[int, int]] = {}
        self._packet_metadata: dict[str, dict[str, Field]] = {}
        for t in message.tables:
            info = TableInfo(
                id=t.preamble.id, name=t.preamble.name,
                fields={f.name: Field(f.id, f.name, f.bitwidth, f.match_type) for f in t.match_fields},
                action_ids=frozenset(a.id for a in t.action_refs),
                direct_counter_id=next((r for r in t.direct_resource_ids
                                        if any(c.preamble.id == r for c in message.direct_counters)), None),
                size=t.size)
            self._register(self._tables, t.preamble, info)
        for a in message.actions:
            info = ActionInfo(a.preamble.id, a.preamble.name,
                              {p.name: Field(p.id, p.name, p.bitwidth) for p in a.params})
            self._register(self._actions, a.preamble, info)
        for c in message.counters:
            self._register(self._counters, c.preamble, c.preamble.id)
        for c in message.direct_counters:
            self._register(self._direct_counters, c.preamble, c.preamble.id)
        for m in message.meters:
            self._register(self._meters, m.preamble, (m.preamble.id, m.size))
        for m in message.controller_packet_metadata:
            self._packet_metadata[m.preamble.name] = {f.name: Field(f.id, f.name, f.bitwidth) for f in m.metadata}
        self.table_names = sorted(t.preamble.name for t in message.tables)

    @staticmethod
    def _register(index: dict, preamble, value) -> None:
        index[preamble.name] = value
        if preamble.alias and preamble.alias not in index:
            index[preamble.alias] = value

    @classmethod
    def load(cls, path: str | Path) -> "P4Info":
        """Read a P4Info file: text format (``.txt``, ``.txtpb``, ``.pb.txt``) or binary."""
        path = Path(path)
        data = path.read_bytes()
        message = p4info_pb2.P4Info()
        try:
            text_format.Merge(data.decode(), message)
        except (UnicodeDecodeError, text_format.ParseError):
            message = p4info_pb2.P4Info()
            message.ParseFromString(data)
        return cls(message)

    @staticmethod
    def _resolve(index: dict, name: str, kind: str):
        """By exact name or alias, else by a unique dotted suffix (bf-p4c may prefix ``pipe.``)."""
        if name in index:
            return index[name]
        hits = {getattr(v, "id", v): v for k, v in index.items() if k.endswith("." + name)}
        if len(hits) == 1:
            return next(iter(hits.values()))
        raise P4InfoError(kind, name, [k for k in index if "." in k] or list(index))

    def table(self, name: str) -> TableInfo:
        return self._resolve(self._tables, name, "table")

    def action(self, name: str) -> ActionInfo:
        return self._resolve(self._actions, name, "action")

    def counter_id(self, name: str) -> int:
        return self._resolve(self._counters, name, "counter")

    def direct_counter_id(self, name: str) -> int:
        return self._resolve(self._direct_counters, name, "direct counter")

    def meter(self, name: str) -> tuple[int, int]:
        """(id, size) of an indirect meter."""
        return self._resolve(self._meters, name, "meter")

    def packet_metadata(self, name: str) -> Mapping[str, Field]:
        """Fields of ``@controller_header(name)`` (``packet_in`` / ``packet_out``)."""
        try:
            return self._packet_metadata[name]
        except KeyError:
            raise P4InfoError("controller header", name, self._packet_metadata) from None


def encode(value: int, bitwidth: int, what: str = "value") -> bytes:
    """Canonical bytestring of ``value`` for a ``bitwidth``-bit field."""
    if not 0 <= value < (1 << bitwidth):
        raise ValueError(f"{what} {value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode(data: bytes) -> int:
    return int.from_bytes(data, "big")


def mac_to_int(mac: str) -> int:
    parts = mac.split(":")
    if len(parts) != 6:
        raise ValueError(f"bad MAC address {mac!r}")
    return int("".join(f"{int(p, 16):02x}" for p in parts), 16)


def ipv4_to_int(addr: str) -> int:
    return int(ipaddress.IPv4Address(addr))
