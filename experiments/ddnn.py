"""Ring-allreduce style DNN training traffic (the DDNN-priority thesis, papers/003), as one worker process.

K workers form a ring (worker i sends to worker i+1 mod K over one TCP connection). Every iteration a
worker "computes" (sleeps ``compute_s``), then runs ring-allreduce on a model of ``model_bytes``: the
model is cut into K chunks and 2 (K - 1) steps follow, each sending one chunk to the successor while
receiving one from the predecessor (reduce-scatter then all-gather). A worker cannot start step s + 1
before it has the predecessor's chunk of step s, so the ring moves at the pace of its slowest link,
as Horovod's does. Iteration time = compute + allreduce; the summary lists every iteration.

The thesis' compute-to-network ratio is compute_time / network_time with network_time =
model_bytes * 2 (1 - 1/K) * 8 / link_rate; the experiment picks ``compute_s`` from it.

CLI: ``python -m netapprox.experiments.ddnn worker --rank I --peers IP0,IP1,... --model-bytes B --compute-s C
--duration S --json F`` (one per worker host; the ring connects itself, retrying until peers listen).
"""
from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time
from typing import Sequence
from netapprox.experiments.hostprog import emit_summary

RING_PORT = 5900


def network_time_s(model_bytes: int, workers: int, rate_bps: float) -> float:
    """Per-iteration transmission time of ring-allreduce on one link (thesis eq. 5.1 denominator)."""
    return model_bytes * 2 * (1 - 1 / workers) * 8 / rate_bps


def _recv_exact(sock: socket.socket, n: int, buf: bytearray) -> None:
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("ring predecessor closed the connection")
        got += k


def run_worker(rank: int, peers: Sequence[str], *, model_bytes: int, compute_s: float, duration_s: float,
               port: int = RING_PORT, connect_timeout: float = 15.0) -> dict:
    k = len(peers)
    if not 0 <= rank < k or k < 2:
        raise ValueError("need at least two workers and 0 <= rank < K")
    chunk = max(1, model_bytes // k)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((peers[rank], port))
    lsock.listen(1)
    succ = peers[(rank + 1) % k]
    out_sock = None
    deadline = time.monotonic() + connect_timeout
    accepted: dict[str, socket.socket] = {}

    def accept() -> None:
        lsock.settimeout(connect_timeout)
        s, _ = lsock.accept()
        accepted["s"] = s

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    while out_sock is None:
        try:
            out_sock = socket.create_connection((succ, port), timeout=1.0)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    t.join(connect_timeout)
    in_sock = accepted["s"]
    out_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out_sock.settimeout(None)
    in_sock.settimeout(None)
    lsock.close()
    # a start barrier: everybody sends one byte around the ring
    out_sock.sendall(b"G")
    _recv_exact(in_sock, 1, bytearray(1))

    payload = b"\x01" * chunk
    rbuf = bytearray(4 + chunk)
    iterations = []
    t_end = time.monotonic() + duration_s
    try:
        while time.monotonic() < t_end:
            it0 = time.monotonic()
            time.sleep(compute_s)
            c0 = time.monotonic()
            for step in range(2 * (k - 1)):
                sender = threading.Thread(target=out_sock.sendall, args=(struct.pack("!I", step) + payload,))
                sender.start()
                _recv_exact(in_sock, 4 + chunk, rbuf)
                sender.join()
            it1 = time.monotonic()
            iterations.append({"start_s": it0, "iteration_s": it1 - it0, "allreduce_s": it1 - c0})
    finally:
        out_sock.close()
        in_sock.close()
    t0 = iterations[0]["start_s"] if iterations else 0.0
    for it in iterations:
        it["start_s"] -= t0
    return {"protocol": "ring-allreduce", "rank": rank, "workers": k, "model_bytes": model_bytes,
            "compute_s": compute_s, "iterations": iterations}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.ddnn", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--peers", required=True, help="comma-separated worker addresses, in ring order")
    w.add_argument("--model-bytes", type=int, required=True)
    w.add_argument("--compute-s", type=float, required=True)
    w.add_argument("--duration", type=float, required=True)
    w.add_argument("--port", type=int, default=RING_PORT)
    w.add_argument("--json")
    args = p.parse_args(argv)
    out = run_worker(args.rank, args.peers.split(","), model_bytes=args.model_bytes, compute_s=args.compute_s,
                     duration_s=args.duration, port=args.port)
    emit_summary(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
