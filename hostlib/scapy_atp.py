"""Scapy layer for the ATP header (docs/wire-format.md), bound to the ATP UDP port and the report port.

    >>> from netapprox.hostlib.scapy_atp import ATP, bind_port
    >>> pkt = IP(dst="10.0.0.2") / UDP(dport=7600) / ATP(type=1, flags=0x01, job_id=7, tlr=0x1000)
    >>> pkt[ATP].show()     # ... tlr = 0x1000 (0.125) ...

The TLR is shown as its Q1.15 value and the fraction it stands for; ``ATP.tlr_fraction`` gives the fraction.

Importing this module needs scapy (a dev/test dependency, not a hostlib runtime dependency). Field names and
widths are taken from ``hostlib.wire.HEADER_FIELDS`` so the layer cannot drift from the encoder.
"""
from __future__ import annotations

from scapy.fields import BitEnumField, BitField, FlagsField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers, split_layers

from netapprox.hostlib import wire


class Q15Field(BitField):
    """A Q1.15 fixed-point fraction (``value / 32768``): shown as ``0x1000 (0.125)``."""

    def i2repr(self, pkt, x):
        if x is None:
            return repr(x)
        return f"0x{x:04x} ({wire.q15_to_tlr(x):g})"

_TYPES = {t.value: t.name for t in wire.PacketType}
_FLAG_NAMES = ["APPROX", "RETX", "ECE", "TAGGED", "CE", "bit5", "bit6", "bit7"]


def _field(name: str, bits: int):
    default = {
        "version": wire.VERSION,
        "type": int(wire.PacketType.DATA),
        "queue": wire.QUEUE_UNSET,
        "pkt_cnt": 1,
        "deadline_us": wire.NO_DEADLINE,
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
        return pkt + pay

    def extract_padding(self, s: bytes):
        return s[: self.length], s[self.length:]


_bound: list[dict[str, int]] = []


def bind_port(port: int = wire.DEFAULT_ATP_PORT, report_port: int | None = wire.DEFAULT_REPORT_PORT) -> None:
    """Dissect UDP traffic to or from ``port`` (DATA to it; ACK and DONE from it) and to ``report_port`` (REPORT
    packets to the controller; ``None``: not bound) as ATP. Idempotent; replaces an earlier binding."""
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
