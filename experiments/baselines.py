"""Baseline transports the experiments compare ATP against, as small programs run on emulated hosts.

- **TCP-ES** (EarlySend): send every message over kernel TCP as soon as it is ready; the receiver
  counts complete messages and, once it has ceil(MSR * N), writes one byte back; the sender stops
  at that byte and aborts the connection (unsent data is discarded, as an application that stops
  early would). JCT: sender start -> stop byte.
- **TCP-SS** (SampleSend): the sender samples exactly ceil(MSR * N) messages uniformly (seeded) and
  sends only those, as they become ready; the receiver answers when it has all of them.
- **UDP blast**: every message, cut into packets of at most ``--mtu`` payload bytes carrying an ATP
  DATA header (docs/wire-format.md), paced at ``--rate`` bit/s. Non-approximate by default (switch
  queue 0); with ``--tlr X`` the packets carry ``APPROX`` and TLR X, so a NetApprox switch queues
  them by TLR exactly like ATP traffic of that TLR. That makes the same program the experiments'
  controlled background traffic. The receiver reports packet and message loss.

TCP uses DCTCP when the kernel offers it (``/proc/sys/net/ipv4/tcp_available_congestion_control``),
otherwise CUBIC; every summary records which one it used.

Every program writes a JSON summary (``--json FILE``, or stdout). Times ``*_wall`` are
``time.time()`` values: all emulated hosts share one kernel clock, so the harness can subtract a
sender's start from a receiver's completion time.

CLI: ``python -m netapprox.experiments.baselines {tcp-send,tcp-recv,udp-send,udp-recv} --help``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import selectors
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from netapprox.hostlib import wire
from netapprox.experiments.hostprog import (StartFile, add_start_after, add_start_at, address, emit_summary,
                                            mark_done, wait_for_file, wait_for_start)
from netapprox.experiments.jobs import JobWorkload
from netapprox.hostlib.config import required_messages
from netapprox.topo.trafgen import Pacer, send_paced

TCP_DEFAULT_PORT = 5600
UDP_DEFAULT_PORT = 5700
CC_FILE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")

_MAGIC = b"NAB1"
_JOB_HDR = struct.Struct("!4sBIII")  # magic, mode, job_id, n, target
_MSG_HDR = struct.Struct("!II")  # msg_id, length
TCP_JOB_HEADER = _JOB_HDR.size
TCP_MSG_HEADER = _MSG_HDR.size
"""The TCP baselines' framing: a 17-byte job header, then 8 bytes before every message (the simulated
baselines write the same stream)."""
_STOP = b"S"
MODE_ES, MODE_SS = 1, 2
_MODE_NAMES = {MODE_ES: "tcp-es", MODE_SS: "tcp-ss"}


def pick_congestion_control(available: str | None = None) -> str:
    """'dctcp' when the kernel lists it, else 'cubic' (else whatever it lists first)."""
    if available is None:
        try:
            available = CC_FILE.read_text()
        except OSError:
            available = ""
    names = available.split()
    for choice in ("dctcp", "cubic"):
        if choice in names:
            return choice
    return names[0] if names else "unknown"


def msr_target(msr: float, n: int) -> int:
    """Messages that must arrive: ceil(MSR * N), as ATP counts them (``hostlib.config.required_messages``)."""
    if not 0.0 < msr <= 1.0:
        raise ValueError(f"MSR must be in (0, 1], got {msr}")
    return required_messages(msr, n)


def sample_messages(n: int, msr: float, seed: int) -> list[int]:
    """TCP-SS: a uniform sample (without replacement) of ceil(MSR*N) message ids, in send order."""
    rng = random.Random(seed)
    return sorted(rng.sample(range(n), msr_target(msr, n)))


def _tcp_info(sock: socket.socket) -> dict:
    """A few struct tcp_info fields (linux/tcp.h): rtt, total retransmits, segments out."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return {}
    out = {}
    if len(raw) >= 104:
        rtt_us, = struct.unpack_from("I", raw, 68)
        total_retrans, = struct.unpack_from("I", raw, 100)
        out.update(rtt_us=rtt_us, total_retrans=total_retrans)
    if len(raw) >= 140:
        segs_out, = struct.unpack_from("I", raw, 136)
        out["segs_out"] = segs_out
    return out


def _wait_until(t0: float, offset_s: float) -> None:
    delay = t0 + offset_s - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _payload(msg_id: int, size: int) -> bytes:
    # Deterministic filler; content does not matter, only its length.
    return bytes([msg_id & 0xFF]) * size


# --------------------------------------------------------------------------------------------------
# TCP-ES / TCP-SS


def tcp_send(dest: tuple[str, int], job: JobWorkload, *, job_id: int, msr: float, mode: str = "es",
             seed: int = 0, cc: str | None = None, timeout: float = 120.0,
             start_at: float | StartFile | None = None) -> dict:
    """Send one job over TCP as EarlySend (``mode='es'``) or SampleSend (``'ss'``); return the summary.
    ``start_at``: the trial's start line (``experiments.hostprog``); the JCT clock starts there."""
    if mode not in ("es", "ss"):
        raise ValueError("mode is 'es' or 'ss'")
    cc = cc or pick_congestion_control()
    if mode == "es":
        order = list(range(job.n))
        target = msr_target(msr, job.n)
    else:
        order = sample_messages(job.n, msr, seed)
        target = len(order)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    except OSError:
        cc = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    late = wait_for_start(start_at)
    start_wall = time.time()
    t0 = time.monotonic()
    sock.settimeout(timeout)
    sock.connect(dest)
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    pending = memoryview(_JOB_HDR.pack(_MAGIC, MODE_ES if mode == "es" else MODE_SS, job_id, job.n, target))
    next_idx = 0
    sent_messages = 0
    bytes_sent = 0
    stopped = False
    deadline = t0 + timeout
    try:
        while not stopped:
            now = time.monotonic()
            if now > deadline:
                break
            if not pending and next_idx < len(order):
                mid = order[next_idx]
                ready = t0 + job.ready_s[mid]
                if ready <= now:
                    pending = memoryview(_MSG_HDR.pack(mid, job.sizes[mid]) + _payload(mid, job.sizes[mid]))
                    next_idx += 1
            want_write = bool(pending)
            wait = 0.5
            if not pending and next_idx < len(order):
                wait = max(0.0, t0 + job.ready_s[order[next_idx]] - now)
            sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0))
            for _key, events in sel.select(timeout=min(wait, 0.5)):
                if events & selectors.EVENT_READ:
                    data = sock.recv(16)
                    if _STOP in data or not data:
                        stopped = bool(data)
                        if not data:
                            deadline = 0  # receiver went away
                        break
                if events & selectors.EVENT_WRITE and pending:
                    try:
                        k = sock.send(pending)
                    except BlockingIOError:
                        k = 0
                    bytes_sent += k
                    pending = pending[k:]
                    if not pending and next_idx > 0:
                        sent_messages += 1
        done = time.monotonic()
        info = _tcp_info(sock)
    finally:
        sel.close()
        # Abort: drop whatever is still queued, as an application that stops early would.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    return {
        "protocol": f"tcp-{mode}", "cc": cc, "job_id": job_id, "n": job.n, "msr": msr, "target": target,
        "workload": job.kind, "workload_seed": job.seed, "total_bytes": job.total_bytes,
        "completed": stopped, "jct_s": (done - t0) if stopped else None,
        "start_wall": start_wall, "end_wall": start_wall + (done - t0),
        "messages_written": sent_messages, "bytes_written": bytes_sent, "tcp_info": info, "late_start_s": late,
    }


@dataclasses.dataclass
class _TcpConn:
    sock: socket.socket
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    job_id: int | None = None
    mode: int = 0
    n: int = 0
    target: int = 0
    delivered: int = 0
    bytes: int = 0
    first_wall: float | None = None
    target_wall: float | None = None
    closed: bool = False

    def feed(self, data: bytes) -> bool:
        """Consume bytes; True when this call completed the target (the stop byte is due)."""
        if self.first_wall is None:
            self.first_wall = time.time()
        self.bytes += len(data)
        self.buf += data
        reached = False
        while True:
            if self.job_id is None:
                if len(self.buf) < _JOB_HDR.size:
                    return reached
                magic, self.mode, self.job_id, self.n, self.target = _JOB_HDR.unpack_from(self.buf)
                if magic != _MAGIC:
                    raise ValueError("not a baseline TCP stream (bad magic)")
                del self.buf[:_JOB_HDR.size]
                continue
            if len(self.buf) < _MSG_HDR.size:
                return reached
            _mid, length = _MSG_HDR.unpack_from(self.buf)
            if len(self.buf) < _MSG_HDR.size + length:
                return reached
            del self.buf[:_MSG_HDR.size + length]
            self.delivered += 1
            if self.delivered == self.target:
                self.target_wall = time.time()
                reached = True

    def summary(self) -> dict:
        return {"protocol": _MODE_NAMES.get(self.mode, "?"), "job_id": self.job_id, "n": self.n,
                "target": self.target, "delivered": self.delivered, "bytes_received": self.bytes,
                "first_wall": self.first_wall, "target_wall": self.target_wall,
                "completed": self.target_wall is not None}


def tcp_listen(bind: tuple[str, int], *, backlog: int, ready_file: str | None = None
               ) -> tuple[socket.socket, selectors.BaseSelector]:
    """A non-blocking listening socket registered in a new selector (data None); writes ``ready_file``
    once listening, so a harness knows when senders may connect."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(bind)
    lsock.listen(backlog)
    lsock.setblocking(False)
    if ready_file:
        Path(ready_file).write_text("ready\n")
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    return lsock, sel


def tcp_receive(bind: tuple[str, int], *, jobs: int = 1, timeout: float = 120.0, ready_file: str | None = None) -> dict:
    """Serve ``jobs`` TCP-ES/SS senders (concurrently); return per-job summaries."""
    lsock, sel = tcp_listen(bind, backlog=64, ready_file=ready_file)
    conns: list[_TcpConn] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if len(conns) >= jobs and all(c.closed or c.target_wall is not None for c in conns):
                break
            for key, _ in sel.select(timeout=0.2):
                if key.data is None:
                    s, _addr = lsock.accept()
                    s.setblocking(False)
                    c = _TcpConn(s)
                    conns.append(c)
                    sel.register(s, selectors.EVENT_READ, c)
                    continue
                c: _TcpConn = key.data
                try:
                    data = c.sock.recv(1 << 16)
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                if not data:
                    c.closed = True
                    sel.unregister(c.sock)
                    c.sock.close()
                    continue
                if c.feed(data):
                    try:
                        c.sock.send(_STOP)
                    except OSError:
                        pass
    finally:
        for c in conns:
            if not c.closed:
                c.sock.close()
        sel.close()
        lsock.close()
    return {"protocol": "tcp-recv", "jobs": [c.summary() for c in conns]}


# --------------------------------------------------------------------------------------------------
# UDP blast


def udp_send(dest: tuple[str, int], job: JobWorkload, *, job_id: int, rate_bps: float, mtu: int = 1400,
             tlr: float | None = None, duration_s: float | None = None, end_copies: int = 5,
             start_at: float | StartFile | None = None, stop_file: str | None = None) -> dict:
    """Send every message of ``job`` as ATP-format DATA packets paced at ``rate_bps`` (UDP payload bits), through
    the one paced generator (``topo.trafgen.send_paced``).

    ``tlr``: mark packets APPROX with this TLR (switches queue them by TLR), else non-approximate.
    ``duration_s``: keep cycling through the job's messages until this much time has passed
    (background traffic); by default each message is sent once, when it is ready. ``stop_file``: no message
    starts once that file exists (the trial's jobs are done: ``TrialPlan.stop_with_jobs``). The end is announced
    with ``end_copies`` DONE packets whose ``seq`` carries the number of DATA packets sent.
    """
    if rate_bps <= 0:
        raise ValueError("rate must be positive")
    chunk = mtu - wire.HEADER_LEN
    if chunk <= 0:
        raise ValueError(f"mtu {mtu} leaves no room after the {wire.HEADER_LEN}-byte header")
    flags = wire.Flags.APPROX if tlr is not None else 0
    tlr_q = wire.tlr_to_q15(tlr) if tlr is not None else 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    late = wait_for_start(start_at)
    start_wall = time.time()
    t0 = time.monotonic()
    seq = 0

    def datagrams() -> Iterator[bytes]:
        nonlocal seq
        cycle = 0
        while True:
            for mid in range(job.n):
                if stop_file is not None and os.path.exists(stop_file):
                    return
                size = job.sizes[mid]
                cnt = max(1, math.ceil(size / chunk))
                if duration_s is None:
                    _wait_until(t0, job.ready_s[mid])
                for idx in range(cnt):
                    plen = min(chunk, size - idx * chunk) if size > 0 else 0
                    hdr = wire.Header(flags=flags, job_id=job_id, msg_id=mid + cycle * job.n, tlr=tlr_q,
                                      pkt_idx=idx, pkt_cnt=cnt, seq=seq)
                    yield wire.encode(hdr, b"\0" * plen)
                    seq += 1
                if duration_s is not None and time.monotonic() - t0 >= duration_s:
                    break
            cycle += 1
            if duration_s is None or time.monotonic() - t0 >= duration_s:
                return

    try:
        out = send_paced(sock, dest, datagrams(), Pacer(rate_bps))
        last = time.monotonic()
        done_hdr = wire.Header(type=wire.PacketType.DONE, job_id=job_id, seq=seq)
        for _ in range(end_copies):
            sock.sendto(wire.encode(done_hdr, struct.pack("!I", 0)), dest)
            time.sleep(0.01)
    finally:
        sock.close()
    return {"protocol": "udp", "job_id": job_id, "n": job.n, "rate_bps": rate_bps, "tlr": tlr,
            "packets_sent": seq, "bytes_sent": out["bytes"], "send_errors": out["send_errors"],
            "duration_s": last - t0, "start_wall": start_wall, "end_wall": start_wall + (last - t0),
            "workload": job.kind, "workload_seed": job.seed, "late_start_s": late}


def udp_receive(bind: tuple[str, int], *, jobs: int = 1, msr: float | None = None, n: int | None = None,
                timeout: float = 120.0, ready_file: str | None = None) -> dict:
    """Count packets and complete messages per job until every job sent DONE (or ``timeout``).

    With ``msr`` and ``n``, also record when ceil(MSR * N) messages of a job were complete.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(bind)
    sock.settimeout(0.2)
    if ready_file:
        Path(ready_file).write_text("ready\n")
    state: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    malformed = 0
    target = msr_target(msr, n) if msr is not None and n is not None else None
    try:
        while time.monotonic() < deadline:
            if len(state) >= jobs and all(s["sent"] is not None for s in state.values()):
                break
            try:
                data, _ = sock.recvfrom(65535)
            except socket.timeout:
                continue
            try:
                hdr, _payload_ = wire.decode(data)
            except wire.MalformedPacket:
                malformed += 1
                continue
            s = state.setdefault(hdr.job_id, {"packets": 0, "bytes": 0, "sent": None, "msgs": {}, "done_ids": set(),
                                              "complete": 0, "first_wall": time.time(), "target_wall": None,
                                              "last_wall": None})
            if hdr.type == wire.PacketType.DONE:
                s["sent"] = hdr.seq
                continue
            s["packets"] += 1
            s["bytes"] += len(data)
            s["last_wall"] = time.time()
            if hdr.msg_id in s["done_ids"]:
                continue
            got = s["msgs"].setdefault(hdr.msg_id, set())
            got.add(hdr.pkt_idx)
            if len(got) == hdr.pkt_cnt:
                s["complete"] += 1
                del s["msgs"][hdr.msg_id]
                s["done_ids"].add(hdr.msg_id)
                if target is not None and s["complete"] == target:
                    s["target_wall"] = time.time()
    finally:
        sock.close()
    out = []
    for job_id, s in state.items():
        sent = s["sent"]
        out.append({"job_id": job_id, "packets_received": s["packets"], "bytes_received": s["bytes"],
                    "packets_sent": sent, "messages_complete": s["complete"],
                    "packet_loss": (1.0 - s["packets"] / sent) if sent else None,
                    "first_wall": s["first_wall"], "last_wall": s["last_wall"], "target": target,
                    "target_wall": s["target_wall"]})
    return {"protocol": "udp-recv", "malformed": malformed, "jobs": out}


# --------------------------------------------------------------------------------------------------
# CLI


def _job_from_args(args: argparse.Namespace) -> JobWorkload:
    if args.job:
        return JobWorkload.from_dict(json.loads(Path(args.job).read_text()))
    if args.fixed_size is not None:
        return JobWorkload(kind="fixed", seed=0, sizes=(args.fixed_size,) * args.n, ready_s=(0.0,) * args.n)
    from netapprox.experiments.workloads import make_job  # noqa: PLC0415 - numpy; a host program given a job file starts without it

    return make_job(args.workload, args.workload_seed, args.n, offered_bps=args.offered_bps,
                    max_size=args.max_size)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.baselines", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def job_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--job", help="JSON file of a JobWorkload (experiments.workloads); overrides the next four")
        sp.add_argument("--workload", choices=["fbkv", "fbhd"], default="fbkv")
        sp.add_argument("--workload-seed", type=int, default=1)
        sp.add_argument("--n", type=int, default=100, help="messages in the job")
        sp.add_argument("--offered-bps", type=float, default=None, help="application data rate (default: all ready)")
        sp.add_argument("--max-size", type=int, default=None)
        sp.add_argument("--fixed-size", type=int, default=None, help="N messages of exactly this many bytes")
        sp.add_argument("--job-id", type=int, default=1)

    s = sub.add_parser("tcp-send", help="TCP-ES or TCP-SS sender")
    s.add_argument("dest", help="HOST[:PORT]")
    s.add_argument("--mode", choices=["es", "ss"], default="es")
    s.add_argument("--msr", type=float, required=True)
    s.add_argument("--seed", type=int, default=0, help="TCP-SS sampling seed")
    s.add_argument("--cc", default=None, help="congestion control (default: dctcp if available, else cubic)")
    s.add_argument("--timeout", type=float, default=120.0)
    s.add_argument("--json")
    add_start_at(s)
    add_start_after(s)
    job_opts(s)

    r = sub.add_parser("tcp-recv", help="TCP-ES/SS receiver")
    r.add_argument("bind", help="ADDR[:PORT]")
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--timeout", type=float, default=120.0)
    r.add_argument("--ready-file")
    r.add_argument("--json")

    u = sub.add_parser("udp-send", help="paced UDP blast (ATP-format packets)")
    u.add_argument("dest", help="HOST[:PORT]")
    u.add_argument("--rate", type=float, required=True, help="bit/s")
    u.add_argument("--mtu", type=int, default=1400)
    u.add_argument("--tlr", type=float, default=None, help="send as APPROX with this TLR")
    u.add_argument("--duration", type=float, default=None, help="cycle the job for this many seconds")
    u.add_argument("--stop-file", help="send no message once this file exists")
    u.add_argument("--json")
    add_start_at(u)
    job_opts(u)

    v = sub.add_parser("udp-recv", help="UDP blast receiver")
    v.add_argument("bind", help="ADDR[:PORT]")
    v.add_argument("--jobs", type=int, default=1)
    v.add_argument("--msr", type=float, default=None)
    v.add_argument("--n", type=int, default=None)
    v.add_argument("--timeout", type=float, default=120.0)
    v.add_argument("--ready-file")
    v.add_argument("--json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "tcp-send":
        wait_for_file(args.start_after, args.timeout)
        out = tcp_send(address(args.dest, TCP_DEFAULT_PORT), _job_from_args(args), job_id=args.job_id,
                       msr=args.msr, mode=args.mode, seed=args.seed, cc=args.cc, timeout=args.timeout,
                       start_at=args.start_at)
        mark_done(args.done_file)
    elif args.cmd == "tcp-recv":
        out = tcp_receive(address(args.bind, TCP_DEFAULT_PORT), jobs=args.jobs, timeout=args.timeout,
                          ready_file=args.ready_file)
    elif args.cmd == "udp-send":
        out = udp_send(address(args.dest, UDP_DEFAULT_PORT), _job_from_args(args), job_id=args.job_id,
                       rate_bps=args.rate, mtu=args.mtu, tlr=args.tlr, duration_s=args.duration,
                       start_at=args.start_at, stop_file=args.stop_file)
    else:
        out = udp_receive(address(args.bind, UDP_DEFAULT_PORT), jobs=args.jobs, msr=args.msr, n=args.n,
                          timeout=args.timeout, ready_file=args.ready_file)
    emit_summary(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
