"""Non-approximate request flows over kernel TCP, for flow completion times (FCT).

A client opens one TCP connection per flow at the flow's start time, writes a 12-byte header
(flow id, size) and ``size`` bytes, and waits for the server's one-byte answer, sent once the server
has read all of it. FCT = start of connect -> answer received. Flows run concurrently (one selector,
non-blocking sockets), so a slow flow does not delay the start of the next.

CLI: ``python -m netapprox.experiments.flows server ADDR[:PORT] --json F`` and
``python -m netapprox.experiments.flows client HOST[:PORT] --schedule FILE --json F`` where the schedule is a JSON
list of ``{"start_s", "size", "trace_size"}`` (experiments.workloads.Flow fields).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import selectors
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Sequence

from netapprox.experiments.baselines import pick_congestion_control, tcp_listen
from netapprox.experiments.hostprog import StartFile, add_start_at, address, emit_summary, wait_for_start

FLOW_DEFAULT_PORT = 5800
_HDR = struct.Struct("!IQ")  # flow id, size
_ANSWER = b"K"


@dataclasses.dataclass
class _ClientFlow:
    fid: int
    size: int
    trace_size: int
    start_s: float
    sock: socket.socket | None = None
    out: memoryview | None = None
    started: float | None = None
    done: float | None = None
    error: str | None = None


def run_client(dest: tuple[str, int], schedule: Sequence[dict], *, timeout: float = 60.0, cc: str | None = None,
               tos: int | None = None, start_at: float | StartFile | None = None,
               stop_file: str | None = None) -> dict:
    """Run every flow of ``schedule``; return per-flow FCTs (``None`` for flows that did not finish).
    Flow start times count from ``start_at`` (the trial's start line, ``experiments.hostprog``). ``stop_file``:
    once that file exists no flow starts (those flows are left out of the result and counted as
    ``not_started``); flows in flight finish."""
    cc = cc or pick_congestion_control()
    flows = [_ClientFlow(i, int(f["size"]), int(f.get("trace_size", f["size"])), float(f["start_s"]))
             for i, f in enumerate(sorted(schedule, key=lambda f: f["start_s"]))]
    sel = selectors.DefaultSelector()
    late = wait_for_start(start_at)
    t0 = time.monotonic()
    start_wall = time.time()
    nxt = 0
    active = 0
    deadline = t0 + (flows[-1].start_s if flows else 0) + timeout
    last = len(flows)  # flows[last:] never start (the stop file appeared)
    try:
        while (nxt < last or active) and time.monotonic() < deadline:
            now = time.monotonic()
            if stop_file is not None and nxt < last and os.path.exists(stop_file):
                last = nxt
            while nxt < last and t0 + flows[nxt].start_s <= now:
                f = flows[nxt]
                nxt += 1
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
                except OSError:
                    pass
                if tos is not None:
                    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
                s.setblocking(False)
                f.started = time.monotonic()
                try:
                    s.connect(dest)
                except BlockingIOError:
                    pass
                except OSError as e:
                    f.error = str(e)
                    s.close()
                    continue
                f.sock = s
                f.out = memoryview(_HDR.pack(f.fid, f.size) + b"\0" * f.size)
                sel.register(s, selectors.EVENT_WRITE | selectors.EVENT_READ, f)
                active += 1
            wait = 0.05
            if nxt < last:
                wait = min(wait, max(0.0, t0 + flows[nxt].start_s - time.monotonic()))
            for key, events in sel.select(timeout=wait):
                f = key.data
                try:
                    if events & selectors.EVENT_WRITE and f.out:
                        k = f.sock.send(f.out)
                        f.out = f.out[k:]
                        if not f.out:
                            sel.modify(f.sock, selectors.EVENT_READ, f)
                    if events & selectors.EVENT_READ:
                        data = f.sock.recv(16)
                        if data:
                            f.done = time.monotonic()
                        else:
                            f.error = "closed before answer"
                        sel.unregister(f.sock)
                        f.sock.close()
                        active -= 1
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    f.error = str(e)
                    sel.unregister(f.sock)
                    f.sock.close()
                    active -= 1
    finally:
        for f in flows:
            if f.sock is not None and f.done is None and f.error is None:
                try:
                    sel.unregister(f.sock)
                except (KeyError, ValueError):
                    pass
                f.sock.close()
        sel.close()
    return {
        "protocol": "tcp-flows", "cc": cc, "start_wall": start_wall, "late_start_s": late,
        "flows": [{"id": f.fid, "size": f.size, "trace_size": f.trace_size, "start_s": f.start_s,
                   "fct_s": (f.done - f.started) if f.done is not None else None, "error": f.error}
                  for f in flows[:last]],
        "not_started": len(flows) - last,
    }


def run_server(bind: tuple[str, int], *, duration: float, ready_file: str | None = None) -> dict:
    """Answer flows for ``duration`` seconds; return how many flows and bytes were served."""
    lsock, sel = tcp_listen(bind, backlog=256, ready_file=ready_file)
    served = 0
    nbytes = 0
    end = time.monotonic() + duration
    state: dict[socket.socket, list] = {}
    try:
        while time.monotonic() < end:
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    try:
                        s, _ = lsock.accept()
                    except BlockingIOError:
                        continue
                    s.setblocking(False)
                    state[s] = [bytearray(), None]
                    sel.register(s, selectors.EVENT_READ, True)
                    continue
                s = key.fileobj
                try:
                    data = s.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                st = state[s]
                if data:
                    nbytes += len(data)
                    if st[1] is None:
                        st[0] += data
                        if len(st[0]) >= _HDR.size:
                            _fid, size = _HDR.unpack_from(st[0])
                            st[1] = size - (len(st[0]) - _HDR.size)
                    else:
                        st[1] -= len(data)
                    if st[1] is not None and st[1] <= 0:
                        try:
                            s.send(_ANSWER)
                        except OSError:
                            pass
                        served += 1
                        st[1] = float("inf")  # answered; wait for the client to close
                    continue
                sel.unregister(s)
                s.close()
                del state[s]
    finally:
        for s in state:
            s.close()
        sel.close()
        lsock.close()
    return {"protocol": "tcp-flows-server", "served": served, "bytes": nbytes}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.flows", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("client")
    c.add_argument("dest")
    c.add_argument("--schedule", required=True)
    c.add_argument("--timeout", type=float, default=60.0, help="seconds after the last start")
    c.add_argument("--tos", type=lambda x: int(x, 0), default=None)
    c.add_argument("--json")
    c.add_argument("--stop-file", help="no flow starts once this file exists (flows in flight finish)")
    add_start_at(c)
    s = sub.add_parser("server")
    s.add_argument("bind")
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--ready-file")
    s.add_argument("--json")
    args = p.parse_args(argv)
    if args.cmd == "client":
        out = run_client(address(args.dest, FLOW_DEFAULT_PORT), json.loads(Path(args.schedule).read_text()), timeout=args.timeout,
                         tos=args.tos, start_at=args.start_at, stop_file=args.stop_file)
    else:
        out = run_server(address(args.bind, FLOW_DEFAULT_PORT), duration=args.duration, ready_file=args.ready_file)
    emit_summary(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
