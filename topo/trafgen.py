"""Paced UDP traffic for tests and the demo's background load: ``python -m netapprox.topo.trafgen send|recv``, and a
TCP bulk flow with a true flow completion time: ``tcp-send|tcp-recv``.

``Pacer`` and ``send_paced`` are the one paced generator of ATP-format DATA: ``send`` here and the experiments'
UDP blast and background traffic (experiments/baselines.py) both send through them.

``send`` emits UDP datagrams at a paced rate (counted on the wire: UDP, IPv4 and Ethernet headers included),
either plain payload or ATP DATA headers (docs/wire-format.md) with a chosen job, TLR (optionally changing
over time), flags and CadentFlow tags, so that a switch classifies them exactly like ATP traffic. It does not react to loss (it is load, not a transport).
``recv`` counts what arrives per (destination port, ATP job), per ATP queue byte and per IPv4 ECN codepoint,
and prints one JSON object.

Both print one JSON line on stdout when done; ``recv`` prints ``{"ready": true}`` first, once bound.
"""
from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import sys
import time
from typing import Iterable, Iterator

from netapprox.hostlib import wire


_stopping = False


def _stop(_signum, _frame) -> None:
    global _stopping
    _stopping = True


def parse_schedule(text: str) -> list[tuple[float, float]]:
    """``"0:0.5,4:0.375"`` -> [(0.0, 0.5), (4.0, 0.375)]: value from that many seconds after the start."""
    out = []
    for part in text.split(","):
        t, v = part.split(":")
        out.append((float(t), float(v)))
    out.sort()
    if not out or out[0][0] != 0.0:
        raise ValueError(f"schedule {text!r} must start at time 0")
    return out


def _at(schedule: list[tuple[float, float]], t: float) -> float:
    value = schedule[0][1]
    for start, v in schedule:
        if t >= start:
            value = v
    return value


WIRE_OVERHEAD = 42
"""Bytes the link adds to a UDP payload: UDP 8, IPv4 20, Ethernet 14."""
CATCH_UP_S = 0.002
"""A paced sender woken late sends what it owes at once, but never more than this much of it."""


class Pacer:
    """Paces datagrams at ``rate_bps``, each counted with ``overhead_bytes`` more (the headers a link adds; 0:
    the rate counts datagrams as they are). ``burst`` datagrams leave back to back per pacing step, followed by
    their share of time or, with ``gap_s``, by that fixed gap. A sender woken late catches up by at most
    ``CATCH_UP_S``. ``rate_bps`` may change between datagrams (a schedule)."""

    def __init__(self, rate_bps: float, *, overhead_bytes: int = 0, burst: int = 1,
                 gap_s: float | None = None) -> None:
        if rate_bps <= 0 and gap_s is None:
            raise ValueError("rate must be positive")
        self.rate_bps = rate_bps
        self.overhead_bytes = overhead_bytes
        self.burst = max(1, burst)
        self.gap_s = gap_s
        self._next = time.monotonic()
        self._in_burst = 0
        self._burst_bytes = 0

    def wait(self) -> None:
        """Sleep until the next datagram may leave."""
        if self._in_burst:
            return
        now = time.monotonic()
        self._next = max(self._next, now - CATCH_UP_S)
        if self._next > now:
            time.sleep(self._next - now)

    def sent(self, nbytes: int) -> None:
        """Account for one datagram of ``nbytes`` (sent or not: pacing is about the sender's schedule)."""
        self._in_burst += 1
        self._burst_bytes += nbytes + self.overhead_bytes
        if self._in_burst < self.burst:
            return
        if self.gap_s is not None:
            self._next = time.monotonic() + self.gap_s
        else:
            self._next += self._burst_bytes * 8 / self.rate_bps
        self._in_burst = self._burst_bytes = 0


def send_paced(sock: socket.socket, dest: tuple[str, int], datagrams: Iterable[bytes], pacer: Pacer, *,
               count: int | None = None) -> dict:
    """Send ``datagrams`` to ``dest`` as ``pacer`` allows, until they end or ``count`` of them were sent: the
    one paced generator of ATP-format DATA (this module's ``send``, the experiments' UDP blast and background).
    A send the kernel refuses (ENOBUFS under overload) is counted as an error and not repeated."""
    sent = nbytes = errors = 0
    for data in datagrams:
        if count is not None and sent >= count:
            break
        pacer.wait()
        try:
            sock.sendto(data, dest)
            sent += 1
            nbytes += len(data)
        except OSError:
            errors += 1
        pacer.sent(len(data))
    return {"sent": sent, "bytes": nbytes, "send_errors": errors}


def send(args: argparse.Namespace) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    if args.sport:
        sock.bind(("0.0.0.0", args.sport))
    if args.tos:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, args.tos)
    rates = parse_schedule(args.rate_mbit) if ":" in str(args.rate_mbit) else [(0.0, float(args.rate_mbit))]
    tlrs = None
    if args.tlr is not None:
        tlrs = parse_schedule(args.tlr) if ":" in args.tlr else [(0.0, float(args.tlr))]
    flags = 0
    if args.approx:
        flags |= wire.Flags.APPROX
    if args.priority is not None or args.deadline_us is not None:
        flags |= wire.Flags.TAGGED
    filler = bytes(max(0, args.size - wire.HEADER_LEN))
    pacer = Pacer(rates[0][1] * 1e6, overhead_bytes=WIRE_OVERHEAD, burst=args.burst,
                  gap_s=args.gap_ms / 1000.0 if args.burst > 1 and args.gap_ms is not None else None)
    start = time.monotonic()

    def datagrams() -> Iterator[bytes]:
        seq = 0
        while not _stopping:
            elapsed = time.monotonic() - start
            if args.duration is not None and elapsed >= args.duration:
                return
            pacer.rate_bps = _at(rates, elapsed) * 1e6
            if args.atp:
                hdr = wire.Header(type=wire.PacketType.DATA, flags=flags, job_id=args.job, msg_id=seq,
                                  tlr=wire.tlr_to_q15(_at(tlrs, elapsed)) if tlrs else 0, priority=args.priority or 0,
                                  deadline_us=args.deadline_us if args.deadline_us is not None else wire.NO_DEADLINE,
                                  seq=seq, queue=args.queue_byte)
                yield wire.encode(hdr, filler)
            else:
                yield seq.to_bytes(4, "big") + bytes(max(0, args.size - 4))
            seq += 1

    out = send_paced(sock, (args.dst, args.dport), datagrams(), pacer, count=args.count)
    return {"sent": out["sent"], "seconds": round(time.monotonic() - start, 4)}


def recv(args: argparse.Namespace) -> dict:
    socks = []
    for port in args.port:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        s.bind(("0.0.0.0", port))
        s.setblocking(False)
        socks.append((port, s))
    print(json.dumps({"ready": True}), flush=True)
    counts: dict[str, int] = {}
    queues: dict[str, int] = {}  # ATP queue byte as received (255: not stamped)
    ecn: dict[str, int] = {}  # IPv4 ECN field as received: 0 Not-ECT, 1/2 ECT, 3 CE
    total = 0
    first = last = None
    start = time.monotonic()
    deadline = start + args.duration
    while not _stopping:
        now = time.monotonic()
        if now >= deadline:
            break
        if args.idle is not None and last is not None and now - last >= args.idle:
            break
        ready, _, _ = select.select([s for _, s in socks], [], [], min(0.05, deadline - now))
        for s in ready:
            port = s.getsockname()[1]
            while True:
                try:
                    data, anc, _flags, _addr = s.recvmsg(65535, socket.CMSG_SPACE(1))
                except BlockingIOError:
                    break
                total += 1
                for level, kind, value in anc:
                    if level == socket.IPPROTO_IP and kind == socket.IP_TOS and value:
                        e = str(value[0] & 3)
                        ecn[e] = ecn.get(e, 0) + 1
                last = time.monotonic()
                first = first or last
                job = 0
                if len(data) >= wire.HEADER_LEN and data[0] >> 4 == wire.VERSION:
                    job = int.from_bytes(data[4:8], "big")
                    q = str(data[2])
                    queues[q] = queues.get(q, 0) + 1
                key = f"{port}/{job}"
                counts[key] = counts.get(key, 0) + 1
    return {"received": total, "by_port_job": counts, "by_queue_byte": queues, "by_ecn": ecn,
            "active_s": round((last - first) if first and last else 0.0, 4)}


def tcp_send(args: argparse.Namespace) -> dict:
    """Send ``--bytes`` over one TCP connection; the flow completes when the receiver confirms it has all of
    them (one byte back after EOF), so ``fct_s`` is the true flow completion time (+ half an RTT)."""
    start = time.monotonic()
    sock = socket.create_connection((args.dst, args.dport), timeout=60)
    chunk = bytes(65536)
    left = args.bytes
    while left > 0 and not _stopping:
        left -= sock.send(chunk[:min(left, len(chunk))])
    sock.shutdown(socket.SHUT_WR)
    confirmed = sock.recv(1) == b"k"
    fct = time.monotonic() - start
    sock.close()
    return {"bytes": args.bytes - max(left, 0), "confirmed": confirmed, "fct_s": round(fct, 4),
            "mbit": round(args.bytes * 8 / fct / 1e6, 3)}


def tcp_recv(args: argparse.Namespace) -> dict:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", args.port[0]))
    srv.listen(1)
    srv.settimeout(0.2)
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.monotonic() + args.duration
    total = 0
    while not _stopping and time.monotonic() < deadline:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                total += len(data)
            conn.sendall(b"k")
        finally:
            conn.close()
        break
    srv.close()
    return {"received_bytes": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m netapprox.topo.trafgen", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send", help="paced UDP sender")
    s.add_argument("--dst", required=True)
    s.add_argument("--dport", type=int, default=wire.DEFAULT_ATP_PORT)
    s.add_argument("--sport", type=int, default=0)
    s.add_argument("--rate-mbit", default="10", help="rate, or a schedule 't:rate,...' (seconds:Mbit/s)")
    s.add_argument("--size", type=int, default=1400, help="UDP payload bytes")
    s.add_argument("--count", type=int, help="stop after this many datagrams")
    s.add_argument("--duration", type=float, help="stop after this many seconds")
    s.add_argument("--burst", type=int, default=1, help="datagrams sent back to back per pacing step")
    s.add_argument("--gap-ms", type=float, help="with --burst: fixed gap between bursts instead of the rate")
    s.add_argument("--atp", action="store_true", help="send ATP DATA headers")
    s.add_argument("--approx", action="store_true", help="set the APPROX flag")
    s.add_argument("--job", type=int, default=1)
    s.add_argument("--tlr", help="TLR, or a schedule 't:tlr,...' (seconds:TLR in [0,1])")
    s.add_argument("--priority", type=int, help="CadentFlow priority tag (sets TAGGED)")
    s.add_argument("--deadline-us", type=int, help="CadentFlow deadline tag (sets TAGGED)")
    s.add_argument("--tos", type=int, default=0)
    s.add_argument("--queue-byte", type=int, default=wire.QUEUE_UNSET,
                   help="ATP queue byte to send (a switch's stamp; default 255 = not set)")
    r = sub.add_parser("recv", help="count received datagrams")
    r.add_argument("--port", type=int, action="append", required=True)
    r.add_argument("--duration", type=float, default=10.0)
    r.add_argument("--idle", type=float, help="stop this many seconds after the last datagram")
    t = sub.add_parser("tcp-send", help="one TCP bulk flow; prints its flow completion time")
    t.add_argument("--dst", required=True)
    t.add_argument("--dport", type=int, default=5201)
    t.add_argument("--bytes", type=int, required=True)
    tr = sub.add_parser("tcp-recv", help="receive one TCP bulk flow and confirm it")
    tr.add_argument("--port", type=int, action="append", default=[])
    tr.add_argument("--duration", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.cmd == "tcp-recv" and not args.port:
        args.port = [5201]
    # SIGINT/SIGTERM end the run early; the JSON result is still printed.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    if args.cmd == "send":
        if args.count is None and args.duration is None:
            ap.error("send needs --count or --duration")
        result = send(args)
    elif args.cmd == "recv":
        result = recv(args)
    elif args.cmd == "tcp-send":
        result = tcp_send(args)
    else:
        result = tcp_recv(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
