"""A hostile host for the real-socket tests: floods an ATP receiver with forged job announces.

    python -m support.atp_flood HOST PORT --seconds S [--rate R] [--spoof K] [--echo E --hold H] [--report-at N]

Two attacks at once, for ``S`` seconds or until SIGTERM, then one JSON line of counts on stdout (and,
before it, the line ``parked`` once every echoing address has parked data in its ``--echo-jobs`` jobs, and
``reached N`` once ``--report-at`` off-path announces are out):

- off path: ``R`` announces per second, each for a new job id declaring 2^20 messages (every tenth
  2^32 - 16, over any limit), from ``K`` sockets on 127.0.1.1, 127.0.1.2, ... (stand-ins for spoofed
  addresses: nobody reads the RETRYs they get);
- a hostile host with ``E`` addresses (127.0.2.1, ...) that opens new jobs at ``--echo-rate`` per second
  and address and echoes every token it gets, so its jobs are admitted; in the first ``--echo-jobs`` jobs
  of each address it parks ``H`` packets of never-completed 4096-packet messages (1300 bytes each).

Loopback only (every address is 127/8), so nothing leaves the machine.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import struct
import time

from netapprox.hostlib import control, wire


def forged_announce(job_id: int, token: bytes = wire.NO_TOKEN) -> bytes:
    total = 0xFFFFFFF0 if job_id % 10 == 0 else 1 << 20
    chunk = control.Manifest(total=total, vector_len=None,
                             groups=(control.GroupShape.from_ids(0, 0.5, range(total)),)).encode()
    payload = control.encode_announce_part(chunk, job_id=job_id, pkt_idx=0, pkt_cnt=1, token=token)
    return wire.encode(wire.Header(job_id=job_id, msg_id=control.ANNOUNCE_MSG_ID, seq=job_id), payload)


_TEMPLATES = {k: bytearray(forged_announce(k)) for k in (10, 11)}
_JOB_AND_SEQ = ((wire.OFFSETS["job_id"], ">I"), (wire.OFFSETS["seq"], ">I"))


def cheap_announce(job_id: int) -> bytes:
    """``forged_announce(job_id)`` from a template: the flood should cost the flooder little CPU."""
    t = _TEMPLATES[10 if job_id % 10 == 0 else 11]
    for off, fmt in _JOB_AND_SEQ:
        struct.pack_into(fmt, t, off, job_id)
    return bytes(t)


def _socket(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 0))
    s.setblocking(False)
    return s


def run(target: tuple[str, int], *, seconds: float, rate: float, spoof: int, echo: int, hold: int,
        echo_rate: float, echo_jobs: int, report_at: int | None = None) -> dict:
    rng = random.Random(11)
    spoofed = [_socket(f"127.0.1.{i + 1}") for i in range(spoof)]
    echoers = [_socket(f"127.0.2.{i + 1}") for i in range(echo)]
    counts = {"announces": 0, "echo_hellos": 0, "echo_admissions": 0, "parked_packets": 0, "send_errors": 0}
    job_id = 100_000_000
    start = time.monotonic()
    sent_at = echo_at = start
    parked_in: dict[socket.socket, int] = {sock: 0 for sock in echoers}

    def send(sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendto(data, target)
            return True
        except (BlockingIOError, ConnectionRefusedError):
            counts["send_errors"] += 1
            return False

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while (now := time.monotonic()) < start + seconds and not stop:
            due = int((now - sent_at) * rate)
            for _ in range(min(due, 500)):
                job_id += 1
                if send(rng.choice(spoofed), cheap_announce(job_id)):
                    counts["announces"] += 1
                    if counts["announces"] == report_at:
                        print(f"reached {report_at}", flush=True)
            if due:
                sent_at = now
            hellos = int((now - echo_at) * echo_rate)
            if hellos:
                echo_at = now
            for sock in echoers:
                for _ in range(min(hellos, 100)):
                    job_id += 1
                    counts["echo_hellos"] += send(sock, cheap_announce(job_id))
                while True:
                    try:
                        data = sock.recv(2048)
                    except (BlockingIOError, ConnectionRefusedError):
                        break
                    h, payload = wire.decode(data)
                    if h.type != wire.PacketType.RETRY:
                        continue
                    counts["echo_admissions"] += send(sock, forged_announce(h.job_id, token=payload))
                    if parked_in[sock] >= echo_jobs:
                        continue
                    parked_in[sock] += 1
                    for m in range(hold):
                        d = wire.Header(flags=wire.Flags.APPROX, job_id=h.job_id, msg_id=m, pkt_cnt=4096, seq=m)
                        counts["parked_packets"] += send(sock, wire.encode(d, b"\xee" * 1300))
                    if all(n >= echo_jobs for n in parked_in.values()):
                        print("parked", flush=True)
            time.sleep(0.005)  # batches every ~5 ms: the flood, not the flooder, is what is measured
    finally:
        for sock in spoofed + echoers:
            sock.close()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rate", type=float, default=2000, help="off-path announces per second")
    ap.add_argument("--spoof", type=int, default=32, help="off-path source addresses")
    ap.add_argument("--echo", type=int, default=4, help="addresses of the host that echoes tokens")
    ap.add_argument("--echo-rate", type=float, default=200, help="new jobs per second and echoing address")
    ap.add_argument("--echo-jobs", type=int, default=16, help="jobs per echoing address that get parked data")
    ap.add_argument("--hold", type=int, default=40, help="packets parked per job")
    ap.add_argument("--report-at", type=int, help="print 'reached N' once N off-path announces are sent")
    a = ap.parse_args()
    print(json.dumps(run((a.host, a.port), seconds=a.seconds, rate=a.rate, spoof=a.spoof, echo=a.echo, hold=a.hold,
                         echo_rate=a.echo_rate, echo_jobs=a.echo_jobs, report_at=a.report_at)), flush=True)


if __name__ == "__main__":
    main()
