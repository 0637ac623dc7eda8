"""Host report intake, sans-I/O: bytes in (from the UDP socket or a packet-in), a validated ``hostlib.wire.Report``
out.

A report is dropped (and counted under a reason) when it is malformed (any ``hostlib.wire.MalformedPacket``
reason: ``truncated``, ``bad_version``, ``bad_tlr``, ``not_report``, ``bad_report``, ``bad_mac`` ...),
names job 0 (``bad_job``), does not move its (job, group) sequence number forward (``stale_seq``), or comes
from a host that exceeded its token bucket (``rate_limited``). The checks run in that order: a host's bucket
is charged only for reports that passed every other one (with a key: authenticated, and new), so forged or
replayed reports from a spoofed source address cost a counter increment and never spend the budget of the
host they name, nor create or evict any per-host state. Nothing here raises on bad input.

``receive_batch`` drains the report socket in batches: with the C helper ``controller/_reportrx.c`` (built by
``pip install``; ``NATIVE`` says whether it is) one ``recvmmsg`` call takes up to ``RECV_BATCH`` datagrams and
decodes and HMAC-checks them in C; without it, a ``recvfrom`` loop hands each datagram to ``Report.decode``.
Both give the same list: each datagram's report, or the reason it is malformed
(tests/controller/test_ctl_reportrx.py).
"""
from __future__ import annotations

import collections
import struct

from netapprox.controller.config import ReportConfig
from netapprox.hostlib.wire import MalformedPacket, Report

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


class ReportIngest:
    """Validates reports. ``accepted`` and ``dropped`` (reason -> count) are cumulative."""

    def __init__(self, config: ReportConfig) -> None:
        self.config = config
        self.accepted = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._last_seq: dict[tuple[int, int], int] = {}
        self._buckets: dict[str, list[float]] = {}  # host -> [tokens, stamp] (a list: updated at line rate)

    def receive(self, data: bytes | Report | str, host: str, now: float) -> Report | None:
        """Validate one REPORT datagram from ``host`` (an address; the rate-limit key). None if dropped. ``data``
        may also be what ``receive_batch`` made of a datagram: its ``Report`` (header, payload and HMAC checked),
        or the reason it is malformed (counted here); the rest of the checks apply as to bytes."""
        if type(data) is Report:
            report = data
        elif type(data) is str:
            self.dropped[data] += 1
            return None
        else:
            try:
                report = Report.decode(data, key=self.config.key)
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
        if not self._take_token(host, now):
            self.dropped["rate_limited"] += 1
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
                  native: bool = NATIVE) -> list[tuple[str, Report | str]]:
    """Up to ``max_batch`` datagrams waiting on the non-blocking UDP socket ``sock``, as (source address,
    item): ``item`` is the datagram's ``Report`` (with ``key``, its HMAC checked) or, when it is not a
    well-formed REPORT, the ``MalformedPacket`` reason (``ReportIngest.receive`` takes either). Empty when
    nothing is waiting. ``native=False`` forces the pure-Python loop (the fallback when the helper is not
    built). Raises OSError on socket errors."""
    if native and _native is not None:
        return _native.recv_reports(sock.fileno(), max_batch, key, Report)
    out: list[tuple[str, Report | str]] = []
    for _ in range(max_batch):
        try:
            data, addr = sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            break
        try:
            item: Report | str = Report.decode(data, key)
        except MalformedPacket as e:
            item = e.reason
        out.append((addr[0], item))
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
