"""Host report intake, sans-I/O: bytes in (from the UDP socket or a packet-in), validated ``Report`` out.

A report is dropped (and counted under a reason) when it is malformed (any ``hostlib.wire.MalformedPacket``
reason: ``truncated``, ``bad_version``, ``bad_tlr``, ``not_report``, ``bad_report``, ``bad_mac`` ...),
names job 0 (``bad_job``), does not move its (job, group) sequence number forward (``stale_seq``), or comes
from a host that exceeded its token bucket (``rate_limited``). Nothing here raises on bad input.

``receive_batch`` drains the report socket in batches: with the C helper ``controller/_reportrx.c`` (built by
``pip install``; ``NATIVE`` says whether it is) one ``recvmmsg`` call takes up to ``RECV_BATCH`` datagrams and
decodes and HMAC-checks the well-formed REPORTs in C; without it, a ``recvfrom`` loop hands the bytes to
``decode_report``. Both give the same reports and the same drop reasons (tests/controller/test_ctl_reportrx.py).
"""
from __future__ import annotations

import collections
import hmac
import struct
from typing import NamedTuple

from netapprox.controller.config import ReportConfig
from netapprox.hostlib.wire import (
    HEADER_LEN,
    REPORT_MAC_LEN,
    REPORT_PAYLOAD_LEN,
    TLR_ONE,
    VERSION,
    Flags,
    MalformedPacket,
    PacketType,
    Report,
)

try:
    from netapprox.controller import _reportrx as _native
except ImportError:  # not built (no compiler at install time): the pure-Python loop in receive_batch
    _native = None

MAX_HOSTS = 4096
MAX_DATAGRAM = 2048
RECV_BATCH = 64
"""Datagrams taken from the report socket per ``receive_batch`` call."""
NATIVE = _native is not None
"""True when the C helper is built and ``receive_batch`` uses it."""


class ReportFields(NamedTuple):
    """A validated REPORT: the fields of ``hostlib.wire.Report`` as a tuple (cheap to build at line rate)."""

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


_HEADER_AND_REPORT = struct.Struct("!BBBBIIHHHHIIBBH" + "HHIIIII")
_REPORT_BYTE0 = (VERSION << 4) | int(PacketType.REPORT)
_VALID_FLAGS = int(sum(Flags))
_MAC_END = HEADER_LEN + REPORT_PAYLOAD_LEN + REPORT_MAC_LEN
_PLAIN, _SIGNED = REPORT_PAYLOAD_LEN, REPORT_PAYLOAD_LEN + REPORT_MAC_LEN


def decode_report(data: bytes, key: bytes | None = None) -> ReportFields:
    """``hostlib.wire.Report.decode`` at line rate: one ``struct`` unpack and a one-shot HMAC for well-formed
    reports; anything else goes through ``Report.decode`` so that the error (a ``MalformedPacket`` reason) is
    exactly the wire module's. tests/controller/test_ctl_reports.py checks the two agree on random input."""
    if len(data) >= HEADER_LEN + REPORT_PAYLOAD_LEN:
        (byte0, flags, _queue, _prio, job, _msg, group, tlr, idx, cnt, seq, _deadline, _weight, _reserved, length,
         loss, msr, rate, total, delivered, lost, epoch) = _HEADER_AND_REPORT.unpack_from(data)
        if (byte0 == _REPORT_BYTE0 and not flags & ~_VALID_FLAGS and tlr <= TLR_ONE and idx < cnt
                and loss <= TLR_ONE and msr <= TLR_ONE and len(data) >= HEADER_LEN + length
                and (length == _PLAIN or length == _SIGNED)):
            if key is not None:
                # Header bytes from job_id to weight, the reserved byte as zero (the wire module re-encodes the
                # header, which does not carry it), then the body.
                mac = hmac.digest(key, data[4:HEADER_LEN - 3] + b"\x00" + data[HEADER_LEN:HEADER_LEN + REPORT_PAYLOAD_LEN],
                                  "sha256")[:REPORT_MAC_LEN]
                if length != _SIGNED or not hmac.compare_digest(data[HEADER_LEN + REPORT_PAYLOAD_LEN:_MAC_END], mac):
                    raise MalformedPacket("bad_mac", "report HMAC missing or wrong")
            return ReportFields(job, group, seq, tlr / TLR_ONE, loss / TLR_ONE, msr / TLR_ONE, rate, total,
                                delivered, lost, epoch)
    r = Report.decode(data, key=key)  # raises the exact MalformedPacket (or accepts what the fast path did not)
    return ReportFields(r.job_id, r.group_id, r.seq, r.tlr, r.loss, r.msr, r.rate_kbps, r.total, r.delivered,
                        r.lost, r.epoch)


class ReportIngest:
    """Validates reports. ``accepted`` and ``dropped`` (reason -> count) are cumulative."""

    def __init__(self, config: ReportConfig) -> None:
        self.config = config
        self.accepted = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._last_seq: dict[tuple[int, int], int] = {}
        self._buckets: dict[str, list[float]] = {}  # host -> [tokens, stamp] (a list: updated at line rate)

    def receive(self, data: bytes | ReportFields, host: str, now: float) -> ReportFields | None:
        """Validate one REPORT datagram from ``host`` (an address; the rate-limit key). None if dropped. ``data``
        may also be a report ``receive_batch`` decoded already (its header, payload and HMAC checked in C): the
        rest of the checks (rate, job, sequence) apply to it as to bytes."""
        if not self._take_token(host, now):
            self.dropped["rate_limited"] += 1
            return None
        if type(data) is ReportFields:
            report = data
        else:
            try:
                report = decode_report(data, key=self.config.key)
            except MalformedPacket as e:
                self.dropped[e.reason] += 1
                return None
            except Exception:  # noqa: BLE001 - a report must never take the loop down
                self.dropped["undecodable"] += 1
                return None
        if report.job_id == 0:
            self.dropped["bad_job"] += 1
            return None
        if not (0.0 <= report.tlr <= 1.0 and 0.0 <= report.loss <= 1.0):
            self.dropped["bad_tlr"] += 1
            return None
        key = (report.job_id, report.group_id)
        last = self._last_seq.get(key)
        if last is not None and report.seq <= last:
            self.dropped["stale_seq"] += 1
            return None
        self._last_seq[key] = report.seq
        self.accepted += 1
        return report

    def forget_job(self, job_id: int) -> None:
        """Forget an expired job's sequence numbers, so a restarted sender (seq from 0 again) is accepted."""
        for key in [k for k in self._last_seq if k[0] == job_id]:
            del self._last_seq[key]

    def forget_group(self, job_id: int, group_id: int) -> None:
        self._last_seq.pop((job_id, group_id), None)

    def _take_token(self, host: str, now: float) -> bool:
        bucket = self._buckets.get(host)
        if bucket is None:
            if len(self._buckets) >= MAX_HOSTS:
                self._prune(now)
            bucket = self._buckets[host] = [float(self.config.burst), now]
        tokens, stamp = bucket
        if now > stamp:
            tokens += (now - stamp) * self.config.rate_per_host
            if tokens > self.config.burst:
                tokens = float(self.config.burst)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            return False
        bucket[0] = tokens - 1.0
        return True

    def _prune(self, now: float) -> None:
        full = [h for h, (tokens, stamp) in self._buckets.items()
                if tokens + (now - stamp) * self.config.rate_per_host >= self.config.burst]
        for h in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[h]


def receive_batch(sock, key: bytes | None, max_batch: int = RECV_BATCH,
                  native: bool = NATIVE) -> list[tuple[str, ReportFields | bytes]]:
    """Up to ``max_batch`` datagrams waiting on the non-blocking UDP socket ``sock``, as (source address,
    item): ``item`` is the decoded report when the C helper accepted it (header, payload and, with ``key``, the
    HMAC checked exactly as ``decode_report`` checks them), else the datagram's bytes, for
    ``ReportIngest.receive`` to decode and classify. Empty when nothing is waiting. ``native=False`` forces the
    pure-Python loop (the fallback when the helper is not built). Raises OSError on socket errors."""
    if native and _native is not None:
        return _native.recv_reports(sock.fileno(), max_batch, key, ReportFields)
    out: list[tuple[str, ReportFields | bytes]] = []
    for _ in range(max_batch):
        try:
            data, addr = sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            break
        out.append((addr[0], data))
    return out


def udp_payload_from_frame(frame: bytes) -> tuple[bytes, str] | None:
    """(UDP payload, IPv4 source) of an Ethernet/IPv4/UDP frame (one optional 802.1Q tag), else None.
    Used on packet-in frames."""
    try:
        off = 12
        (ethertype,) = struct.unpack_from("!H", frame, off)
        off += 2
        if ethertype == 0x8100:
            (ethertype,) = struct.unpack_from("!H", frame, off + 2)
            off += 4
        if ethertype != 0x0800 or frame[off] >> 4 != 4:
            return None
        ihl = (frame[off] & 0x0F) * 4
        total_len = struct.unpack_from("!H", frame, off + 2)[0]
        if frame[off + 9] != 17 or ihl < 20:
            return None
        src = ".".join(str(b) for b in frame[off + 12:off + 16])
        udp = off + ihl
        udp_len = struct.unpack_from("!H", frame, udp + 4)[0]
        end = min(len(frame), off + total_len, udp + udp_len)
        if end < udp + 8:
            return None
        return bytes(frame[udp + 8:end]), src
    except (struct.error, IndexError):
        return None
