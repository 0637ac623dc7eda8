"""Scapy layer for the ATP header (docs/wire-format.md), bound to the ATP UDP port.

    >>> from netapprox.hostlib.scapy_atp import ATP, bind_port
    >>> pkt = IP(dst="10.0.0.2") / UDP(dport=7600) / ATP(type=1, flags=0x01, job_id=7, tlr=0x1000)

Importing this module needs scapy (a dev/test dependency, not a hostlib runtime dependency). Field names and
widths are taken from ``hostlib.wire.HEADER_FIELDS`` so the layer cannot drift from the encoder.
"""
from __future__ import annotations

from scapy.fields import BitEnumField, BitField, FlagsField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers, split_layers

from netapprox.hostlib import wire

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
    return BitField(name, default, bits)


class ATP(Packet):
    name = "ATP"
    fields_desc = [_field(name, bits) for name, bits in wire.HEADER_FIELDS]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None or (self.length == 0 and pay):
            pkt = pkt[:30] + len(pay).to_bytes(2, "big")
        return pkt + pay

    def extract_padding(self, s: bytes):
        return s[: self.length], s[self.length:]


_bound: list[int] = []


def bind_port(port: int = wire.DEFAULT_ATP_PORT) -> None:
    """Dissect UDP traffic to or from ``port`` as ATP (idempotent; replaces an earlier binding)."""
    for old in _bound:
        split_layers(UDP, ATP, dport=old)
        split_layers(UDP, ATP, sport=old)
    _bound.clear()
    bind_layers(UDP, ATP, dport=port)
    bind_layers(UDP, ATP, sport=port)
    _bound.append(port)


bind_port(wire.DEFAULT_ATP_PORT)
