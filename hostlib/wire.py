"""ATP wire format: the one Python definition of docs/wire-format.md.

Pure functions over bytes, no I/O. ``HEADER_FIELDS`` lists (name, bit width) in wire order; the P4 header
(p4src/shared/header.p4) and the scapy layer (hostlib/scapy_atp.py) are checked against it by
tests/test_wire_contract.py.
"""
from __future__ import annotations

import array
import dataclasses
import enum
import hmac
import struct
import sys
from typing import NamedTuple, Sequence

VERSION = 2
"""Version 2 (docs/wire-format.md): DATA packets carry ``count`` whole messages (packing), ACKs optional grant and
token fields, the GRANT and NEW_TOKEN types and the TRIM/GRANT/TOKEN flags. Datagrams of any other version are malformed
(``bad_version``): both ends of a job must speak version 2."""
HEADER_LEN = 32
DEFAULT_ATP_PORT = 7600
DEFAULT_REPORT_PORT = 7601
QUEUE_UNSET = 0xFF
NO_DEADLINE = 0xFFFFFFFF
TLR_ONE = 0x8000  # Q1.15 fixed point: 1.0

# (name, bits) in wire order. version and type share the first byte (version in the high nibble).
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", 4),
    ("type", 4),
    ("flags", 8),
    ("queue", 8),
    ("priority", 8),
    ("job_id", 32),
    ("msg_id", 32),
    ("group_id", 16),
    ("tlr", 16),
    ("pkt_idx", 16),
    ("pkt_cnt", 16),
    ("seq", 32),
    ("deadline_us", 32),
    ("weight", 8),
    ("count", 8),
    ("length", 16),
)
_HEADER = struct.Struct("!BBBBIIHHHHIIBBH")


def _byte_offsets() -> dict[str, int]:
    offsets, bit = {}, 0
    for name, bits in HEADER_FIELDS:
        offsets[name] = bit // 8
        bit += bits
    return offsets


OFFSETS: dict[str, int] = _byte_offsets()
"""Byte offset of every header field from the start of the ATP header (``version`` and ``type`` share byte
0). Switch-side code (the reference model, the kernel switch's u32 keys, the simulator) reads fields here."""
assert _HEADER.size == HEADER_LEN == sum(bits for _, bits in HEADER_FIELDS) // 8


class PacketType(enum.IntEnum):
    DATA = 1
    ACK = 2
    REPORT = 3
    DONE = 4
    RETRY = 5
    GRANT = 6
    NEW_TOKEN = 7


class Flags(enum.IntFlag):
    APPROX = 0x01
    RETX = 0x02
    ECE = 0x04
    TAGGED = 0x08
    CE = 0x10
    TRIM = 0x20
    GRANT = 0x40
    TOKEN = 0x80


_VALID_FLAGS = 0xFF
MAX_PACKED = 0xFF
"""Most whole messages one DATA packet carries (the 8-bit ``count`` field)."""
RECORD_HEADER_LEN = 6
"""A packed message's record header: ``msg_id:u32 | len:u16``."""


class MalformedPacket(ValueError):
    """A datagram that is not a well-formed ATP packet. ``reason`` is a short machine-readable tag."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def tlr_to_q15(tlr: float) -> int:
    """Encode a TLR in [0, 1] as Q1.15 (clamped; NaN is an error)."""
    if tlr != tlr:
        raise ValueError("TLR is NaN")
    return int(round(min(1.0, max(0.0, tlr)) * TLR_ONE))


def q15_to_tlr(value: int) -> float:
    return value / TLR_ONE


@dataclasses.dataclass(frozen=True)
class Header:
    """One ATP header. Defaults describe an untagged, non-approximate DATA packet."""

    type: PacketType = PacketType.DATA
    flags: int = 0
    queue: int = QUEUE_UNSET
    priority: int = 0
    job_id: int = 0
    msg_id: int = 0
    group_id: int = 0
    tlr: int = 0
    pkt_idx: int = 0
    pkt_cnt: int = 1
    seq: int = 0
    deadline_us: int = NO_DEADLINE
    weight: int = 0
    count: int = -1
    """DATA: whole messages in the payload (1: one message, or one part of one; >= 2: packed records). Other
    types: 0 on send, ignored on receive. Left out (-1): 1 for DATA, 0 otherwise."""
    length: int = 0
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.count < 0:
            object.__setattr__(self, "count", 1 if self.type == PacketType.DATA else 0)

    @property
    def approx(self) -> bool:
        return bool(self.flags & Flags.APPROX)

    @property
    def tagged(self) -> bool:
        return bool(self.flags & Flags.TAGGED)

    def encode(self) -> bytes:
        return _HEADER.pack(
            (self.version << 4) | int(self.type),
            self.flags,
            self.queue,
            self.priority,
            self.job_id,
            self.msg_id,
            self.group_id,
            self.tlr,
            self.pkt_idx,
            self.pkt_cnt,
            self.seq,
            self.deadline_us,
            self.weight,
            self.count,
            self.length,
        )


def encode(header: Header, payload: bytes = b"") -> bytes:
    """Header plus payload, with ``length`` set from the payload."""
    if len(payload) > 0xFFFF:
        raise ValueError(f"payload of {len(payload)} bytes does not fit the 16-bit length field")
    return dataclasses.replace(header, length=len(payload)).encode() + payload


def decode(data: bytes) -> tuple[Header, bytes]:
    """Parse one datagram into (header, payload). Raises MalformedPacket for anything off-spec."""
    if len(data) < HEADER_LEN:
        raise MalformedPacket("truncated", f"{len(data)} bytes, header needs {HEADER_LEN}")
    (vt, flags, queue, prio, job, msg, group, tlr, idx, cnt, seq, deadline, weight, count,
     length) = _HEADER.unpack_from(data)
    version, ptype = vt >> 4, vt & 0x0F
    if version != VERSION:
        raise MalformedPacket("bad_version", f"version {version}, expected {VERSION}")
    try:
        ptype = PacketType(ptype)
    except ValueError:
        raise MalformedPacket("bad_type", f"packet type {ptype}") from None
    if flags & ~_VALID_FLAGS:
        raise MalformedPacket("bad_flags", f"flags 0x{flags:02x}")
    if tlr > TLR_ONE:
        raise MalformedPacket("bad_tlr", f"tlr 0x{tlr:04x} above 1.0")
    if cnt == 0 or idx >= cnt:
        raise MalformedPacket("bad_index", f"packet index {idx} of {cnt}")
    if ptype == PacketType.DATA and (count == 0 or (count > 1 and (idx, cnt) != (0, 1))):
        raise MalformedPacket("bad_count", f"DATA packet of {count} messages, packet {idx} of {cnt}")
    if len(data) < HEADER_LEN + length:
        raise MalformedPacket("truncated", f"payload {len(data) - HEADER_LEN} bytes, header says {length}")
    header = Header(type=ptype, flags=flags, queue=queue, priority=prio, job_id=job, msg_id=msg,
                    group_id=group, tlr=tlr, pkt_idx=idx, pkt_cnt=cnt, seq=seq, deadline_us=deadline,
                    weight=weight, count=count, length=length, version=version)
    return header, bytes(data[HEADER_LEN:HEADER_LEN + length])


# --- REPORT ---------------------------------------------------------------------------------------

_REPORT = struct.Struct("!HHIIIII")
REPORT_PAYLOAD_LEN = _REPORT.size  # 24
REPORT_MAC_LEN = 16
_HEADER_AND_REPORT = struct.Struct(_HEADER.format + _REPORT.format[1:])
_REPORT_BYTE0 = (VERSION << 4) | PacketType.REPORT
_REPORT_PLAIN, _REPORT_SIGNED = REPORT_PAYLOAD_LEN, REPORT_PAYLOAD_LEN + REPORT_MAC_LEN
_MAC_HEADER_END = OFFSETS["count"]
"""The MAC covers the header from ``job_id`` up to here (``weight``), then a zero byte for ``count`` (0 on a
REPORT)."""


class Report(NamedTuple):
    """One per-epoch sender report (job, group) for the controller: the one record of a REPORT, from the
    sender's core (``events.ReportReady``) to the controller's policy. A tuple, so that the controller makes one
    per datagram at line rate (and its C receive helper, controller/_reportrx.c, builds them directly)."""

    job_id: int
    group_id: int
    seq: int
    tlr: float
    loss: float
    msr: float
    rate_kbps: int
    total: int
    delivered: int
    lost: int
    epoch: int

    def encode(self, key: bytes | None = None) -> bytes:
        body = _REPORT.pack(tlr_to_q15(self.loss), tlr_to_q15(self.msr), self.rate_kbps, self.total,
                            self.delivered, self.lost, self.epoch)
        header = Header(type=PacketType.REPORT, job_id=self.job_id, group_id=self.group_id,
                        tlr=tlr_to_q15(self.tlr), seq=self.seq)
        if key is not None:
            body += _report_mac(key, header.encode(), body)
        return encode(header, body)

    @classmethod
    def decode(cls, data: bytes, key: bytes | None = None) -> "Report":
        """Parse a REPORT datagram. With ``key``, the HMAC must be present and correct. Raises MalformedPacket
        (``decode``'s reasons, then ``not_report``, ``bad_report``, ``bad_mac``).

        A well-formed report takes one ``struct`` unpack and, with a key, one HMAC (the controller's line rate);
        anything else is classified field by field (``_report_error``) so that the reason is exact."""
        if len(data) >= HEADER_LEN + REPORT_PAYLOAD_LEN:
            (byte0, flags, _queue, _prio, job, _msg, group, tlr, idx, cnt, seq, _deadline, _weight, _count,
             length, loss, msr, rate, total, delivered, lost, epoch) = _HEADER_AND_REPORT.unpack_from(data)
            if (byte0 == _REPORT_BYTE0 and not flags & ~_VALID_FLAGS and tlr <= TLR_ONE and idx < cnt
                    and loss <= TLR_ONE and msr <= TLR_ONE and len(data) >= HEADER_LEN + length
                    and (length == _REPORT_SIGNED or (key is None and length == _REPORT_PLAIN))
                    and (key is None or hmac.compare_digest(data[HEADER_LEN + REPORT_PAYLOAD_LEN:HEADER_LEN + length],
                                                            _report_mac(key, data, data[HEADER_LEN:])))):
                return cls(job, group, seq, tlr / TLR_ONE, loss / TLR_ONE, msr / TLR_ONE, rate, total, delivered,
                           lost, epoch)
        raise _report_error(data, key)


def _report_mac(key: bytes, header: bytes, body: bytes) -> bytes:
    """HMAC-SHA256 (first 16 bytes) over the header from job_id to weight, a zero byte for ``count``, and the
    24-byte body: neither the queue byte a switch rewrites nor the length (which differs with and without the
    MAC) is covered. ``header`` and ``body`` may run on (a whole datagram and its payload)."""
    return hmac.digest(key, header[OFFSETS["job_id"]:_MAC_HEADER_END] + b"\x00" + body[:REPORT_PAYLOAD_LEN],
                       "sha256")[:REPORT_MAC_LEN]


def _report_error(data: bytes, key: bytes | None) -> MalformedPacket:
    """Why ``Report.decode`` refused ``data``, checked in the order of docs/wire-format.md: the header
    (``decode``), the type, the payload length, the MAC, the values."""
    try:
        header, payload = decode(data)
    except MalformedPacket as err:
        return err
    if header.type != PacketType.REPORT:
        return MalformedPacket("not_report", f"packet type {header.type.name}")
    if len(payload) not in (_REPORT_PLAIN, _REPORT_SIGNED):
        return MalformedPacket("bad_report", f"report payload of {len(payload)} bytes")
    if key is not None and (len(payload) != _REPORT_SIGNED or not hmac.compare_digest(
            payload[REPORT_PAYLOAD_LEN:], _report_mac(key, data, payload))):
        return MalformedPacket("bad_mac", "report HMAC missing or wrong")
    loss, msr = struct.unpack_from("!HH", payload)
    if loss > TLR_ONE or msr > TLR_ONE:
        return MalformedPacket("bad_report", "loss or MSR above 1.0")
    return MalformedPacket("bad_report", "not a report")  # not reached: Report.decode accepts the rest


# --- ACK payload: selective-ack blocks ------------------------------------------------------------

MAX_SACK_BLOCKS = 16
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_SACK_BLOCK = struct.Struct("!II")
SACK_BLOCK_LEN = _SACK_BLOCK.size
ACK_BASE_LEN = HEADER_LEN + 2
"""An ACK without SACK blocks; each block adds ``SACK_BLOCK_LEN``."""


def encode_ack_payload(blocks: "list[tuple[int, int]] | tuple[tuple[int, int], ...]") -> bytes:
    """ACK payload: ``n:u16`` then ``n`` inclusive ``(first, last)`` sequence ranges, newest first (<= 16)."""
    if len(blocks) > MAX_SACK_BLOCKS:
        raise ValueError(f"{len(blocks)} SACK blocks, at most {MAX_SACK_BLOCKS} fit an ACK")
    out = [_U16.pack(len(blocks))]
    for first, last in blocks:
        if not 0 <= first <= last <= 0xFFFFFFFF:
            raise ValueError(f"bad SACK block ({first}, {last})")
        out.append(_SACK_BLOCK.pack(first, last))
    return b"".join(out)


def encode_ack(*, flags: int, queue: int, job_id: int, msg_id: int, group_id: int, pkt_idx: int, pkt_cnt: int,
               seq: int, blocks: "list[tuple[int, int]]", grant: int | None = None, token: bytes | None = None,
               ptype: int = PacketType.ACK) -> bytes:
    """An ACK: same bytes as ``encode(Header(type=ACK, ...), payload)`` without building a Header (the receiver's
    per-packet path). ``grant`` (a sequence number: the sender may send data below it) adds the ``GRANT`` flag and
    field, ``token`` (an admission token, to an unvalidated job) the ``TOKEN`` flag and field. ``ptype`` GRANT:
    the same layout as a GRANT packet (no blocks needed, ``grant`` required)."""
    payload = encode_ack_payload(blocks)
    if grant is not None:
        flags |= Flags.GRANT
        payload += _U32.pack(grant & 0xFFFFFFFF)
    if token is not None:
        if len(token) != TOKEN_LEN:
            raise ValueError(f"an admission token is {TOKEN_LEN} bytes, got {len(token)}")
        flags |= Flags.TOKEN
        payload += token
    return _HEADER.pack((VERSION << 4) | ptype, flags, queue, 0, job_id, msg_id, group_id, 0, pkt_idx,
                        pkt_cnt, seq, NO_DEADLINE, 0, 0, len(payload)) + payload


def decode_ack(payload: bytes, flags: int) -> "tuple[list[tuple[int, int]], int | None, bytes | None]":
    """An ACK's or GRANT's payload: ``(blocks, grant, token)``; ``grant``/``token`` are ``None`` unless the
    ``GRANT``/``TOKEN`` flag says the field is there. Raises MalformedPacket ``bad_ack``."""
    tail = (4 if flags & Flags.GRANT else 0) + (TOKEN_LEN if flags & Flags.TOKEN else 0)
    if len(payload) < tail:
        raise MalformedPacket("bad_ack", f"ACK payload of {len(payload)} bytes, its flags need {tail}")
    end = len(payload) - tail
    blocks = decode_ack_payload(payload[:end])
    grant = token = None
    if flags & Flags.GRANT:
        (grant,) = _U32.unpack_from(payload, end)
        end += 4
    if flags & Flags.TOKEN:
        token = bytes(payload[end:end + TOKEN_LEN])
        if token == NO_TOKEN:
            raise MalformedPacket("bad_ack", "an all-zero admission token")
    return blocks, grant, token


def decode_ack_payload(payload: bytes) -> list[tuple[int, int]]:
    """Inverse of :func:`encode_ack_payload`. An empty payload means no blocks."""
    if not payload:
        return []
    if len(payload) < 2:
        raise MalformedPacket("bad_ack", "ACK payload shorter than its block count")
    (n,) = _U16.unpack_from(payload)
    if n > MAX_SACK_BLOCKS or len(payload) != 2 + 8 * n:
        raise MalformedPacket("bad_ack", f"{n} SACK blocks in {len(payload)} payload bytes")
    blocks = [_SACK_BLOCK.unpack_from(payload, 2 + 8 * i) for i in range(n)]
    for first, last in blocks:
        if first > last:
            raise MalformedPacket("bad_ack", f"SACK block ({first}, {last}) runs backwards")
    return blocks


# --- RETRY payload: the admission token -----------------------------------------------------------

TOKEN_LEN = 16
NO_TOKEN = bytes(TOKEN_LEN)
"""The all-zero token field of an announce part: the sender holds no token yet."""


def encode_retry(announce: Header, token: bytes) -> bytes:
    """The RETRY answering one announce part: its coordinates and ``seq`` echoed, the token as payload."""
    if len(token) != TOKEN_LEN:
        raise ValueError(f"an admission token is {TOKEN_LEN} bytes, got {len(token)}")
    return _HEADER.pack((VERSION << 4) | PacketType.RETRY, 0, QUEUE_UNSET, 0, announce.job_id, announce.msg_id, 0, 0,
                        announce.pkt_idx, announce.pkt_cnt, announce.seq, NO_DEADLINE, 0, 0, TOKEN_LEN) + token


def decode_retry_payload(payload: bytes) -> bytes:
    """The token a RETRY carries (exactly ``TOKEN_LEN`` bytes, not all zero)."""
    if len(payload) != TOKEN_LEN or payload == NO_TOKEN:
        raise MalformedPacket("bad_retry", f"RETRY payload of {len(payload)} bytes, expected a {TOKEN_LEN}-byte token")
    return bytes(payload)


# --- NEW_TOKEN payload: an address-validation token for the sender's next jobs (QUIC's NEW_TOKEN) ----------

def encode_new_token(announce: Header, token: bytes) -> bytes:
    """The NEW_TOKEN answering the announce part that validated a job: its coordinates and ``seq`` echoed, the
    address-validation token as payload (48 bytes, as a RETRY)."""
    if len(token) != TOKEN_LEN:
        raise ValueError(f"an address-validation token is {TOKEN_LEN} bytes, got {len(token)}")
    return _HEADER.pack((VERSION << 4) | PacketType.NEW_TOKEN, 0, QUEUE_UNSET, 0, announce.job_id, announce.msg_id, 0,
                        0, announce.pkt_idx, announce.pkt_cnt, announce.seq, NO_DEADLINE, 0, 0, TOKEN_LEN) + token


def decode_new_token_payload(payload: bytes) -> bytes:
    """The token a NEW_TOKEN carries (exactly ``TOKEN_LEN`` bytes, not all zero)."""
    if len(payload) != TOKEN_LEN or payload == NO_TOKEN:
        raise MalformedPacket("bad_new_token",
                              f"NEW_TOKEN payload of {len(payload)} bytes, expected a {TOKEN_LEN}-byte token")
    return bytes(payload)


# --- DONE payload: lost message ids, as ranges ---------------------------------------------------
# A DONE part is ``n:u32`` then ``n`` ranges ``first:u32, end:u32`` (ids ``first .. end-1``), ascending and
# disjoint within the part and across parts in ``pkt_idx`` order. Ranges, not ids: a DONE costs O(gaps), and
# a job has at most one gap more than the messages it delivered, so a DONE is never larger than what its sender
# sent, whatever N the job declared.

_RANGE = struct.Struct("!II")


def done_ranges_per_part(max_payload: int) -> int:
    """How many lost-id ranges one DONE part carries within ``max_payload`` bytes."""
    n = (max_payload - 4) // 8
    if n < 1:
        raise ValueError(f"max_payload {max_payload} cannot carry a DONE part")
    return n


def encode_done_payloads(lost_ranges: "Sequence[int]", max_payload: int) -> list[bytes]:
    """Split lost-id ranges, given flat as ``first0, end0, first1, end1, ...`` (an ``array('I')`` is taken as
    is), into DONE payloads; at least one part, at most 65535. Linear, at C speed."""
    per = done_ranges_per_part(max_payload)
    flat = array.array("I", lost_ranges)
    n = len(flat) // 2
    if len(flat) % 2:
        raise ValueError("lost ranges must be given as first, end pairs")
    if n > per * 0xFFFF:
        raise ValueError(f"{n} lost ranges need more than 65535 DONE parts")
    if sys.byteorder == "little":
        flat.byteswap()
    raw = flat.tobytes()
    return [_U32.pack(min(per, n - i)) + raw[8 * i:8 * (i + per)] for i in range(0, max(1, n), per)]


def encode_done(*, job_id: int, seq: int, pkt_idx: int, pkt_cnt: int, payload: bytes) -> bytes:
    """A DONE part: same bytes as ``encode(Header(type=DONE, ...), payload)``, without building a Header."""
    return _HEADER.pack((VERSION << 4) | PacketType.DONE, 0, QUEUE_UNSET, 0, job_id, 0, 0, 0, pkt_idx, pkt_cnt, seq,
                        NO_DEADLINE, 0, 0, len(payload)) + payload


def id_ranges(ids: "Sequence[int]") -> array.array:
    """Ascending, distinct ids as flat ``first, end`` ranges (what ``encode_done_payloads`` takes)."""
    out = array.array("I")
    for i in ids:
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out.extend((i, i + 1))
    return out


def range_ids(ranges: "Sequence[tuple[int, int]]") -> list[int]:
    """The ids of ``(first, end)`` ranges, ascending (as long as the ranges are: mind a range's size)."""
    return [i for first, end in ranges for i in range(first, end)]


def decode_done_payload(payload: bytes) -> list[tuple[int, int]]:
    """Lost-id ranges ``(first, end)`` of one DONE part: non-empty, ascending, disjoint."""
    if len(payload) < 4:
        raise MalformedPacket("bad_done", f"DONE payload of {len(payload)} bytes")
    (n,) = _U32.unpack_from(payload)
    if len(payload) != 4 + 8 * n:
        raise MalformedPacket("bad_done", f"DONE says {n} ranges in {len(payload)} payload bytes")
    ranges = list(_RANGE.iter_unpack(memoryview(payload)[4:]))
    prev_end = 0
    for first, end in ranges:
        if not prev_end <= first < end:
            raise MalformedPacket("bad_done", f"DONE range [{first}, {end}) is empty or out of order")
        prev_end = end
    return ranges


# --- DATA payload for float vectors (bounded-loss mode) -------------------------------------------

FLOAT_RANGE_HEADER_LEN = 8


def floats_per_packet(max_payload: int) -> int:
    """Whole float32 values that fit one DATA payload after the 8-byte range header."""
    return max(0, (max_payload - FLOAT_RANGE_HEADER_LEN) // 4)


def encode_float_range(first_index: int, values) -> bytes:
    """``first_index:u32, count:u32`` followed by ``count`` big-endian float32 values."""
    values = list(values)
    if not 0 <= first_index <= 0xFFFFFFFF or first_index + len(values) > 0xFFFFFFFF + 1:
        raise ValueError(f"float range starting at {first_index} with {len(values)} values exceeds u32")
    return struct.pack(f"!II{len(values)}f", first_index, len(values), *values)


def decode_float_range(payload: bytes) -> tuple[int, tuple[float, ...]]:
    """Inverse of :func:`encode_float_range`: (first_index, values)."""
    if len(payload) < FLOAT_RANGE_HEADER_LEN:
        raise MalformedPacket("bad_floats", f"float payload of {len(payload)} bytes, range header needs 8")
    first, count = struct.unpack_from("!II", payload)
    if len(payload) != FLOAT_RANGE_HEADER_LEN + 4 * count:
        raise MalformedPacket("bad_floats", f"range says {count} floats in {len(payload) - 8} bytes")
    return first, struct.unpack_from(f"!{count}f", payload, FLOAT_RANGE_HEADER_LEN)


def encode_data(*, flags: int, priority: int, job_id: int, msg_id: int, group_id: int, tlr: int, pkt_idx: int,
                pkt_cnt: int, seq: int, deadline_us: int, weight: int, payload: bytes,
                queue: int = QUEUE_UNSET, count: int = 1) -> bytes:
    """A DATA packet, same bytes as ``encode(Header(type=DATA, ...), payload)`` without building a Header
    (the sender's per-packet fast path)."""
    return _HEADER.pack((VERSION << 4) | PacketType.DATA, flags, queue, priority, job_id, msg_id, group_id, tlr,
                        pkt_idx, pkt_cnt, seq, deadline_us, weight, count, len(payload)) + payload


# --- DATA payload of a packed packet: several whole messages -----------------------------------------

_RECORD = struct.Struct("!IH")


def encode_records(messages: "Sequence[tuple[int, bytes]]") -> bytes:
    """The payload of a packed DATA packet: ``msg_id:u32 | len:u16 | data`` per message, in order."""
    return b"".join(_RECORD.pack(msg_id, len(data)) + bytes(data) for msg_id, data in messages)


def decode_records(payload: bytes, header: Header) -> list[tuple[int, bytes]]:
    """``[(msg_id, data)]`` of a packed DATA packet (``header.count >= 2``): exactly ``count`` records filling the
    payload, the first one the header's ``msg_id``, no id twice. Raises MalformedPacket ``bad_pack``."""
    out: list[tuple[int, bytes]] = []
    off, n, end = 0, header.count, len(payload)
    while off < end:
        if off + RECORD_HEADER_LEN > end:
            raise MalformedPacket("bad_pack", f"record header cut at byte {off} of {end}")
        msg_id, size = _RECORD.unpack_from(payload, off)
        off += RECORD_HEADER_LEN
        if off + size > end:
            raise MalformedPacket("bad_pack", f"record of message {msg_id} ({size} bytes) past the payload")
        out.append((msg_id, bytes(payload[off:off + size])))
        off += size
    if len(out) != n or out[0][0] != header.msg_id:
        raise MalformedPacket("bad_pack", f"{len(out)} records, count says {n}; first {out[0][0] if out else None}, "
                                          f"header msg_id {header.msg_id}")
    if len({m for m, _ in out}) != n:
        raise MalformedPacket("bad_pack", "a message twice in one packet")
    return out
