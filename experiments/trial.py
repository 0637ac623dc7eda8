"""One trial on a testbed: start receivers, background traffic and senders, wait, collect unified metrics.

A *trial* runs a set of jobs (``JobPlan``: sender host, receiver host, workload, MSR) with one protocol:

| protocol | sender | receiver |
|---|---|---|
| ``atp`` (+ variants) | ``experiments.atp_job send`` (hostlib.api) | ``experiments.atp_job recv`` |
| ``tcp-es``, ``tcp-ss`` | ``experiments.baselines tcp-send`` | ``experiments.baselines tcp-recv`` |
| ``udp`` | ``experiments.baselines udp-send`` at line rate | ``experiments.baselines udp-recv`` |

plus optional background UDP blasts (``Background``) and non-approximate request flows (``FlowLoad``),
and returns per-job metrics with the same names for every protocol:

- ``delivered_bytes_frac``: payload bytes delivered / job bytes (MSR counts *messages*: with MRDF, ATP
  meets it with the smallest messages first, so with skewed sizes it moves fewer bytes than EarlySend),
- ``jct_s``: job completion time (ATP: the sender's completion policy; TCP: the receiver's stop byte
  reached the sender; UDP: sender start -> the receiver held ceil(MSR*N) complete messages; ``None`` when
  the job did not complete),
- ``msr_met`` (bool), ``delivered`` (messages), ``msg_loss`` (ATP: messages given up / N),
- ``pkt_loss`` (ATP: packets lost / sent; UDP: 1 - received / sent; TCP: retransmitted / sent segments),
- ``bound_s``: MSR x job bytes x 8 / bottleneck rate (= MSR*N*size/rate for equal sizes), and
  ``jct_over_bound`` = JCT / bound_s; ``strict_bound_s``: the ceil(MSR*N) smallest messages' bytes at
  line rate (``lower_bound_s()``), a bound no scheme can beat even by picking the smallest messages;
  ``wire_bound_s``: the line time of the ceil(MSR*N) smallest messages as ATP puts them on the wire (each
  packet with its ATP, UDP, IPv4 and Ethernet headers, ``wire_bound_s()``): the physical bound of an ATP job,
  and ``jct_over_wire_bound`` = JCT / wire_bound_s.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from netapprox.experiments.baselines import TCP_DEFAULT_PORT, UDP_DEFAULT_PORT, msr_target
from netapprox.experiments.harness import Proc, Testbed, read_json, read_json_lines
from netapprox.experiments.jobs import Flow, JobWorkload
from netapprox.experiments.results import flow_fct_stats  # noqa: F401 - where the runner and ddp take it from
from netapprox.hostlib.wire import DEFAULT_ATP_PORT as ATP_PORT

# ATP variants: protocol name -> hostlib AtpConfig knobs (ATP_FixPrio also needs a static switch,
# see experiments.runner).
ATP_VARIANTS: dict[str, dict[str, Any]] = {
    "atp": {"mode": "adaptive", "mrdf": True},
    "atp-paper": {"mode": "paper", "mrdf": True},
    "atp-full": {"mode": "full", "mrdf": True},
    "atp-fixprio": {"mode": "full", "mrdf": True},
    "atp-base": {"mode": "base", "mrdf": False},
    "atp-rc": {"mode": "fixtlr", "mrdf": False},
    "atp-mrdf": {"mode": "fixtlr", "mrdf": True},
    "atp-fixtlr": {"mode": "fixtlr", "mrdf": True},
    "atp-early": {"mode": "paper", "mrdf": True, "completion": "early"},
    "atp-all-sent": {"mode": "adaptive", "mrdf": True, "completion": "all_sent"},
}
BASELINES = ("tcp-es", "tcp-ss", "udp")
START_LEAD_S = 0.4
START_LEAD_PER_PROGRAM_S = 0.15
"""The start line is this far in the future when the programs are launched (process start-up, ~0.3 s of
CPU each on two shared cores, overlaps the wait)."""
PROTOCOLS = tuple(ATP_VARIANTS) + BASELINES


@dataclasses.dataclass(frozen=True)
class JobPlan:
    job_id: int
    src: int
    dst: int
    workload: JobWorkload
    msr: float
    delay_s: float = 0.0
    """Start this long after the trial's senders start."""


@dataclasses.dataclass(frozen=True)
class Background:
    """A paced UDP blast from ``src`` to ``dst``: non-approximate (queue 0) or APPROX with ``tlr``."""

    src: int
    dst: int
    rate_bps: float
    duration_s: float
    tlr: float | None = None
    delay_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class FlowLoad:
    """Non-approximate TCP request flows from ``src`` to ``dst`` with the given schedule."""

    src: int
    dst: int
    flows: tuple[Flow, ...]
    port: int = 5800


def _bg_port(b: "Background", i: int) -> int:
    return ATP_PORT if b.tlr is not None else UDP_DEFAULT_PORT + 1 + i


def _is_atp(protocol: str) -> bool:
    return protocol in ATP_VARIANTS


def _rate_arg(bps: float) -> str:
    return f"{bps / 1e6:g}M"


def run_trial(tb: Testbed, protocol: str, plans: Sequence[JobPlan], *, name: str, timeout: float = 60.0,
              background: Sequence[Background] = (), flows: Sequence[FlowLoad] = (),
              warmup_s: float = 0.0) -> dict:
    """Run ``plans`` with ``protocol`` on ``tb``; return {"jobs": [...metrics...], "flows": [...], ...}."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    wd = tb.workdir / name
    if wd.exists():  # a previous run's ready files and summaries must not be mistaken for this run's
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    rate_bps = tb.config.rate_mbit * 1e6
    receivers: dict[int, Proc] = {}
    rx_json: dict[int, Path] = {}
    by_dst: dict[int, list[JobPlan]] = {}
    for p in plans:
        by_dst.setdefault(p.dst, []).append(p)

    # 1. receivers
    for dst, ps in by_dst.items():
        out = wd / f"rx{dst}.json"
        ready = wd / f"rx{dst}.ready"
        rx_json[dst] = out
        if _is_atp(protocol):
            args = ["recv", f"{tb.ip(dst)}:{ATP_PORT}", "--jobs", str(len(ps)), "--timeout", str(timeout), "--json", str(out)]
            receivers[dst] = tb.start_py(dst, "netapprox.experiments.atp_job", args, f"{name}-rx{dst}")
        elif protocol in ("tcp-es", "tcp-ss"):
            args = ["tcp-recv", f"{tb.ip(dst)}:{TCP_DEFAULT_PORT}", "--jobs", str(len(ps)), "--timeout", str(timeout),
                    "--json", str(out), "--ready-file", str(ready)]
            receivers[dst] = tb.start_py(dst, "netapprox.experiments.baselines", args, f"{name}-rx{dst}")
            tb.wait_file(ready)
        else:
            n = ps[0].workload.n
            args = ["udp-recv", f"{tb.ip(dst)}:{UDP_DEFAULT_PORT}", "--jobs", str(len(ps)), "--timeout", str(timeout),
                    "--msr", str(ps[0].msr), "--n", str(n), "--json", str(out), "--ready-file", str(ready)]
            receivers[dst] = tb.start_py(dst, "netapprox.experiments.baselines", args, f"{name}-rx{dst}")
            tb.wait_file(ready)
    flow_servers: list[Proc] = []
    flow_clients: list[tuple[Proc, Path, FlowLoad]] = []
    span = max([b.duration_s + b.delay_s for b in background] + [max((f.start_s for f in fl.flows), default=0)
                                                                  for fl in flows] + [0.0])
    for i, fl in enumerate(flows):
        ready = wd / f"fsrv{i}.ready"
        flow_servers.append(tb.start_py(fl.dst, "netapprox.experiments.flows",
                                        ["server", f"{tb.ip(fl.dst)}:{fl.port}", "--duration",
                                         str(span + timeout + 5), "--ready-file", str(ready)], f"{name}-fsrv{i}"))
        tb.wait_file(ready)
    bg_rx: list[tuple[Proc, Path]] = []
    # Approximate-looking background must use the ATP port to be queued by TLR; it goes to a second
    # address of the receiving host (same switch port), so no ATP receiver socket sees it. Segments to
    # the same (host, port) share one receiver that counts them as separate jobs.
    bg_ports = [_bg_port(b, i) for i, b in enumerate(background)]
    groups: dict[tuple[int, int], list[Background]] = {}
    for b, port in zip(background, bg_ports):
        groups.setdefault((b.dst, port), []).append(b)
    for i, ((dst, port), bs) in enumerate(groups.items()):
        ready = wd / f"bgrx{i}.ready"
        out = wd / f"bgrx{i}.json"
        span_b = max(b.duration_s + b.delay_s for b in bs)
        bg_rx.append((tb.start_py(dst, "netapprox.experiments.baselines",
                                  ["udp-recv", f"{tb.alias_ip(dst)}:{port}", "--jobs", str(len(bs)),
                                   "--timeout", str(span_b + timeout), "--json", str(out), "--ready-file", str(ready)],
                                  f"{name}-bgrx{i}"), out))
        tb.wait_file(ready)
    if _is_atp(protocol):
        for dst in by_dst:
            tb.wait_bound(dst, ATP_PORT)

    # 2. background, flows and jobs, all from one start line (experiments.hostprog): every program is
    # launched first and waits for ``t_start``, so start-up costs do not stagger an "all at once" pattern.
    launches = len(background) + len(flows) + len(plans)
    t_start = time.time() + START_LEAD_S + START_LEAD_PER_PROGRAM_S * launches
    bg_tx = []
    for i, (b, port) in enumerate(zip(background, bg_ports)):
        args = ["udp-send", f"{tb.alias_ip(b.dst)}:{port}", "--rate", str(b.rate_bps), "--duration", str(b.duration_s),
                "--n", "50", "--fixed-size", "1368", "--job-id", str(900000 + i),
                "--json", str(wd / f"bgtx{i}.json"), "--start-at", repr(t_start + b.delay_s)]
        if b.tlr is not None:
            args += ["--tlr", str(b.tlr)]
        bg_tx.append(tb.start_py(b.src, "netapprox.experiments.baselines", args, f"{name}-bgtx{i}"))
    for i, fl in enumerate(flows):
        sched = wd / f"flows{i}.json"
        sched.write_text(json.dumps([dataclasses.asdict(f) for f in fl.flows]))
        out = wd / f"fcli{i}.json"
        flow_clients.append((tb.start_py(fl.src, "netapprox.experiments.flows",
                                         ["client", f"{tb.ip(fl.dst)}:{fl.port}", "--schedule", str(sched),
                                          "--timeout", str(timeout), "--json", str(out),
                                          "--start-at", repr(t_start)], f"{name}-fcli{i}"), out, fl))
    senders: list[tuple[Proc, Path, JobPlan, Path]] = []
    for p in plans:
        job_file = wd / f"job{p.job_id}.json"
        job_file.write_text(json.dumps(p.workload.to_dict()))
        out = wd / f"tx{p.job_id}.json"
        timeline = wd / f"timeline{p.job_id}.jsonl"
        start = ["--start-at", repr(t_start + warmup_s + p.delay_s)]
        if _is_atp(protocol):
            v = ATP_VARIANTS[protocol]
            args = ["send", f"{tb.ip(p.dst)}:{ATP_PORT}", "--job", str(job_file), "--job-id", str(p.job_id),
                    "--msr", str(p.msr), "--mode", v["mode"], "--completion", v.get("completion", "early"),
                    "--rate", _rate_arg(rate_bps), "--json", str(out), "--timeline", str(timeline), *start]
            if not v["mrdf"]:
                args.append("--no-mrdf")
            if tb.controller is not None:
                args += ["--report-to", f"{tb.report_addr[0]}:{tb.report_addr[1]}"]
            module = "netapprox.experiments.atp_job"
        elif protocol in ("tcp-es", "tcp-ss"):
            args = ["tcp-send", f"{tb.ip(p.dst)}:{TCP_DEFAULT_PORT}", "--mode", protocol[-2:], "--msr", str(p.msr),
                    "--job", str(job_file), "--job-id", str(p.job_id), "--seed", str(p.job_id),
                    "--timeout", str(timeout), "--json", str(out), *start]
            module = "netapprox.experiments.baselines"
        else:
            args = ["udp-send", f"{tb.ip(p.dst)}:{UDP_DEFAULT_PORT}", "--rate", str(rate_bps), "--job", str(job_file),
                    "--job-id", str(p.job_id), "--json", str(out), *start]
            module = "netapprox.experiments.baselines"
        senders.append((tb.start_py(p.src, module, args, f"{name}-tx{p.job_id}"), out, p, timeline))

    # 3. wait
    lead = max(0.0, t_start - time.time()) + warmup_s
    codes = tb.wait_all([s[0] for s in senders], lead + timeout + max((p.delay_s for p in plans), default=0) + 10)
    rx_codes = tb.wait_all(list(receivers.values()), 15)
    fl_codes = tb.wait_all([c[0] for c in flow_clients], max(0.0, t_start - time.time()) + timeout + span + 10)
    for s in flow_servers:
        tb.stop(s)
    bg_codes = tb.wait_all(bg_tx, max(0.0, t_start - time.time()) + span + 10)
    tb.wait_all([r for r, _ in bg_rx], 15)
    t_end = time.time()

    # 4. collect
    rx_by_dst = {dst: read_json(path) or {} for dst, path in rx_json.items()}
    jobs = []
    for (proc, out, plan, timeline), code in zip(senders, codes):
        tx = read_json(out)
        rx_jobs = rx_by_dst.get(plan.dst, {}).get("jobs", [])
        rx = next((j for j in rx_jobs if j.get("job_id") == plan.job_id), None)
        m = job_metrics(protocol, plan, tx, rx, rate_bps)
        m["exit_code"] = code
        if tx is None:
            m["error"] = proc.tail(600)
        if _is_atp(protocol):
            m["timeline"] = read_json_lines(timeline)
        jobs.append(m)
    flow_rows = []
    for (proc, out, fl), code in zip(flow_clients, fl_codes):
        res = read_json(out) or {}
        for f in res.get("flows", []):
            f["src"], f["dst"] = fl.src, fl.dst
            flow_rows.append(f)
    bg_rows = [read_json(p) for _, p in bg_rx]
    bg_sent = [read_json(wd / f"bgtx{i}.json") for i in range(len(background))]
    return {"protocol": protocol, "jobs": jobs, "flows": flow_rows, "background": bg_rows, "background_tx": bg_sent,
            "start_wall": t_start, "end_wall": t_end, "receiver_exit_codes": rx_codes, "background_exit_codes": bg_codes}


def job_metrics(protocol: str, plan: JobPlan, tx: dict | None, rx: dict | None, rate_bps: float) -> dict:
    """Unified per-job metrics from the sender's and receiver's JSON summaries (see module docstring)."""
    n = plan.workload.n
    bound = plan.msr * plan.workload.total_bytes * 8 / rate_bps
    m: dict[str, Any] = {"job_id": plan.job_id, "src": plan.src, "dst": plan.dst, "msr": plan.msr, "n": n,
                         "bytes": plan.workload.total_bytes, "bound_s": bound,
                         "strict_bound_s": lower_bound_s(plan.workload, plan.msr, rate_bps),
                         "wire_bound_s": wire_bound_s(plan.workload, plan.msr, rate_bps), "jct_s": None,
                         "msr_met": False, "delivered": None, "msg_loss": None, "pkt_loss": None}
    if tx is None:
        return m
    m["start_wall"] = tx.get("start_wall")
    m["late_start_s"] = tx.get("late_start_s")
    if _is_atp(protocol):
        groups = tx.get("groups") or []
        delivered = sum(g.get("delivered", 0) for g in groups)
        lost = sum(g.get("lost", 0) for g in groups)
        sent = tx.get("packets_sent") or 0
        m.update(jct_s=tx.get("jct_s"), msr_met=bool(tx.get("msr_met")), delivered=delivered,
                 msg_loss=lost / n if n else None,
                 pkt_loss=(tx.get("packets_lost", 0) / sent) if sent else None,
                 receiver_confirmed=tx.get("receiver_confirmed"), retransmissions=tx.get("retransmissions"),
                 final_tlr=[g.get("final_tlr") for g in groups])
        if rx is not None and rx.get("lost_ids") is not None:
            lost_bytes = sum(plan.workload.sizes[i] for i in rx["lost_ids"] if 0 <= i < n)
            m["delivered_bytes_frac"] = 1 - lost_bytes / max(1, plan.workload.total_bytes)
    elif protocol in ("tcp-es", "tcp-ss"):
        info = tx.get("tcp_info") or {}
        segs = info.get("segs_out")
        m.update(jct_s=tx.get("jct_s"), msr_met=bool(tx.get("completed")),
                 delivered=(rx or {}).get("delivered"), msg_loss=0.0 if tx.get("completed") else None,
                 pkt_loss=(info.get("total_retrans", 0) / segs) if segs else None, cc=tx.get("cc"))
        if rx is not None and rx.get("bytes_received") is not None:
            # stream bytes include the 8-byte message headers and the 17-byte job header
            payload = rx["bytes_received"] - 17 - 8 * (rx.get("delivered") or 0)
            m["delivered_bytes_frac"] = min(1.0, max(0, payload) / max(1, plan.workload.total_bytes))
    else:
        if rx is not None:
            complete = rx.get("messages_complete", 0)
            tw = rx.get("target_wall")
            m.update(delivered=complete, msr_met=complete >= msr_target(plan.msr, n),
                     msg_loss=1 - complete / n, pkt_loss=rx.get("packet_loss"),
                     jct_s=(tw - tx["start_wall"]) if tw else None)
    if m["jct_s"] is not None and bound > 0:
        m["jct_over_bound"] = m["jct_s"] / bound
        m["jct_over_wire_bound"] = m["jct_s"] / m["wire_bound_s"]
    return m


def lower_bound_s(workload: JobWorkload, msr: float, rate_bps: float) -> float:
    """Physical lower bound of a job's JCT: the ceil(MSR*N) smallest messages' payload at line rate.

    With equal message sizes this is MSR * N * size / rate. Headers are not counted, so no transport
    reaches it (the ratio JCT / bound is >= 1 by construction)."""
    k = msr_target(msr, workload.n)
    return sum(sorted(workload.sizes)[:k]) * 8 / rate_bps


def wire_bound_s(workload: JobWorkload, msr: float, rate_bps: float) -> float:
    """Line time of the ceil(MSR*N) smallest messages as ATP packets: every packet of a message carries at
    most ``AtpConfig().max_payload`` bytes plus its ATP header and ``AtpConfig().overhead_bytes`` of UDP,
    IPv4 and Ethernet headers (what the switch's shaper counts). Acknowledgements, the job announce and
    the FIN are not counted, so no ATP job reaches it."""
    from netapprox.hostlib.config import AtpConfig
    from netapprox.hostlib.wire import HEADER_LEN
    cfg = AtpConfig()
    per_packet = HEADER_LEN + cfg.overhead_bytes
    k = msr_target(msr, workload.n)
    wire = sum(s + max(1, -(-s // cfg.max_payload)) * per_packet for s in sorted(workload.sizes)[:k])
    return wire * 8 / rate_bps


