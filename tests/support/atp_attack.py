"""A hostile host for the receiver-bounds tests: admitted jobs that make a receiver work, hold or send.

    python -m support.atp_attack HOST PORT --seconds S [--sources K] [--fins R] [--huge R] [--manifests R]

From ``K`` addresses (127.0.3.1, ...), each of which gets its jobs admitted the way a sender does (announce,
RETRY, announce echoing the token), for ``S`` seconds or until SIGTERM:

- ``--fins R``: per address, one admitted job declaring the receiver's largest N that sends nothing but its
  FIN, then repeats that FIN ``R`` times per second (each repeat asks for the whole DONE again);
- ``--huge R``: per address, ``R`` new jobs per second declaring the largest N, each finished at once with a
  FIN (a ``--serve --json`` receiver writes a summary of each);
- ``--manifests R``: per address, ``R`` new jobs per second whose ~1 MiB manifest (two interleaved groups,
  in 1,300-byte announce parts) fails only its last check (the groups overlap in their last range).

Loopback only. Prints ``attacking`` once every address has its jobs admitted and at work, and one JSON line at
the end: per address, the bytes it sent to the receiver's port and the
bytes it got back, and the counts of what it did.
"""
from __future__ import annotations

import argparse
import array
import json
import signal
import socket
import struct
import time

from netapprox.hostlib import control, wire

MAX_N = 1 << 20  # AtpConfig.max_messages' default


def announce_parts(job_id: int, chunk: bytes, token: bytes) -> list[bytes]:
    pieces = [chunk[i:i + 1300] for i in range(0, len(chunk), 1300)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        payload = control.encode_announce_part(piece, job_id=job_id, pkt_idx=i, pkt_cnt=len(pieces), token=token)
        out.append(wire.encode(wire.Header(job_id=job_id, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=i,
                                           pkt_cnt=len(pieces), seq=job_id + i), payload))
    return out


HUGE = control.Manifest(total=MAX_N, vector_len=None, groups=(control.GroupShape(
    0, 0.5, array.array("I", [0]), array.array("I", [MAX_N - 1])),)).encode()


def failing_manifest(n: int = 1 << 16) -> bytes:
    """Two groups of ``n`` one-id ranges each, interleaved, whose last ranges overlap: every check passes but
    the very last one (``groups overlap``)."""
    even = array.array("I", range(0, 2 * n, 2))
    odd = array.array("I", range(1, 2 * n, 2))
    odd[-1] = even[-1]  # the overlap, at the end
    head = struct.pack("!4sIIH", b"ATPJ", 2 * n, control.NO_VECTOR, 2)
    body = b""
    for gid, ids in ((0, even), (1, odd)):
        flat = array.array("I")
        for i in ids:
            flat.extend((i, i))
        flat.byteswap()
        body += struct.pack("!HHII", gid, 0x4000, len(ids), len(ids)) + flat.tobytes()
    return head + body


def fin(job_id: int, seq: int) -> bytes:
    return wire.encode(wire.Header(job_id=job_id, msg_id=control.FIN_MSG_ID, seq=seq))


class Source:
    def __init__(self, addr: str, target: tuple[str, int]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, 0))
        self.sock.setblocking(False)
        self.addr = addr
        self.target = target
        self.sent = 0
        self.received = 0
        self.pending: dict[int, bytes] = {}  # job id -> manifest chunk, waiting for a RETRY
        self.admitted: list[int] = []

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendto(data, self.target)
            self.sent += len(data)
        except (BlockingIOError, ConnectionRefusedError):
            pass

    def open_job(self, job_id: int, chunk: bytes) -> None:
        self.pending[job_id] = chunk
        self.send(announce_parts(job_id, chunk, wire.NO_TOKEN)[0])

    def drain(self) -> list[tuple[int, bytes]]:
        """Read replies; returns ``(job_id, token)`` of every RETRY."""
        retries = []
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, ConnectionRefusedError):
                return retries
            self.received += len(data)
            try:
                h, payload = wire.decode(data)
            except wire.MalformedPacket:
                continue
            if h.type == wire.PacketType.RETRY and h.job_id in self.pending:
                retries.append((h.job_id, payload))


def run(target: tuple[str, int], *, seconds: float, sources: int, fins: float, huge: float,
        manifests: float) -> dict:
    srcs = [Source(f"127.0.3.{i + 1}", target) for i in range(sources)]
    failing = failing_manifest()
    counts = {"fins": 0, "huge_jobs": 0, "manifests": 0}
    job_id = 200_000_000
    fin_jobs: dict[Source, int] = {}
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    start = last = time.monotonic()
    for s in srcs:
        if fins:
            job_id += 1
            fin_jobs[s] = job_id
            s.open_job(job_id, HUGE)
    announced = False
    try:
        while (now := time.monotonic()) < start + seconds and not stop:
            if not announced and all(fin_jobs.get(s) in s.admitted for s in srcs if s in fin_jobs) and \
                    (not (huge or manifests) or counts["huge_jobs"] + counts["manifests"] >= len(srcs)):
                print("attacking", flush=True)  # every address is admitted and at work
                announced = True
            dt, last = now - last, now
            n_huge, n_manifests, n_fins = (_due(k, r, dt) for k, r in (("huge", huge), ("manifests", manifests),
                                                                         ("fins", fins)))
            for s in srcs:
                for _ in range(n_huge):
                    job_id += 1
                    s.open_job(job_id, HUGE)
                for _ in range(n_manifests):
                    job_id += 1
                    s.open_job(job_id, failing)
                for jid, token in s.drain():
                    chunk = s.pending.pop(jid)
                    for part in announce_parts(jid, chunk, token):
                        s.send(part)
                    if chunk is failing:
                        counts["manifests"] += 1
                    elif jid != fin_jobs.get(s):
                        s.send(fin(jid, jid + 1))
                        counts["huge_jobs"] += 1
                    else:
                        s.admitted.append(jid)
                if s in fin_jobs and fin_jobs[s] in s.admitted:
                    for _ in range(n_fins):
                        s.send(fin(fin_jobs[s], fin_jobs[s] + 1))
                        counts["fins"] += 1
            time.sleep(0.002)
        time.sleep(0.2)
        for s in srcs:
            s.drain()
    finally:
        for s in srcs:
            s.sock.close()
    return {"sources": {s.addr: {"sent": s.sent, "received": s.received} for s in srcs}, **counts}


_carry: dict[str, float] = {}


def _due(kind: str, rate: float, dt: float) -> int:
    """How many of ``rate`` per second are due after ``dt`` seconds (fractions carried over)."""
    v = _carry.get(kind, 0.0) + rate * dt
    n = int(v)
    _carry[kind] = v - n
    return min(n, 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--sources", type=int, default=4)
    ap.add_argument("--fins", type=float, default=0.0, help="repeated FINs per second per address")
    ap.add_argument("--huge", type=float, default=0.0, help="huge declared jobs per second per address")
    ap.add_argument("--manifests", type=float, default=0.0, help="failing 1 MiB manifests per second per address")
    a = ap.parse_args()
    print(json.dumps(run((a.host, a.port), seconds=a.seconds, sources=a.sources, fins=a.fins, huge=a.huge,
                         manifests=a.manifests)), flush=True)


if __name__ == "__main__":
    main()
