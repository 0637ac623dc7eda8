"""Scapy layer for ATP (docs/wire-format.md, version 2), bound to the ATP UDP port and the report port.

    >>> from netapprox.hostlib.scapy_atp import ATP, ATPAck, ATPRecord, ATPRecords, bind_port
    >>> pkt = IP(dst="10.0.0.2") / UDP(dport=7600) / ATP(type=1, flags=0x01, job_id=7, tlr=0x1000)
    >>> pkt[ATP].show()     # ... tlr = 0x1000 (0.125) ...
    >>> packed = ATP(type=1, job_id=7, msg_id=3) / ATPRecords(records=[ATPRecord(msg_id=3, data=b"a"),
    ...                                                                ATPRecord(msg_id=9, data=b"bc")])
    >>> ack = ATP(type=2, job_id=7, seq=41) / ATPAck(blocks=[ATPSackBlock(first=40, last=41)], grant=60)

The TLR is shown as its Q1.15 value and the fraction it stands for; ``ATP.tlr_fraction`` gives the fraction.

Left unset (``None``), ``count`` and ``length`` are filled in when the packet is built: ``count`` is the number
of packed records under an ``ATPRecords`` payload, else 1 for DATA and 0 for the other types; ``length`` is the
payload's size. An ``ATPAck`` payload (ACK and GRANT) with ``grant`` or ``token`` set adds the ``GRANT`` or
``TOKEN`` flag to the header, as ``hostlib.wire.encode_ack`` does. When dissecting, a DATA packet with
``count >= 2`` gets an ``ATPRecords`` payload, a DATA packet with the MSR change's message id (not trimmed) an
``ATPMsrChange`` payload, and an ACK or GRANT an ``ATPAck`` payload whose ``grant`` and ``token`` are read when the
header's flags say they are there; other payloads stay ``Raw`` (a RETRY's or a NEW_TOKEN's 16-byte token among
them).

    >>> change = ATP(type=1, job_id=7, msg_id=MSR_MSG_ID, group_id=2) / ATPMsrChange(change=1, msr=0x2000)

Importing this module needs scapy (a dev/test dependency, not a hostlib runtime dependency). Header field names
and widths are taken from ``hostlib.wire.HEADER_FIELDS`` so the layer cannot drift from the encoder.
"""
from __future__ import annotations

from scapy.fields import (BitEnumField, BitField, ConditionalField, FieldLenField, FlagsField, IntField,
                          PacketListField, StrFixedLenField, StrLenField)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_layers, split_layers

from netapprox.hostlib import wire
from netapprox.hostlib.control import MSR_MSG_ID


class Q15Field(BitField):
    """A Q1.15 fixed-point fraction (``value / 32768``): shown as ``0x1000 (0.125)``."""

    def i2repr(self, pkt, x):
        if x is None:
            return repr(x)
        return f"0x{x:04x} ({wire.q15_to_tlr(x):g})"

_TYPES = {t.value: t.name for t in wire.PacketType}
_FLAG_NAMES = [wire.Flags(1 << bit).name for bit in range(8)]  # APPROX, RETX, ECE, TAGGED, CE, TRIM, GRANT, TOKEN


def _field(name: str, bits: int):
    default = {
        "version": wire.VERSION,
        "type": int(wire.PacketType.DATA),
        "queue": wire.QUEUE_UNSET,
        "pkt_cnt": 1,
        "deadline_us": wire.NO_DEADLINE,
        "count": None,
    }.get(name, 0)
    if name == "type":
        return BitEnumField(name, default, bits, _TYPES)
    if name == "flags":
        return FlagsField(name, default, bits, _FLAG_NAMES)
    if name == "tlr":
        return Q15Field(name, default, bits)
    return BitField(name, default, bits)


class ATP(Packet):
    name = "ATP"
    fields_desc = [_field(name, bits) for name, bits in wire.HEADER_FIELDS]

    @property
    def tlr_fraction(self) -> float:
        """The TLR as a fraction in [0, 1] (values above 0x8000 are malformed and give more than 1)."""
        return wire.q15_to_tlr(self.tlr)

    def mysummary(self) -> str:
        kind = _TYPES.get(self.type, f"type {self.type}")
        return self.sprintf(f"ATP {kind} job %ATP.job_id% msg %ATP.msg_id% seq %ATP.seq% ") + \
            f"TLR {self.tlr_fraction:g}"

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None or (self.length == 0 and pay):
            pkt = pkt[:30] + len(pay).to_bytes(2, "big")
        if self.count is None:
            if isinstance(self.payload, ATPRecords):
                count = len(self.payload.records)
            else:
                count = 1 if self.type == wire.PacketType.DATA else 0
            pkt = pkt[:29] + bytes([count]) + pkt[30:]
        if isinstance(self.payload, ATPAck):
            added = (wire.Flags.GRANT if self.payload.getfieldval("grant") is not None else 0) | \
                (wire.Flags.TOKEN if self.payload.getfieldval("token") is not None else 0)
            pkt = pkt[:1] + bytes([pkt[1] | added]) + pkt[2:]
        return pkt + pay

    def extract_padding(self, s: bytes):
        return s[: self.length], s[self.length:]

    def guess_payload_class(self, payload: bytes):
        if self.type == wire.PacketType.DATA and self.count is not None and self.count >= 2:
            return ATPRecords
        if self.type == wire.PacketType.DATA and self.msg_id == MSR_MSG_ID and not self.flags & wire.Flags.TRIM:
            return ATPMsrChange
        if self.type in (wire.PacketType.ACK, wire.PacketType.GRANT):
            return ATPAck
        return Raw


# --- DATA payload of a packed packet: records msg_id:u32 | len:u16 | data ------------------------------------


class ATPRecord(Packet):
    """One whole message of a packed DATA packet."""

    name = "ATP packed record"
    fields_desc = [
        IntField("msg_id", 0),
        FieldLenField("len", None, length_of="data", fmt="!H"),
        StrLenField("data", b"", length_from=lambda p: p.len),
    ]

    def extract_padding(self, s: bytes):
        return b"", s


class ATPRecords(Packet):
    """The payload of a DATA packet with ``count >= 2``: its records back to back, filling the payload (bytes
    that do not parse as a record are kept as a trailing ``Raw``, as a receiver would reject them: ``bad_pack``)."""

    name = "ATP packed records"
    fields_desc = [PacketListField("records", [], ATPRecord)]

    def mysummary(self) -> str:
        return "records " + ",".join(str(r.msg_id) for r in self.records if isinstance(r, ATPRecord))


# --- DATA payload of an MSR change (msg_id MSR_MSG_ID): change:u32 | msr:u16 (Q1.15) --------------------------


class ATPMsrChange(Packet):
    """A live MSR change of the header's group: the sender's change number (from 1) and the new MSR (below 1)."""

    name = "ATP MSR change"
    fields_desc = [IntField("change", 1), Q15Field("msr", 0, 16)]

    def mysummary(self) -> str:
        return f"MSR change {self.change}: {wire.q15_to_tlr(self.msr):g}"


# --- ACK and GRANT payload: n:u16, n SACK blocks, then grant:u32 (GRANT flag), token:16 (TOKEN flag) -----------


class ATPSackBlock(Packet):
    """An inclusive range of sequence numbers received."""

    name = "ATP SACK block"
    fields_desc = [IntField("first", 0), IntField("last", 0)]

    def extract_padding(self, s: bytes):
        return b"", s


def _flag_set(flag: int):
    """Whether an ``ATPAck`` carries a field: set when building, or its header's flag says so when dissecting."""
    def present(pkt) -> bool:
        under = pkt.underlayer
        return isinstance(under, ATP) and bool(int(under.flags) & flag)
    return present


class ATPAck(Packet):
    """ACK payload (also a GRANT's: ``n = 0`` and ``grant``). ``grant`` and ``token`` left ``None`` are absent."""

    name = "ATP ACK payload"
    fields_desc = [
        FieldLenField("n", None, count_of="blocks", fmt="!H"),
        PacketListField("blocks", [], ATPSackBlock, count_from=lambda p: p.n),
        ConditionalField(IntField("grant", None),
                         lambda p: p.getfieldval("grant") is not None or _flag_set(wire.Flags.GRANT)(p)),
        ConditionalField(StrFixedLenField("token", None, wire.TOKEN_LEN),
                         lambda p: p.getfieldval("token") is not None or _flag_set(wire.Flags.TOKEN)(p)),
    ]


_bound: list[dict[str, int]] = []


def bind_port(port: int = wire.DEFAULT_ATP_PORT, report_port: int | None = wire.DEFAULT_REPORT_PORT) -> None:
    """Dissect UDP traffic to or from ``port`` (DATA to it; ACK, GRANT, DONE and RETRY from it) and to
    ``report_port`` (REPORT packets to the controller; ``None``: not bound) as ATP. Idempotent; replaces an
    earlier binding."""
    for fields in _bound:
        split_layers(UDP, ATP, **fields)
    _bound.clear()
    wanted = [{"dport": port}, {"sport": port}]
    if report_port is not None:
        wanted.append({"dport": report_port})
    for fields in wanted:
        bind_layers(UDP, ATP, **fields)
        _bound.append(fields)


bind_port()
