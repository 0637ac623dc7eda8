"""hostlib benchmark: one ATP sender -> receiver pair over loopback next to raw UDP loops, in the same run.

``run(quick=False, progress=print) -> dict`` (for ``make bench``) or
``python -m netapprox.bench.hostlib [--quick] [--json FILE]``.

Every row moves 1400-byte datagrams between two processes (one core each at most: both are single-threaded):

- ``raw-batched``: the denominator. A Python loop that sends prepared datagrams through the same batching
  primitives hostlib's native path uses (``_native.send_batch``: UDP GSO for runs of equal-size datagrams,
  sendmmsg) and receives them through them (``_native.recv_batch``: recvmmsg, GRO super-datagrams split),
  keeping every datagram as a ``bytes`` (as an application would). Unpaced.
- ``raw-udp``: the plain socket-module loop (``sendto`` / ``recv_into`` per datagram), for context.
- ``atp``: ``hostlib.api.send_job`` -> ``ReceiverEndpoint.serve`` with the native cores (hostlib/core.py) and the
  default ``AtpConfig`` (``max_rate_bps`` = the target rate, or 100 Gbit/s unpaced), one job of single-packet
  messages with MSR 1, so every message is sent, acknowledged and handed to the application.
- ``atp-python``: the same with the pure-Python reference cores.

Per row: packets (messages) per second (first to last packet at the receiver for raw UDP; the job's JCT for
ATP), the rate on the wire (datagram + 42 bytes of IPv4/UDP/Ethernet) and its share of the target, the goodput
(payload bits per second), and each process's CPU (user + system) per packet and as a share of one core.

Headline: ``hostlib_pps_over_raw_udp`` is native ATP's unpaced packets/s over ``raw-batched``'s, and
``hostlib_loopback_gbps`` native ATP's unpaced goodput, both the median over back-to-back pairs. Both sides share
the machine's cores with whatever else runs; compare the rows of one run (the result records the load average).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import resource
import select
import socket
import subprocess
import sys
import time
from typing import Any, Callable

from netapprox.hostlib import api, core, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message

DATAGRAM = 1400
WIRE_OVERHEAD = 42
UNPACED_ATP_RATE = 100e9
_SHORT_SLEEP_S = 0.001
_BATCH = 64


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


def _udp(bind: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    if bind:
        sock.bind(("127.0.0.1", 0))
    return sock


# -- raw UDP, socket module -------------------------------------------------------------------------------------

def _raw_receiver(port_q: Any, out_q: Any, count: int, idle_s: float) -> None:
    sock = _udp(True)
    port_q.put(sock.getsockname()[1])
    buf = bytearray(65535)
    sock.settimeout(10.0)
    try:
        sock.recv_into(buf)
    except socket.timeout:
        out_q.put({"received": 0})
        return
    first = last = time.monotonic()
    cpu0 = _cpu_s()
    got = 1
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
    sock = _udp(False)
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


# -- raw UDP, the native batching primitives -----------------------------------------------------------------------

def _batched_receiver(port_q: Any, out_q: Any, count: int, idle_s: float) -> None:
    from netapprox.hostlib import _native  # noqa: PLC0415 - the optional C extension; its rows say when it is missing
    sock = _udp(True)
    _native.enable_gro(sock)
    port_q.put(sock.getsockname()[1])
    fd = sock.fileno()
    kept: list[bytes] = []
    if not select.select([sock], [], [], 10.0)[0]:
        out_q.put({"received": 0})
        return
    first = last = time.monotonic()
    cpu0 = _cpu_s()
    while len(kept) < count:
        if not select.select([sock], [], [], idle_s)[0]:
            break
        for data, _addr, _ce in _native.recv_batch(fd, 16):
            kept.append(data)
        last = time.monotonic()
    out_q.put({"received": len(kept), "seconds": last - first, "cpu_s": _cpu_s() - cpu0})
    sock.close()


def _batched_sender(port: int, out_q: Any, count: int, rate_bps: float | None) -> None:
    from netapprox.hostlib import _native  # noqa: PLC0415 - the optional C extension
    sock = _udp(False)
    addr = ("127.0.0.1", port)
    datagrams = [((i % 256).to_bytes(1, "big") * DATAGRAM, addr) for i in range(_BATCH)]
    fd = sock.fileno()
    sent = 0
    cpu0 = _cpu_s()
    t0 = time.monotonic()
    while sent < count:
        n = min(_BATCH, count - sent)
        _native.send_batch(fd, datagrams[:n])
        sent += n
    out_q.put({"sent": sent, "seconds": time.monotonic() - t0, "cpu_s": _cpu_s() - cpu0})
    sock.close()


# -- ATP ---------------------------------------------------------------------------------------------------------

def use_cores(impl: str) -> None:
    """Run the ``impl`` cores in this process (the ``cores`` test fixture does the same; bench.loss too)."""
    if impl == "python":
        core.AtpSender, core.AtpReceiver = core.PyAtpSender, core.PyAtpReceiver
    elif core.NativeAtpSender is None:
        raise RuntimeError(f"native cores unavailable: {core.native_error}")
    else:
        core.AtpSender, core.AtpReceiver = core.NativeAtpSender, core.NativeAtpReceiver


def open_receiver(port_q: Any, out_q: Any, impl: str) -> api.ReceiverEndpoint | None:
    """In a benchmark's receiver process: a loopback endpoint for one job on ``impl``'s cores, its port put on
    ``port_q``; None (and the error on ``out_q``, never silently) when it cannot be opened."""
    try:
        use_cores(impl)
        ep = api.ReceiverEndpoint(("127.0.0.1", 0), config=AtpConfig(), accept_jobs=1)
    except Exception as exc:  # reported in the row, never silently
        port_q.put(None)
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
        return None
    port_q.put(ep.bound[1])
    return ep


def _atp_receiver(port_q: Any, out_q: Any, impl: str, timeout: float) -> None:
    ep = open_receiver(port_q, out_q, impl)
    if ep is None:
        return
    try:
        cpu0 = _cpu_s()
        res = ep.serve(jobs=1, timeout=timeout, linger_s=0.05)[0]
        out_q.put({"delivered": res.delivered, "packets": res.packets, "cpu_s": _cpu_s() - cpu0})
    except Exception as exc:
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        ep.close()


def _atp_sender(port: int, out_q: Any, impl: str, count: int, rate_bps: float | None) -> None:
    payload = b"\xa5" * (DATAGRAM - wire.HEADER_LEN)
    job = JobSpec(job_id=4242, messages=tuple(Message(payload) for _ in range(count)), msr=1.0)
    cfg = AtpConfig(max_rate_bps=UNPACED_ATP_RATE if rate_bps is None else rate_bps, packet_size=DATAGRAM)
    try:
        use_cores(impl)
        cpu0 = _cpu_s()
        s = api.send_job(("127.0.0.1", port), job, config=cfg, timeout=120)
        out_q.put({"jct_s": s.jct_s, "packets_sent": s.packets_sent, "retransmissions": s.retransmissions,
                   "cpu_s": _cpu_s() - cpu0, "delivered": sum(g.delivered for g in s.groups),
                   "losses_found_by": dict(s.losses_found_by), "srtt_s": s.srtt_s})
    except Exception as exc:
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})


def _pair(receiver: Callable, r_args: tuple, sender: Callable, s_args: tuple) -> tuple[dict, dict]:
    ctx = mp.get_context("fork")
    port_q, rx_q, tx_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    rx = ctx.Process(target=receiver, args=(port_q, rx_q, *r_args))
    rx.start()
    tx = None
    try:
        port = port_q.get(timeout=20)
        if port is None:
            return {}, rx_q.get(timeout=20)
        tx = ctx.Process(target=sender, args=(port, tx_q, *s_args))
        tx.start()
        t = tx_q.get(timeout=180)
        r = rx_q.get(timeout=180)
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
    payload = DATAGRAM - 32 if kind.startswith("atp") else DATAGRAM
    row = {"transport": kind, "target_mbit": rate_mbit, "packets": packets, "seconds": seconds,
           "pps": pps, "mbit": mbit, "share_of_target": (mbit / rate_mbit) if mbit and rate_mbit else None,
           "goodput_gbps": pps * payload * 8 / 1e9 if pps else None,
           "cpu_us_per_pkt_sender": cpu_tx * 1e6 / packets if packets and cpu_tx is not None else None,
           "cpu_us_per_pkt_receiver": cpu_rx * 1e6 / packets if packets and cpu_rx is not None else None,
           "cores_sender": cpu_tx / seconds if seconds and cpu_tx is not None else None,
           "cores_receiver": cpu_rx / seconds if seconds and cpu_rx is not None else None}
    if row["cpu_us_per_pkt_sender"] is not None and row["cpu_us_per_pkt_receiver"] is not None:
        row["cpu_us_per_pkt"] = row["cpu_us_per_pkt_sender"] + row["cpu_us_per_pkt_receiver"]
    row.update(extra)
    return row


def measure_raw(rate_mbit: float | None, count: int) -> dict:
    rate = None if rate_mbit is None else rate_mbit * 1e6
    t, r = _pair(_raw_receiver, (count, 0.5), _raw_sender, (count, rate))
    return _row("raw-udp", rate_mbit, r.get("received", 0), r.get("seconds"), t.get("cpu_s"), r.get("cpu_s"),
                sent=t.get("sent"))


def measure_batched(count: int) -> dict:
    t, r = _pair(_batched_receiver, (count, 0.5), _batched_sender, (count, None))
    return _row("raw-batched", None, r.get("received", 0), r.get("seconds"), t.get("cpu_s"), r.get("cpu_s"),
                sent=t.get("sent"))


def measure_atp(rate_mbit: float | None, count: int, impl: str = "native") -> dict:
    rate = None if rate_mbit is None else rate_mbit * 1e6
    kind = "atp" if impl == "native" else "atp-python"
    t, r = _pair(_atp_receiver, (impl, 120.0), _atp_sender, (impl, count, rate))
    if "error" in t or "error" in r:
        return {"transport": kind, "target_mbit": rate_mbit, "error": t.get("error") or r.get("error")}
    return _row(kind, rate_mbit, t["delivered"], t["jct_s"], t["cpu_s"], r["cpu_s"],
                packets_sent=t["packets_sent"], retransmissions=t["retransmissions"],
                losses_found_by=t.get("losses_found_by"), srtt_s=t.get("srtt_s"))


def _job_under(attacker: list[str], ready: str, messages: int) -> dict:
    """A job's JCT alone, twice while ``python -m <attacker...>`` (a module of tests/support, run from the checkout)
    attacks its receiver (an ``atp-recv --serve`` process with a 32 MiB budget), and alone again. ``ready``: the
    line the attacker prints once its attack is under way. One job of ``messages`` 1368-byte messages (MSR 0.9,
    20 Mbit/s) each time. ``ratio``: mean JCT under attack / mean JCT alone (the unit tests assert only counts
    and bounds)."""
    repo = pathlib.Path(__file__).resolve().parents[1]
    if not (repo / "tests" / "support" / (attacker[0].split(".")[-1] + ".py")).exists():
        return {"error": f"needs a source checkout (tests/support/{attacker[0].split('.')[-1]}.py)"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rx = subprocess.Popen([sys.executable, "-m", "netapprox.hostlib", "recv", "--serve", "--bind", "127.0.0.1",
                           "--port", str(port), "--memory-budget-mb", "32"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    attack = None
    try:
        def job(job_id: int) -> float:
            summary = api.send_job(("127.0.0.1", port), JobSpec.uniform(job_id, messages=messages, size=1368,
                                                                        msr=0.9),
                                   config=AtpConfig(max_rate_bps=20e6), timeout=60)
            if not summary.msr_met():
                raise RuntimeError(f"job {job_id} missed its MSR")
            return summary.jct_s

        deadline = time.monotonic() + 10
        while True:  # the receiver is up once a job goes through
            try:
                alone = [job(77)]
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        env = dict(os.environ, PYTHONPATH=str(repo / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        attack = subprocess.Popen([sys.executable, "-m", attacker[0], "127.0.0.1", str(port), *attacker[1:]],
                                  cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if attack.stdout.readline().strip() != ready:
            return {"error": f"the attacker stopped before it printed {ready!r}"}
        attacked = [job(78), job(79)]
        attack.terminate()
        attack.communicate(timeout=30)
        alone.append(job(80))
    except Exception as exc:  # reported in the result, never silently
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for p in (attack, rx):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    mean_alone, mean_attacked = sum(alone) / len(alone), sum(attacked) / len(attacked)
    return {"jct_alone_s": alone, "jct_attacked_s": attacked, "ratio": mean_attacked / mean_alone}


def measure_job_under_flood(messages: int = 2500) -> dict:
    """The setup of tests/hostlib/test_hostlib_hostile_io.py: the flooder tests/support/atp_flood.py at 1,500
    off-path announces/s plus a host parking data in admitted jobs."""
    return _job_under(["support.atp_flood", "--seconds", "120", "--rate", "1500", "--echo", "4", "--echo-rate", "50",
                       "--hold", "600"], "parked", messages)


def measure_job_under_receiver_attacks(messages: int = 2500) -> dict:
    """The setup of tests/hostlib/test_hostlib_bounds_io.py: four admitted addresses (tests/support/atp_attack.py)
    repeating the FIN of a maximal job 2,000 times a second each, finishing 20 maximal jobs a second each and
    sending two 1 MiB manifests a second each that fail their last check."""
    return _job_under(["support.atp_attack", "--seconds", "120", "--sources", "4", "--fins", "2000", "--huge", "20",
                       "--manifests", "2"], "attacking", messages)


def _count(rate_mbit: float | None, seconds: float, unpaced_pps: float) -> int:
    pps = unpaced_pps if rate_mbit is None else rate_mbit * 1e6 / ((DATAGRAM + WIRE_OVERHEAD) * 8)
    return max(500, int(pps * seconds))


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def run(quick: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Measure every row; returns ``{"rows": [...], "headline": {...}, ...}``.

    The unpaced comparison runs as ``reps`` back-to-back pairs (raw-batched, then ATP): each pair gives a ratio,
    the headline is the median ratio and the median ATP goodput (on a shared machine one pair can land in a
    quiet or a busy second; the median of adjacent pairs is what the two loops do under the same load)."""
    seconds = 0.5 if quick else 2.0
    reps = 3 if quick else 5
    rows: list[dict] = []

    def note(label: str, row: dict, t0: float) -> None:
        rows.append(row)
        progress(f"hostlib: {label}: " + (f"error {row['error']}" if "error" in row else
                                          f"{row['pps'] or 0:,.0f} packets/s, {row['goodput_gbps'] or 0:.3f} Gbit/s "
                                          f"goodput ({time.monotonic() - t0:.1f} s)"))

    pairs = []
    for rep in range(reps):
        t0 = time.monotonic()
        raw = measure_batched(_count(None, seconds, 400_000))
        raw["rep"] = rep
        note(f"raw-batched unpaced #{rep + 1}", raw, t0)
        t0 = time.monotonic()
        atp = measure_atp(None, _count(None, seconds, 300_000))
        atp["rep"] = rep
        note(f"atp unpaced #{rep + 1}", atp, t0)
        if atp.get("pps") and raw.get("pps"):
            pairs.append((atp["pps"] / raw["pps"], atp["goodput_gbps"], atp))
    plan: list[tuple[str, Callable[[], dict]]] = [
        ("raw-udp unpaced", lambda: measure_raw(None, _count(None, seconds, 60_000))),
        ("atp-python unpaced", lambda: measure_atp(None, _count(None, seconds / 2, 10_000), "python")),
    ]
    for rate in (20.0, 100.0, 200.0, 1000.0):
        plan.append((f"atp {rate:g} Mbit/s", lambda rate=rate: measure_atp(rate, _count(rate, seconds, 0))))
    plan.append(("atp-python 100 Mbit/s", lambda: measure_atp(100.0, _count(100.0, seconds / 2, 0), "python")))
    plan.append(("raw-udp 100 Mbit/s", lambda: measure_raw(100.0, _count(100.0, seconds, 0))))
    for label, fn in plan:
        t0 = time.monotonic()
        note(label, fn(), t0)
    t0 = time.monotonic()
    flood = measure_job_under_flood(1000 if quick else 2500)
    progress("hostlib: job under an announce flood: " + (f"error {flood['error']}" if "error" in flood else
             f"JCT {flood['ratio']:.2f}x alone ({time.monotonic() - t0:.1f} s)"))
    t0 = time.monotonic()
    attacks = measure_job_under_receiver_attacks(1000 if quick else 2500)
    progress("hostlib: job under an admitted host's receiver attacks: " + (
        f"error {attacks['error']}" if "error" in attacks else
        f"JCT {attacks['ratio']:.2f}x alone ({time.monotonic() - t0:.1f} s)"))

    ratio = _median([p[0] for p in pairs])
    gbps = _median([p[1] for p in pairs])
    atp_pps = _median([p[2]["pps"] for p in pairs])
    py = next((r for r in rows if r["transport"] == "atp-python" and r["target_mbit"] is None and "error" not in r),
              {})
    busiest = [max(p[2].get("cores_sender") or 0, p[2].get("cores_receiver") or 0) for p in pairs]
    return {"name": "hostlib", "datagram_bytes": DATAGRAM, "rows": rows, "cpus": os.cpu_count(), "quick": quick,
            "reps": reps, "unpaced_ratios": [p[0] for p in pairs],
            "hostlib_pps_over_raw_udp": ratio,
            "atp_unpaced_cores_max": max(busiest) if busiest else None,
            "native_over_python_pps": atp_pps / py["pps"] if atp_pps and py.get("pps") else None,
            "load_average": os.getloadavg(), "job_under_flood": flood, "job_under_receiver_attacks": attacks,
            "headline": {"hostlib_pps_over_raw_udp": ratio, "hostlib_loopback_gbps": gbps,
                         "hostlib_jct_under_flood_over_alone": flood.get("ratio"),
                         "hostlib_jct_under_receiver_attacks_over_alone": attacks.get("ratio")}}


def format_table(result: dict) -> str:
    def f(x: Any, nd: int = 1) -> str:
        return "n/a" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)

    lines = ["| transport | target | packets/s | Mbit/s | share | goodput Gbit/s | CPU µs/pkt sender | receiver | "
             "cores sender | receiver |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        target = "unpaced" if r["target_mbit"] is None else f"{r['target_mbit']:g} Mbit/s"
        if "rep" in r:
            target += f" #{r['rep'] + 1}"
        if "error" in r:
            lines.append(f"| {r['transport']} | {target} | error: {r['error']} | | | | | | | |")
            continue
        lines.append(f"| {r['transport']} | {target} | {f(r['pps'], 0)} | {f(r['mbit'])} | "
                     f"{f(r['share_of_target'], 2)} | {f(r['goodput_gbps'], 3)} | {f(r['cpu_us_per_pkt_sender'], 2)} | "
                     f"{f(r['cpu_us_per_pkt_receiver'], 2)} | {f(r['cores_sender'], 2)} | {f(r['cores_receiver'], 2)} |")
    h = result["headline"]
    lines.append("")
    lines.append(f"Unpaced, median of {result['reps']} back-to-back pairs: ATP packets/s / raw batched UDP packets/s "
                 f"{f(h['hostlib_pps_over_raw_udp'], 3)} (pairs: "
                 f"{', '.join(f(x, 2) for x in result['unpaced_ratios'])}); ATP goodput "
                 f"{f(h['hostlib_loopback_gbps'], 3)} Gbit/s; busiest side at most "
                 f"{f(result.get('atp_unpaced_cores_max'), 2)} core; native / pure-Python packets/s "
                 f"{f(result.get('native_over_python_pps'), 1)}; load average "
                 f"{', '.join(f(x, 1) for x in result['load_average'])}")
    for key, what in (("job_under_flood", "while its receiver is flooded with forged announces"),
                      ("job_under_receiver_attacks", "while an admitted host attacks its receiver (FINs, huge jobs, "
                                                     "failing manifests)")):
        m = result.get(key) or {}
        if "ratio" in m:
            lines.append(f"A job's JCT {what} / alone: {f(m['ratio'], 2)} ({', '.join(f(x, 2) for x in m['jct_attacked_s'])}"
                         f" s attacked, {', '.join(f(x, 2) for x in m['jct_alone_s'])} s alone)")
        elif m:
            lines.append(f"A job {what}: error: {m['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.bench.hostlib", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter transfers (~0.5 s per row)")
    p.add_argument("--json", help="also write the result as JSON to this file")
    args = p.parse_args(argv)
    result = run(quick=args.quick, progress=lambda line: print(line, file=sys.stderr))
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
