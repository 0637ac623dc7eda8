"""hostlib benchmark: ATP sender + receiver over loopback next to a raw Python UDP loop, in the same run.

``run(quick=False) -> dict`` (for ``make bench``) or ``python -m netapprox.bench.hostlib [--quick] [--json FILE]``.

For each target rate (20, 100, 200 Mbit/s paced, and unpaced) two transfers of 1400-byte datagrams
cross the loopback interface between two processes:

- ``raw-udp``: a minimal Python loop, ``sendto`` in one process (paced by sleeping until each packet's
  departure time), ``recv_into`` in the other; nothing else.
- ``atp``: ``hostlib.api.send_job`` -> ``hostlib.api.receive_job`` with the default ``AtpConfig`` (``max_rate_bps``
  = the target rate, or 10 Gbit/s unpaced), one job of single-packet messages with MSR 1 (so every
  message is sent and acknowledged; loopback loses nothing), ACKs flowing back.

Per row: packets/s delivered (first to last packet at the receiver for raw UDP; the job's JCT for ATP),
the rate on the wire (datagram + 42 bytes of IPv4/UDP/Ethernet) and its share of the target, and CPU
µs per delivered packet of each process (user + system time of that process while it transferred) and
of both together. ``hostlib_pps_over_raw_udp`` is ATP's unpaced packets/s over raw UDP's unpaced packets/s:
the ceiling hostlib's per-packet work leaves of what Python can push through a socket on this machine.
Both sides share the machine's cores with whatever else runs; compare the two rows of one run.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import select
import socket
import sys
import time
from typing import Any

DATAGRAM = 1400
WIRE_OVERHEAD = 42
RATES_MBIT = (20.0, 100.0, 200.0, None)  # None: unpaced
UNPACED_ATP_RATE = 10e9
_SHORT_SLEEP_S = 0.001


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pace_wait(until: float) -> None:
    """Sleep until ``until`` (monotonic): the same two-step wait hostlib.api uses (sleep < 1 ms, else select)."""
    delay = until - time.monotonic()
    if delay <= 0:
        return
    if delay <= _SHORT_SLEEP_S:
        time.sleep(delay)
    else:
        select.select([], [], [], delay)


# -- raw UDP --------------------------------------------------------------------------------------------

def _raw_receiver(port_q: Any, out_q: Any, count: int, idle_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("127.0.0.1", 0))
    port_q.put(sock.getsockname()[1])
    buf = bytearray(65535)
    got = 0
    sock.settimeout(10.0)
    try:
        sock.recv_into(buf)
    except socket.timeout:
        out_q.put({"received": 0})
        return
    first = time.monotonic()
    cpu0 = _cpu_s()
    got = 1
    last = first
    sock.settimeout(idle_s)
    while got < count:
        try:
            sock.recv_into(buf)
        except socket.timeout:
            break
        got += 1
        last = time.monotonic()
    out_q.put({"received": got, "seconds": last - first, "cpu_s": _cpu_s() - cpu0})
    sock.close()


def _raw_sender(port: int, out_q: Any, count: int, rate_bps: float | None) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    payload = bytes(DATAGRAM)
    addr = ("127.0.0.1", port)
    gap = None if rate_bps is None else (DATAGRAM + WIRE_OVERHEAD) * 8 / rate_bps
    sent = 0
    cpu0 = _cpu_s()
    t0 = time.monotonic()
    for i in range(count):
        if gap is not None:
            _pace_wait(t0 + i * gap)
        try:
            sock.sendto(payload, addr)
            sent += 1
        except OSError:
            pass
    out_q.put({"sent": sent, "seconds": time.monotonic() - t0, "cpu_s": _cpu_s() - cpu0})
    sock.close()


# -- ATP ------------------------------------------------------------------------------------------------

def _atp_receiver(port_q: Any, out_q: Any, timeout: float) -> None:
    from netapprox.hostlib import api
    from netapprox.hostlib.config import AtpConfig

    ep = api.ReceiverEndpoint(("127.0.0.1", 0), config=AtpConfig(), accept_jobs=1)
    port_q.put(ep.bound[1])
    try:
        cpu0 = _cpu_s()
        res = ep.serve(jobs=1, timeout=timeout, linger_s=0.05)[0]
        out_q.put({"delivered": res.delivered, "packets": res.packets, "cpu_s": _cpu_s() - cpu0})
    except Exception as exc:  # reported in the row, never silently
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        ep.close()


def _atp_sender(port: int, out_q: Any, count: int, rate_bps: float | None) -> None:
    from netapprox.hostlib import api
    from netapprox.hostlib.config import AtpConfig, JobSpec

    from netapprox.hostlib import wire
    job = JobSpec.uniform(4242, messages=count, size=DATAGRAM - wire.HEADER_LEN, msr=1.0)
    cfg = AtpConfig(max_rate_bps=UNPACED_ATP_RATE if rate_bps is None else rate_bps, packet_size=DATAGRAM)
    try:
        cpu0 = _cpu_s()
        s = api.send_job(("127.0.0.1", port), job, config=cfg, timeout=60)
        out_q.put({"jct_s": s.jct_s, "packets_sent": s.packets_sent, "retransmissions": s.retransmissions,
                   "cpu_s": _cpu_s() - cpu0, "delivered": sum(g.delivered for g in s.groups)})
    except Exception as exc:
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})


def _pair(receiver, r_args, sender, s_args) -> tuple[dict, dict]:
    ctx = mp.get_context("fork")
    port_q, rx_q, tx_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    rx = ctx.Process(target=receiver, args=(port_q, rx_q, *r_args))
    rx.start()
    tx = None
    try:
        port = port_q.get(timeout=20)
        tx = ctx.Process(target=sender, args=(port, tx_q, *s_args))
        tx.start()
        t = tx_q.get(timeout=120)
        r = rx_q.get(timeout=120)
        return t, r
    finally:
        for p in (tx, rx):
            if p is not None:
                p.join(timeout=10)
                if p.is_alive():
                    p.terminate()
                    p.join()


def _row(kind: str, rate_mbit: float | None, packets: int, seconds: float | None, cpu_tx: float | None,
         cpu_rx: float | None, **extra: Any) -> dict:
    pps = packets / seconds if seconds else None
    mbit = pps * (DATAGRAM + WIRE_OVERHEAD) * 8 / 1e6 if pps else None
    row = {"transport": kind, "target_mbit": rate_mbit, "packets": packets, "seconds": seconds,
           "pps": pps, "mbit": mbit, "share_of_target": (mbit / rate_mbit) if mbit and rate_mbit else None,
           "cpu_us_per_pkt_sender": cpu_tx * 1e6 / packets if packets and cpu_tx is not None else None,
           "cpu_us_per_pkt_receiver": cpu_rx * 1e6 / packets if packets and cpu_rx is not None else None}
    if row["cpu_us_per_pkt_sender"] is not None and row["cpu_us_per_pkt_receiver"] is not None:
        row["cpu_us_per_pkt"] = row["cpu_us_per_pkt_sender"] + row["cpu_us_per_pkt_receiver"]
    row.update(extra)
    return row


def measure_raw(rate_mbit: float | None, count: int) -> dict:
    rate = None if rate_mbit is None else rate_mbit * 1e6
    t, r = _pair(_raw_receiver, (count, 0.5), _raw_sender, (count, rate))
    got = r.get("received", 0)
    return _row("raw-udp", rate_mbit, got, r.get("seconds"), t.get("cpu_s"), r.get("cpu_s"), sent=t.get("sent"))


def measure_atp(rate_mbit: float | None, count: int) -> dict:
    rate = None if rate_mbit is None else rate_mbit * 1e6
    t, r = _pair(_atp_receiver, (90.0,), _atp_sender, (count, rate))
    if "error" in t or "error" in r:
        return {"transport": "atp", "target_mbit": rate_mbit, "error": t.get("error") or r.get("error")}
    return _row("atp", rate_mbit, t["delivered"], t["jct_s"], t["cpu_s"], r["cpu_s"], packets_sent=t["packets_sent"],
                retransmissions=t["retransmissions"])


def run(quick: bool = False) -> dict:
    """Measure every row; returns ``{"rows": [...], "hostlib_pps_over_raw_udp": float | None, ...}``."""
    seconds = 0.5 if quick else 2.0
    rows = []
    for rate_mbit in RATES_MBIT:
        # enough packets for ``seconds`` at the target rate (unpaced: what ~60k pps would send)
        pps_target = 60_000 if rate_mbit is None else rate_mbit * 1e6 / ((DATAGRAM + WIRE_OVERHEAD) * 8)
        count = max(500, int(pps_target * seconds))
        rows.append(measure_raw(rate_mbit, count))
        rows.append(measure_atp(rate_mbit, count if rate_mbit is not None else count // 4))
    raw = next((r for r in rows if r["transport"] == "raw-udp" and r["target_mbit"] is None), {})
    atp = next((r for r in rows if r["transport"] == "atp" and r["target_mbit"] is None), {})
    ratio = atp["pps"] / raw["pps"] if atp.get("pps") and raw.get("pps") else None
    return {"name": "hostlib", "datagram_bytes": DATAGRAM, "rows": rows, "hostlib_pps_over_raw_udp": ratio,
            "cpus": os.cpu_count(), "quick": quick}


def format_table(result: dict) -> str:
    def f(x: Any, nd: int = 1) -> str:
        return "n/a" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)

    lines = ["| transport | target | packets/s | Mbit/s | share | CPU µs/pkt sender | receiver | total |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        target = "unpaced" if r["target_mbit"] is None else f"{r['target_mbit']:g} Mbit/s"
        if "error" in r:
            lines.append(f"| {r['transport']} | {target} | error: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['transport']} | {target} | {f(r['pps'], 0)} | {f(r['mbit'])} | "
                     f"{f(r['share_of_target'], 2)} | {f(r['cpu_us_per_pkt_sender'])} | "
                     f"{f(r['cpu_us_per_pkt_receiver'])} | {f(r.get('cpu_us_per_pkt'))} |")
    lines.append("")
    lines.append(f"ATP packets/s / raw UDP packets/s, unpaced: {f(result['hostlib_pps_over_raw_udp'], 3)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.bench.hostlib", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter transfers (~0.5 s per row)")
    p.add_argument("--json", help="also write the result as JSON to this file")
    args = p.parse_args(argv)
    result = run(quick=args.quick)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
