"""``make demo``: NetApprox end to end on one machine (``python -m netapprox.topo.demo --target kernel|bmv2``).

A Mininet dumbbell (h1..h3 on s1, h4..h6 on s2, one bottleneck s1 -> s2, plus the controller's in-band host
``ctl`` on s1) carries, all across the bottleneck:

- job A (approximate, MSR 0.9) h1 -> h4 and job B (approximate, MSR 0.5) h2 -> h5: ATP (hostlib CLI),
  reporting their TLR every epoch to the controller;
- a non-approximate bulk TCP flow h1 -> h4 (``topo.trafgen tcp-send``: its FCT ends when the receiver confirms
  the last byte), started a few seconds in;
- background load h3 -> h6: approximate ATP DATA with a fixed TLR that steps down over time
  (0.5 -> 0.375 -> 0.25, i.e. queues 4 -> 3 -> 2 on the default thresholds), like the background of
  Fig. 10 of the NetApprox paper; it sends no reports, so the switch places it by its TLR.

The controller runs in this process through its one runtime (``controller.runtime.Runtime``), which programs
every switch (kernel target: ``KernelDriver``; BMv2: ``P4RuntimeDriver``) and reads the hosts' reports (from
a socket in the ``ctl`` host on the kernel target, as packet-in on BMv2); the demo only listens to its
per-epoch callback. The programs on the hosts run through the testbed's ``HostPrograms`` (topo/testbed.py):
every output path is made absolute once, before any host starts, so the demo reads what the hosts write from
any folder and from an installed package. While it runs, a progress line per second; then a table and one
PNG timeline per job in ``results/`` (``--results``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from netapprox.controller.config import ControllerConfig, ReportConfig
from netapprox.controller.kernel import tc
from netapprox.controller.model import queue_for_tlr
from netapprox.controller.errors import BindError
from netapprox.controller.runtime import Runtime
from netapprox.hostlib import checks as C
from netapprox.hostlib import wire
from netapprox.hostlib.config import MAX_MESSAGES
from netapprox.topo.bmv2 import P4_TOOLS_HINT, bmv2_available
from netapprox.topo.net import Emulation, EmulationConfig
from netapprox.topo.netns import stop_on_signals
from netapprox.topo.testbed import HostPrograms, Proc, read_json, read_json_lines
from netapprox.topo.trafgen import parse_schedule

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class DemoJob:
    name: str
    job_id: int
    msr: float
    messages: int
    src: int  # host number
    dst: int


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The experiment ``make demo`` runs."""

    target: str = "kernel"
    """``kernel`` or ``bmv2``."""
    bottleneck_mbit: float = 20.0
    """The s1 -> s2 link: every flow of the demo crosses it."""
    host_mbit: float = 50.0
    """Host links."""
    buffer_packets: int = 64
    """Per-port buffer in packets (queues 1..7 hold 7..1 packets, queue 0 the rest)."""
    jobs: tuple[DemoJob, ...] = (
        DemoJob("A", 101, 0.9, 20000, 1, 4),
        DemoJob("B", 102, 0.5, 20000, 2, 5),
    )
    """The approximate jobs (1368-byte messages, one packet each)."""
    job_rate: str = "25M"
    """R_max of the ATP senders."""
    bulk_bytes: int = 8_000_000
    """The non-approximate TCP flow, bytes."""
    bulk_start_s: float = 8.0
    """When the TCP flow starts, seconds after the jobs."""
    background_mbit: float = 5.0
    """Background load."""
    background_tlr: str = "0:0.5,10:0.375,20:0.25"
    """Background TLR schedule (seconds:TLR)."""
    background_s: float = 40.0
    """How long the background runs (it stops earlier when the jobs are done)."""
    time_limit_s: float = 90.0
    """Give up on the jobs after this long."""
    epoch_s: float = 0.02
    """Controller epoch."""
    results: str = "results"
    """Output directory (a relative path is taken from the caller's folder)."""
    pcap: str | None = None
    """Write one pcap per switch interface into this directory (relative: from the caller's folder)."""
    metrics_port: int = -1
    """Serve the controller's Prometheus metrics on this port (-1: off)."""
    p4_build: str | None = None
    """BMv2 target: the folder holding the compiled program, ``bmv2.json`` and ``p4info.txtpb`` (``make p4`` writes
    build/v1model); ``None``: the checkout's build/v1model."""

    def bmv2_json(self) -> Path:
        return Path(self.p4_build).resolve() / "bmv2.json" if self.p4_build else REPO / "build" / "v1model" / "bmv2.json"


def _log(msg: str) -> None:
    print(msg, flush=True)


class _Timeline:
    """Follows a sender's --timeline JSON-lines file as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = []
        self._pos = 0
        self._partial = ""

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        new = []
        for line in lines:
            if line.strip():
                try:
                    new.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.rows += new
        return new


class Demo:
    def __init__(self, config: DemoConfig) -> None:
        # Every output path, absolute, once: the hosts' programs and this process then mean the same files.
        self.out = Path(config.results).resolve()
        self.cfg = dataclasses.replace(config, results=str(self.out),
                                       pcap=str(Path(config.pcap).resolve()) if config.pcap else None)
        self.programs = HostPrograms(self.out, lambda host, cmd, **kw: host.popen(cmd, **kw))
        self.t0 = 0.0
        self.assign_log: list[tuple[float, dict[int, int]]] = []  # (t since t0, assignments) on change
        self.report_times: dict[tuple[int, int], float] = {}  # (job, sender epoch) -> t since t0
        self.last_drops: list | None = None  # the bottleneck's per-queue stats at the last progress line
        self.emu = None
        self.bulk_span: list[float] = []  # [start, end] of the bulk TCP flow, seconds since t0

    # -- the controller's per-epoch callback ----------------------------------------------------------------
    def on_epoch(self, result) -> None:
        t = time.monotonic() - self.t0
        if not self.assign_log or self.assign_log[-1][1] != dict(result.assignments):
            self.assign_log.append((t, dict(result.assignments)))
        for rep in result.reports:
            self.report_times.setdefault((rep.job_id, rep.epoch), t)

    def bottleneck_stats(self, netns: str | None, ifname: str) -> list:
        """Per-queue statistics of the bottleneck port's traffic manager (its own netlink handle)."""
        ipr = IPRoute(netns=netns, flags=0) if netns else IPRoute()
        try:
            return tc.read_port_stats(ipr, ipr.link_lookup(ifname=ifname)[0])
        finally:
            ipr.close()

    # -- the run ----------------------------------------------------------------------------------------------
    def plan(self) -> list[str]:
        """What the demo runs and where it writes, as the lines it prints first (``--dry-run`` prints only them)."""
        cfg = self.cfg
        lines = [f"NetApprox demo on the {cfg.target} target: dumbbell h1-h3 | s1 ={cfg.bottleneck_mbit:g} Mbit/s=> "
                 f"s2 | h4-h6, host links {cfg.host_mbit:g} Mbit/s, {cfg.buffer_packets}-packet port buffers"]
        lines += [f"  job {j.name} (id {j.job_id}): h{j.src} -> h{j.dst}, {j.messages} messages, MSR {j.msr}"
                  for j in cfg.jobs]
        lines.append(f"  bulk TCP h1 -> h4: {cfg.bulk_bytes / 1e6:g} MB from t = {cfg.bulk_start_s:g} s; background "
                     f"h3 -> h6: {cfg.background_mbit:g} Mbit/s approximate, TLR schedule {cfg.background_tlr}")
        lines.append(f"  results in {self.out}" + (f", captures in {cfg.pcap}" if cfg.pcap else "")
                     + (f", P4 program {cfg.bmv2_json()}" if cfg.target == "bmv2" else ""))
        return lines

    def run(self) -> int:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        for old in self.out.glob("demo-*"):
            old.unlink()
        for line in self.plan():
            _log(line)
        emu_cfg = EmulationConfig(topology="dumbbell", hosts=3, rate_mbit=cfg.host_mbit,
                                  bottleneck_mbit=cfg.bottleneck_mbit, buffer_packets=cfg.buffer_packets,
                                  target=cfg.target, log_dir=str(self.out), pcap=cfg.pcap,
                                  bmv2_json=str(cfg.bmv2_json()))
        t_setup = time.monotonic()
        with Emulation(emu_cfg) as emu:
            self.emu = emu
            ccfg = ControllerConfig(switches=emu.switch_configs(), epoch_s=cfg.epoch_s, counters_every=5,
                                    reports=ReportConfig(rate_per_host=100000.0, burst=10000, key=emu.report_key()),
                                    metrics_port=cfg.metrics_port)
            # Kernel target: hosts report to the ctl host's address; BMv2 punts reports as packet-in.
            sock = emu.report_socket() if cfg.target == "kernel" else None
            with Runtime(ccfg, on_epoch=self.on_epoch, report_socket=sock) as runtime:
                if not runtime.connect(30.0):
                    raise RuntimeError("the controller could not program the switches within 30 s")
                _log(f"network and controller up in {time.monotonic() - t_setup:.1f} s "
                     f"({len(ccfg.switches)} switches, epoch {cfg.epoch_s * 1e3:g} ms)")
                self.t0 = time.monotonic()
                runtime.start()
                try:
                    return self._experiment(emu)
                finally:
                    runtime.stop()
                    self.programs.stop_all()

    # over 100 lines: the demo as a reader follows it: receivers, background, jobs, progress lines, the report
    def _experiment(self, emu) -> int:
        cfg = self.cfg
        hosts = {int(h.name[1:]): h for h in emu.hosts}
        s1 = emu.net.get("s1")
        bottleneck = next(i.name for i in s1.intfList() if i.link and {i.link.intf1.node.name, i.link.intf2.node.name} == {"s1", "s2"})
        bottleneck_ns = s1.netns_name if cfg.target == "kernel" else None
        start = self.programs.start_py
        # Receivers first.
        recv_timeout = str(int(cfg.time_limit_s + 20))
        for j in cfg.jobs:
            start(hosts[j.dst], "netapprox.hostlib", ["recv", "--port", str(wire.DEFAULT_ATP_PORT), "--once",
                                                      "--timeout", recv_timeout,
                                                      "--json", str(self.out / f"demo-recv-{j.name}.json")],
                  f"demo-recv-{j.name}")
        bulk_rx = start(hosts[4], "netapprox.topo.trafgen", ["tcp-recv", "--port", "5201", "--duration",
                                                             str(cfg.time_limit_s + 20)], "demo-bulk-recv")
        bg_rx = start(hosts[6], "netapprox.topo.trafgen", ["recv", "--port", str(wire.DEFAULT_ATP_PORT),
                                                           "--duration", str(cfg.background_s + 5)],
                      "demo-background-recv")
        time.sleep(1.0)
        bg = start(hosts[3], "netapprox.topo.trafgen", ["send", "--dst", hosts[6].IP(), "--atp", "--approx",
                                                        "--job", "999", "--tlr", cfg.background_tlr,
                                                        "--rate-mbit", str(cfg.background_mbit),
                                                        "--duration", str(cfg.background_s)], "demo-background")
        bg_start = time.monotonic() - self.t0
        senders = {}
        timelines = {}
        starts = {}
        for j in cfg.jobs:
            tl = self.out / f"demo-timeline-{j.name}.jsonl"
            timelines[j.name] = _Timeline(tl)
            starts[j.name] = time.monotonic() - self.t0
            senders[j.name] = start(hosts[j.src], "netapprox.hostlib", [
                "send", f"{hosts[j.dst].IP()}:{wire.DEFAULT_ATP_PORT}", "--job-id", str(j.job_id),
                "--messages", str(j.messages), "--msr", str(j.msr), "--rate", cfg.job_rate,
                *emu.report_args, "--timeout", str(int(cfg.time_limit_s)),
                "--json", str(self.out / f"demo-send-{j.name}.json"), "--timeline", str(tl)], f"demo-send-{j.name}")
        jobs_start = min(starts.values())
        bulk: Proc | None = None
        bulk_json = self.out / "demo-bulk-tcp.log"
        _log(f"traffic started (t = 0 is the background start; jobs at t = {jobs_start:.1f} s)")
        _log("   t  | " + " | ".join(f"job {j.name}: TLR  rate Mbit/s  loss  queue" for j in cfg.jobs)
             + " | bottleneck drops per queue 1..7")
        next_print = time.monotonic() + 1.0
        prev_drops = None
        while True:
            now = time.monotonic() - self.t0
            if bulk is None and now >= jobs_start + cfg.bulk_start_s:
                bulk = start(hosts[1], "netapprox.topo.trafgen", ["tcp-send", "--dst", hosts[4].IP(), "--dport", "5201",
                                                                  "--bytes", str(cfg.bulk_bytes)], bulk_json.stem)
                self.bulk_span = [now]
                _log(f"{now:5.1f} | bulk TCP flow started")
            for tl in timelines.values():
                tl.poll()
            if bulk is not None and len(self.bulk_span) == 1 and bulk.poll() is not None:
                self.bulk_span.append(now)
            done = all(p.poll() is not None for p in senders.values())
            if time.monotonic() >= next_print:
                next_print += 1.0
                parts = []
                for j in cfg.jobs:
                    rows = [r for r in timelines[j.name].rows if r["time"] >= timelines[j.name].rows[-1]["time"] - 1.0] \
                        if timelines[j.name].rows else []
                    if senders[j.name].poll() is not None:
                        parts.append(f"{'finished':^36}")
                    elif rows:
                        sent = sum(r["sent"] for r in rows)
                        acked = sum(r["acked"] for r in rows)
                        loss = max(0.0, 1 - acked / sent) if sent else 0.0
                        q = self.queue_of(j.job_id, rows[-1]["tlr"], now, rows[-1].get("queues", {}))
                        parts.append(f"{rows[-1]['tlr']:5.3f} {rows[-1]['rate_bps'] / 1e6:8.2f}   {loss:5.3f}    q{q}   ")
                    else:
                        parts.append(f"{'starting':^36}")
                drops = "-"
                try:
                    self.last_drops = self.bottleneck_stats(bottleneck_ns, bottleneck)
                    cur = [st.drops for st in self.last_drops]
                    base = prev_drops or [0] * len(cur)
                    drops = " ".join(f"{c - b:4d}" for c, b in zip(cur[1:], base[1:]))
                    prev_drops = cur
                except Exception:  # noqa: BLE001 - a progress line never stops the demo
                    pass
                _log(f"{now:5.1f} | " + " | ".join(parts) + f" | {drops}")
            if done and (bulk is None or bulk.poll() is not None):
                break
            if now > cfg.time_limit_s + 10:
                _log("time limit reached; stopping the remaining flows")
                break
            time.sleep(0.1)
        end = time.monotonic() - self.t0
        try:
            self.last_drops = self.bottleneck_stats(bottleneck_ns, bottleneck)
        except Exception:  # noqa: BLE001 - the table then goes without the queue line
            pass
        for p in [bg, bg_rx, bulk_rx]:
            if p.running():
                p.popen.send_signal(signal.SIGINT)  # they print their counts and exit
        time.sleep(0.5)
        for tl in timelines.values():
            tl.poll()
        return self.report(timelines, starts, bg_start, end, bulk_json)

    # -- assigned queue ---------------------------------------------------------------------------------------
    def queue_of(self, job_id: int, tlr: float, t: float, ack_queues: dict) -> int:
        """The queue the switch used for the job at time ``t``. BMv2 stamps it (seen on ACKs); on the kernel
        target it is the controller's job entry, or the TLR table before the first assignment."""
        stamped = {int(k): v for k, v in ack_queues.items() if int(k) != wire.QUEUE_UNSET}
        if stamped:
            return max(stamped, key=stamped.get)
        current = None
        for when, assign in self.assign_log:
            if when > t:
                break
            current = assign.get(job_id)
        return current if current is not None else queue_for_tlr(tlr)

    def sender_offset(self, job: DemoJob, rows: list[dict], launched: float) -> float:
        """t0-relative time of the sender's clock zero: from report arrival times when available (kernel),
        else its launch time."""
        by_epoch = {r["epoch"]: r["time"] for r in rows}
        cands = [t - by_epoch[e] for (jid, e), t in self.report_times.items() if jid == job.job_id and e in by_epoch]
        return min(cands) if cands else launched

    # -- results ----------------------------------------------------------------------------------------------
    def report(self, timelines, starts, bg_start, end, bulk_json: Path) -> int:
        cfg = self.cfg
        rows_out = []
        ok = True
        for j in cfg.jobs:
            send = read_json(self.out / f"demo-send-{j.name}.json")
            rows = timelines[j.name].rows
            offset = self.sender_offset(j, rows, starts[j.name])
            for r in rows:
                r["t"] = r["time"] + offset
                r["queue"] = self.queue_of(j.job_id, r["tlr"], r["t"], r.get("queues", {}))
            queues_used = sorted({r["queue"] for r in rows if r["sent"]})
            entry: dict[str, Any] = {"job": j.name, "job_id": j.job_id, "msr": j.msr, "queues": queues_used}
            if send:
                g = send["groups"][0]
                entry.update(jct_s=send["jct_s"], delivered=g["delivered"], required=g["required"],
                             total=g["total"], loss=g["measured_loss"], target_loss=g["target_loss"],
                             msr_met=send["msr_met"])
                ok &= bool(send["msr_met"])
            else:
                ok = False
                entry.update(error=_tail(self.out / f"demo-send-{j.name}.log"))
            rows_out.append(entry)
            self.plot(j, rows, bg_start, end)
        bulk = _result(bulk_json)
        fct = bulk.get("fct_s") if bulk.get("confirmed") else None
        # Table.
        _log("")
        _log(f"{'job':<5}{'MSR':>5}{'JCT (s)':>9}{'delivered / required (of N)':>30}{'loss':>8}{'1-MSR':>7}"
             f"{'MSR met':>9}  queues used")
        for e in rows_out:
            if "jct_s" in e:
                _log(f"{e['job']:<5}{e['msr']:>5.2f}{e['jct_s']:>9.2f}"
                     f"{str(e['delivered']) + ' / ' + str(e['required']) + ' (' + str(e['total']) + ')':>30}"
                     f"{e['loss']:>8.3f}{e['target_loss']:>7.3f}{'yes' if e['msr_met'] else 'NO':>9}  "
                     f"{', '.join(f'q{q}' for q in e['queues'])}")
            else:
                _log(f"{e['job']:<5}{e['msr']:>5.2f}  did not finish: {e['error']}")
        if fct is not None:
            _log(f"non-approximate bulk TCP flow ({cfg.bulk_bytes / 1e6:g} MB, queue 0): FCT {fct:.2f} s "
                 f"({bulk['mbit']:.1f} Mbit/s)")
        else:
            ok = False
            _log(f"non-approximate bulk TCP flow: no result (see {bulk_json})")
        if self.last_drops:
            last = self.last_drops
            _log("bottleneck port s1 -> s2, per queue: " + ", ".join(
                f"q{s.qid} {s.packets} sent/{s.drops} dropped" for s in last if s.packets or s.drops))
        bg = _result(self.out / "demo-background-recv.log")
        bgs = _result(self.out / "demo-background.log")
        if bg and bgs:
            _log(f"background: {bgs.get('sent', 0)} packets sent, {bg.get('received', 0)} received")
        summary = {"target": cfg.target, "config": dataclasses.asdict(cfg), "jobs": rows_out, "bulk_fct_s": fct,
                   "assignments": [(round(t, 3), {str(k): v for k, v in a.items()}) for t, a in self.assign_log]}
        (self.out / "demo-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        _log(f"timelines: {', '.join(str(self.out / f'demo-timeline-{j.name}.png') for j in cfg.jobs)}; "
             f"summary: {self.out / 'demo-summary.json'}")
        return 0 if ok else 1

    def plot(self, job: DemoJob, rows: list[dict], bg_start: float, end: float) -> None:
        # matplotlib only when plotting: it is slow to import, and choosing its backend is this call's business
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        bins: dict[int, list[dict]] = {}
        for r in rows:
            bins.setdefault(int(r["t"] / 0.1), []).append(r)
        ts, tlr, rate, loss, queue = [], [], [], [], []
        for b in sorted(bins):
            rs = bins[b]
            sent = sum(r["sent"] for r in rs)
            acked = sum(r["acked"] for r in rs)
            ts.append(b * 0.1 + 0.05)
            tlr.append(sum(r["tlr"] for r in rs) / len(rs))
            rate.append(sum(r["rate_bps"] for r in rs) / len(rs) / 1e6)
            loss.append(min(1.0, max(0.0, 1 - acked / sent)) if sent else float("nan"))
            qs = [r["queue"] for r in rs]
            queue.append(max(set(qs), key=qs.count))
        fig, ax = plt.subplots(4, 1, figsize=(9, 8), sharex=True)
        ax[0].plot(ts, tlr, color="tab:blue", label="TLR")
        ax[0].axhline(1 - job.msr, color="gray", ls=":", label="1 - MSR")
        ax[0].set_ylabel("TLR\n(fraction)")
        ax[0].legend(loc="upper right", fontsize=8)
        ax[1].plot(ts, rate, color="tab:green", label=f"job {job.name}")
        ax[1].set_ylabel("sending rate\n(Mbit/s)")
        ax[1].legend(loc="upper right", fontsize=8)
        ax[2].plot(ts, loss, color="tab:red", label="measured loss (unacknowledged / sent)")
        ax[2].plot(ts, tlr, color="tab:blue", lw=0.8, alpha=0.6, label="TLR")
        ax[2].set_ylabel("loss rate\n(fraction of packets)")
        ax[2].set_ylim(-0.02, 1.02)
        ax[2].legend(loc="upper right", fontsize=8)
        ax[3].step(ts, queue, where="mid", color="tab:purple", label=f"job {job.name} (queue echoed on its ACKs)")
        sched = parse_schedule(self.cfg.background_tlr)
        for i, (st, v) in enumerate(sched):
            a = bg_start + st
            b = bg_start + (sched[i + 1][0] if i + 1 < len(sched) else self.cfg.background_s)
            b = min(b, end)
            if a < b:
                ax[3].hlines(queue_for_tlr(v), a, b, color="gray", ls="--",
                             label="background (queue of its TLR)" if i == 0 else None)
        ax[3].set_ylabel("queue\n(0 = highest priority)")
        ax[3].set_ylim(7.5, -0.5)
        ax[3].set_yticks(range(8))
        ax[3].legend(loc="upper right", fontsize=8)
        ax[3].set_xlabel("time (s); values per 100 ms (epochs averaged)")
        if self.bulk_span:
            t_end = self.bulk_span[1] if len(self.bulk_span) > 1 else end
            for a in ax:
                a.axvspan(self.bulk_span[0], t_end, color="orange", alpha=0.15, lw=0)
            ax[1].text(self.bulk_span[0], 0.95, " bulk TCP\n (queue 0)", va="top", fontsize=8, color="darkorange",
                       transform=ax[1].get_xaxis_transform())
        fig.suptitle(f"job {job.name} (MSR {job.msr}) on the {self.cfg.target} target, "
                     f"{self.cfg.bottleneck_mbit:g} Mbit/s bottleneck")
        fig.tight_layout()
        fig.savefig(self.out / f"demo-timeline-{job.name}.png", dpi=110)
        plt.close(fig)


def _result(path: Path) -> dict:
    """The result a ``topo.trafgen`` program printed last in its log (not its ``{"ready": true}``); {} if none."""
    rows = [r for r in read_json_lines(path) if not r.get("ready")]
    return rows[-1] if rows else {}


def _tail(path: Path, n: int = 2) -> str:
    try:
        return " / ".join(path.read_text().strip().splitlines()[-n:]) or "(no output)"
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    ap = C.OneLineParser(prog="python -m netapprox.topo.demo", description="Run the NetApprox demo experiment.")
    ap.add_argument("--target", choices=["kernel", "bmv2"], default="kernel",
                    help="the switch: kernel (tc/eBPF) or bmv2 (simple_switch_grpc and p4c on PATH)")
    ap.add_argument("--results", default="results", help="output directory (default: results)")
    ap.add_argument("--bottleneck-mbit", type=C.arg(C.number(gt=0.0, le=10000.0)), default=DemoConfig.bottleneck_mbit,
                    help="rate of the s1-s2 link, Mbit/s (default %(default)s)")
    ap.add_argument("--messages", type=C.arg(C.integer(ge=1, le=MAX_MESSAGES)), default=None,
                    help="messages per job (default 20000)")
    ap.add_argument("--quick", action="store_true", help="a short run (smaller jobs and flow)")
    ap.add_argument("--pcap", metavar="DIR", help="write one pcap per switch interface into DIR (default: no capture)")
    ap.add_argument("--metrics-port", type=C.arg(C.port(allow=(-1, 0))), default=-1,
                    help="serve the controller's Prometheus metrics here (default -1: off)")
    ap.add_argument("--p4-build", metavar="DIR",
                    help="--target bmv2: folder with the compiled bmv2.json and p4info.txtpb (default: the "
                         "checkout's build/v1model, which `make p4` writes)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print what would run and where it would write, check the options, start nothing (no root)")
    args = ap.parse_args(argv)
    for option, directory in (("--results", args.results), ("--pcap", args.pcap)):
        if directory is not None:
            try:
                C.output_file(create_dirs=True)(Path(directory) / "demo-summary.json", option)
            except C.CheckError as e:
                ap.error(str(e))
    logging.basicConfig(level=logging.WARNING, format="  [%(name)s] %(message)s")
    cfg = DemoConfig(target=args.target, results=args.results, bottleneck_mbit=args.bottleneck_mbit, pcap=args.pcap,
                     metrics_port=args.metrics_port, p4_build=args.p4_build)
    messages = args.messages or (4000 if args.quick else None)
    if messages:
        cfg = dataclasses.replace(cfg, jobs=tuple(dataclasses.replace(j, messages=messages) for j in cfg.jobs))
    if args.quick:
        cfg = dataclasses.replace(cfg, bulk_bytes=1_000_000, bulk_start_s=2.0, background_tlr="0:0.5,3:0.375,6:0.25",
                                  background_s=15.0, time_limit_s=40.0)
    if args.dry_run:
        for line in Demo(cfg).plan():
            print(line)
        return 0
    if os.geteuid() != 0:
        print(f"{ap.prog}: error: make demo needs root (network namespaces, qdiscs): run it with sudo.", file=sys.stderr)
        return 2
    missing = [t for t in ("mnexec", "ethtool", "tc") if shutil.which(t) is None]
    if missing:
        print(f"{ap.prog}: error: missing tools: {', '.join(missing)}. Run `make setup` (tools/setup-system.sh "
              "installs them).",
              file=sys.stderr)
        return 2
    if args.target == "bmv2":
        if not bmv2_available():
            print(f"{ap.prog}: error: make demo TARGET=bmv2: {P4_TOOLS_HINT}", file=sys.stderr)
            return 2
        if not cfg.bmv2_json().exists():
            print(f"{ap.prog}: error: make demo TARGET=bmv2: {cfg.bmv2_json()} is missing; run `make p4` in the "
                  "checkout first, or give "
                  "--p4-build DIR with the compiled bmv2.json and p4info.txtpb.", file=sys.stderr)
            return 2
    demo = Demo(cfg)
    # SIGTERM/SIGHUP clean up like Ctrl-C: every process, namespace and link the demo made is removed.
    stop_on_signals()
    try:
        return demo.run()
    except BindError as e:  # a port in use (--metrics-port): one line, exit status 2
        print(f"{ap.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: everything the demo started has been stopped and removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
