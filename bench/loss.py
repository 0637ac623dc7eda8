"""Loss benchmark (``make bench`` section ``loss``): one ATP job through a lossy path, its JCT over the ideal.

``run(progress=print) -> dict`` (for ``make bench``) or ``python -m netapprox.bench.loss [--seeds ...] [--json FILE]``.

The path is a relay on loopback (a process of its own, between the sender's and the receiver's processes): towards
the receiver a 20 Mbit/s link (each datagram takes (its bytes + 42) x 8 / 20e6 s to leave, behind a 64-packet
drop-tail queue), then the loss pattern (a datagram that left the link dies with it: the link carries what dies
too), then 5 ms; back to the sender 5 ms, nothing lost. Patterns: random loss 0.3, 0.6 and 0.9, and bursts
(Gilbert-Elliott per datagram: a good state that loses nothing and a bad one that loses everything, 5 % of the
datagrams in the good state start a burst, bursts last 10 datagrams on average: a third of the datagrams die).

The job: 620 messages of 1000 bytes in two groups, MSR 1.0 (310) and 0.5 (310), each message's bytes its own; the
receiver checks every delivered message byte for byte and each group's MSR. The ideal is the time the messages the
MSRs need (465) take on the link when a fraction ``loss`` of what is sent dies: 465 x (1000 + 32 + 42) bytes x 8 /
20 Mbit/s / (1 - loss) (``loss`` the pattern's: 1/3 for the bursts); JCT / ideal is 1 for a sender that keeps
the link busy with needed data from the first datagram to the last and never sends a datagram twice that arrived.

Three seeds (the loss pattern's), both cores (``native`` and ``python``, the sender's and the receiver's alike).
Headline ``atp_jct_under_loss_over_ideal``: per pattern (``random_0.3``, ``random_0.6``, ``random_0.9``, ``burst``),
the larger of the two cores' means over the seeds. Timing depends on this machine's load: run it alone
(``flock /work/locks/measure.lock`` where that is the rule).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import heapq
import json
import math
import multiprocessing as mp
import os
import random
import select
import socket
import sys
import time
from typing import Any, Callable

from netapprox.bench.hostlib import open_receiver, use_cores
from netapprox.hostlib import api, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message

RATE_BPS = 20e6
DELAY_S = 0.005
QUEUE_PACKETS = 64
WIRE_OVERHEAD = 42  # IPv4 + UDP + Ethernet, as AtpConfig.overhead_bytes
SIZE = 1000
MESSAGES = 620
MSRS = ((0, 1.0), (1, 0.5))
BURST = (0.05, 0.1)
"""Gilbert-Elliott: P(good -> bad), P(bad -> good) per datagram; mean loss 0.05 / 0.15 = 1/3."""
PATTERNS: dict[str, tuple[str, float]] = {
    "random_0.3": ("random", 0.3), "random_0.6": ("random", 0.6), "random_0.9": ("random", 0.9),
    "burst": ("burst", BURST[0] / (BURST[0] + BURST[1])),
}
IMPLS = ("native", "python")
RUN_TIMEOUT_S = 60.0


def job(job_id: int = 3801) -> JobSpec:
    return JobSpec(job_id=job_id, messages=tuple(Message(content(i), group_id=i % 2) for i in range(MESSAGES)),
                   group_msr=MSRS)


def content(i: int) -> bytes:
    """Message ``i``'s bytes: its own, so a message delivered in another's place is caught."""
    seed = hashlib.sha256(i.to_bytes(4, "big")).digest()
    return (seed * (SIZE // len(seed) + 1))[:SIZE]


def ideal_s(loss: float) -> float:
    j = job()
    need = sum(math.ceil(round(j.msr_of(g) * n, 9)) for g, n in j.group_sizes().items())
    return need * (SIZE + wire.HEADER_LEN + WIRE_OVERHEAD) * 8 / RATE_BPS / (1 - loss)


def dies(kind: str, loss: float, seed: int) -> Callable[[], bool]:
    """The pattern: called once per datagram that left the link, True when it dies."""
    rng = random.Random(seed)
    if kind == "random":
        return lambda: rng.random() < loss
    bad = [False]

    def burst() -> bool:
        bad[0] = rng.random() >= BURST[1] if bad[0] else rng.random() < BURST[0]
        return bad[0]
    return burst


# -- the relay -------------------------------------------------------------------------------------------------------

def _relay(port_q: Any, stop: Any, out_q: Any, receiver_port: int, kind: str, loss: float, seed: int) -> None:
    """Forwards the sender's datagrams (to its ``front`` socket) over the lossy link to the receiver, from its
    ``back`` socket, and the receiver's answers back, until ``stop`` is set; reports what it forwarded and dropped."""
    front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for s in (front, back):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
    port_q.put(front.getsockname()[1])
    receiver = ("127.0.0.1", receiver_port)
    sender: Any = None
    dead = dies(kind, loss, seed)
    due: list[tuple[float, int, int, bytes]] = []  # (when, order, 0: to the receiver / 1: to the sender, datagram)
    backlog: collections.deque[float] = collections.deque()  # when each queued datagram starts to leave
    busy_until = 0.0
    n = 0
    counts = collections.Counter()
    late: list[float] = []  # how long after its due time each datagram left: the relay's own scheduling delay
    while not stop.is_set():
        wait = min(0.05, max(0.0, due[0][0] - time.monotonic())) if due else 0.05
        readable, _, _ = select.select([front, back], [], [], wait)
        now = time.monotonic()
        for sock in readable:
            while True:
                try:
                    data, addr = sock.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:
                    continue
                n += 1
                if sock is back:
                    heapq.heappush(due, (now + DELAY_S, n, 1, data))
                    counts["to_sender"] += 1
                    continue
                sender = addr
                counts["offered"] += 1
                while backlog and backlog[0] <= now:
                    backlog.popleft()
                if len(backlog) >= QUEUE_PACKETS:
                    counts["queue_drops"] += 1
                    continue
                start = max(now, busy_until)
                busy_until = start + (len(data) + WIRE_OVERHEAD) * 8 / RATE_BPS
                backlog.append(start)
                if dead():
                    counts["pattern_drops"] += 1
                    continue
                heapq.heappush(due, (busy_until + DELAY_S, n, 0, data))
        now = time.monotonic()
        while due and due[0][0] <= now:
            when, _, to_sender, data = heapq.heappop(due)
            late.append(now - when)
            try:
                if to_sender:
                    if sender is not None:
                        front.sendto(data, sender)
                else:
                    back.sendto(data, receiver)
                    counts["delivered"] += 1
            except OSError:
                counts["send_errors"] += 1
    late.sort()
    pct = {f"p{round(100 * q)}": round(1e3 * late[min(len(late) - 1, int(q * len(late)))], 3) if late else None
           for q in (0.5, 0.99)}
    out_q.put({**counts, "late_ms": pct})
    front.close()
    back.close()


# -- the endpoints -----------------------------------------------------------------------------------------------------

def _receiver(port_q: Any, out_q: Any, impl: str) -> None:
    ep = open_receiver(port_q, out_q, impl)
    if ep is None:
        return
    try:
        res = ep.serve(jobs=1, timeout=RUN_TIMEOUT_S, linger_s=0.05)[0]
        j = job()
        exact = all(data == j.messages[i].data for i, data in res.messages.items())
        per_group = collections.Counter(j.messages[i].group_id for i in res.messages)
        msr_met = all(per_group[g] >= math.ceil(round(msr * n, 9))
                      for (g, msr), n in zip(MSRS, (j.group_sizes()[g] for g, _ in MSRS)))
        out_q.put({"delivered": res.delivered, "exact": exact, "msr_met": msr_met, "duplicates": res.duplicates})
    except Exception as exc:
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        ep.close()


def _sender(port: int, out_q: Any, impl: str) -> None:
    try:
        use_cores(impl)
        s = api.send_job(("127.0.0.1", port), job(), config=AtpConfig(max_rate_bps=RATE_BPS, initial_rtt_s=2 * DELAY_S),
                         timeout=RUN_TIMEOUT_S)
        out_q.put({"jct_s": s.jct_s, "msr_met": s.msr_met(), "packets_sent": s.packets_sent,
                   "retransmissions": s.retransmissions, "losses_found_by": dict(s.losses_found_by),
                   "spurious_losses": s.spurious_losses, "srtt_s": s.srtt_s})
    except Exception as exc:
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})


def measure(pattern: str, seed: int, impl: str) -> dict:
    """One job through the relay with ``pattern``; the row says what happened (``error`` when the job failed)."""
    kind, loss = PATTERNS[pattern]
    ctx = mp.get_context("fork")
    rx_port_q, relay_port_q, rx_q, relay_q, tx_q = (ctx.Queue() for _ in range(5))
    stop = ctx.Event()
    procs: list[Any] = []
    row: dict[str, Any] = {"pattern": pattern, "loss": loss, "seed": seed, "impl": impl}
    try:
        rx = ctx.Process(target=_receiver, args=(rx_port_q, rx_q, impl))
        rx.start()
        procs.append(rx)
        rx_port = rx_port_q.get(timeout=20)
        if rx_port is None:
            return {**row, **rx_q.get(timeout=20)}
        relay = ctx.Process(target=_relay, args=(relay_port_q, stop, relay_q, rx_port, kind, loss, seed))
        relay.start()
        procs.append(relay)
        tx = ctx.Process(target=_sender, args=(relay_port_q.get(timeout=20), tx_q, impl))
        tx.start()
        procs.append(tx)
        t = tx_q.get(timeout=RUN_TIMEOUT_S + 30)
        r = rx_q.get(timeout=RUN_TIMEOUT_S + 30)
        stop.set()
        path = relay_q.get(timeout=20)
    finally:
        stop.set()
        for p in reversed(procs):
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    if "error" in t or "error" in r:
        return {**row, "error": t.get("error") or r.get("error")}
    ideal = ideal_s(loss)
    forwarded = path.get("offered", 0) - path.get("queue_drops", 0)
    return {**row, **t, "receiver": r, "path": path, "ideal_s": ideal, "jct_over_ideal": t["jct_s"] / ideal,
            "relay_late_ms": path.get("late_ms"),
            "measured_loss": path.get("pattern_drops", 0) / forwarded if forwarded else None,
            "guarantee": bool(t["msr_met"] and r["msr_met"] and r["exact"])}


def summarize(rows: list[dict]) -> dict:
    """Per pattern and core: the mean JCT / ideal over the seeds (None when a run failed or broke a guarantee)."""
    out: dict[str, Any] = {}
    for pattern in PATTERNS:
        per_impl = {}
        for impl in IMPLS:
            rs = [r for r in rows if r["pattern"] == pattern and r["impl"] == impl]
            ok = rs and all("error" not in r and r["guarantee"] for r in rs)
            per_impl[impl] = sum(r["jct_over_ideal"] for r in rs) / len(rs) if ok else None
        vals = list(per_impl.values())
        out[pattern] = {"per_core": per_impl, "worst": None if None in vals else max(vals),
                        "per_seed": {impl: [round(r["jct_over_ideal"], 3) if "jct_over_ideal" in r else None
                                            for r in rows if r["pattern"] == pattern and r["impl"] == impl]
                                     for impl in IMPLS}}
    return out


def run(seeds: tuple[int, ...] = (1, 2, 3), progress: Callable[[str], None] = print) -> dict:
    rows = []
    t0 = time.monotonic()
    load_before = os.getloadavg()
    for pattern in PATTERNS:
        for impl in IMPLS:
            for seed in seeds:
                row = measure(pattern, seed, impl)
                rows.append(row)
                progress(f"{pattern} {impl} seed {seed}: " + (
                    f"error {row['error']}" if "error" in row else
                    f"JCT {row['jct_s']:.3f} s = {row['jct_over_ideal']:.2f} x ideal {row['ideal_s']:.3f} s, "
                    f"measured loss {row['measured_loss']:.3f}, relay late p99 {row['relay_late_ms']['p99']} ms, "
                    f"guarantee {'held' if row['guarantee'] else 'BROKEN'}"))
    summary = summarize(rows)
    return {"headline": {"atp_jct_under_loss_over_ideal": {p: v["worst"] for p, v in summary.items()}},
            "summary": summary, "rows": rows, "seconds": time.monotonic() - t0,
            "machine": {"loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                        "relay_late_ms_p99_max": max((r["relay_late_ms"]["p99"] or 0.0 for r in rows
                                                      if "relay_late_ms" in r), default=None)},
            "setup": {"rate_bps": RATE_BPS, "one_way_delay_s": DELAY_S, "queue_packets": QUEUE_PACKETS,
                      "messages": MESSAGES, "size": SIZE, "msrs": MSRS, "burst": BURST, "seeds": list(seeds)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.bench.loss", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    res = run(tuple(args.seeds))
    print(json.dumps({"headline": res["headline"], "summary": res["summary"]}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
